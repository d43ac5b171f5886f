//! The receiving half: posts clear-to-send entries and completes receives
//! from write-with-immediate completions (see the protocol in `comm`).

use super::{
    post_chain, register_for_recv, rkeys, unknown_request, Conn, Fault, RailMrs, BOUNCE_BYTES,
    POLL_BATCH, SLOTS, WR_CTS, WR_RECV,
};
use crate::device::Port;
use crate::error::{VerbsError, WcStatus};
use crate::rails::MAX_RAILS;
use crate::regcache::{EntryId, RegCache};
use crate::sys;
use crate::verbs::{RegisteredBuf, ACCESS_REMOTE_WRITE};
use crate::wire::{Cts, Record, RecordStatus, CTS_BYTES, RECORD_BYTES};
use nccl_net::{MemHandle, NetError, NetResult, RecvComm, Request, RequestQueue};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    Bounce,
    Reg(EntryId),
}

struct RecvOp {
    /// Message sequence number: the request id minus 1.
    seq: u64,
    data: *mut u8,
    cap: usize,
    tag: u32,
    dst: Dest,
    imms: u32,
    record: Option<Record>,
    done: Option<usize>,
}

/// The receiver's registered buffers, made before the handshake.
pub(crate) struct RecvBuffers {
    /// Records (SLOTS × RECORD_BYTES) then bounce slots; the sender writes
    /// here (records over rail 0, bounce parts over any rail: registered
    /// on every rail).
    pub(crate) remote: RegisteredBuf,
    /// Outgoing clear-to-send entries (SLOTS × CTS_BYTES), sent on rail 0.
    pub(crate) cts_out: RegisteredBuf,
}

impl RecvBuffers {
    /// For a connection whose rails use `ports` (rail 0 first).
    pub(crate) fn new(ports: &[Arc<Port>]) -> Result<RecvBuffers, VerbsError> {
        let pds: Vec<_> = ports.iter().map(|p| Arc::clone(&p.pd)).collect();
        Ok(RecvBuffers {
            remote: RegisteredBuf::new_on(
                &pds,
                SLOTS * (RECORD_BYTES + BOUNCE_BYTES),
                ACCESS_REMOTE_WRITE,
            )?,
            cts_out: RegisteredBuf::new_on(
                &pds[..1],
                SLOTS * CTS_BYTES,
                sys::IBV_ACCESS_LOCAL_WRITE,
            )?,
        })
    }
}

/// The receiving half of a verbs connection.
pub(crate) struct VerbsRecvComm {
    /// Declared first: QPs are destroyed before the buffers below.
    conn: Conn,
    bufs: RecvBuffers,
    fifo_addr: u64,
    fifo_rkey: u32,
    cache: RegCache<RailMrs>,
    q: RequestQueue<RecvOp>,
    next_cts: u64,
    cts_free: u32,
}

// SAFETY: as for VerbsSendComm (irecv contract).
unsafe impl Send for VerbsRecvComm {}

/// Empty receives kept posted per QP (one per message in flight, plus
/// slack).
pub(crate) const RECVS_PER_QP: usize = SLOTS + 2;
/// Send-queue depth of receiver QPs (clear-to-send writes on QP 0).
pub(crate) const RECV_SIDE_SQ: u32 = SLOTS as u32 + 4;

impl VerbsRecvComm {
    pub(crate) fn new(conn: Conn, bufs: RecvBuffers, fifo_addr: u64, fifo_rkey: u32) -> Self {
        VerbsRecvComm {
            conn,
            bufs,
            fifo_addr,
            fifo_rkey,
            cache: RegCache::new(),
            q: RequestQueue::with_capacity(SLOTS),
            next_cts: 0,
            cts_free: RECV_SIDE_SQ,
        }
    }

    /// Sequence number of the next message: request ids start at 1, one
    /// per message, so this never drifts from the queue's ids.
    fn next_seq(&self) -> u64 {
        self.q.next_id() - 1
    }

    fn bounce_ptr(&self, slot: usize) -> *mut u8 {
        self.bufs
            .remote
            .ptr()
            .wrapping_add(SLOTS * RECORD_BYTES + slot * BOUNCE_BYTES)
    }

    fn progress(&mut self) {
        if self.conn.fault.is_some() {
            return;
        }
        self.post_cts();
        self.reap();
        self.post_cts();
        let pending = self.q.iter().any(|op| op.done.is_none());
        self.conn.check_peer(pending);
    }

