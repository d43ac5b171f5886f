//! Calls on device buffers that return at once (`cuda` feature).
//!
//! When a batch of a communicator holds a call on device memory and
//! stream memory operations work (`nccl_rs::cuda::async_support`, off with
//! `NCCL_RS_CUDA_ASYNC=0`), the communicator switches to its proxy thread
//! (`worker.rs`) for good: every later call of it, host memory included,
//! runs there in call order, so the order is the same on every rank.
//!
//! Each call on device memory is *gated* when it is handed to the proxy:
//! on each of its streams, an event after the stream's earlier work, then
//! a wait until the communicator's flag reaches the call's sequence number
//! ([`GateSet`]). The call returns. The proxy waits for the events, runs
//! the call through the stager on its own stream of the same context,
//! waits for that stream, and raises the flag, also when the call failed
//! (the error goes to `ncclCommGetAsyncError`) or never ran (abort, a
//! failed batch, a panic: dropping a `GateSet` raises its flag). So a
//! stream never waits forever.
//!
//! Without the feature nothing here is ever gated.

use crate::device::Stager;
use crate::error::FfiResult;
use crate::work::Work;
use std::sync::Mutex;
use std::time::Duration;

/// A queued [`Work`] with its gates on the application's streams, if it
/// runs on device memory and returns at once.
pub(crate) struct Item {
    pub(crate) work: Work,
    pub(crate) gate: Option<GateSet>,
}

/// A communicator (`comm::CommShared`) as the gates and the proxy thread
/// (`worker.rs`) use it. A trait, so that this module and `worker.rs` sit
/// below `comm.rs` (the layering: `work.rs`).
pub(crate) trait Proxied: Send + Sync + 'static {
    /// (rank, nranks) if known.
    fn ident_if_known(&self) -> Option<(usize, usize)>;
    /// Its pinned staging buffers, made on first use.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn stager(&self) -> &Mutex<Option<Stager>>;
    /// The deadline of each of its operations.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn timeout(&self) -> Duration;
    /// Whether `ncclCommAbort` was called.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn aborted(&self) -> bool;
    /// Runs one item, ungated.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn run_one(&self, w: Work) -> FfiResult<()>;
    /// Runs a batch in order, stopping at the first error; items not run
    /// release their gates.
    fn execute_items(&self, batch: Vec<Item>, px: &mut ProxyState) -> FfiResult<()>;
    /// Counts `n` issued calls finished with `res`.
    fn finish(&self, n: usize, res: &FfiResult<()>);
}

#[cfg(feature = "cuda")]
pub(crate) use imp::*;

#[cfg(not(feature = "cuda"))]
pub(crate) use none::*;

#[cfg(not(feature = "cuda"))]
mod none {
    use super::*;

    /// Never made without the `cuda` feature.
    pub(crate) enum GateSet {}

    impl GateSet {
        pub(crate) fn complete(&self) -> bool {
            match *self {}
        }
    }

    /// Nothing to keep without the `cuda` feature.
    #[derive(Default)]
    pub(crate) struct ProxyState {
        _none: (),
    }

    /// Never.
    pub(crate) fn async_for(_comm: &dyn Proxied, _batch: &[Work]) -> bool {
        false
    }

    /// The per-communicator flag (none).
    #[derive(Default)]
    pub(crate) struct Flag;

    impl Flag {
        pub(crate) fn gate(&mut self, _comm: &dyn Proxied, _w: &Work) -> Option<GateSet> {
            None
        }

        pub(crate) fn release_all(&self) {}
    }

