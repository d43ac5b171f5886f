//! Splitting a single-copy message between both ends.
//!
//! A single-copy message (see [`super::cma`]) is copied by the receiver
//! alone, while the sender, which only waits for the receiver to release
//! the frame, idles on its core. For a message of at least
//! [`SPLIT_MIN_BYTES`] the receiver instead *offers* it: it publishes its
//! destination address and cuts the message into pieces, and both ends
//! claim runs of pieces from a shared claim word, the receiver from the
//! front (copying with `process_vm_readv` from the sender) and the sender
//! from the back (copying with `process_vm_writev` into the receiver). So
//! two cores copy one message instead of one.
//!
//! # Protocol
//! The [`Offer`] line holds the claim word `epoch:32 | front:16 | back:16`,
//! the destination address, the piece size and the message length. The
//! epoch names the frame (its stream position in lines, truncated), so a
//! claim never lands on a later message. Pieces `[0, front)` belong to the
//! receiver and `[back, n)` to the sender; each side takes a run with a
//! compare-exchange (half of what is left, at least [`MIN_CLAIM_BYTES`]),
//! so whichever end is not there simply leaves the work to the other.
//!
//! * The receiver stores address, piece size and length, then the claim
//!   word `(epoch, 0, n)` with Release; the sender's Acquire load of the
//!   claim word makes them visible. They cannot change under a sender whose
//!   compare-exchange succeeds: the receiver writes a new offer only after
//!   `front == back`, and no claim succeeds from such a word.
//! * The sender reports its finished pieces in its own line
//!   ([`Header::helped`](super::segment::Header)), `epoch:32 | count:31`
//!   (bit 31: its write failed, the errno in the count bits), stored with
//!   Release after each `process_vm_writev`.
//! * The receiver is done once `front == back` and the sender's count for
//!   this epoch is `n - back`; only then does it release the frame's line,
//!   which completes the send. Its Acquire load of the count orders the
//!   sender's writes before its completion.
//! * A receiver that goes away with an offer open withdraws it (sets
//!   `front = back`) and waits for the sender's pieces in flight, so no
//!   write lands in a buffer the caller got back.

use super::mapped::{SharedRegion, MAPPED_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};

/// Messages of at least this many bytes are split when the sender helps:
/// below it the offer, the claims and the second system call cost about
/// what half of the copy saves (fitted on a 2-core VM; refit on real
/// hardware with `scripts/paired.sh`).
pub(super) const SPLIT_MIN_BYTES: usize = 128 << 10;
/// After its first, no claim takes fewer bytes than this unless less is
/// left: every claim is one system call.
pub(super) const MIN_CLAIM_BYTES: usize = 256 << 10;
/// Pieces are whole pages unless the message has more pages than a claim
/// word counts.
const PAGE: usize = 4096;
/// Bit of the sender's count word that says its write failed.
pub(super) const HELP_FAILED: u32 = 1 << 31;

/// The receiver's offer, in a line of its own (both sides write the claim
/// word).
#[repr(C)]
#[derive(Default)]
pub(super) struct Offer {
    /// `epoch:32 | front:16 | back:16`.
    pub(super) claim: AtomicU64,
    /// The receiver's destination address.
    pub(super) dst: AtomicU64,
    /// Bytes per piece.
    pub(super) piece: AtomicU64,
    /// Message bytes.
    pub(super) len: AtomicU64,
    /// The shared allocation holding the destination, if any
    /// ([`SharedRegion::encode`], all zero for none): the sender may write
    /// into a mapping of it.
    pub(super) shared: [AtomicU64; SHARED_WORDS],
}

/// Words of an encoded [`SharedRegion`] in an [`Offer`].
const SHARED_WORDS: usize = MAPPED_BYTES.div_ceil(8);

/// A run of pieces the sender claimed ([`Offer::claim_back`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BackRun {
    /// The receiver's address of the whole message.
    pub(super) dst: u64,
    /// Where the whole message lies in a shared allocation of the
    /// receiver's, if it does.
    pub(super) shared: Option<SharedRegion>,
    /// Bytes per piece.
    pub(super) piece: usize,
    /// Pieces `[lo, hi)`.
    pub(super) lo: u16,
    pub(super) hi: u16,
}

/// A decoded claim word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) epoch: u32,
    pub(super) front: u16,
    pub(super) back: u16,
}

impl Claim {
    fn pack(self) -> u64 {
        (u64::from(self.epoch) << 32) | (u64::from(self.front) << 16) | u64::from(self.back)
    }

    fn unpack(w: u64) -> Claim {
        Claim {
            epoch: (w >> 32) as u32,
            front: (w >> 16) as u16,
            back: w as u16,
        }
    }

    fn left(self) -> u16 {
        self.back.saturating_sub(self.front)
    }
}

/// The epoch of the frame that starts at stream position `start`.
pub(super) fn epoch_of(start: u64) -> u32 {
    (start / super::ring::FRAME_ALIGN as u64) as u32
}

