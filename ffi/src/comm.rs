//! The state behind an `ncclComm_t`, and the one place its work runs.
//!
//! Every operation on a communicator becomes a [`Work`] item (`work.rs`).
//! Items run in batches through [`CommShared::execute`]: on the calling
//! thread for a blocking communicator, on a scoped thread per communicator
//! at `ncclGroupEnd`, or on the communicator's [`Worker`] (its proxy
//! thread) when it is non-blocking or has switched to it for calls on
//! device memory that return at once (`gate.rs`). `pending` counts the
//! calls issued but not finished, which is what `ncclCommGetAsyncError`
//! reports as `ncclInProgress`.
//!
//! The machinery below this module (`work`, `device`, `gate`, `worker`)
//! sees a communicator through [`SplitChild`] and [`Proxied`], which
//! [`CommShared`] implements here (the layering: `work.rs`).

use crate::config::CommSettings;
use crate::device::{self, Stager};
use crate::error::{usage, Failure, FfiResult};
use crate::gate::{Item, Proxied, ProxyState};
use crate::redop::{premultiplied, OpChoice, RedOps, Scalar};
use crate::work::{CollWork, SplitChild, Work};
use crate::worker::Worker;
use nccl_rs::comm::raw::{RawArgs, RawP2p};
use nccl_rs::comm::AbortHandle;
use nccl_rs::{Communicator, Config, Error};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// Progress and first error of a communicator.
#[derive(Default)]
struct Status {
    pending: usize,
    error: Option<Failure>,
}

