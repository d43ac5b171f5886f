//! The data-parallel gradient reducer: PyTorch DDP's bucketing and overlap
//! over `nccl-rs`'s non-blocking all-reduce.
//!
//! Parameter tensors are assigned to buckets in *reverse* forward order (the
//! order backward produces their gradients), each bucket holding up to
//! `cap_bytes` of gradients (a tensor is never split; one larger than the
//! cap gets a bucket of its own). The gradients are written straight into
//! their bucket's buffer (DDP's `gradient_as_bucket_view`). As soon as the
//! last gradient of a bucket is ready, the bucket's buffer is *moved* into
//! [`Communicator::all_reduce_async`] with [`RedOp::Avg`], so the reduction
//! runs on the communicator's worker while backward goes on with the earlier
//! layers. [`Step::finish`] waits for every bucket in launch order and takes
//! the buffers back, before the optimizer reads them.
//!
//! Ownership does the safety work: while a bucket is in flight its `Vec`
//! belongs to the [`AsyncOp`], so nothing here can read or write it.

use crate::mlp::GradSink;
use nccl_rs::comm::AsyncOp;
use nccl_rs::{Communicator, RedOp};
use std::time::{Duration, Instant};

/// Where one tensor's gradient lives.
#[derive(Clone, Copy, Debug)]
struct Loc {
    bucket: usize,
    offset: usize,
    len: usize,
}

#[derive(Debug)]
struct Bucket {
    /// Tensors in the order their gradients become ready.
    tensors: Vec<usize>,
    /// `None` while the bucket's all-reduce is in flight.
    buf: Option<Vec<f32>>,
    /// Gradients of this bucket not ready yet in the current step.
    pending: usize,
}

/// Per-step communication counters (summed over steps by the caller).
#[derive(Clone, Copy, Debug, Default)]
pub struct CommStats {
    /// Buckets all-reduced.
    pub buckets: usize,
    /// Buckets already complete when backward ended (fully overlapped).
    pub overlapped: usize,
    /// Time spent blocked in [`Step::finish`] (communication not hidden).
    pub wait: Duration,
}

impl CommStats {
    /// Adds another step's counters.
    pub fn add(&mut self, other: CommStats) {
        self.buckets += other.buckets;
        self.overlapped += other.overlapped;
        self.wait += other.wait;
    }
}

/// Bucketed, overlapped gradient averaging for one model.
#[derive(Debug)]
pub struct Reducer {
    buckets: Vec<Bucket>,
    loc: Vec<Loc>,
}

impl Reducer {
    /// Buckets for tensors of the given lengths (forward order), capped at
    /// `cap_bytes` of `f32` gradients each.
    pub fn new(tensor_lens: &[usize], cap_bytes: usize) -> Reducer {
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut loc = vec![
            Loc {
                bucket: 0,
                offset: 0,
                len: 0
            };
            tensor_lens.len()
        ];
        let mut fill = 0usize;
        for t in (0..tensor_lens.len()).rev() {
            let bytes = tensor_lens[t] * 4;
            if buckets.is_empty() || (fill > 0 && fill + bytes > cap_bytes) {
                buckets.push(Bucket {
                    tensors: vec![],
                    buf: Some(vec![]),
                    pending: 0,
                });
                fill = 0;
            }
            let b = buckets.len() - 1;
            let buf = buckets[b].buf.as_mut().expect("not in flight");
            loc[t] = Loc {
                bucket: b,
                offset: buf.len(),
                len: tensor_lens[t],
            };
            buf.resize(buf.len() + tensor_lens[t], 0.0);
            buckets[b].tensors.push(t);
            fill += bytes;
        }
        for b in &mut buckets {
            b.pending = b.tensors.len();
        }
        Reducer { buckets, loc }
    }

