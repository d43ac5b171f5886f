//! The receiver's side of split single-copy messages (`shm::split`):
//! copying its runs of an offered message, waiting for the sender's, and
//! withdrawing an offer when it goes away.

use super::super::comm::Fault;
use super::super::mapped::SharedRegion;
use super::super::peer::pid_alive;
use super::super::ring::Payload;
use super::super::split;
use super::{ShmRecvComm, Src};
use std::sync::atomic::Ordering;

/// A single-copy message we offered for splitting and copy in parts.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpenSplit {
    epoch: u32,
    len: usize,
    /// Where the message is read from.
    src: Src,
    piece: usize,
    pieces: u16,
    /// Whether we have claimed nothing yet.
    first: bool,
}

/// How long a receiver going away waits for the sender's writes into a
/// buffer it is about to hand back.
const WITHDRAW_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl ShmRecvComm {
    /// Offers the single-copy message of `len` bytes at the sender's `src`
    /// for request `i` and copies our first run of it.
    pub(super) fn open_split(
        &mut self,
        i: usize,
        len: usize,
        src: Src,
        moved: &mut bool,
    ) -> Result<Option<(usize, Payload)>, Fault> {
        let (piece, pieces) = split::cut(len);
        let s = OpenSplit {
            epoch: split::epoch_of(self.cons.position()),
            len,
            src,
            piece,
            pieces,
            first: true,
        };
        let dst = self.q[i].data;
        let shared = SharedRegion::locate(dst, len);
        self.seg
            .header()
            .offer
            .0
            .publish(s.epoch, dst as u64, shared, len, piece, pieces);
        self.open = Some(s);
        self.split_step(i, s, moved)
    }

    /// Copies our next run of pieces of the split message `s` for request
    /// `i`, or, when none is left, sees whether the sender has copied its
    /// runs. Returns `(len, Cma)` once the whole message is in.
    pub(super) fn split_step(
        &mut self,
        i: usize,
        s: OpenSplit,
        moved: &mut bool,
    ) -> Result<Option<(usize, Payload)>, Fault> {
        let hdr = self.seg.header();
        let claim = hdr
            .offer
            .0
            .claim_front(s.epoch, s.piece, s.first)
            .map_err(Fault::Corrupt)?;
        let back = match claim {
            Ok((lo, hi)) => {
                let (at, n) = split::bytes_of(lo, hi, s.piece, s.len);
                self.read_peer(&self.q[i], at, n, s.src.offset(at))?;
                self.open = Some(OpenSplit { first: false, ..s });
                *moved = true;
                // One run per poll: the sender may take what is left.
                return Ok(None);
            }
            Err(back) => back,
        };
        let theirs = u32::from(s.pieces - back);
        if theirs > 0 {
            // Acquire: their writes into our buffer are over.
            match split::helped_for(hdr.helped.0.load(Ordering::Acquire), s.epoch) {
                Some(Ok(n)) if n == theirs => {}
                Some(Ok(n)) if n > theirs => {
                    return Err(Fault::Corrupt("the sender copied more than it claimed"))
                }
                Some(Err(errno)) => return Err(Fault::Helper(errno)),
                _ => return Ok(None),
            }
        }
        self.open = None;
        Ok(Some((s.len, Payload::Cma)))
    }

    /// Closes the open split offer, if any, and waits (a bounded time) for
    /// the sender's writes in flight into the buffer.
    pub(super) fn withdraw(&mut self) {
        let Some(s) = self.open.take() else {
            return;
        };
        let hdr = self.seg.header();
        let back = hdr.offer.0.withdraw(s.epoch);
        let theirs = u32::from(s.pieces - back);
        if theirs == 0 {
            return;
        }
        let deadline = std::time::Instant::now() + WITHDRAW_WAIT;
        loop {
            match split::helped_for(hdr.helped.0.load(Ordering::Acquire), s.epoch) {
                Some(Ok(n)) if n >= theirs => return,
                Some(Err(_)) => return,
                _ => {}
            }
            // Its comm's drop comes after any write it started.
            if hdr.send.0.closed.load(Ordering::Acquire) != 0 || !pid_alive(self.watch.pid()) {
                return;
            }
            if std::time::Instant::now() >= deadline {
                tracing::error!(
                    peer_pid = self.watch.pid(),
                    "SHM: the sender still holds part of a split message after {WITHDRAW_WAIT:?}; giving its buffer back anyway"
                );
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}
