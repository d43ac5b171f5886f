//! Sealed frames: the receiver of a tiny message waits on one cache line.
//!
//! A frame written by the eager path ([`super::super::send`]'s
//! `send_eager`) has a header line whose last word, stored last (Release),
//! is the seal of its stream position: `key ^ pos * ODD`, where `key` comes
//! from the segment's random nonce. Its payload rides inside that line
//! (up to [`SEALED_MAX`] bytes) or fills the lines after it, written
//! before the seal; a payload of 41 to 48 bytes would reach the seal's
//! word, so such a frame goes unsealed. A consumer that reads its tail line's last
//! word (Acquire) and finds the seal of its tail position knows the whole
//! line is written, without loading the producer's counter first: one
//! cache transfer instead of two (the counter's, then the line's). The
//! producer still publishes its counter as for every frame, so a consumer
//! that does not look for seals reads sealed frames like any other.
//!
//! What else can be in that word: the seal of an earlier lap's frame at
//! the same place (`pos - k * cap`; the seal is a bijection of the
//! position, so never equal), or bytes of another frame (payload, an
//! unsealed header line's padding): those match only if they equal this
//! connection's random key mixed with the position, a 2^-64 chance that
//! no data chosen without the key can raise.

use super::{Consumer, Producer, FRAME_ALIGN, HDR_BYTES};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Offset of the seal in its line.
pub(in crate::transport::shm) const SEAL_AT: usize = FRAME_ALIGN - 8;
/// Payload bytes a sealed frame carries inline, before the seal.
pub(in crate::transport::shm) const SEALED_MAX: usize = SEAL_AT - HDR_BYTES;
/// Largest eager message: the copies in and out of the ring are each one
/// piece, so longer messages, whose request path overlaps them, stay
/// there; so do messages over half a small ring.
pub(in crate::transport::shm) const EAGER_MAX_BYTES: usize = 4096;

/// The largest eager message on a ring of `cap` bytes.
pub(in crate::transport::shm) fn eager_limit(cap: usize) -> usize {
    EAGER_MAX_BYTES.min((cap / 2).saturating_sub(FRAME_ALIGN))
}

/// Where `len` stream bytes from `pos` lie in a ring of `cap` bytes: one
/// piece, or two where they wrap past its end; each `(ring offset, offset
/// in the `len` bytes, bytes)`.
fn pieces(pos: u64, len: usize, cap: usize) -> [(usize, usize, usize); 2] {
    let at = (pos % cap as u64) as usize;
    let first = len.min(cap - at);
    [(at, 0, first), (0, first, len - first)]
}

