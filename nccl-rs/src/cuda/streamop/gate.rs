//! Gates on application streams and the proxy's own streams (see the
//! parent module).

use super::{
    call_ctx, memops, query, HostFlag, EVENT_DISABLE_TIMING, STREAM_NON_BLOCKING,
    STREAM_WAIT_VALUE_GEQ,
};
use crate::cuda::driver::{self, check, Ctx, CtxGuard, Event};
use crate::cuda::stage::Stream;
use crate::cuda::CudaError;
use cudarc::driver::sys::{CUevent, CUstream};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A gate event, returned to a per-context pool when dropped.
struct GateEvent {
    ctx: Ctx,
    raw: usize,
}

/// Per context: free events, and events dropped before they completed.
type Pool = HashMap<Ctx, (Vec<usize>, Vec<usize>)>;
static EVENTS: Mutex<Option<Pool>> = Mutex::new(None);

impl GateEvent {
    /// A free event of `ctx` (which is current).
    fn take(ctx: Ctx) -> Result<GateEvent, CudaError> {
        {
            let mut pool = EVENTS.lock().unwrap_or_else(|p| p.into_inner());
            let (free, pending) = pool
                .get_or_insert_with(HashMap::new)
                .entry(ctx)
                .or_default();
            if free.is_empty() {
                let done: Vec<usize> = pending
                    .iter()
                    .copied()
                    .filter(|&e| query(e).unwrap_or(false))
                    .collect();
                pending.retain(|e| !done.contains(e));
                free.extend(done);
            }
            if let Some(raw) = free.pop() {
                return Ok(GateEvent { ctx, raw });
            }
        }
        let api = driver::api()?;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `ctx` is current.
        check(api, "cuEventCreate", unsafe {
            (api.cuEventCreate)(&mut e, EVENT_DISABLE_TIMING)
        })?;
        Ok(GateEvent {
            ctx,
            raw: e as usize,
        })
    }
}

impl Drop for GateEvent {
    fn drop(&mut self) {
        let done = query(self.raw).unwrap_or(false);
        let mut pool = EVENTS.lock().unwrap_or_else(|p| p.into_inner());
        let (free, pending) = pool
            .get_or_insert_with(HashMap::new)
            .entry(self.ctx)
            .or_default();
        // An event still pending (its stream is stuck) is reused only once
        // it completed: recording it again would move what waiters wait for.
        if done {
            free.push(self.raw);
        } else {
            pending.push(self.raw);
        }
    }
}

/// How [`Gate::wait_ready`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateWait {
    /// The stream's work before the call is done.
    Ready,
    /// `cancelled` said so (e.g. `ncclCommAbort`).
    Cancelled,
    /// The deadline passed first.
    TimedOut,
}

/// The point of one call on an application stream: an event after the
/// stream's earlier work, then a wait for a [`HostFlag`] to reach `seq`.
pub struct Gate {
    ctx: Ctx,
    stream: Stream,
    ev: GateEvent,
}