/// How a message of `len > 0` bytes is cut: `(piece bytes, pieces)`.
pub(super) fn cut(len: usize) -> (usize, u16) {
    let max = usize::from(u16::MAX);
    let piece = len.div_ceil(max).div_ceil(PAGE).max(1) * PAGE;
    let n = len.div_ceil(piece);
    (piece, u16::try_from(n).expect("at most u16::MAX pieces"))
}

/// Pieces to take out of `left`: half, but at least `min` (or all that is
/// left).
fn take(left: u16, min: u16) -> u16 {
    left.div_ceil(2).max(min).min(left)
}

/// Pieces in a claim of [`MIN_CLAIM_BYTES`].
fn min_pieces(piece: usize) -> u16 {
    u16::try_from(MIN_CLAIM_BYTES.div_ceil(piece).max(1)).unwrap_or(u16::MAX)
}

/// The byte range of pieces `[lo, hi)` of a message of `len` bytes.
pub(super) fn bytes_of(lo: u16, hi: u16, piece: usize, len: usize) -> (usize, usize) {
    let start = (usize::from(lo) * piece).min(len);
    let end = (usize::from(hi) * piece).min(len);
    (start, end - start)
}

impl Offer {
    /// Receiver: offers message `epoch` of `len` bytes, to be copied to
    /// `dst` (in `shared`, if it is in a shared allocation), in `n` pieces
    /// of `piece` bytes.
    pub(super) fn publish(
        &self,
        epoch: u32,
        dst: u64,
        shared: Option<SharedRegion>,
        len: usize,
        piece: usize,
        n: u16,
    ) {
        let mut bytes = [0u8; SHARED_WORDS * 8];
        if let Some(r) = shared {
            bytes[..MAPPED_BYTES].copy_from_slice(&r.encode());
        }
        for (w, b) in self.shared.iter().zip(bytes.chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(b.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
        self.dst.store(dst, Ordering::Relaxed);
        self.piece.store(piece as u64, Ordering::Relaxed);
        self.len.store(len as u64, Ordering::Relaxed);
        let c = Claim {
            epoch,
            front: 0,
            back: n,
        };
        // Release: the fields above are visible to a sender that loads this
        // with Acquire.
        self.claim.store(c.pack(), Ordering::Release);
    }

    /// Receiver: takes the next run of pieces from the front of offer
    /// `epoch` (half of what is left, or at least `min_pieces(piece)` when
    /// `first` is false). `Ok(None)`: nothing is left; the `u16` is then
    /// where the sender's pieces start. `Err`: the word names another epoch
    /// (a corrupt peer).
    pub(super) fn claim_front(
        &self,
        epoch: u32,
        piece: usize,
        first: bool,
    ) -> Result<Result<(u16, u16), u16>, &'static str> {
        let mut w = self.claim.load(Ordering::Acquire);
        loop {
            let c = Claim::unpack(w);
            if c.epoch != epoch || c.front > c.back {
                return Err("the sender rewrote the split offer");
            }
            if c.left() == 0 {
                return Ok(Err(c.back));
            }
            let k = take(c.left(), if first { 1 } else { min_pieces(piece) });
            let next = Claim {
                front: c.front + k,
                ..c
            };
            match self.claim.compare_exchange_weak(
                w,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Ok((c.front, next.front))),
                Err(now) => w = now,
            }
        }
    }

    /// Receiver: closes offer `epoch` to further claims; returns where the
    /// sender's pieces start.
    pub(super) fn withdraw(&self, epoch: u32) -> u16 {
        let mut w = self.claim.load(Ordering::Acquire);
        loop {
            let c = Claim::unpack(w);
            if c.epoch != epoch || c.left() == 0 {
                return c.back;
            }
            let next = Claim { front: c.back, ..c };
            match self.claim.compare_exchange_weak(
                w,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return c.back,
                Err(now) => w = now,
            }
        }
    }

    /// The shared allocation the offer names, if any.
    fn shared_dst(&self) -> Option<SharedRegion> {
        let mut bytes = [0u8; SHARED_WORDS * 8];
        for (w, b) in self.shared.iter().zip(bytes.chunks_exact_mut(8)) {
            b.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let none = bytes.iter().all(|&b| b == 0);
        (!none).then(|| SharedRegion::decode(bytes[..MAPPED_BYTES].try_into().expect("encoded")))
    }

    /// Sender: takes a run of pieces from the back of the offer if it is
    /// for `epoch` and a message of `len` bytes.
    pub(super) fn claim_back(&self, epoch: u32, len: usize) -> Option<BackRun> {
        let mut w = self.claim.load(Ordering::Acquire);
        loop {
            let c = Claim::unpack(w);
            if c.epoch != epoch || c.left() == 0 {
                return None;
            }
            // Valid while the claim below succeeds (see the module docs).
            let dst = self.dst.load(Ordering::Relaxed);
            let shared = self.shared_dst();
            let piece = usize::try_from(self.piece.load(Ordering::Relaxed)).ok()?;
            let offered = self.len.load(Ordering::Relaxed);
            // Only the cut we would make for our own message: the receiver
            // cannot point us outside it.
            let (want_piece, want_n) = cut(len);
            if offered != len as u64 || piece != want_piece || c.back > want_n {
                return None;
            }
            let k = take(c.left(), min_pieces(piece));
            let next = Claim {
                back: c.back - k,
                ..c
            };
            match self.claim.compare_exchange_weak(
                w,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(BackRun {
                        dst,
                        shared,
                        piece,
                        lo: next.back,
                        hi: c.back,
                    })
                }
                Err(now) => w = now,
            }
        }
    }
}

