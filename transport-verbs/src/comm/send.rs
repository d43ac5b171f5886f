//! The sending half: waits for each message's clear-to-send, then RDMA-writes
//! the payload and the completion record (see the protocol in `comm`).

mod completion;
mod post;

use super::{
    lkeys, register_for_send, unknown_request, Conn, Fault, RailMrs, BOUNCE_BYTES,
    MAX_MESSAGE_BYTES, SLOTS,
};
use crate::device::Port;
use crate::error::VerbsError;
use crate::rails::MAX_RAILS;
use crate::regcache::{EntryId, RegCache};
use crate::sys;
use crate::verbs::{RegisteredBuf, ACCESS_REMOTE_WRITE};
use crate::wire::{CTS_BYTES, RECORD_BYTES};
use nccl_net::profile::RequestEvents;
use nccl_net::{MemHandle, NetError, NetProfile, NetResult, Request, RequestQueue, SendComm};
use std::collections::VecDeque;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Copied into the sender's bounce slot.
    Bounce,
    /// A registration cache entry.
    Reg(EntryId),
}

struct SendOp {
    /// Message sequence number: the request id minus 1.
    seq: u64,
    len: usize,
    tag: u32,
    src: Source,
    /// Local key of the source on each connection rail.
    lkeys: [u32; MAX_RAILS],
    src_addr: u64,
    /// Signaled work requests still to complete (after posting).
    pending_wrs: u32,
    posted: bool,
    done: bool,
    error: Option<Fault>,
    /// Its profiler events (a QP event per work-request chain posted),
    /// if it was posted with a profile.
    prof: Option<Box<RequestEvents>>,
}

/// The sending half of a verbs connection.
pub(crate) struct VerbsSendComm {
    /// Declared first: QPs are destroyed before the buffers below.
    conn: Conn,
    /// Clear-to-send FIFO the receiver writes (SLOTS × CTS_BYTES).
    fifo: RegisteredBuf,
    /// Outgoing records (SLOTS × RECORD_BYTES) then bounce slots,
    /// registered on every rail.
    staging: RegisteredBuf,
    remote_records: u64,
    remote_rkey: u32,
    cache: RegCache<RailMrs>,
    q: RequestQueue<SendOp>,
    next_post: u64,
    sq_free: Vec<u32>,
    /// Per QP: send-queue entries freed by each outstanding signaled WR.
    sq_batches: Vec<VecDeque<u32>>,
    wr_chunk: usize,
    wrs: Vec<sys::ibv_send_wr>,
    sges: Vec<sys::ibv_sge>,
    /// The profile of the next request posted.
    next_prof: Option<NetProfile>,
}

// SAFETY: the raw pointers are caller buffers that the isend contract
// keeps valid until completion, whichever thread polls; the verbs objects
// are thread-safe.
unsafe impl Send for VerbsSendComm {}

/// Send-queue depth for a port: room for every in-flight message's
/// signaled WR plus the largest message's chunks.
pub(crate) fn send_queue_depth(wr_chunk: usize) -> u32 {
    let chunks = MAX_MESSAGE_BYTES.div_ceil(wr_chunk.max(1));
    u32::try_from(2 * SLOTS + chunks + 2).unwrap_or(u32::MAX)
}

/// Bytes one RDMA write carries at most on every port of `ports`.
pub(crate) fn conn_wr_chunk(ports: &[Arc<Port>]) -> usize {
    ports
        .iter()
        .map(|p| wr_chunk(p))
        .min()
        .unwrap_or(MAX_MESSAGE_BYTES)
}

/// Bytes one RDMA write carries at most on `port`.
fn wr_chunk(port: &Port) -> usize {
    let max = usize::try_from(port.info.max_msg_sz).unwrap_or(usize::MAX);
    if max == 0 {
        MAX_MESSAGE_BYTES
    } else {
        max.clamp(64 << 10, MAX_MESSAGE_BYTES)
    }
}

/// The sender's registered buffers, made before the handshake so their
/// addresses can be advertised.
pub(crate) struct SendBuffers {
    /// Written by the receiver over rail 0.
    pub(crate) fifo: RegisteredBuf,
    /// Read by every rail (bounce parts go over any of them).
    pub(crate) staging: RegisteredBuf,
}

impl SendBuffers {
    /// For a connection whose rails use `ports` (rail 0 first).
    pub(crate) fn new(ports: &[Arc<Port>]) -> Result<SendBuffers, VerbsError> {
        let pds: Vec<_> = ports.iter().map(|p| Arc::clone(&p.pd)).collect();
        Ok(SendBuffers {
            fifo: RegisteredBuf::new_on(&pds[..1], SLOTS * CTS_BYTES, ACCESS_REMOTE_WRITE)?,
            staging: RegisteredBuf::new_on(
                &pds,
                SLOTS * (RECORD_BYTES + BOUNCE_BYTES),
                sys::IBV_ACCESS_LOCAL_WRITE,
            )?,
        })
    }
}

impl VerbsSendComm {
    pub(crate) fn new(
        conn: Conn,
        bufs: SendBuffers,
        remote_records: u64,
        remote_rkey: u32,
        sq_depth: Vec<u32>,
    ) -> Self {
        let nqps = conn.qps.len();
        let wr_chunk = conn_wr_chunk(&conn.ports);
        VerbsSendComm {
            conn,
            fifo: bufs.fifo,
            staging: bufs.staging,
            remote_records,
            remote_rkey,
            cache: RegCache::new(),
            q: RequestQueue::with_capacity(SLOTS),
            next_post: 0,
            sq_free: sq_depth,
            sq_batches: vec![VecDeque::with_capacity(SLOTS); nqps],
            wr_chunk,
            wrs: Vec::new(),
            sges: Vec::new(),
            next_prof: None,
        }
    }