    /// Writes clear-to-send entries for receives that have none yet.
    fn post_cts(&mut self) {
        while self.next_cts < self.next_seq() && self.cts_free > 0 && self.conn.fault.is_none() {
            let seq = self.next_cts;
            let slot = (seq % SLOTS as u64) as usize;
            let op = &self.q[(seq - self.q[0].seq) as usize];
            let (addr, rkeys) = match op.dst {
                Dest::Bounce => {
                    let mut k = [0; MAX_RAILS];
                    for (r, key) in k.iter_mut().enumerate().take(self.conn.rails()) {
                        *key = self.bufs.remote.mr_on(r).rkey();
                    }
                    (self.bounce_ptr(slot) as u64, k)
                }
                Dest::Reg(id) => (op.data as u64, rkeys(self.cache.get(id))),
            };
            let cts = Cts {
                seq: seq + 1,
                addr,
                rkeys,
                tag: op.tag,
                size: op.cap as u64,
                slot: slot as u32,
            }
            .encode();
            let out = self.bufs.cts_out.ptr().wrapping_add(slot * CTS_BYTES);
            // SAFETY: the slot lies inside `cts_out`, which we own; the
            // adapter finished reading it for message seq - SLOTS (the
            // sender consumed that entry before that message completed).
            unsafe { std::ptr::copy_nonoverlapping(cts.as_ptr(), out, CTS_BYTES) };
            let mut wrs = [sys::ibv_send_wr {
                opcode: sys::IBV_WR_RDMA_WRITE,
                num_sge: 1,
                send_flags: sys::IBV_SEND_SIGNALED,
                ..Default::default()
            }];
            wrs[0].rdma.remote_addr = self.fifo_addr + (slot * CTS_BYTES) as u64;
            wrs[0].rdma.rkey = self.fifo_rkey;
            let mut sges = [sys::ibv_sge {
                addr: out as u64,
                length: CTS_BYTES as u32,
                lkey: self.bufs.cts_out.mr().lkey(),
            }];
            // SAFETY: the SGE names our registered `cts_out` slot, which
            // stays untouched until this write completes (see above); the
            // remote range is the sender's FIFO slot it advertised.
            let r = unsafe { post_chain(&self.conn.qps[0], &mut wrs, &mut sges, WR_CTS | seq) };
            if let Err(e) = r {
                self.conn.fail(Fault::from_verbs(&e));
                return;
            }
            self.cts_free -= 1;
            self.next_cts += 1;
        }
    }

    /// Processes the completions of every rail.
    fn reap(&mut self) {
        for rail in 0..self.conn.rails() {
            loop {
                let n = self.conn.poll(rail);
                for i in 0..n {
                    let wc = self.conn.wc[i];
                    self.on_completion(rail, &wc);
                }
                if n < POLL_BATCH {
                    break;
                }
            }
        }
    }

    fn on_completion(&mut self, rail: usize, wc: &sys::ibv_wc) {
        if wc.status != 0 {
            let op = if wc.wr_id & WR_CTS != 0 {
                "clear-to-send RDMA write"
            } else {
                "write-with-immediate receive"
            };
            self.conn.fail(Fault::Completion {
                op,
                rail,
                status: WcStatus(wc.status),
                vendor_err: wc.vendor_err,
            });
            return;
        }
        if wc.wr_id & WR_CTS != 0 {
            self.cts_free += 1;
            return;
        }
        if wc.opcode != sys::IBV_WC_RECV_RDMA_WITH_IMM || wc.wc_flags & sys::IBV_WC_WITH_IMM == 0 {
            self.conn.fail(Fault::Protocol(format!(
                "unexpected completion opcode {}",
                wc.opcode
            )));
            return;
        }
        let Some(qp) = self.conn.qp_index(rail, wc.qp_num) else {
            self.conn.fail(Fault::Protocol(format!(
                "completion for unknown QP {} on rail {rail}",
                wc.qp_num
            )));
            return;
        };
        if let Err(e) = self.conn.qps[qp].post_empty_recvs(1, WR_RECV) {
            self.conn.fail(Fault::from_verbs(&e));
            return;
        }
        let imm = u32::from_be(wc.imm_data);
        let Some(idx) = self
            .q
            .iter()
            .position(|op| op.seq as u32 == imm && op.done.is_none())
        else {
            self.conn.fail(Fault::Protocol(format!(
                "write-with-immediate for unknown message {imm}"
            )));
            return;
        };
        let slot = (self.q[idx].seq % SLOTS as u64) as usize;
        if qp == 0 {
            let p = self.bufs.remote.ptr().wrapping_add(slot * RECORD_BYTES);
            // SAFETY: the record slot lies inside `remote`; the adapter
            // wrote it before generating this completion and will not write
            // it again before we post the next clear-to-send for the slot.
            let b = unsafe { std::ptr::read_volatile(p.cast::<[u8; RECORD_BYTES]>()) };
            match Record::decode(&b) {
                Some(r) if r.fits(imm, self.conn.qps.len()) => self.q[idx].record = Some(r),
                _ => {
                    self.conn.fail(Fault::Protocol(format!(
                        "bad completion record for message {imm}"
                    )));
                    return;
                }
            }
        }
        self.q[idx].imms += 1;
        self.maybe_complete(idx, slot);
    }

