//! The engine: the only code that turns schedule steps into transport calls.
//!
//! It owns the connections to every peer, the reusable staging slots and
//! scratch buffer, and the deadline. [`Run`] is a poll-driven state machine
//! for one operation (so tests can drive many ranks from one thread);
//! [`Engine::run`] drives it to completion by polling and yielding, then
//! sleeping between polls, until the deadline.
//!
//! A small call whose every message fits the transports' eager paths (the
//! shared-memory transport's sealed frames, up to 4 KiB) runs without
//! requests: each send is written at once, each receive read when its step
//! comes ([`nccl_net::SendComm::send_eager`]); data to be reduced lands in
//! staging slot 0 first. Requests and their bookkeeping cost more than such
//! a call's copies.
//!
//! Every other call hands its plan's hints ([`Hints`], from
//! `plan::call`) to the transports before it starts; the engine itself
//! decides nothing about how a message travels.

mod buffers;
mod label;
mod run;
pub(crate) mod zero_copy;

pub(crate) use buffers::{copy_region, CallBufs, Region, SendStaging};
pub(crate) use label::{fingerprint_all_reduce, OpLabel};
pub(crate) use run::{Call, Hints, Run};

use crate::error::{Error, Result};
use crate::observe::telemetry::{ErrorKind, Telemetry, Wait};
use crate::transport::{RecvComm, SendComm};
pub(crate) use buffers::AlignedBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stops a communicator's current and later operations from any thread.
#[derive(Clone, Debug, Default)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Makes the operation in flight (and every later one) return
    /// `Error::Aborted` at its next poll.
    pub fn abort(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether `abort` was called.
    pub fn is_aborted(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Connections and reusable memory of one communicator.
pub(crate) struct Engine {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) send: Vec<Option<Box<dyn SendComm>>>,
    pub(crate) recv: Vec<Option<Box<dyn RecvComm>>>,
    slot_bytes: usize,
    slots: Vec<AlignedBuf>,
    slot_regions: SlotRegions,
    scratch: AlignedBuf,
    book: run::Bookkeeping,
    pub(crate) timeout: Duration,
    pub(crate) abort: AbortHandle,
    /// More local ranks than CPUs: an idle rank never spins.
    pub(crate) oversubscribed: bool,
    /// Per peer, the largest message the eager path of the connection to
    /// it, and from it, takes (0: none, or no connection); see
    /// [`Engine::eager`].
    eager_max: Vec<(usize, usize)>,
    /// Per-peer counters (`observe::telemetry`).
    pub(crate) telemetry: Arc<Telemetry>,
    /// The operations now run are the library's own exchanges (counted as
    /// control traffic, not payload).
    pub(crate) control: bool,
    /// The profiler's events of the call in flight (`None`: no plugin).
    pub(crate) trace: Option<Box<crate::profiler::Trace>>,
}

/// The staging slots' memory, computed once.
struct SlotRegions(Vec<Region>);

// SAFETY: the regions point into `Engine::slots`, heap buffers owned by the
// same `Engine` that never grow after the regions are taken; they move with
// the engine and are only dereferenced by whoever holds it mutably.
unsafe impl Send for SlotRegions {}

/// Most steps a call on the eager path has (a one-hop tiny collective
/// at 32 ranks has about 64); longer schedules are not tiny calls.
const EAGER_MAX_STEPS: usize = 64;
/// An idle engine polls, yielding the core between polls, for `YIELD`, then
/// sleeps `SLEEP` between polls. It spins without yielding only for `SPIN`,
/// and only when this host has no more local ranks than CPUs: where two
/// ranks share a core, a spinning rank holds the core its peer needs for a
/// whole time slice (Open MPI yields likewise when oversubscribed). Between
/// two ranks on their own CPUs the short spin saves tiny calls the
/// `sched_yield` round trips.
const SPIN: Duration = Duration::from_micros(5);
/// Idle polls that spin before the clock is first read (each poll takes
/// well under 100 ns, so these stay inside [`SPIN`]): a tiny call that
/// waits a few hundred nanoseconds for its peer spends them polling.
const CLOCKLESS_SPINS: u32 = 32;
const YIELD: Duration = Duration::from_millis(2);
const SLEEP: Duration = Duration::from_micros(100);
/// How often an idle operation asks whether another rank failed.
const HEALTH_EVERY: Duration = Duration::from_millis(1);

impl Engine {
    pub(crate) fn new(
        rank: usize,
        nranks: usize,
        send: Vec<Option<Box<dyn SendComm>>>,
        recv: Vec<Option<Box<dyn RecvComm>>>,
        slot_bytes: usize,
        nslots: usize,
        timeout: Duration,
    ) -> Engine {
        let eager_max = (0..nranks)
            .map(|p| {
                let s = send
                    .get(p)
                    .and_then(Option::as_ref)
                    .map_or(0, |c| c.eager_max());
                let r = recv
                    .get(p)
                    .and_then(Option::as_ref)
                    .map_or(0, |c| c.eager_max());
                (s, r)
            })
            .collect();
        Engine {
            rank,
            nranks,
            send,
            recv,
            slot_bytes,
            slots: (0..nslots).map(|_| AlignedBuf::default()).collect(),
            slot_regions: SlotRegions(Vec::new()),
            scratch: AlignedBuf::default(),
            book: run::Bookkeeping::default(),
            timeout,
            abort: AbortHandle::default(),
            oversubscribed: false,
            eager_max,
            telemetry: Arc::new(Telemetry::new(0, rank, nranks)),
            control: false,
            trace: None,
        }
    }

    /// The link probes of each peer's connections (both directions), for
    /// the telemetry.
    pub(crate) fn link_probes(&self) -> Vec<Vec<nccl_net::SharedProbe>> {
        (0..self.nranks)
            .map(|p| {
                let s = self.send.get(p).and_then(Option::as_ref);
                let r = self.recv.get(p).and_then(Option::as_ref);
                s.and_then(|c| c.link_probe())
                    .into_iter()
                    .chain(r.and_then(|c| c.link_probe()))
                    .collect()
            })
            .collect()
    }

    /// Elements per pipelined chunk for elements of `elem` bytes.
    pub(crate) fn chunk_elems(&self, elem: usize) -> usize {
        (self.slot_bytes / elem).max(1)
    }

    /// Starts one operation; poll the result until it reports completion.
    #[inline]
    /// Allocates the staging slots (on the first run).
    #[cold]
    fn allocate_slots(&mut self) {
        let slot_bytes = self.slot_bytes;
        for s in &mut self.slots {
            s.ensure(slot_bytes);
        }
        self.slot_regions.0 = self
            .slots
            .iter_mut()
            .map(|s| Region::new(s.as_mut_ptr(), slot_bytes))
            .collect();
    }

    /// Tells every connection how the next run's messages travel (runs
    /// off the eager path only).
    #[inline(never)]
    fn hint_transports(&mut self, hints: Hints) {
        for comm in self.send.iter_mut().flatten() {
            comm.hint_copy(hints.send);
        }
        for comm in self.recv.iter_mut().flatten() {
            comm.hint_recv(hints.recv);
        }
    }

    pub(crate) fn start<'a>(&'a mut self, call: Call<'a>, bufs: CallBufs) -> Run<'a> {
        let elem = call.dtype.size();
        let scratch_bytes = call.sched.scratch * elem;
        self.scratch.ensure(scratch_bytes);
        if self.slot_regions.0.is_empty() {
            self.allocate_slots();
        }
        let eager = self.eager(&call);
        if !eager {
            self.hint_transports(call.hints);
        }
        let scratch = Region::new(self.scratch.as_mut_ptr(), scratch_bytes);
        let slots = &self.slot_regions.0;
        Run::new(
            self.rank,
            self.nranks,
            &mut self.send,
            &mut self.recv,
            call,
            bufs,
            scratch,
            slots,
            &mut self.book,
            &self.abort,
            eager,
            (&self.telemetry, self.control),
            self.trace.as_deref_mut(),
        )
    }

    /// Whether `call` runs on the eager (tiny-message) path: it has at
    /// most [`EAGER_MAX_STEPS`] steps, and every message fits the eager
    /// path of the transport it travels on (and a staging slot, where it
    /// is reduced). Transports without one (sockets) never qualify.
    fn eager(&self, call: &Call<'_>) -> bool {
        let steps = &call.sched.steps;
        if steps.len() > EAGER_MAX_STEPS || self.slots.is_empty() {
            return false;
        }
        let es = call.dtype.size();
        // A transport without an eager path says 0: not even an empty
        // message goes that way.
        let fits = |bytes: usize, max: usize| max > 0 && bytes <= max;
        let max = |peer: usize| self.eager_max.get(peer).copied().unwrap_or((0, 0));
        steps.iter().all(|s| {
            let bytes = s.count().saturating_mul(es);
            s.send_peer().is_none_or(|p| fits(bytes, max(p).0))
                && s.recv_peer()
                    .is_none_or(|p| fits(bytes, max(p).1) && bytes <= self.slot_bytes)
        })
    }

    /// Runs one operation to completion or to the deadline. While idle it
    /// calls `health` about once a millisecond with where the operation
    /// stands; an error from it (another rank failed) ends the operation.
    pub(crate) fn run(
        &mut self,
        call: Call<'_>,
        bufs: CallBufs,
        health: &mut dyn FnMut(crate::observe::progress::WaitPoint) -> Option<Error>,
    ) -> Result<()> {
        let (rank, timeout, what) = (self.rank, self.timeout, call.what);
        if self.abort.is_aborted() {
            return Err(Error::Aborted {
                rank,
                op: what.to_string(),
            });
        }
        let spin = match self.oversubscribed {
            true => Duration::ZERO,
            false => SPIN,
        };
        let mut run = self.start(call, bufs);
        let mut idle = Idle::default();
        let mut quiet = 0u32;
        loop {
            let (done, moved) = run.poll()?;
            if done || moved {
                idle.ended(&run);
                if done {
                    return Ok(());
                }
                quiet = 0;
                continue;
            }
            quiet = quiet.saturating_add(1);
            if quiet <= CLOCKLESS_SPINS && !spin.is_zero() {
                // Well inside the spin: no need to read the clock yet.
                std::hint::spin_loop();
                continue;
            }
            idle.wait(&run, (rank, what), timeout, spin, health)?;
        }
    }
}

/// The idle time of one operation. The clock is first read when a poll
/// moves nothing: a small call that completes while it keeps moving never
/// reads it.
#[derive(Default)]
struct Idle {
    /// The first clock read (the deadline counts from it).
    start: Option<Instant>,
    /// When the current idle stretch began.
    since: Option<Instant>,
    polls: u32,
    last_health: Option<Instant>,
    /// What the current idle stretch waits on, and how long it had at the
    /// clock's last read (for the wait counters: the stretch's end reads
    /// no clock, so a wait counts at most one poll interval short).
    waiting: Option<Wait>,
    seen: Duration,
}

impl Idle {
    /// A poll moved: the idle stretch, if any, goes to the wait counters.
    #[inline]
    fn ended(&mut self, run: &Run<'_>) {
        if self.since.take().is_some() {
            run.telemetry()
                .waited(self.waiting, std::mem::take(&mut self.seen));
        }
    }

    /// One idle poll past the clockless spins: spins, yields or sleeps as
    /// the stretch's length says, then checks the abort flag, the other
    /// ranks' health and the deadline. Out of line: a call whose data is
    /// already there never comes here.
    #[inline(never)]
    fn wait(
        &mut self,
        run: &Run<'_>,
        (rank, what): (usize, OpLabel),
        timeout: Duration,
        spin: Duration,
        health: &mut dyn FnMut(crate::observe::progress::WaitPoint) -> Option<Error>,
    ) -> Result<()> {
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let last_health = self.last_health.get_or_insert(now);
        let idle = now
            - *self.since.get_or_insert_with(|| {
                self.waiting = run.waits_on();
                now
            });
        self.seen = idle;
        self.polls = self.polls.wrapping_add(1);
        if idle < spin {
            std::hint::spin_loop();
        } else if idle < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(SLEEP);
        }
        if run.aborted() {
            return Err(Error::Aborted {
                rank,
                op: what.to_string(),
            });
        }
        if idle >= HEALTH_EVERY && now - *last_health >= HEALTH_EVERY {
            *last_health = now;
            if let Some(e) = health(run.wait_point()) {
                return Err(e);
            }
        }
        if self.polls % 64 == 0 && now - start > timeout {
            run.telemetry().waited(self.waiting, idle);
            if let Some(Wait::Recv(p) | Wait::Send(p)) = self.waiting {
                run.telemetry().error(p, ErrorKind::Timeout);
            }
            return Err(Error::Timeout {
                rank,
                op: what.to_string(),
                after: timeout,
                waiting_for: run.waiting_for(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