    /// Number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// One line per bucket: its tensors and size.
    pub fn describe(&self) -> Vec<String> {
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let n = b.buf.as_ref().map_or(0, Vec::len);
                format!(
                    "bucket {i}: tensors {:?}, {n} floats ({} bytes)",
                    b.tensors,
                    n * 4
                )
            })
            .collect()
    }

    /// The averaged gradient of `tensor` (valid after [`Step::finish`]).
    pub fn grad(&self, tensor: usize) -> &[f32] {
        let l = self.loc[tensor];
        &self.buckets[l.bucket]
            .buf
            .as_ref()
            .expect("no bucket in flight between steps")[l.offset..l.offset + l.len]
    }

    /// Starts one training step's backward on `comm`.
    pub fn step<'a>(&'a mut self, comm: &'a mut Communicator) -> Step<'a> {
        Step {
            reducer: self,
            comm,
            inflight: Vec::new(),
        }
    }
}

/// A backward pass in progress: the [`GradSink`] that launches buckets.
#[must_use = "call finish() to wait for the all-reduces"]
pub struct Step<'a> {
    reducer: &'a mut Reducer,
    comm: &'a mut Communicator,
    inflight: Vec<(usize, AsyncOp<Vec<f32>>)>,
}

impl GradSink for Step<'_> {
    fn grad_mut(&mut self, tensor: usize) -> &mut [f32] {
        let l = self.reducer.loc[tensor];
        let buf = self.reducer.buckets[l.bucket]
            .buf
            .as_mut()
            .expect("gradient written after its bucket was launched");
        &mut buf[l.offset..l.offset + l.len]
    }

    fn ready(&mut self, tensor: usize) -> nccl_rs::Result<()> {
        let b = self.reducer.loc[tensor].bucket;
        let bucket = &mut self.reducer.buckets[b];
        bucket.pending -= 1;
        // Buckets launch in index order on every rank (the collectives must
        // match across ranks); backward readies them in that order anyway.
        while let Some(next) = self.reducer.buckets.get_mut(self.inflight.len()) {
            if next.pending > 0 {
                break;
            }
            let buf = next.buf.take().expect("launched once per step");
            let op = self.comm.all_reduce_async(buf, RedOp::Avg)?;
            self.inflight.push((self.inflight.len(), op));
        }
        Ok(())
    }
}

impl Step<'_> {
    /// Waits for every bucket (in launch order), gives the averaged buffers
    /// back to the reducer and resets it for the next step.
    pub fn finish(self) -> nccl_rs::Result<CommStats> {
        let total = self.reducer.buckets.len();
        assert_eq!(
            self.inflight.len(),
            total,
            "backward did not ready every gradient"
        );
        let overlapped = self.inflight.iter().filter(|(_, op)| op.is_done()).count();
        let t0 = Instant::now();
        for (b, op) in self.inflight {
            let bucket = &mut self.reducer.buckets[b];
            bucket.buf = Some(op.wait()?);
            bucket.pending = bucket.tensors.len();
        }
        Ok(CommStats {
            buckets: total,
            overlapped,
            wait: t0.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Reducer;

    #[test]
    fn buckets_follow_backward_order_and_cap() {
        // Tensors (forward order) of a 4-8-3 MLP: W0 32, b0 8, W1 24, b1 3.
        let lens = [32, 8, 24, 3];
        let one = Reducer::new(&lens, 25 << 20);
        assert_eq!(one.num_buckets(), 1);
        assert_eq!(one.buckets[0].tensors, vec![3, 2, 1, 0]);
        let tiny = Reducer::new(&lens, 1);
        assert_eq!(
            tiny.num_buckets(),
            4,
            "a tensor over the cap gets its own bucket"
        );
        let mid = Reducer::new(&lens, 4 * 30);
        let groups: Vec<_> = mid.buckets.iter().map(|b| b.tensors.clone()).collect();
        assert_eq!(groups, vec![vec![3, 2], vec![1], vec![0]]);
        assert_eq!(mid.grad(0).len(), 32);
    }
}
