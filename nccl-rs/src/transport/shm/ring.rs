//! The single-producer single-consumer byte ring and the frame format.
//!
//! The ring is `ring_bytes` bytes tiled by slots of `slot_bytes` (a multiple
//! of [`FRAME_ALIGN`]). Two monotonically increasing byte counters live in
//! the segment header on cache lines of their own: `head` (bytes published
//! by the producer) and `tail` (bytes released by the consumer). Byte `i` of
//! the stream lives at ring offset `i % ring_bytes`. Each side keeps its own
//! counter in a local variable, a cached copy of the other side's, and the
//! value it last published.
//!
//! See the module docs of [`super`] for the memory-ordering argument.

use std::ptr::NonNull;

mod seal;
pub(super) use seal::{eager_limit, SEALED_MAX};
use std::sync::atomic::{AtomicU64, Ordering};

/// Frames start at multiples of this; a header never straddles the end of
/// the ring or of a slot.
pub(super) const FRAME_ALIGN: usize = 64;
/// Frame header: tag (`u32`), [`FRAME_MARK`] (`u32`), length (`u64`).
pub(super) const HDR_BYTES: usize = 16;
/// Messages up to this size travel inside the header's cache line.
pub(super) const INLINE_MAX: usize = FRAME_ALIGN - HDR_BYTES;
/// Second word of a frame whose payload follows in the ring.
const FRAME_MARK: u32 = u32::from_le_bytes(*b"FRM1");
/// Second word of a single-copy frame: one line, whose bytes
/// `HDR_BYTES..HDR_BYTES + 8` hold the address of the sender's buffer
/// (little-endian `u64`); the receiver reads the payload from there (see
/// [`super::cma`]). The next four bytes are flags ([`CMA_SENDER_HELPS`]).
pub(super) const FRAME_MARK_CMA: u32 = u32::from_le_bytes(*b"CMA1");

/// Flag of a single-copy frame: the sender will copy parts of this message
/// into the receiver if it offers them ([`super::split`]).
pub(super) const CMA_SENDER_HELPS: u32 = 1;
/// Flag of a single-copy frame: the message lies in a shared allocation of
/// the sender, named by the [`super::mapped::SharedRegion`] in the line's bytes
/// `HDR_BYTES + 16..`; the receiver may map it and copy with `memcpy`.
pub(super) const CMA_MAPPED: u32 = 2;

/// How a frame's payload travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Payload {
    /// In the ring, after the header (or inside its line).
    Ring,
    /// In the sender's memory, read with `process_vm_readv`.
    Cma,
}

/// Bytes a message of `len` bytes occupies in the stream: the header line
/// (holding the payload too when `len <= INLINE_MAX`), then the payload
/// padded to [`FRAME_ALIGN`]. `None` on overflow.
pub(super) fn frame_span(len: usize) -> Option<usize> {
    if len <= INLINE_MAX {
        Some(FRAME_ALIGN)
    } else {
        len.checked_add(FRAME_ALIGN - 1)
            .map(|x| x & !(FRAME_ALIGN - 1))
            .and_then(|x| x.checked_add(FRAME_ALIGN))
    }
}

/// Stream bytes of a frame of `len` payload bytes sent as `how`.
pub(super) fn span_of(len: usize, how: Payload) -> Option<usize> {
    match how {
        Payload::Ring => frame_span(len),
        Payload::Cma => Some(FRAME_ALIGN),
    }
}

/// The header bytes of a frame.
pub(super) fn encode_header(tag: u32, len: u64, how: Payload) -> [u8; HDR_BYTES] {
    let mark = match how {
        Payload::Ring => FRAME_MARK,
        Payload::Cma => FRAME_MARK_CMA,
    };
    let mut h = [0u8; HDR_BYTES];
    h[0..4].copy_from_slice(&tag.to_le_bytes());
    h[4..8].copy_from_slice(&mark.to_le_bytes());
    h[8..16].copy_from_slice(&len.to_le_bytes());
    h
}