/// The sender's report word: `epoch:32 | count:31 | failed:1`.
pub(super) fn helped_word(epoch: u32, count: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(count)
}

/// What the sender reports for `epoch`: `Some(Ok(count))`, `Some(Err(errno))`
/// when its write failed, `None` when the word is about another epoch.
pub(super) fn helped_for(w: u64, epoch: u32) -> Option<Result<u32, i32>> {
    if (w >> 32) as u32 != epoch {
        return None;
    }
    let low = w as u32;
    Some(if low & HELP_FAILED != 0 {
        Err((low & !HELP_FAILED) as i32)
    } else {
        Ok(low)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_in_pages_up_to_the_word() {
        assert_eq!(cut(1), (4096, 1));
        assert_eq!(cut(64 << 10), (4096, 16));
        assert_eq!(cut((1 << 20) + 1), (4096, 257));
        let (piece, n) = cut(1 << 30);
        assert_eq!(piece % 4096, 0);
        assert!(piece * usize::from(n) >= 1 << 30);
        assert!(piece * (usize::from(n) - 1) < 1 << 30);
        let (piece, n) = cut(1 << 40);
        assert!(piece * usize::from(n) >= 1 << 40);
    }

    #[test]
    fn both_ends_claim_disjoint_runs_that_cover_the_message() {
        let o = Offer::default();
        let len = (3 << 20) + 5;
        let (piece, n) = cut(len);
        o.publish(7, 0x1000, None, len, piece, n);
        // The receiver's first claim takes half.
        let (lo, hi) = o.claim_front(7, piece, true).unwrap().unwrap();
        assert_eq!((lo, hi), (0, n.div_ceil(2)));
        // A sender with another message, or of another epoch, takes nothing.
        assert!(o.claim_back(8, len).is_none());
        assert!(o.claim_back(7, len - 1).is_none());
        let mut sender = Vec::new();
        let mut receiver = vec![(lo, hi)];
        while let Some(run) = o.claim_back(7, len) {
            assert_eq!((run.dst, run.piece, run.shared), (0x1000, piece, None));
            sender.push((run.lo, run.hi));
            if let Ok(run) = o.claim_front(7, piece, false).unwrap() {
                receiver.push(run);
            }
        }
        let back = o.claim_front(7, piece, false).unwrap().unwrap_err();
        // The receiver's runs tile [0, back), the sender's [back, n).
        let mut at = 0;
        for &(a, b) in &receiver {
            assert_eq!(a, at);
            at = b;
        }
        assert_eq!(at, back);
        let mut end = n;
        for &(a, b) in &sender {
            assert_eq!(b, end);
            assert!(usize::from(b - a) * piece >= MIN_CLAIM_BYTES || a == back);
            end = a;
        }
        assert_eq!(end, back);
        assert!(!sender.is_empty() && receiver.len() > 1);
        let (s, l) = bytes_of(n - 1, n, piece, len);
        assert_eq!(s + l, len);
    }

    #[test]
    fn a_withdrawn_offer_gives_nothing_more() {
        let o = Offer::default();
        let (piece, n) = cut(1 << 20);
        o.publish(3, 0x2000, None, 1 << 20, piece, n);
        let back = o.withdraw(3);
        assert_eq!(back, n);
        assert!(o.claim_back(3, 1 << 20).is_none());
        assert_eq!(o.claim_front(3, piece, false).unwrap(), Err(n));
        assert!(o.claim_front(4, piece, false).is_err(), "another epoch");
    }

    #[test]
    fn an_offer_names_the_shared_allocation_of_its_destination() {
        let b = crate::ShmBuffer::<u8>::zeroed(3 << 20).unwrap();
        let len = 2 << 20;
        let at = SharedRegion::locate(b.as_ptr().wrapping_add(4096), len).unwrap();
        let o = Offer::default();
        let (piece, n) = cut(len);
        o.publish(9, 0x3000, Some(at), len, piece, n);
        assert_eq!(o.claim_back(9, len).unwrap().shared, Some(at));
        // The next offer, without one, clears it.
        o.withdraw(9);
        o.publish(10, 0x3000, None, len, piece, n);
        assert_eq!(o.claim_back(10, len).unwrap().shared, None);
    }

    #[test]
    fn the_initial_word_offers_nothing() {
        let o = Offer::default();
        assert!(o.claim_back(0, 1 << 20).is_none());
    }

    #[test]
    fn report_words() {
        assert_eq!(helped_for(helped_word(5, 9), 5), Some(Ok(9)));
        assert_eq!(helped_for(helped_word(5, 9), 6), None);
        let failed = helped_word(5, HELP_FAILED | libc::EPERM as u32);
        assert_eq!(helped_for(failed, 5), Some(Err(libc::EPERM)));
    }
}
