//! Connection set-up: [`ShmListener`] (creates the segment) and
//! [`ShmConnector`] (maps it and claims the sending side).

use super::cma::{self, CmaOpts};
use super::comm::{ShmRecvComm, ShmSendComm};
use super::handle::ShmHandle;
use super::peer::{own_pid, own_pidns};
use super::segment::{new_nonce, Geometry, Segment};
use nccl_net::{Connector, Listener, NetError, NetResult, RecvComm, SendComm};
use std::sync::atomic::Ordering;

/// Sender pid while a connector is claiming the segment.
const CLAIMING: u32 = u32::MAX;

/// The receiving end being set up: owns the segment until accepted.
pub(super) struct ShmListener {
    /// `None` once accepted.
    seg: Option<Segment>,
    handle: Vec<u8>,
    /// Single-copy settings (`None`: single copy off), for the probe.
    cma: Option<CmaOpts>,
    /// Whether the receive comm may lend ring bytes in place.
    lend: bool,
}

impl ShmListener {
    /// Creates a segment of geometry `geom`. With `cma` set, `accept`
    /// probes whether single copy works from the sender (and, to split
    /// messages, the sender probes us). `lend`: whether the receive comm may
    /// lend ring bytes in place.
    pub(super) fn new(geom: Geometry, cma: Option<CmaOpts>, lend: bool) -> NetResult<ShmListener> {
        let nonce = new_nonce()?;
        let seg = Segment::create(geom, nonce)?;
        if cma.is_some_and(|c| c.split) {
            // Read by a connector that offers to help (before it has the
            // handle, which travels by a system call).
            seg.header()
                .recv
                .0
                .cma_probe
                .store(cma::probe_addr(), Ordering::Relaxed);
        }
        let total = geom.total_bytes().expect("checked by create");
        let handle = ShmHandle {
            name: seg.name().to_owned(),
            size: total as u64,
            nonce,
        }
        .encode();
        tracing::debug!(segment = seg.name(), bytes = total, "SHM: listening");
        Ok(ShmListener {
            seg: Some(seg),
            handle,
            cma,
            lend,
        })
    }
}

#[cfg(test)]
impl ShmListener {
    /// The segment header until accepted (tests tamper with it).
    pub(super) fn header(&self) -> Option<&super::segment::Header> {
        self.seg.as_ref().map(Segment::header)
    }
}

impl Listener for ShmListener {
    fn handle(&self) -> &[u8] {
        &self.handle
    }

    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        let Some(seg) = &mut self.seg else {
            return Err(NetError::Other("SHM: listener already accepted".into()));
        };
        let send = &seg.header().send.0;
        // Acquire: pairs with the connector's Release store of its pid, so
        // its pid namespace (stored before) is visible.
        let pid = send.pid.load(Ordering::Acquire);
        if pid == 0 || pid == CLAIMING {
            return Ok(None);
        }
        let pidns = send.pidns.load(Ordering::Relaxed);
        let cma_ok = self.cma.is_some_and(|c| {
            let outcome = probe_peer(pid as i32, pidns, send.cma_probe.load(Ordering::Relaxed));
            cma::log_outcome(&outcome, c.min);
            outcome.is_ok()
        });
        // The sender helps with split messages only if it could read us.
        let split = cma_ok
            && self.cma.is_some_and(|c| c.split)
            && send.cma.load(Ordering::Relaxed) == cma::CMA_YES;
        let verdict = if cma_ok { cma::CMA_YES } else { cma::CMA_NO };
        seg.header().recv.0.cma.store(verdict, Ordering::Release);
        // Both sides have mapped it: the name is no longer needed.
        seg.unlink();
        let seg = self.seg.take().expect("checked above");
        tracing::debug!(peer_pid = pid, cma_ok, split, "SHM: accepted");
        Ok(Some(Box::new(ShmRecvComm::new(
            seg, pid as i32, pidns, cma_ok, split, self.lend,
        ))))
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        if let Some(seg) = &self.seg {
            // A connector that already claimed the segment must not wait for
            // a receiver that will never come. The segment's own drop
            // unlinks the name.
            seg.header().recv.0.closed.store(1, Ordering::Release);
        }
    }
}

/// Whether we may read process `pid` (in pid namespace `pidns`), whose
/// probe word is at `addr`.
fn probe_peer(pid: i32, pidns: u64, addr: u64) -> Result<(), String> {
    if pidns != 0 && own_pidns() != 0 && pidns != own_pidns() {
        return Err("the peer is in another pid namespace".to_string());
    }
    cma::probe(pid, addr)
}

/// The sending end being set up. All the work happens in
/// [`ShmConnector::connect`] (local system calls only); polling yields the
/// comm.
pub(super) struct ShmConnector {
    comm: Option<ShmSendComm>,
}

impl ShmConnector {
    /// Maps the segment named by `handle`, checks it, claims the sending
    /// side and unlinks the name. Messages of at least `cma.min` bytes will
    /// go single-copy if the receiver's probe succeeds; with `cma.split` we
    /// help copy the large ones if we can write into the receiver.
    pub(super) fn connect(handle: &[u8], cma: Option<CmaOpts>) -> NetResult<ShmConnector> {
        let h = ShmHandle::decode(handle)?;
        let mut seg = Segment::open(&h.name, h.size, h.nonce)?;
        let hdr = seg.header();
        let recv_pid = hdr.recv.0.pid.load(Ordering::Relaxed) as i32;
        let recv_pidns = hdr.recv.0.pidns.load(Ordering::Relaxed);
        if hdr.recv.0.closed.load(Ordering::Acquire) != 0 {
            return Err(NetError::Closed(format!(
                "shm peer pid {recv_pid} (listener dropped)"
            )));
        }
        // Claim the sending side: 0 -> CLAIMING (only one connector wins),
        // then our pid namespace, then our pid with Release, which is what
        // the listener's Acquire waits for.
        if let Err(other) =
            hdr.send
                .0
                .pid
                .compare_exchange(0, CLAIMING, Ordering::AcqRel, Ordering::Acquire)
        {
            return Err(NetError::BadHandle(format!(
                "SHM: segment {} is already connected (to pid {})",
                h.name, other as i32
            )));
        }
        hdr.send.0.pidns.store(own_pidns(), Ordering::Relaxed);
        let probe = if cma.is_some() { cma::probe_addr() } else { 0 };
        hdr.send.0.cma_probe.store(probe, Ordering::Relaxed);
        // Writing into the receiver needs the same permission as reading it.
        let helps = cma.is_some_and(|c| c.split)
            && probe_peer(
                recv_pid,
                recv_pidns,
                hdr.recv.0.cma_probe.load(Ordering::Relaxed),
            )
            .is_ok();
        if helps {
            hdr.send.0.cma.store(cma::CMA_YES, Ordering::Relaxed);
        }
        hdr.send.0.pid.store(own_pid() as u32, Ordering::Release);
        seg.unlink();
        tracing::debug!(segment = h.name, peer_pid = recv_pid, "SHM: connected");
        Ok(ShmConnector {
            comm: Some(ShmSendComm::new(
                seg,
                recv_pid,
                recv_pidns,
                cma.map(|c| c.min),
                helps,
            )),
        })
    }
}

impl Connector for ShmConnector {
    fn poll_connect(&mut self) -> NetResult<Option<Box<dyn SendComm>>> {
        match self.comm.take() {
            Some(c) => Ok(Some(Box::new(c))),
            None => Err(NetError::Other("SHM: connector already completed".into())),
        }
    }
}
