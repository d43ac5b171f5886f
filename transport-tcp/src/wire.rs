//! The data stream's wire format: the message header, and the 64-byte units
//! every write is padded to so that the kernel's copies run at full speed.
//!
//! # Header (16 bytes, on socket 0)
//! | bytes | field |
//! |-------|-------|
//! | 0..4  | tag, `u32` little-endian |
//! | 4..12 | payload length, `u64` little-endian |
//! | 12    | `align`: the sender's payload address modulo [`UNIT`] |
//! | 13    | flags: bit 0 [`Header::spliced`] |
//! | 14..16 | reserved, zero |
//!
//! # Units
//! Everything a connection writes comes in units of a whole number of
//! [`UNIT`] bytes. On socket 0 a message is `[header][head pad][inline
//! payload][tail pad]` (a striped message has no inline payload, so its
//! unit is the header and 48 bytes of padding); on a data socket a piece is
//! `[head pad][piece][tail pad]`. The head pad puts the payload at offset
//! `align` within its unit ([`pads`]); pad bytes are zero and the receiver
//! discards them. Both sides compute the pads from the header, so nothing
//! else describes them.
//!
//! # Why
//! The kernel copies socket data with `rep movsb`, from the sender's buffer
//! into page fragments it fills back to back per *thread*
//! (`current->task_frag`: one fragment for every socket a thread writes
//! to), and later from those fragments into the receiver's buffer. On AMD
//! Zen (seen on an EPYC of family 25) `rep movsb` runs about 15 times
//! slower when its destination lies 1 to 15 bytes after its source modulo
//! 4096, and somewhat slower up to 31 (glibc's `memcpy` has the same cliff
//! between 4 KiB and 1 MiB). The old 12-byte
//! header put the payload 12 bytes into the fragment, so a buffer from
//! `malloc` (16 bytes into its page) on both sides was received at distance
//! 4: every byte of every message, striped ones too, since the header had
//! shifted the thread's fragment for the data sockets as well. Whole units
//! keep the fragment offset a multiple of 64 at every unit start (until a
//! partial write of a full socket buffer, after which offsets are arbitrary
//! rather than systematically bad); with the payload at `align` the send
//! copy runs at a distance that is a multiple of 64, and the receive copy
//! at the receiver's buffer offset minus the sender's (modulo 64): 0 when
//! both buffers sit alike in their cache lines, as a collective's buffers
//! usually do. Staying off the cliff made 1 MiB collectives over loopback
//! about twice as fast.

/// Every write is a whole number of these bytes.
pub(crate) const UNIT: usize = 64;
// A striped message's pieces start at multiples of the chunk alignment, so
// each sits in its cache line as the message does (both sides use the
// header's `align` for every piece).
const _: () = assert!(crate::stripe::CHUNK_ALIGN % UNIT == 0);
/// Message header size.
pub(crate) const HDR: usize = 16;
/// An acknowledgement of a spliced message, written by the receiver on
/// socket 0 (the otherwise idle direction): the message's sequence number
/// on the connection (0 for the first message), `u64` little-endian.
pub(crate) const ACK: usize = 8;

/// A decoded message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) tag: u32,
    pub(crate) len: u64,
    /// The sender's payload address modulo [`UNIT`].
    pub(crate) align: u8,
    /// The pieces are spliced from the sender's pages (see
    /// [`crate::lanes`]): they carry no pads, and the receiver acknowledges
    /// the whole message on socket 0 once it is in (see [`crate::comm`]).
    pub(crate) spliced: bool,
}

impl Header {
    /// The header of a message of `len` bytes from `data`.
    pub(crate) fn new(tag: u32, len: usize, data: *const u8) -> Header {
        Header {
            tag,
            len: len as u64,
            align: (data as usize % UNIT) as u8,
            spliced: false,
        }
    }

    /// The pads of a `len`-byte piece on a data socket: none when spliced.
    pub(crate) fn piece_pads(&self, len: usize) -> (usize, usize) {
        if self.spliced {
            (0, 0)
        } else {
            pads(0, len, self.align)
        }
    }

    pub(crate) fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0..4].copy_from_slice(&self.tag.to_le_bytes());
        b[4..12].copy_from_slice(&self.len.to_le_bytes());
        b[12] = self.align;
        b[13] = u8::from(self.spliced);
        b
    }

    /// Decodes `b`; an `align` out of range or a reserved byte set is a
    /// protocol error (garbage, or a peer speaking another format).
    pub(crate) fn decode(b: &[u8; HDR]) -> Result<Header, String> {
        let mut len = [0u8; 8];
        len.copy_from_slice(&b[4..12]);
        let h = Header {
            tag: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            len: u64::from_le_bytes(len),
            align: b[12],
            spliced: b[13] & 1 != 0,
        };
        if usize::from(h.align) >= UNIT || b[13] > 1 || b[14..].iter().any(|&x| x != 0) {
            return Err(format!(
                "bad message header (align {}, flags {}, reserved {:?})",
                h.align,
                b[13],
                &b[14..]
            ));
        }
        Ok(h)
    }
}

/// The head and tail padding of `len` payload bytes that follow `before`
/// bytes of their unit (the header on socket 0, nothing on a data socket):
/// the payload starts at `align` modulo [`UNIT`] within the unit and the
/// unit ends on a [`UNIT`] boundary. No payload, no head pad.
pub(crate) fn pads(before: usize, len: usize, align: u8) -> (usize, usize) {
    let head = match len {
        0 => 0,
        _ => (usize::from(align) + UNIT - before % UNIT) % UNIT,
    };
    let tail = (UNIT - (before + head + len) % UNIT) % UNIT;
    (head, tail)
}