    pub(crate) fn run_gated(
        _comm: &dyn Proxied,
        _work: Work,
        g: GateSet,
        _px: &mut ProxyState,
    ) -> FfiResult<()> {
        match g {}
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use nccl_rs::cuda::{Gate, GateWait, HostFlag, MemKind, ProxyStreams, Stream};
    use nccl_rs::Error;
    use std::time::Instant;

    /// The gates of one call (one per stream it uses) and the flag value
    /// that releases them. Dropping it releases them.
    pub(crate) struct GateSet {
        seq: u32,
        flag: HostFlag,
        gates: Vec<Gate>,
        /// Every stream of the call is gated. If not (gating one failed),
        /// the call's other streams are used directly, as without gates,
        /// and the caller waits for the call.
        complete: bool,
    }

    impl GateSet {
        /// Every stream of the call is gated: the caller need not wait.
        pub(crate) fn complete(&self) -> bool {
            self.complete
        }
    }

    impl Drop for GateSet {
        fn drop(&mut self) {
            self.flag.release(self.seq);
        }
    }

    /// The proxy thread's CUDA state: its streams.
    #[derive(Default)]
    pub(crate) struct ProxyState {
        streams: ProxyStreams,
    }

    /// Whether calls on device buffers return at once here (probed once,
    /// in the context of the first such call).
    fn enabled(stream: usize, bufs: &[*const u8]) -> bool {
        nccl_rs::cuda::async_support_for(Stream(stream), bufs).is_ok()
    }

    /// Whether `batch` holds a call on device memory and such calls return
    /// at once here.
    pub(crate) fn async_for(comm: &dyn Proxied, batch: &[Work]) -> bool {
        batch
            .iter()
            .find_map(|w| device_streams(comm, w).into_iter().next())
            .is_some_and(|(s, bufs)| enabled(s, &bufs))
    }

    fn on_device(p: *const u8) -> bool {
        nccl_rs::cuda::classify(p.cast()) != MemKind::Host
    }

    /// The streams of `w` with the buffers on them (device memory only).
    fn device_streams(comm: &dyn Proxied, w: &Work) -> Vec<(usize, Vec<*const u8>)> {
        match w {
            Work::Coll(c) => {
                let (sb, rb) = match comm.ident_if_known() {
                    Some((rank, n)) => {
                        crate::work::sizes(c.coll, rank, n, c.root, c.count, c.dtype.size())
                            .unwrap_or((0, 0))
                    }
                    // Unknown yet (a split in flight): any non-NULL buffer.
                    None => (
                        usize::from(!c.send.is_null()),
                        usize::from(!c.recv.is_null()),
                    ),
                };
                let mut bufs = Vec::with_capacity(2);
                if sb > 0 && c.count > 0 {
                    bufs.push(c.send);
                }
                if rb > 0 && c.count > 0 {
                    bufs.push(c.recv.cast_const());
                }
                if bufs.iter().any(|p| on_device(*p)) {
                    vec![(c.stream, bufs)]
                } else {
                    Vec::new()
                }
            }
            Work::P2p(ops) => {
                let mut out: Vec<(usize, Vec<*const u8>)> = Vec::new();
                for o in ops {
                    if o.op.bytes == 0 || !on_device(o.op.ptr) {
                        continue;
                    }
                    match out.iter_mut().find(|(s, _)| *s == o.stream) {
                        Some((_, bufs)) => bufs.push(o.op.ptr),
                        None => out.push((o.stream, vec![o.op.ptr])),
                    }
                }
                out
            }
            Work::Init(_) | Work::Split { .. } => Vec::new(),
        }
    }

    /// A communicator's flag and the sequence number of its last gate.
    #[derive(Default)]
    pub(crate) struct Flag {
        flag: Option<HostFlag>,
        seq: u32,
    }

    impl Flag {
        /// Gates `w` if it uses device memory and gating works; `None`
        /// otherwise (the caller then waits for it to run). A set that is
        /// not [`complete`](GateSet::complete) still goes with the call: its
        /// flag value must only be reached in call order (raising it now
        /// would release earlier calls' gates too).
        pub(crate) fn gate(&mut self, comm: &dyn Proxied, w: &Work) -> Option<GateSet> {
            let streams = device_streams(comm, w);
            if !streams.first().is_some_and(|(s, bufs)| enabled(*s, bufs)) {
                return None;
            }
            reserve_staging(comm, w);
            let flag = match self.flag {
                Some(f) => f,
                None => {
                    let (s, bufs) = &streams[0];
                    match HostFlag::new_for(Stream(*s), bufs) {
                        Ok(f) => *self.flag.insert(f),
                        Err(e) => {
                            tracing::warn!("no stream flag ({e}): calls on device memory block");
                            return None;
                        }
                    }
                }
            };
            self.seq = self.seq.wrapping_add(1);
            let mut set = GateSet {
                seq: self.seq,
                flag,
                gates: Vec::with_capacity(streams.len()),
                complete: true,
            };
            for (s, bufs) in &streams {
                // SAFETY: the application's stream, live for the call (NCCL's
                // contract); the proxy (or dropping `set`, in call order)
                // releases the flag.
                match unsafe { Gate::enqueue(Stream(*s), bufs, &flag, self.seq) } {
                    Ok(g) => set.gates.push(g),
                    Err(e) => {
                        tracing::warn!(
                            "gating a call on stream {s:#x} failed ({e}); it runs blocking there"
                        );
                        set.complete = false;
                    }
                }
            }
            Some(set)
        }

        /// Releases every gate made so far (the proxy has stopped).
        pub(crate) fn release_all(&self) {
            if let Some(f) = self.flag {
                f.release(self.seq);
            }
        }
    }

    /// Grows the stager's buffers for collective `w` before its stream is
    /// gated (allocating while a stream waits for the proxy may synchronize
    /// with it: `Stager::reserve`). Skipped while the proxy uses the stager.
    fn reserve_staging(comm: &dyn Proxied, w: &Work) {
        let (Work::Coll(c), Some((rank, n))) = (w, comm.ident_if_known()) else {
            return;
        };
        let Some((sb, rb)) = crate::work::sizes(c.coll, rank, n, c.root, c.count, c.dtype.size())
        else {
            return;
        };
        let Ok(mut stager) = comm.stager().try_lock() else {
            return;
        };
        let st = match &mut *stager {
            Some(st) => st,
            None => match nccl_rs::cuda::Stager::from_env() {
                Ok(st) => stager.insert(st),
                Err(_) => return,
            },
        };
        let bufs = [c.send, c.recv.cast_const()];
        if let Err(e) = st.reserve(sb, rb, Stream(c.stream), &bufs) {
            tracing::debug!("reserving staging memory before gating failed ({e})");
        }
    }

    /// Runs a gated call on the proxy thread: waits for the stream's
    /// earlier work (abortable, within the communicator's timeout), runs
    /// it on our stream, waits for that, releases the gates.
    pub(crate) fn run_gated(
        comm: &dyn Proxied,
        mut work: Work,
        g: GateSet,
        px: &mut ProxyState,
    ) -> FfiResult<()> {
        let rank = comm.ident_if_known().map_or(0, |i| i.0);
        let timeout = comm.timeout();
        let deadline = Instant::now() + timeout;
        for gate in &g.gates {
            match gate.wait_ready(deadline, || comm.aborted()) {
                Ok(GateWait::Ready) => {}
                Ok(GateWait::Cancelled) => {
                    return Err(Error::Aborted {
                        rank,
                        op: "waiting for the stream (ncclCommAbort was called)".into(),
                    })
                }
                Ok(GateWait::TimedOut) => {
                    return Err(Error::Timeout {
                        rank,
                        op: "a call on device buffers".into(),
                        after: timeout,
                        waiting_for: format!(
                            "the work enqueued on stream {:#x} before the call",
                            gate.stream().0
                        ),
                    })
                }
                Err(e) => return Err(e.into_error(rank)),
            }
        }
        let mut ours = Vec::with_capacity(g.gates.len());
        for gate in &g.gates {
            ours.push((
                gate.stream().0,
                px.streams
                    .stream_for(gate)
                    .map_err(|e| e.into_error(rank))?
                    .0,
            ));
        }
        let mapped = |s: usize| ours.iter().find(|(u, _)| *u == s).map_or(s, |(_, o)| *o);
        match &mut work {
            Work::Coll(c) => c.stream = mapped(c.stream),
            Work::P2p(ops) => {
                for o in ops.iter_mut() {
                    o.stream = mapped(o.stream);
                }
            }
            Work::Init(_) | Work::Split { .. } => {}
        }
        let res = comm.run_one(work);
        let mut synced = Ok(());
        for gate in &g.gates {
            if let Err(e) = px.streams.sync(gate) {
                synced = Err(e.into_error(rank));
            }
        }
        drop(g);
        res.and(synced)
    }
}
