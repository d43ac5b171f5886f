//! How a message is spread over the sockets of a connection.
//!
//! A connection has `n` data sockets (`nsocks`, 1..=64; NCCL's
//! `NCCL_NSOCKS_PERTHREAD` × `NCCL_SOCKET_NTHREADS`). With `n` = 1 it is
//! one TCP socket that carries everything. With `n` ≥ 2 it is `n + 1`
//! sockets, as in NCCL: socket 0 is the control socket and sockets 1..=n
//! carry the pieces of large messages.
//!
//! Socket 0 carries every message header (tag, length) in posting order. A
//! message of at most [`MIN_CHUNK`] bytes, or any message when `n` is 1,
//! follows its header inline on socket 0, exactly as on a one-socket
//! connection, so small messages cost one `sendmsg` / `recvmsg` as before.
//!
//! A larger message is cut into pieces of
//! `max(MIN_CHUNK, ceil(len / n))` bytes rounded up to [`CHUNK_ALIGN`] (as
//! NCCL's socket transport, whose minimum chunk per socket is also 64 KiB).
//! Piece `i` travels on socket `1 + (rot + i) % n`, where `rot` is a
//! rotation both sides advance by the piece count of every striped message,
//! so that successive messages start on different sockets. Both sides run
//! this same pure computation in the same message order, so nothing but
//! the header crosses the wire to describe the layout. Keeping the pieces
//! off socket 0 lets helper threads move all the bulk data while the
//! caller's thread only reads headers and small messages.

/// Smallest chunk a message is cut into (NCCL's `MIN_CHUNKSIZE`).
pub(crate) const MIN_CHUNK: usize = 64 << 10;
/// Chunk sizes are rounded up to a multiple of this (pages).
pub(crate) const CHUNK_ALIGN: usize = 4096;

/// One piece of a striped message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Socket index, 1..=n.
    pub(crate) sock: usize,
    /// Offset in the message.
    pub(crate) off: usize,
    /// Length in bytes (never 0).
    pub(crate) len: usize,
}

/// TCP sockets of a connection with `n` data sockets.
pub(crate) fn total_sockets(n: usize) -> usize {
    if n <= 1 {
        1
    } else {
        n + 1
    }
}

/// Data sockets of a connection of `total` TCP sockets.
pub(crate) fn data_sockets(total: usize) -> usize {
    total.saturating_sub(1).max(1)
}

/// The stripe layout state of one direction of a connection.
#[derive(Clone, Debug)]
pub(crate) struct Striper {
    n: usize,
    rot: usize,
}

impl Striper {
    /// A layout over `n` data sockets (`n >= 1`).
    pub(crate) fn new(n: usize) -> Striper {
        Striper {
            n: n.max(1),
            rot: 0,
        }
    }

    /// Chunk size of a `len`-byte message, or `None` if it goes inline on
    /// socket 0.
    fn chunk(&self, len: usize) -> Option<usize> {
        if self.n == 1 || len <= MIN_CHUNK {
            return None;
        }
        let even = len.div_ceil(self.n).max(MIN_CHUNK);
        Some(even.div_ceil(CHUNK_ALIGN).saturating_mul(CHUNK_ALIGN))
    }

    /// Whether a message of `len` bytes is striped (not inline on socket 0).
    pub(crate) fn stripes(&self, len: usize) -> bool {
        self.chunk(len).is_some()
    }

    /// Lays out the next message of `len` bytes: calls `piece` for every
    /// piece in order and advances the rotation. Returns `false` (and calls
    /// nothing) for a message that goes inline on socket 0.
    pub(crate) fn layout(&mut self, len: usize, mut piece: impl FnMut(Piece)) -> bool {
        let Some(chunk) = self.chunk(len) else {
            return false;
        };
        let mut off = 0;
        let mut i = 0;
        while off < len {
            let l = chunk.min(len - off);
            piece(Piece {
                sock: 1 + (self.rot + i) % self.n,
                off,
                len: l,
            });
            off += l;
            i += 1;
        }
        self.rot = (self.rot + i) % self.n;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &mut Striper, len: usize) -> Vec<Piece> {
        let mut v = Vec::new();
        let striped = s.layout(len, |p| v.push(p));
        assert_eq!(striped, !v.is_empty());
        v
    }