/// The seal of stream position `pos` under `key`.
fn seal(key: u64, pos: u64) -> u64 {
    key ^ pos.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The seal word of the line at stream position `pos` of the ring at
/// `at(pos)`.
///
/// # Safety
/// `line` must be the start of a line of the ring (`FRAME_ALIGN`-aligned,
/// inside the mapping for the ring's lifetime).
unsafe fn word<'a>(line: *mut u8) -> &'a AtomicU64 {
    // SAFETY: `line + SEAL_AT` is 8-byte aligned (lines are 64-aligned in
    // a page-aligned mapping) and inside the ring per the contract; the
    // ring's bytes are shared memory that may change under us at any time,
    // which is what an atomic is for.
    unsafe { &*line.add(SEAL_AT).cast::<AtomicU64>() }
}

impl Producer {
    /// Copies `len` bytes from `src` into the ring from stream position
    /// `head + off` on, wrapping at the ring's end.
    ///
    /// # Safety
    /// `off + len` bytes from the head must be free (`free`), and `src`
    /// readable for `len` bytes.
    pub(in crate::transport::shm) unsafe fn write_ahead(
        &self,
        off: usize,
        src: *const u8,
        len: usize,
    ) {
        let ring = self.r.data.as_ptr();
        for (o, at, n) in pieces(self.head.wrapping_add(off as u64), len, self.r.cap) {
            // SAFETY: `o + n <= cap`, inside the ring; those bytes are free
            // per the contract (nothing reads them until we publish);
            // `at + n <= len` bytes of `src` are readable.
            unsafe { ptr::copy_nonoverlapping(src.add(at), ring.add(o), n) };
        }
    }

    /// Ring bytes.
    pub(in crate::transport::shm) fn capacity(&self) -> usize {
        self.r.cap
    }

    /// Seals the frame line at the head, whose other bytes the caller has
    /// written (Release: they are visible to whoever sees the seal). Call
    /// before `advance`.
    pub(in crate::transport::shm) fn seal_head(&self) {
        // SAFETY: frames start line-aligned; the head line is in the ring.
        let w = unsafe { word(self.head_ptr()) };
        w.store(seal(self.r.key, self.head), Ordering::Release);
    }
}

impl Consumer {
    /// Copies `len` stream bytes from `tail + off` on into `dst`, wrapping
    /// at the ring's end.
    ///
    /// # Safety
    /// Those bytes must be published (or sealed) and not released, and
    /// `dst` writable for `len` bytes.
    pub(in crate::transport::shm) unsafe fn read_ahead(
        &self,
        off: usize,
        dst: *mut u8,
        len: usize,
    ) {
        let ring = self.r.data.as_ptr();
        for (o, at, n) in pieces(self.tail.wrapping_add(off as u64), len, self.r.cap) {
            // SAFETY: `o + n <= cap`, inside the ring, holding written bytes
            // the producer leaves alone until we release them (contract);
            // `at + n <= len` bytes of `dst` are writable.
            unsafe { ptr::copy_nonoverlapping(ring.add(o), dst.add(at), n) };
        }
    }

    /// Whether the line at the tail is a sealed frame, completely written
    /// (Acquire). A frame seen this way may not be covered by the
    /// producer's published counter yet; `avail` allows for that.
    pub(in crate::transport::shm) fn sealed(&self) -> bool {
        // SAFETY: frames start line-aligned; the tail line is in the ring.
        // The producer may be writing that line's bytes non-atomically
        // right now (an unsealed frame): the aligned word reads as old or
        // new bytes, and only an exact seal is trusted.
        let w = unsafe { word(self.tail_ptr().cast_mut()) };
        w.load(Ordering::Acquire) == seal(self.r.key, self.tail)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Counter, RingPtrs};
    use super::*;
    use std::ptr::NonNull;

    /// A sealed frame is seen before the counter says so, once per lap;
    /// a stale seal of the previous lap, or an unsealed frame, is not.
    #[test]
    fn seals_name_their_position() {
        let mut buf = vec![0u64; 32]; // 256 bytes: 4 lines
        let (head, tail) = (Counter::default(), Counter::default());
        let data = NonNull::new(buf.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `buf` and the counters outlive `p` and `c`; one producer,
        // one consumer; 64 divides 256.
        let r = unsafe { RingPtrs::new(data, 256, 64, &head, &tail, 0x5eed) };
        let (mut p, mut c) = (Producer::new(r), Consumer::new(r));
        assert!(!c.sealed(), "zeroed memory");
        for lap in 0..3u64 {
            for line in 0..4u64 {
                let pos = (lap * 4 + line) * 64;
                assert!(!c.sealed(), "{pos}: the previous lap's seal");
                if line == 2 {
                    // An unsealed frame: found through the counter only.
                    p.advance(64);
                    p.publish();
                    assert!(!c.sealed(), "{pos}: unsealed");
                    assert_eq!(c.avail(64).unwrap(), 64);
                } else {
                    p.seal_head();
                    assert!(c.sealed(), "{pos}");
                    // Before the producer publishes: nothing counted yet,
                    // and no underflow once the consumer moves past.
                    assert_eq!(c.avail(0).unwrap(), 0);
                    p.advance(64);
                }
                c.advance(64);
                c.publish();
                assert_eq!(c.avail(0).unwrap(), 0, "{pos}");
                p.publish();
                assert_eq!(p.consumed().unwrap(), pos + 64, "{pos}");
            }
        }
    }
}