/// `(tag, len, how)` of a frame header, or `None` if it is not one.
pub(super) fn decode_header(h: &[u8; HDR_BYTES]) -> Option<(u32, u64, Payload)> {
    let w = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let how = match w(4) {
        FRAME_MARK => Payload::Ring,
        FRAME_MARK_CMA => Payload::Cma,
        _ => return None,
    };
    Some((w(0), u64::from(w(8)) | (u64::from(w(12)) << 32), how))
}

/// A violated ring invariant: the peer wrote a counter it could not have.
pub(super) type Corrupt = &'static str;

/// A ring counter, alone in its line.
#[repr(C)]
#[derive(Default)]
pub(super) struct Counter {
    pub(super) value: AtomicU64,
}

impl Counter {
    fn load(&self, order: Ordering) -> u64 {
        self.value.load(order)
    }

    /// Publishes `v` (Release).
    fn publish(&self, v: u64) {
        self.value.store(v, Ordering::Release);
    }
}

/// Where the ring and its counters are.
#[derive(Clone, Copy, Debug)]
pub(super) struct RingPtrs {
    data: NonNull<u8>,
    cap: usize,
    slot: usize,
    head: NonNull<Counter>,
    tail: NonNull<Counter>,
    /// Keys the seals of this ring's sealed frames ([`seal`]).
    key: u64,
}

impl RingPtrs {
    /// Describes a ring of `cap` bytes at `data` with counters `head` and
    /// `tail`, whose sealed frames are keyed with `key` (random, the same
    /// at both ends).
    ///
    /// # Safety
    /// `data..data+cap` must be valid for reads and writes, and `head` and
    /// `tail` valid, for as long as any [`Producer`] or [`Consumer`] made
    /// from the result is used. `slot` must be a non-zero multiple of
    /// [`FRAME_ALIGN`] dividing `cap`. At most one producer and one consumer
    /// may use a ring (across all processes mapping it), and nothing else
    /// may write its bytes or counters.
    pub(super) unsafe fn new(
        data: NonNull<u8>,
        cap: usize,
        slot: usize,
        head: &Counter,
        tail: &Counter,
        key: u64,
    ) -> RingPtrs {
        debug_assert!(slot > 0 && slot & (FRAME_ALIGN - 1) == 0 && cap / slot * slot == cap);
        RingPtrs {
            data,
            cap,
            slot,
            head: NonNull::from(head),
            tail: NonNull::from(tail),
            key,
        }
    }

    fn head(&self) -> &Counter {
        // SAFETY: valid for the ring's lifetime per `new`'s contract.
        unsafe { self.head.as_ref() }
    }

    fn tail(&self) -> &Counter {
        // SAFETY: valid for the ring's lifetime per `new`'s contract.
        unsafe { self.tail.as_ref() }
    }

    /// Address of stream byte `pos`. Stays inside the ring.
    fn at(&self, pos: u64) -> *mut u8 {
        self.data
            .as_ptr()
            .wrapping_add((pos % self.cap as u64) as usize)
    }

    /// Bytes from `pos` to the end of its slot.
    fn slot_room(&self, pos: u64) -> usize {
        self.slot - (pos % self.slot as u64) as usize
    }
}

/// The writing end.
#[derive(Debug)]
pub(super) struct Producer {
    r: RingPtrs,
    /// Next byte to write (local; ahead of `published`).
    head: u64,
    published: u64,
    /// Cached consumer counter.
    tail: u64,
}

impl Producer {
    /// The writing end of `r`, starting at the published counters.
    pub(super) fn new(r: RingPtrs) -> Producer {
        let head = r.head().load(Ordering::Acquire);
        let tail = r.tail().load(Ordering::Acquire);
        Producer {
            r,
            head,
            published: head,
            tail,
        }
    }