    #[test]
    fn socket_counts() {
        assert_eq!(total_sockets(1), 1);
        assert_eq!(total_sockets(4), 5);
        assert_eq!(data_sockets(1), 1);
        assert_eq!(data_sockets(5), 4);
    }

    #[test]
    fn small_and_single_socket_messages_are_inline() {
        let mut one = Striper::new(1);
        assert!(pieces(&mut one, 1 << 30).is_empty());
        let mut four = Striper::new(4);
        for len in [0, 1, MIN_CHUNK - 1, MIN_CHUNK] {
            assert!(pieces(&mut four, len).is_empty(), "{len}");
        }
        // Inline messages do not rotate.
        assert_eq!(four.rot, 0);
    }

    #[test]
    fn pieces_cover_the_message_exactly() {
        for n in [2, 3, 4, 7, 8, 64] {
            let mut s = Striper::new(n);
            for len in [
                MIN_CHUNK + 1,
                1 << 20,
                (1 << 20) + 3,
                (16 << 20) + 5,
                12345678,
            ] {
                let rot = s.rot;
                let v = pieces(&mut s, len);
                assert!(v.len() >= 2 && v.len() <= n, "n {n} len {len}: {}", v.len());
                let mut off = 0;
                for (i, p) in v.iter().enumerate() {
                    assert_eq!(p.off, off);
                    assert!(p.len > 0);
                    assert_eq!(p.sock, 1 + (rot + i) % n);
                    off += p.len;
                }
                assert_eq!(off, len);
                // All but the last piece have the same aligned size >= 64 KiB.
                let c = v[0].len;
                assert!(c >= MIN_CHUNK && c.is_multiple_of(CHUNK_ALIGN));
                assert!(v[..v.len() - 1].iter().all(|p| p.len == c));
                assert_eq!(s.rot, (rot + v.len()) % n);
            }
        }
    }

    #[test]
    fn layout_examples() {
        let mut s = Striper::new(4);
        // 64 KiB + 1: two pieces, 64 KiB and 1 byte.
        let v = pieces(&mut s, MIN_CHUNK + 1);
        assert_eq!(
            v,
            [
                Piece {
                    sock: 1,
                    off: 0,
                    len: MIN_CHUNK
                },
                Piece {
                    sock: 2,
                    off: MIN_CHUNK,
                    len: 1
                }
            ]
        );
        // 1 MiB over 4 sockets: 256 KiB each, starting at socket 3.
        let v = pieces(&mut s, 1 << 20);
        let socks: Vec<usize> = v.iter().map(|p| p.sock).collect();
        assert_eq!(socks, [3, 4, 1, 2]);
        assert!(v.iter().all(|p| p.len == 256 << 10));
    }

    /// With the data sockets a multiple of the rails, as
    /// `rails::connection_nsocks` makes them, every rail carries the same
    /// share of a large message, to within one aligned chunk per socket.
    #[test]
    fn rails_get_equal_shares() {
        use crate::rails::{connection_nsocks, socket_rails};
        for r in 1..=crate::MAX_RAILS {
            for nsocks in [1, 2, 3, 4, 8, 64] {
                let n = connection_nsocks(nsocks, r);
                if n == 1 {
                    // One socket, one rail: everything inline on it.
                    continue;
                }
                let mut s = Striper::new(n);
                for len in [64 << 20, (64 << 20) + 12345, 1 << 30, n * MIN_CHUNK * 7 + 1] {
                    let mut per = vec![0usize; r];
                    s.layout(len, |p| per[socket_rails(p.sock, n, r, r, r).0] += p.len);
                    assert_eq!(per.iter().sum::<usize>(), len);
                    let fair = len / r;
                    let slack = n * CHUNK_ALIGN;
                    for (rail, &b) in per.iter().enumerate() {
                        assert!(
                            b + slack >= fair && b <= fair + slack,
                            "{r} rails, {n} sockets, {len} bytes: rail {rail} got {b} of {per:?}"
                        );
                    }
                }
            }
        }
        // Exactly: 64 MiB over 4 sockets on 2 rails, 32 MiB each.
        let mut s = Striper::new(4);
        let mut per = [0usize; 2];
        s.layout(64 << 20, |p| {
            per[socket_rails(p.sock, 4, 2, 2, 2).0] += p.len
        });
        assert_eq!(per, [32 << 20, 32 << 20]);
    }
}