    /// Destroys the QPs but keeps the side socket open: to the peer this
    /// looks like a host that stopped answering (tests only).
    #[cfg(test)]
    pub(crate) fn destroy_qps_for_test(&mut self) {
        self.conn.qps.clear();
    }

    fn bounce_ptr(&self, slot: usize) -> *mut u8 {
        self.staging
            .ptr()
            .wrapping_add(SLOTS * RECORD_BYTES + slot * BOUNCE_BYTES)
    }

    fn record_ptr(&self, slot: usize) -> *mut u8 {
        self.staging.ptr().wrapping_add(slot * RECORD_BYTES)
    }

    fn progress(&mut self) {
        if self.conn.fault.is_some() {
            return;
        }
        self.reap();
        while self.conn.fault.is_none() && self.post_next() {}
        let pending = self.q.iter().any(|op| !op.done);
        self.conn.check_peer(pending);
    }

    /// Sequence number of the next message: request ids start at 1, one
    /// per message, so this never drifts from the queue's ids.
    pub(super) fn next_seq(&self) -> u64 {
        self.q.next_id() - 1
    }
}

impl SendComm for VerbsSendComm {
    fn reg_mr(&mut self, ptr: *const u8, len: usize) -> NetResult<MemHandle> {
        let pds = self.conn.pds();
        let id = self
            .cache
            .pin(ptr as usize, len, |s, l| register_for_send(&pds, s, l))?;
        Ok(MemHandle(id))
    }

    fn reg_mr_dmabuf(
        &mut self,
        data: *const u8,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> NetResult<MemHandle> {
        if let Some(port) = self.conn.ports.iter().find(|p| !p.dmabuf) {
            return Err(NetError::Unsupported(format!(
                "DMA-BUF registration on {} (the probe at open found no support)",
                port.name()
            )));
        }
        let id = crate::gdr::pin_dmabuf(
            &mut self.cache,
            &self.conn.pds(),
            data as usize,
            len,
            offset,
            fd,
            sys::IBV_ACCESS_LOCAL_WRITE,
        )?;
        Ok(MemHandle(id))
    }

    fn dereg_mr(&mut self, mr: MemHandle) -> NetResult<()> {
        match self.cache.unpin(mr.0) {
            Ok(released) => {
                drop(released);
                Ok(())
            }
            Err(()) => Err(NetError::Other(format!("unknown memory handle {}", mr.0))),
        }
    }

    /// # Safety
    /// The trait's contract ([`SendComm::isend`]): the buffer stays valid, and
    /// untouched by the caller, until `test` reports the request or the
    /// comm is dropped.
    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: u32,
        mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        if let Some(e) = self.conn.error() {
            return Err(e);
        }
        if self.q.len() >= SLOTS {
            self.progress();
            return Ok(None);
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(NetError::Other(format!(
                "send of {len} bytes exceeds the {MAX_MESSAGE_BYTES} byte limit"
            )));
        }
        let seq = self.next_seq();
        let slot = (seq % SLOTS as u64) as usize;
        let (src, lkeys, src_addr) = match mr {
            Some(h) => {
                let id = self
                    .cache
                    .acquire_id(h.0, data as usize, len)
                    .ok_or_else(|| {
                        NetError::Other(format!(
                            "memory handle {} does not cover the {len} bytes at {data:p}",
                            h.0
                        ))
                    })?;
                (Source::Reg(id), lkeys(self.cache.get(id)), data as u64)
            }
            None if len <= BOUNCE_BYTES => {
                let dst = self.bounce_ptr(slot);
                if len > 0 {
                    // SAFETY: the caller guarantees `data..data+len` is
                    // readable; the bounce slot is ours, BOUNCE_BYTES long,
                    // and idle (the request that last used it has completed,
                    // since at most SLOTS are outstanding).
                    unsafe { std::ptr::copy_nonoverlapping(data, dst, len) };
                }
                let mut keys = [0; MAX_RAILS];
                for (r, k) in keys.iter_mut().enumerate().take(self.conn.rails()) {
                    *k = self.staging.mr_on(r).lkey();
                }
                (Source::Bounce, keys, dst as u64)
            }
            None => {
                let pds = self.conn.pds();
                let id = self
                    .cache
                    .acquire(data as usize, len, |s, l| register_for_send(&pds, s, l))?;
                (Source::Reg(id), lkeys(self.cache.get(id)), data as u64)
            }
        };
        let req = self.q.push(SendOp {
            seq,
            len,
            tag,
            src,
            lkeys,
            src_addr,
            pending_wrs: 0,
            posted: false,
            done: false,
            error: None,
            prof: self.next_prof.take().map(RequestEvents::new),
        });
        self.progress();
        Ok(Some(req))
    }

    fn profile(&mut self, p: Option<NetProfile>) {
        self.next_prof = p;
    }

    fn test(&mut self, req: Request) -> NetResult<bool> {
        let idx = self.q.live(req).ok_or_else(|| unknown_request(req))?;
        // `progress` pops nothing, so `idx` stays valid.
        self.progress();
        let op = &self.q[idx];
        if let Some(f) = &op.error {
            return Err(f.to_error(&self.conn.peer, &self.conn.names));
        }
        if op.done {
            debug_assert!(op.posted);
            self.q.report(idx);
            return Ok(true);
        }
        match self.conn.error() {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }
}