    /// Bytes that may be written at the head without overwriting anything
    /// the consumer has not released. Reloads the consumer's counter
    /// (Acquire) only when the cached one shows fewer than `want`.
    pub(super) fn free(&mut self, want: usize) -> Result<usize, Corrupt> {
        let cap = self.r.cap as u64;
        let mut free = cap - (self.head - self.tail);
        if free < want as u64 {
            let t = self.r.tail().load(Ordering::Acquire);
            if t < self.tail || t > self.published {
                return Err("consumer counter out of range");
            }
            self.tail = t;
            free = cap - (self.head - t);
        }
        Ok(free as usize)
    }

    /// Bytes writable in one piece at the head: to the end of its slot
    /// (slots tile the ring, so never past the ring's end).
    pub(super) fn contiguous(&self) -> usize {
        self.r.slot_room(self.head)
    }

    /// Where the next byte goes. Writing `n` bytes there is allowed when
    /// `n <= free(..)` and `n <= contiguous()`.
    pub(super) fn head_ptr(&self) -> *mut u8 {
        self.r.at(self.head)
    }

    /// Marks `n` written bytes; publishes when a slot fills.
    pub(super) fn advance(&mut self, n: usize) {
        self.head += n as u64;
        if self.r.slot_room(self.head) == self.r.slot {
            self.publish();
        }
    }

    /// Publishes everything written so far (Release: the bytes become
    /// visible to a consumer that loads `head` with Acquire).
    pub(super) fn publish(&mut self) {
        if self.head != self.published {
            self.r.head().publish(self.head);
            self.published = self.head;
        }
    }

    /// Stream position of the next byte to write.
    pub(super) fn position(&self) -> u64 {
        self.head
    }

    /// Reloads the consumer's counter (Acquire: everything the consumer did
    /// before releasing those bytes, such as a single-copy read of our
    /// memory, is over) and returns it.
    pub(super) fn consumed(&mut self) -> Result<u64, Corrupt> {
        let t = self.r.tail().load(Ordering::Acquire);
        if t < self.tail || t > self.published {
            return Err("consumer counter out of range");
        }
        self.tail = t;
        Ok(t)
    }
}

/// The reading end.
#[derive(Debug)]
pub(super) struct Consumer {
    r: RingPtrs,
    /// Next byte to read (local; ahead of `published`).
    tail: u64,
    published: u64,
    /// Cached producer counter.
    head: u64,
}

impl Consumer {
    /// The reading end of `r`, starting at the published counters.
    pub(super) fn new(r: RingPtrs) -> Consumer {
        let tail = r.tail().load(Ordering::Acquire);
        let head = r.head().load(Ordering::Acquire).max(tail);
        Consumer {
            r,
            tail,
            published: tail,
            head,
        }
    }

    /// Published bytes not read yet. Reloads the producer's counter
    /// (Acquire) only when the cached one shows fewer than `want`. Frames
    /// read by their seal ([`seal`]) may lie past the published counter:
    /// nothing is available until it passes them.
    pub(super) fn avail(&mut self, want: usize) -> Result<usize, Corrupt> {
        let mut avail = self.head.saturating_sub(self.tail);
        if avail < want as u64 {
            let h = self.r.head().load(Ordering::Acquire);
            if h < self.head || h.saturating_sub(self.published) > self.r.cap as u64 {
                return Err("producer counter out of range");
            }
            self.head = h;
            avail = h.saturating_sub(self.tail);
        }
        Ok(avail as usize)
    }

    /// Bytes readable in one piece at the tail: to the end of its slot.
    pub(super) fn contiguous(&self) -> usize {
        self.r.slot_room(self.tail)
    }

    /// Where the next byte is read. Reading `n` bytes there is allowed when
    /// `n <= avail(..)` and `n <= contiguous()`.
    pub(super) fn tail_ptr(&self) -> *const u8 {
        self.r.at(self.tail)
    }