/// A thread inside a call on a communicator (see [`CommShared::enter_call`]).
pub(crate) struct InCall<'a>(&'a CommShared);

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.0.threads_in_calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What an `ncclComm_t` stands for.
pub(crate) struct CommShared {
    pub(crate) settings: CommSettings,
    /// What `ncclCommCuDevice` reports.
    pub(crate) device: c_int,
    /// (rank, nranks), once known (at once for init; after a split).
    ident: OnceLock<(usize, usize)>,
    core: Mutex<Option<Communicator>>,
    /// Whether `ncclCommAbort` was called, and the core's abort handle once
    /// there is a core (one lock, so an abort racing an install is seen).
    abort: Mutex<(bool, Option<AbortHandle>)>,
    /// The core is installed (init or split finished).
    ready: AtomicBool,
    closed: AtomicBool,
    finalized: AtomicBool,
    /// Threads inside a blocking call on this communicator right now.
    threads_in_calls: AtomicUsize,
    status: Mutex<Status>,
    idle: Condvar,
    ops: Mutex<RedOps>,
    /// Pinned staging buffers for device memory (`cuda` feature), made on
    /// first use.
    pub(crate) stager: Mutex<Option<Stager>>,
    pub(crate) worker: Worker,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CommShared {
    /// A communicator whose core is not there yet.
    pub(crate) fn new(
        settings: CommSettings,
        ident: Option<(usize, usize)>,
        device: c_int,
    ) -> Arc<CommShared> {
        let c = CommShared {
            settings,
            device,
            ident: OnceLock::new(),
            core: Mutex::new(None),
            abort: Mutex::new((false, None)),
            ready: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            threads_in_calls: AtomicUsize::new(0),
            status: Mutex::default(),
            idle: Condvar::new(),
            ops: Mutex::default(),
            stager: Mutex::new(None),
            worker: Worker::default(),
        };
        if let Some(i) = ident {
            let _ = c.ident.set(i);
        }
        Arc::new(c)
    }

    /// A communicator around a core that is ready.
    pub(crate) fn with_core(
        settings: CommSettings,
        core: Communicator,
        device: c_int,
    ) -> Arc<CommShared> {
        let c = CommShared::new(settings, None, device);
        c.install(core);
        c
    }

    /// The network transport's properties: `None` before the core is
    /// installed, or while an operation holds it (never waits).
    #[cfg(feature = "cuda")]
    pub(crate) fn net_properties(&self) -> Option<nccl_net::Properties> {
        match self.core.try_lock() {
            Ok(g) => g.as_ref().map(Communicator::net_properties),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().as_ref().map(Communicator::net_properties)
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// (rank, nranks), or an error while a split has not finished.
    pub(crate) fn ident(&self) -> FfiResult<(usize, usize)> {
        self.ident
            .get()
            .copied()
            .ok_or_else(|| usage("the communicator is still being created (ncclInProgress)"))
    }

    /// (rank, nranks) if known.
    pub(crate) fn ident_if_known(&self) -> Option<(usize, usize)> {
        self.ident.get().copied()
    }

    pub(crate) fn blocking(&self) -> bool {
        self.settings.blocking
    }

    pub(crate) fn red_ops(&self) -> MutexGuard<'_, RedOps> {
        lock(&self.ops)
    }

    fn install(&self, core: Communicator) {
        let _ = self.ident.set((core.rank(), core.size()));
        let handle = core.abort_handle();
        *lock(&self.core) = Some(core);
        self.ready.store(true, Ordering::Release);
        let mut abort = lock(&self.abort);
        if abort.0 {
            handle.abort();
        }
        abort.1 = Some(handle);
    }

    /// Counts `n` calls as issued and not finished.
    pub(crate) fn begin(&self, n: usize) {
        lock(&self.status).pending += n;
    }

    /// Counts `n` calls as finished with `res`; keeps the first error.
    pub(crate) fn finish(&self, n: usize, res: &FfiResult<()>) {
        let mut s = lock(&self.status);
        s.pending = s.pending.saturating_sub(n);
        if let Err(e) = res {
            s.error.get_or_insert_with(|| Failure::from(e));
        }
        self.idle.notify_all();
    }

    /// `ncclCommGetAsyncError`: in progress, the first error, or success.
    ///
    /// A non-blocking communicator is in progress while any call is
    /// unfinished. A blocking one only until its init (or split) is done,
    /// as in NCCL: a watchdog thread polling it while another thread runs
    /// a collective must see `ncclSuccess`, not `ncclInProgress`.
    pub(crate) fn async_state(&self) -> Option<Result<(), Failure>> {
        let s = lock(&self.status);
        let busy = match self.blocking() {
            false => s.pending > 0,
            true => !self.ready.load(Ordering::Acquire),
        };
        if busy && s.error.is_none() {
            return None;
        }
        Some(match &s.error {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        })
    }

    /// Waits until nothing is pending (at most the communicator's
    /// timeout); returns the first error, if any.
    pub(crate) fn wait_idle(&self) -> Result<(), Failure> {
        let timeout = self.settings.core.timeout;
        let deadline = std::time::Instant::now() + timeout;
        let mut s = lock(&self.status);
        while s.pending > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                let e = Error::Timeout {
                    rank: self.ident_if_known().map_or(0, |i| i.0),
                    op: format!("ncclCommFinalize of {}", self.what()),
                    after: timeout,
                    waiting_for: format!("{} call(s) to finish", s.pending),
                };
                return Err(Failure::from(&e));
            }
            s = self
                .idle
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        s.error.clone().map_or(Ok(()), Err)
    }

    /// Refuses work after finalize, destroy or abort.
    pub(crate) fn check_open(&self) -> FfiResult<()> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(usage("the communicator was finalized (ncclCommFinalize): only ncclCommDestroy may follow"));
        }
        Ok(())
    }

    pub(crate) fn mark_finalized(&self) {
        self.finalized.store(true, Ordering::Release);
    }

    /// Counts the calling thread as inside a call on this communicator
    /// until the guard drops.
    pub(crate) fn enter_call(&self) -> InCall<'_> {
        self.threads_in_calls.fetch_add(1, Ordering::AcqRel);
        InCall(self)
    }

    /// How many threads are inside a blocking call on this communicator.
    pub(crate) fn threads_in_calls(&self) -> usize {
        self.threads_in_calls.load(Ordering::Acquire)
    }

    /// Stops operations in flight and later ones (`ncclCommAbort`).
    pub(crate) fn abort(&self) {
        let mut abort = lock(&self.abort);
        abort.0 = true;
        if let Some(h) = &abort.1 {
            h.abort();
        }
    }

    pub(crate) fn aborted(&self) -> bool {
        lock(&self.abort).0
    }

    /// Stops the worker (after its queue ran) and drops the core.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.worker.stop();
        let core = lock(&self.core).take();
        drop(core);
    }

    fn what(&self) -> String {
        match (self.ident.get(), &self.settings.name) {
            (Some((r, n)), Some(name)) => format!("communicator {name:?} (rank {r} of {n})"),
            (Some((r, n)), None) => format!("communicator rank {r} of {n}"),
            (None, _) => "communicator".into(),
        }
    }

    /// Runs a batch in order; stops at the first error (and fails the
    /// splits it did not reach, so their new handles do not stay pending).
    pub(crate) fn execute(&self, batch: Vec<Work>) -> FfiResult<()> {
        let items = batch
            .into_iter()
            .map(|work| Item { work, gate: None })
            .collect();
        self.execute_items(items, &mut ProxyState::default())
    }

    /// [`execute`](Self::execute) with gated items (on the proxy thread,
    /// whose CUDA state is `px`). Items not run release their gates.
    pub(crate) fn execute_items(&self, batch: Vec<Item>, px: &mut ProxyState) -> FfiResult<()> {
        let mut items = batch.into_iter();
        while let Some(item) = items.next() {
            let res = match item.gate {
                None => self.run_one(item.work),
                Some(g) => crate::gate::run_gated(self, item.work, g, px),
            };
            if let Err(e) = res {
                let why = e.to_string();
                for rest in items {
                    if let Work::Split { child: Some(c), .. } = rest.work {
                        c.finish(
                            1,
                            &Err(usage(format!(
                                "split not run: an earlier operation failed: {why}"
                            ))),
                        );
                    }
                }
                return Err(e);
            }
        }
        Ok(())
    }

    pub(crate) fn run_one(&self, w: Work) -> FfiResult<()> {
        let rank = self.ident_if_known().map_or(0, |i| i.0);
        if self.aborted() {
            let e = Error::Aborted {
                rank,
                op: format!("{} (ncclCommAbort was called)", self.what()),
            };
            if let Work::Split { child: Some(c), .. } = &w {
                c.finish(1, &Err(usage(e.to_string())));
            }
            return Err(e);
        }
        if let Work::Init(id) = w {
            let (rank, nranks) = self.ident()?;
            let core = Communicator::init(&id, nranks, rank, &self.settings.core)?;
            self.install(core);
            return Ok(());
        }
        let mut guard = lock(&self.core);
        let Some(core) = guard.as_mut() else {
            if let Work::Split { child: Some(c), .. } = &w {
                c.finish(
                    1,
                    &Err(usage("split not run: parent communicator unusable")),
                );
            }
            return Err(self.missing_core());
        };
        match w {
            Work::Init(_) => unreachable!("handled above"),
            Work::Coll(c) => run_coll(core, &mut lock(&self.stager), c),
            Work::P2p(ops) => device::run_p2p(core, &mut lock(&self.stager), ops, run_p2p),
            Work::Split { color, key, child } => {
                let mut config = child
                    .as_ref()
                    .map_or(&self.settings.core, |c| c.core_config())
                    .clone();
                // The new communicator's root must not be NCCL_COMM_ID's
                // address (the parent's root may hold it): NCCL's split
                // never uses NCCL_COMM_ID either.
                config.comm_id = None;
                let res = core.split(color, key, &config);
                match (res, child) {
                    (Ok(Some(new)), Some(c)) => {
                        c.install(new);
                        c.finish(1, &Ok(()));
                        Ok(())
                    }
                    (Ok(None), None) => Ok(()),
                    (Ok(_), child) => {
                        let e = Error::Internal {
                            rank,
                            msg: "split returned a communicator for another color".into(),
                        };
                        if let Some(c) = child {
                            c.finish(1, &Err(usage(e.to_string())));
                        }
                        Err(e)
                    }
                    (Err(e), child) => {
                        if let Some(c) = child {
                            c.finish(1, &Err(usage(format!("ncclCommSplit failed: {e}"))));
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    fn missing_core(&self) -> Error {
        if self.closed.load(Ordering::Acquire) {
            return usage(format!("{} was destroyed", self.what()));
        }
        match &lock(&self.status).error {
            Some(f) => usage(format!(
                "{} is unusable: its creation failed: {}",
                self.what(),
                f.msg
            )),
            None => usage(format!("{} is not initialized yet", self.what())),
        }
    }
}

impl SplitChild for CommShared {
    fn core_config(&self) -> &Config {
        &self.settings.core
    }

    fn install(&self, core: Communicator) {
        CommShared::install(self, core);
    }

    fn finish(&self, n: usize, res: &FfiResult<()>) {
        CommShared::finish(self, n, res);
    }
}

impl Proxied for CommShared {
    fn ident_if_known(&self) -> Option<(usize, usize)> {
        CommShared::ident_if_known(self)
    }

    fn stager(&self) -> &Mutex<Option<Stager>> {
        &self.stager
    }

    fn timeout(&self) -> Duration {
        self.settings.core.timeout
    }

    fn aborted(&self) -> bool {
        CommShared::aborted(self)
    }

    fn run_one(&self, w: Work) -> FfiResult<()> {
        CommShared::run_one(self, w)
    }

    fn execute_items(&self, batch: Vec<Item>, px: &mut ProxyState) -> FfiResult<()> {
        CommShared::execute_items(self, batch, px)
    }

    fn finish(&self, n: usize, res: &FfiResult<()>) {
        CommShared::finish(self, n, res);
    }
}

fn run_coll(core: &mut Communicator, stager: &mut Option<Stager>, c: CollWork) -> FfiResult<()> {
    let mut args = RawArgs {
        coll: c.coll,
        send: c.send,
        recv: c.recv,
        count: c.count,
        dtype: c.dtype,
        op: c.op.core_op(),
        root: c.root,
    };
    let scalar = match &c.op {
        OpChoice::PreMul(s) => Some(device::scalar_bytes(s, c.dtype, c.stream)?),
        OpChoice::Builtin(_) => None,
    };
    if device::coll_on_device(core, &args) {
        return device::run_coll(core, stager, &args, c.stream, scalar.as_deref());
    }
    let _copy;
    if let Some(scalar) = scalar {
        let bytes = core.raw_sizes(&args).0;
        if bytes > 0 && c.send.is_null() {
            return Err(crate::error::invalid("sendbuff is NULL"));
        }
        // SAFETY: the application lent `send` for `bytes` bytes (the
        // collective's input size on this rank) until the call completes.
        _copy = unsafe { premultiplied(c.send, bytes, c.dtype, &Scalar::Value(scalar)) };
        args.send = _copy.as_ptr().cast();
    }
    // SAFETY: `send`/`recv` are the application's buffers of the sizes NCCL
    // defines for this collective (or our aligned copy of the input), valid
    // and untouched until the call completes, by the C contract.
    unsafe { core.collective_raw(&args) }
}

/// Runs sends and receives together. Those with this rank as peer are
/// local copies, the k-th send matched with the k-th receive (NCCL allows
/// self send/recv).
fn run_p2p(core: &mut Communicator, ops: Vec<RawP2p>) -> FfiResult<()> {
    let me = core.rank();
    let (local, remote): (Vec<RawP2p>, Vec<RawP2p>) = ops.into_iter().partition(|o| o.peer == me);
    let (sends, recvs): (Vec<RawP2p>, Vec<RawP2p>) = local.into_iter().partition(|o| o.is_send);
    if sends.len() != recvs.len() {
        return Err(usage(format!(
            "rank {me}: {} sends to itself but {} receives from itself",
            sends.len(),
            recvs.len()
        )));
    }
    for (s, r) in sends.iter().zip(&recvs) {
        if s.bytes != r.bytes {
            return Err(usage(format!(
                "rank {me}: send of {} bytes to itself matched with a receive of {} bytes",
                s.bytes, r.bytes
            )));
        }
        if s.bytes > 0 && (s.ptr.is_null() || r.ptr.is_null()) {
            return Err(crate::error::invalid(
                "NULL buffer in a send/receive to self",
            ));
        }
        if s.bytes > 0 {
            // SAFETY: both buffers are lent for `bytes` bytes until the
            // call completes; `copy` allows overlap.
            unsafe { std::ptr::copy(s.ptr.cast_const(), r.ptr, s.bytes) };
        }
    }
    if remote.is_empty() {
        return Ok(());
    }
    // SAFETY: every buffer is lent for its `bytes` (reads for sends, writes
    // for receives) until the call completes, by the C contract.
    unsafe { core.run_group_raw(&remote) }
}
