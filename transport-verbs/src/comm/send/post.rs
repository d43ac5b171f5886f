//! Posting: once message `seq`'s clear-to-send has arrived and the send
//! queues have room, RDMA-write its payload parts (part `i` on QP `i`, so on
//! that QP's rail, with the rail's keys) and its completion record (QP 0).

use super::VerbsSendComm;
use crate::comm::{post_chain, split_parts, Fault, SLOTS, WR_QP_BITS};
use crate::sys;
use crate::wire::{Cts, Record, RecordStatus, CTS_BYTES, RECORD_BYTES};
use std::sync::atomic::{fence, Ordering};

impl VerbsSendComm {
    /// The clear-to-send entry for message `seq`, if it has fully arrived.
    fn read_cts(&self, seq: u64) -> Option<Cts> {
        let slot = (seq % SLOTS as u64) as usize;
        let p = self.fifo.ptr().wrapping_add(slot * CTS_BYTES);
        // SAFETY: `p + 56` is inside the FIFO buffer and 8-byte aligned
        // (page-aligned buffer, 64-byte slots). The adapter writes this
        // memory concurrently, hence the volatile read.
        let tail = unsafe { std::ptr::read_volatile(p.wrapping_add(56).cast::<u64>()) };
        if u64::from_le(tail) != seq + 1 {
            return None;
        }
        fence(Ordering::Acquire);
        // SAFETY: as above; the 64 bytes lie inside the FIFO buffer.
        let b = unsafe { std::ptr::read_volatile(p.cast::<[u8; CTS_BYTES]>()) };
        Cts::decode(&b, seq + 1)
    }

    /// Posts the next send if its clear-to-send has arrived and the send
    /// queues have room. Returns whether it posted.
    pub(super) fn post_next(&mut self) -> bool {
        if self.next_post == self.next_seq() {
            return false;
        }
        let seq = self.next_post;
        let Some(cts) = self.read_cts(seq) else {
            return false;
        };
        let slot = (seq % SLOTS as u64) as usize;
        if cts.slot as usize != slot {
            self.conn.fail(Fault::Protocol(format!(
                "clear-to-send {seq} names slot {}",
                cts.slot
            )));
            return false;
        }
        let idx = (seq - self.q[0].seq) as usize;
        let (len, tag, lkeys, src_addr) = {
            let op = &self.q[idx];
            (op.len, op.tag, op.lkeys, op.src_addr)
        };
        let (status, parts) = if cts.tag != tag {
            (RecordStatus::TagMismatch, Vec::new())
        } else if len as u64 > cts.size {
            (RecordStatus::Truncated, Vec::new())
        } else {
            (RecordStatus::Ok, split_parts(len, self.conn.qps.len()))
        };
        // Work requests per QP: the payload chunks, plus the record on QP 0.
        let mut need = vec![0u32; self.conn.qps.len()];
        need[0] = 1;
        for (i, &(_, l)) in parts.iter().enumerate() {
            need[i] += u32::try_from(l.div_ceil(self.wr_chunk)).unwrap_or(u32::MAX);
        }
        if need.iter().zip(&self.sq_free).any(|(n, f)| n > f) {
            return false; // wait for completions
        }
        let record = Record {
            size: len as u64,
            tag,
            status,
            nparts: u32::try_from(parts.len().max(1)).unwrap_or(1),
            seq: seq as u32,
        };
        let rec = record.encode();
        // SAFETY: the record slot lies inside `staging`, which we own; the
        // adapter last read it for message seq - SLOTS, whose completion
        // was polled before this request could be posted.
        unsafe { std::ptr::copy_nonoverlapping(rec.as_ptr(), self.record_ptr(slot), RECORD_BYTES) };
        let mut signaled = 0;
        for (i, &n) in need.iter().enumerate() {
            if n == 0 {
                continue;
            }
            self.wrs.clear();
            self.sges.clear();
            let rail = self.conn.qp_rails[i];
            if let Some(&(off, l)) = parts.get(i) {
                let (lkey, rkey) = (lkeys[rail], cts.rkeys[rail]);
                let mut c = 0;
                while c < l {
                    let k = self.wr_chunk.min(l - c);
                    self.push_wr(
                        sys::IBV_WR_RDMA_WRITE,
                        src_addr + (off + c) as u64,
                        k,
                        lkey,
                        cts.addr + (off + c) as u64,
                        rkey,
                    );
                    c += k;
                }
            }
            if i == 0 {
                let (addr, key) = (self.record_ptr(slot) as u64, self.staging.mr().lkey());
                let remote = self.remote_records + (slot * RECORD_BYTES) as u64;
                self.push_wr(
                    sys::IBV_WR_RDMA_WRITE_WITH_IMM,
                    addr,
                    RECORD_BYTES,
                    key,
                    remote,
                    self.remote_rkey,
                );
            }
            let last = self.wrs.last_mut().expect("at least one work request");
            last.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
            last.imm_data = (seq as u32).to_be();
            last.send_flags = sys::IBV_SEND_SIGNALED;
            let wr_id = (seq << WR_QP_BITS) | i as u64;
            // SAFETY: `wrs`/`sges` are fully built; the SGEs name our
            // staging buffer or memory registered for this request (valid
            // until its completion, per the isend contract), and the remote
            // ranges are those the receiver granted in its CTS / endpoint.
            let posted =
                unsafe { post_chain(&self.conn.qps[i], &mut self.wrs, &mut self.sges, wr_id) };
            if let Err(e) = posted {
                self.conn.fail(Fault::from_verbs(&e));
                return false;
            }
            self.sq_free[i] -= n;
            self.sq_batches[i].push_back(n);
            signaled += 1;
            let qp_num = self.conn.qps[i].qpn();
            if let Some(events) = self.q[idx].prof.as_mut() {
                // The chain's payload (the record on QP 0 is framing).
                let length = parts.get(i).map_or(0, |p| p.1);
                events.qp(nccl_net::profile::Qp {
                    device: rail as i32,
                    wr_id,
                    opcode: sys::IBV_WR_RDMA_WRITE_WITH_IMM as i32,
                    qp_num: qp_num as i32,
                    length,
                });
            }
        }
        let op = &mut self.q[idx];
        op.posted = true;
        op.pending_wrs = signaled;
        self.next_post += 1;
        match status {
            RecordStatus::Ok => {}
            RecordStatus::TagMismatch => {
                let f = Fault::Tag {
                    expected: cts.tag,
                    got: tag,
                };
                op.error = Some(f.clone());
                self.conn.fail(f);
            }
            RecordStatus::Truncated => {
                let f = Fault::Truncated {
                    posted: cts.size as usize,
                    got: len,
                };
                op.error = Some(f.clone());
                self.conn.fail(f);
            }
        }
        true
    }

    fn push_wr(&mut self, opcode: u32, addr: u64, len: usize, lkey: u32, remote: u64, rkey: u32) {
        self.sges.push(sys::ibv_sge {
            addr,
            length: u32::try_from(len).unwrap_or(u32::MAX),
            lkey,
        });
        let mut wr = sys::ibv_send_wr {
            opcode,
            num_sge: 1,
            ..Default::default()
        };
        wr.rdma.remote_addr = remote;
        wr.rdma.rkey = rkey;
        self.wrs.push(wr);
    }
}