    /// Where the next `n <= capacity` stream bytes are: one piece, or two
    /// when they wrap past the end of the ring. Reading them is allowed
    /// when `n <= avail(..)`.
    pub(super) fn peek(&self, n: usize) -> [(*const u8, usize); 2] {
        let off = (self.tail % self.r.cap as u64) as usize;
        let first = n.min(self.r.cap - off);
        [
            (self.r.at(self.tail).cast_const(), first),
            (self.r.data.as_ptr().cast_const(), n - first),
        ]
    }

    /// Stream position of the next byte to read.
    pub(super) fn position(&self) -> u64 {
        self.tail
    }

    /// Ring bytes.
    pub(super) fn capacity(&self) -> usize {
        self.r.cap
    }

    /// Marks `n` bytes as read; releases them when a slot empties.
    pub(super) fn advance(&mut self, n: usize) {
        self.tail += n as u64;
        if self.r.slot_room(self.tail) == self.r.slot {
            self.publish();
        }
    }

    /// Releases everything read so far back to the producer (Release: our
    /// reads happen before its later overwrites).
    pub(super) fn publish(&mut self) {
        if self.tail != self.published {
            self.r.tail().publish(self.tail);
            self.published = self.tail;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(frame_span(0), Some(64));
        assert_eq!(frame_span(48), Some(64));
        assert_eq!(frame_span(49), Some(128));
        assert_eq!(frame_span(64), Some(128));
        assert_eq!(frame_span(65), Some(192));
        assert_eq!(frame_span(usize::MAX), None);
        let h = encode_header(0xdead_beef, 1 << 40, Payload::Ring);
        assert_eq!(
            decode_header(&h),
            Some((0xdead_beef, 1 << 40, Payload::Ring))
        );
        let c = encode_header(7, 1 << 20, Payload::Cma);
        assert_eq!(decode_header(&c), Some((7, 1 << 20, Payload::Cma)));
        assert_eq!(span_of(1 << 20, Payload::Cma), Some(64));
        assert_eq!(span_of(65, Payload::Ring), Some(192));
        let mut bad = h;
        bad[5] ^= 1;
        assert_eq!(decode_header(&bad), None);
    }

    /// Streams bytes through a tiny ring in odd-sized pieces, one thread.
    #[test]
    fn wraps_and_keeps_order() {
        let mut buf = vec![0u64; 32]; // 256 bytes, 8-aligned
        let (head, tail) = (Counter::default(), Counter::default());
        let data = NonNull::new(buf.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `buf` and the counters outlive `p` and `c`; one producer,
        // one consumer; 64 divides 256.
        let r = unsafe { RingPtrs::new(data, 256, 64, &head, &tail, 1) };
        let (mut p, mut c) = (Producer::new(r), Consumer::new(r));
        let (mut wrote, mut read) = (0u64, 0u64);
        let total = 10_000u64;
        let mut step = 1usize;
        while read < total {
            step = step % 97 + 13;
            let n = p.free(1).unwrap().min(p.contiguous()).min(step);
            let n = n.min((total - wrote) as usize);
            for i in 0..n {
                // SAFETY: i < n <= free and contiguous.
                unsafe { *p.head_ptr().add(i) = (wrote + i as u64) as u8 };
            }
            p.advance(n);
            wrote += n as u64;
            if step % 3 == 1 {
                p.publish();
            }
            let m = c.avail(1).unwrap().min(c.contiguous()).min(step / 2 + 1);
            for i in 0..m {
                // SAFETY: i < m <= avail and contiguous.
                assert_eq!(unsafe { *c.tail_ptr().add(i) }, (read + i as u64) as u8);
            }
            c.advance(m);
            read += m as u64;
            if step % 5 == 1 {
                c.publish();
            }
            if wrote == total {
                p.publish();
            }
        }
        assert!(p.free(1).unwrap() <= 256);
    }
}