    fn maybe_complete(&mut self, idx: usize, slot: usize) {
        let op = &self.q[idx];
        let Some(r) = op.record else {
            return;
        };
        if op.imms < r.nparts {
            return;
        }
        match r.status {
            RecordStatus::TagMismatch => {
                let f = Fault::Tag {
                    expected: op.tag,
                    got: r.tag,
                };
                self.conn.fail(f);
            }
            RecordStatus::Truncated => {
                let f = Fault::Truncated {
                    posted: op.cap,
                    got: usize::try_from(r.size).unwrap_or(usize::MAX),
                };
                self.conn.fail(f);
            }
            RecordStatus::Ok => {
                let size = usize::try_from(r.size).unwrap_or(usize::MAX);
                if size > op.cap {
                    self.conn.fail(Fault::Protocol(format!(
                        "peer wrote {size} bytes into a {} byte receive",
                        op.cap
                    )));
                    return;
                }
                match op.dst {
                    Dest::Bounce => {
                        let src = self.bounce_ptr(slot);
                        if size > 0 {
                            // SAFETY: the bounce slot holds `size` <= cap <=
                            // BOUNCE_BYTES bytes the sender finished writing
                            // (all its completions arrived); the irecv caller
                            // guarantees `data..data+cap` is writable.
                            unsafe { std::ptr::copy_nonoverlapping(src, op.data, size) };
                        }
                    }
                    Dest::Reg(id) => drop(self.cache.release(id)),
                }
                self.q[idx].done = Some(size);
            }
        }
    }
}

impl RecvComm for VerbsRecvComm {
    fn reg_mr(&mut self, ptr: *mut u8, len: usize) -> NetResult<MemHandle> {
        let pds = self.conn.pds();
        let id = self
            .cache
            .pin(ptr as usize, len, |s, l| register_for_recv(&pds, s, l))?;
        Ok(MemHandle(id))
    }

    fn reg_mr_dmabuf(
        &mut self,
        data: *mut u8,
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
            ACCESS_REMOTE_WRITE,
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
    /// The trait's contract ([`RecvComm::irecv`]): the buffer stays valid, and
    /// untouched by the caller, until `test` reports the request or the
    /// comm is dropped.
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
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
        let dst = match mr {
            Some(h) => Dest::Reg(self.cache.acquire_id(h.0, data as usize, len).ok_or_else(
                || {
                    NetError::Other(format!(
                        "memory handle {} does not cover the {len} bytes at {data:p}",
                        h.0
                    ))
                },
            )?),
            None if len <= BOUNCE_BYTES => Dest::Bounce,
            None => {
                let pds = self.conn.pds();
                Dest::Reg(
                    self.cache
                        .acquire(data as usize, len, |s, l| register_for_recv(&pds, s, l))?,
                )
            }
        };
        let seq = self.next_seq();
        let req = self.q.push(RecvOp {
            seq,
            data,
            cap: len,
            tag,
            dst,
            imms: 0,
            record: None,
            done: None,
        });
        self.progress();
        Ok(Some(req))
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        let idx = self.q.live(req).ok_or_else(|| unknown_request(req))?;
        // `progress` pops nothing, so `idx` stays valid.
        self.progress();
        if let Some(size) = self.q[idx].done {
            self.q.report(idx);
            return Ok(Some(size));
        }
        match self.conn.error() {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }
}