/// Zero bytes that pads are sent from.
pub(crate) static ZEROS: [u8; UNIT] = [0; UNIT];

/// Appends to `iov` (from `*n` on) the parts of `segs` that lie at or after
/// byte `done` of their concatenation, skipping empty ones; returns the
/// bytes described. Stops when `iov` is full.
pub(crate) fn iov_from(
    segs: &[(*mut u8, usize)],
    mut done: usize,
    iov: &mut [libc::iovec],
    n: &mut usize,
) -> usize {
    let mut bytes = 0;
    for &(ptr, len) in segs {
        if done >= len {
            done -= len;
            continue;
        }
        if *n == iov.len() {
            break;
        }
        iov[*n] = libc::iovec {
            // Stays inside the segment: done < len.
            iov_base: ptr.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        *n += 1;
        bytes += len - done;
        done = 0;
    }
    bytes
}

/// Copies `src` into the concatenation of `segs` from its byte `done` on
/// (the counterpart of [`iov_from`] for bytes already read).
///
/// # Safety
/// Every segment must be valid for writes of its length and must not
/// overlap `src`; `done + src.len()` must not exceed the segments' total.
pub(crate) unsafe fn scatter(segs: &[(*mut u8, usize)], mut done: usize, mut src: &[u8]) {
    for &(ptr, len) in segs {
        if src.is_empty() {
            break;
        }
        if done >= len {
            done -= len;
            continue;
        }
        let k = (len - done).min(src.len());
        // SAFETY: `done + k <= len` lies within the segment, which the
        // caller guarantees writable and disjoint from `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.add(done), k) };
        src = &src[k..];
        done = 0;
    }
    debug_assert!(src.is_empty(), "scatter past the segments");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = Header {
            tag: 0xdead_beef,
            len: 1 << 40,
            align: 63,
            spliced: false,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let s = Header { spliced: true, ..h };
        assert_eq!(Header::decode(&s.encode()), Ok(s));
        assert_eq!(s.piece_pads(100), (0, 0), "spliced pieces carry no pads");
        assert_eq!(h.piece_pads(100), pads(0, 100, 63));
        let mut b = h.encode();
        b[13] = 2;
        assert!(Header::decode(&b).is_err(), "unknown flag");
        let mut b = h.encode();
        b[12] = 64;
        assert!(Header::decode(&b).is_err(), "align out of range");
        let mut b = h.encode();
        b[15] = 1;
        assert!(Header::decode(&b).is_err(), "reserved byte set");
        let p = 0x1000usize as *const u8;
        assert_eq!(Header::new(1, 5, p.wrapping_add(70)).align, 6);
    }

    #[test]
    fn units_are_whole_and_payload_sits_at_align() {
        for before in [0, HDR] {
            for align in 0..UNIT as u8 {
                for len in [1, 2, 47, 48, 63, 64, 65, 4096, 100_000] {
                    let (head, tail) = pads(before, len, align);
                    assert!(head < UNIT && tail < UNIT);
                    assert_eq!(
                        (before + head) % UNIT,
                        usize::from(align),
                        "{before} {align} {len}"
                    );
                    assert_eq!((before + head + len + tail) % UNIT, 0);
                }
            }
            let (head, tail) = pads(before, 0, 17);
            assert_eq!(head, 0, "no payload, no head pad");
            assert_eq!((before + tail) % UNIT, 0);
        }
        // The common case: malloc'd buffers, 16 bytes into a line.
        assert_eq!(pads(HDR, 1 << 20, 16), (0, 48));
        assert_eq!(pads(0, 1 << 20, 16), (16, 48));
    }

    /// Segments over `a` and `b` with an empty one between them.
    fn around_empty(a: &mut [u8], b: &mut [u8]) -> [(*mut u8, usize); 3] {
        [
            (a.as_mut_ptr(), a.len()),
            (std::ptr::null_mut(), 0),
            (b.as_mut_ptr(), b.len()),
        ]
    }

    #[test]
    fn scatter_continues_where_it_left_off() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 4];
        let segs = around_empty(&mut a, &mut b);
        // SAFETY: both arrays outlive the calls; 2 + 3 and 5 + 2 <= 7.
        unsafe {
            scatter(&segs, 2, &[1, 2, 3]);
            scatter(&segs, 5, &[4, 5]);
        }
        assert_eq!((a, b), ([0, 0, 1], [2, 3, 4, 5]));
    }

    #[test]
    fn iov_from_skips_what_is_done() {
        let mut a = [0u8; 10];
        let mut b = [0u8; 5];
        let segs = around_empty(&mut a, &mut b);
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        let mut n = 0;
        assert_eq!(iov_from(&segs, 0, &mut iov, &mut n), 15);
        assert_eq!(n, 2, "the empty segment is skipped");
        let mut n = 0;
        assert_eq!(iov_from(&segs, 12, &mut iov, &mut n), 3);
        assert_eq!((n, iov[0].iov_len), (1, 3));
        assert_eq!(iov[0].iov_base as usize, b.as_ptr() as usize + 2);
        let mut n = 0;
        assert_eq!(iov_from(&segs, 15, &mut iov, &mut n), 0);
        assert_eq!(n, 0);
        let mut n = 4;
        assert_eq!(iov_from(&segs, 0, &mut iov, &mut n), 0, "iov full");
    }
}
