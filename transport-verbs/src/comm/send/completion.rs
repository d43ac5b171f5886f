//! Completion handling: reaping signaled send completions, returning
//! send-queue entries and finishing messages.

use super::{Source, VerbsSendComm};
use crate::comm::{Fault, POLL_BATCH, WR_QP_BITS, WR_QP_MASK};
use crate::error::WcStatus;
use std::collections::VecDeque;

impl VerbsSendComm {
    /// Processes send completions of every rail.
    pub(super) fn reap(&mut self) {
        for rail in 0..self.conn.rails() {
            self.reap_rail(rail);
        }
    }

    fn reap_rail(&mut self, rail: usize) {
        loop {
            let n = self.conn.poll(rail);
            for i in 0..n {
                let wc = self.conn.wc[i];
                let qp = (wc.wr_id & WR_QP_MASK) as usize;
                let seq = wc.wr_id >> WR_QP_BITS;
                if wc.status != 0 {
                    self.conn.fail(Fault::Completion {
                        op: "RDMA write",
                        rail,
                        status: WcStatus(wc.status),
                        vendor_err: wc.vendor_err,
                    });
                    continue;
                }
                if let Some(freed) = self.sq_batches.get_mut(qp).and_then(VecDeque::pop_front) {
                    self.sq_free[qp] += freed;
                }
                let Some(front) = self.q.front().map(|op| op.seq) else {
                    continue;
                };
                let Some(op) = seq
                    .checked_sub(front)
                    .and_then(|i| self.q.get_mut(i as usize))
                else {
                    continue;
                };
                op.pending_wrs = op.pending_wrs.saturating_sub(1);
                if op.pending_wrs == 0 && !op.done {
                    op.done = true;
                    if let Some(events) = op.prof.take() {
                        events.finish();
                    }
                    if let Source::Reg(id) = op.src {
                        drop(self.cache.release(id));
                    }
                }
            }
            if n < POLL_BATCH {
                break;
            }
        }
    }
}