// SAFETY: the gate holds driver handles (a context, a stream address, an
// event), usable from any thread.
unsafe impl Send for Gate {}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("ctx", &self.ctx)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// Enqueues the gate of a call on `stream` whose buffers are `bufs`
    /// (they choose the context for the special streams 0, 1, 2): the
    /// stream's later work waits until `flag` reaches `seq`.
    ///
    /// # Safety
    /// `stream` is a live stream (or 0, 1, 2). Something must release
    /// `flag` to `seq` (or beyond), or the stream waits forever.
    pub unsafe fn enqueue(
        stream: Stream,
        bufs: &[*const u8],
        flag: &HostFlag,
        seq: u32,
    ) -> Result<Gate, CudaError> {
        let ops = memops()?;
        let api = driver::api()?;
        let ctx = call_ctx(stream, bufs)?;
        let _g = CtxGuard::bind(ctx)?;
        let ev = GateEvent::take(ctx)?;
        let s = stream.effective();
        // SAFETY: a live event of the current context; `s` is the caller's
        // stream (contract).
        check(api, "cuEventRecord", unsafe {
            (api.cuEventRecord)(ev.raw as CUevent, s)
        })?;
        // SAFETY: as above; the flag is mapped pinned memory never freed.
        let rc = unsafe { (ops.wait_value32)(s, flag.dev, seq, STREAM_WAIT_VALUE_GEQ) };
        check(api, "cuStreamWaitValue32", rc)?;
        Ok(Gate { ctx, stream, ev })
    }

    /// The application's stream.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Waits until the stream's work before the gate is done: polls its
    /// event (yielding at first, then sleeping up to 1 ms between polls)
    /// until then, until `cancelled()` is true, or until `deadline`.
    pub fn wait_ready(
        &self,
        deadline: Instant,
        cancelled: impl Fn() -> bool,
    ) -> Result<GateWait, CudaError> {
        let mut pause = Duration::from_micros(10);
        for polls in 0u32.. {
            if query(self.ev.raw)? {
                return Ok(GateWait::Ready);
            }
            if cancelled() {
                return Ok(GateWait::Cancelled);
            }
            if Instant::now() >= deadline {
                return Ok(GateWait::TimedOut);
            }
            // Short waits are common (the stream is usually caught up):
            // yield first, sleep (backing off) only after that.
            if polls < 200 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
        unreachable!("the loop returns")
    }
}

/// A non-blocking stream of ours, with an event to wait for it.
pub(super) struct InternalStream {
    ctx: Ctx,
    raw: usize,
    done: Event,
}

impl InternalStream {
    /// In `ctx`, which must be current.
    pub(super) fn new(ctx: Ctx) -> Result<InternalStream, CudaError> {
        let ops = memops()?;
        let done = Event::new()?;
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `ctx` is current.
        let rc = unsafe { (ops.stream_create)(&mut s, STREAM_NON_BLOCKING) };
        check(driver::api()?, "cuStreamCreate", rc)?;
        Ok(InternalStream {
            ctx,
            raw: s as usize,
            done,
        })
    }

    pub(super) fn raw(&self) -> CUstream {
        self.raw as CUstream
    }

    /// Waits for everything enqueued so far (the context must be current).
    pub(super) fn sync(&self) -> Result<(), CudaError> {
        self.done.record(self.raw())?;
        self.done.wait()
    }
}

impl Drop for InternalStream {
    fn drop(&mut self) {
        let (Ok(ops), Ok(_g)) = (memops(), CtxGuard::bind(self.ctx)) else {
            return;
        };
        if let Err(e) = self.sync() {
            tracing::warn!("waiting for a proxy stream failed: {e}");
        }
        // SAFETY: our stream, destroyed once, its work done.
        unsafe { (ops.stream_destroy)(self.raw()) };
    }
}

/// A proxy thread's own streams, one per context, made on first use.
#[derive(Default)]
pub struct ProxyStreams {
    streams: Vec<InternalStream>,
}

impl std::fmt::Debug for ProxyStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyStreams")
            .field("contexts", &self.streams.len())
            .finish()
    }
}

impl ProxyStreams {
    /// None yet.
    pub fn new() -> ProxyStreams {
        ProxyStreams::default()
    }

    fn of(&mut self, ctx: Ctx) -> Result<&InternalStream, CudaError> {
        let i = match self.streams.iter().position(|s| s.ctx == ctx) {
            Some(i) => i,
            None => {
                let _g = CtxGuard::bind(ctx)?;
                self.streams.push(InternalStream::new(ctx)?);
                self.streams.len() - 1
            }
        };
        Ok(&self.streams[i])
    }

    /// Our stream in the context of `gate`: the call runs there once
    /// [`Gate::wait_ready`] said `Ready`.
    pub fn stream_for(&mut self, gate: &Gate) -> Result<Stream, CudaError> {
        Ok(Stream(self.of(gate.ctx)?.raw))
    }

    /// Waits for all work on our stream in the context of `gate`.
    pub fn sync(&mut self, gate: &Gate) -> Result<(), CudaError> {
        let s = self.of(gate.ctx)?;
        let _g = CtxGuard::bind(s.ctx)?;
        s.sync()
    }
}
