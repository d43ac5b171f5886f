//! [`ReadAhead`]: bytes of socket 0 read before the message they belong to
//! was laid out.
//!
//! A receiver waiting for a header reads up to [`AHEAD`] bytes, not just
//! the header, so a small message (its header unit and inline payload)
//! comes in with one `recv` instead of a `recv` for the header and a
//! `recvmsg` for the rest; the payload is then copied out of this buffer.
//! Every payload `recvmsg` also offers the whole buffer for what follows.
//! A system call saved per small message is about an eighth of a loopback
//! exchange.
//!
//! Socket 0 carries whole [`UNIT`]s and every message starts on a unit
//! boundary; the buffer is unit-aligned and unread bytes move to its front
//! only at a message boundary, so a payload sits in it at its sender's
//! offset within a cache line, as it would in the caller's buffer.

use crate::wire::{HDR, UNIT};

/// Bytes read ahead at most: a header unit and a 4 KiB payload, nearly.
pub(crate) const AHEAD: usize = 4096;

#[repr(C, align(64))]
struct Bytes([u8; AHEAD]);
const _: () = assert!(std::mem::align_of::<Bytes>() == UNIT);

/// Unread bytes `buf[lo..hi]` of socket 0's stream.
pub(crate) struct ReadAhead {
    buf: Box<Bytes>,
    lo: usize,
    hi: usize,
}

impl ReadAhead {
    pub(crate) fn new() -> ReadAhead {
        ReadAhead {
            buf: Box::new(Bytes([0; AHEAD])),
            lo: 0,
            hi: 0,
        }
    }

    /// Unread bytes.
    pub(crate) fn len(&self) -> usize {
        self.hi - self.lo
    }

    /// Where to read more (at a message boundary): the unread bytes move
    /// to the front, the rest of the buffer is returned.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        if self.lo > 0 {
            self.buf.0.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        &mut self.buf.0[self.hi..]
    }

    /// `n` bytes were read into [`ReadAhead::space`] or [`ReadAhead::whole`].
    pub(crate) fn filled(&mut self, n: usize) {
        debug_assert!(self.hi + n <= AHEAD);
        self.hi += n;
    }

    /// The next header, if all of it is in.
    pub(crate) fn header(&mut self) -> Option<[u8; HDR]> {
        if self.len() < HDR {
            return None;
        }
        let mut h = [0u8; HDR];
        h.copy_from_slice(&self.buf.0[self.lo..self.lo + HDR]);
        self.lo += HDR;
        Some(h)
    }

    /// Hands out up to `want` unread bytes, oldest first.
    pub(crate) fn take(&mut self, want: usize) -> &[u8] {
        let k = want.min(self.len());
        let lo = self.lo;
        self.lo += k;
        &self.buf.0[lo..lo + k]
    }

    /// The whole buffer, to read ahead into after a payload; only when
    /// nothing is unread.
    pub(crate) fn whole(&mut self) -> (*mut u8, usize) {
        debug_assert_eq!(self.len(), 0);
        self.lo = 0;
        self.hi = 0;
        (self.buf.0.as_mut_ptr(), AHEAD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_come_out_in_order_and_move_front_at_boundaries() {
        let mut a = ReadAhead::new();
        assert_eq!(a.buf.0.as_ptr() as usize % UNIT, 0);
        assert!(a.header().is_none());
        let s = a.space();
        assert_eq!(s.len(), AHEAD);
        for (i, b) in s[..40].iter_mut().enumerate() {
            *b = i as u8;
        }
        a.filled(40);
        let h = a.header().unwrap();
        assert_eq!(h[..], (0..16).collect::<Vec<u8>>()[..]);
        assert_eq!(a.take(4), &[16, 17, 18, 19]);
        assert_eq!(a.len(), 20);
        assert_eq!(
            a.space().len(),
            AHEAD - 20,
            "unread bytes moved to the front"
        );
        assert_eq!(a.take(100), (20..40).collect::<Vec<u8>>().as_slice());
        assert_eq!(a.len(), 0);
        assert!(a.take(1).is_empty());
        let (p, n) = a.whole();
        assert_eq!((p as usize % UNIT, n), (0, AHEAD));
    }
}
