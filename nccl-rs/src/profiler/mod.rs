//! NCCL's profiler plugin interface (versions 5 and 4), unchanged: a
//! library named by `NCCL_PROFILER_PLUGIN` (found as NCCL finds it) is
//! opened once per process, initialised per communicator, and told of
//! each call's Group, Coll or P2p events and, below them, of a KernelCh
//! event per task and, for network peers, of the ProxyOp and ProxyStep
//! events of its messages, with their state transitions, and of the
//! transport's NetPlugin events under those.
//! Only the event types the plugin's activation mask asks for (or that
//! are parents of those, as NCCL does) are started.
//!
//! The C header is `include/nccl_profiler.h`; `docs/profiler.md` maps our
//! engine onto NCCL's events. With no plugin loaded a communicator holds
//! no profiler and each hook is one branch on an empty `Option`.

mod ffi;
mod load;
mod trace;

pub(crate) use trace::{Sent, Trace};

use crate::datatype::DataType;
use crate::engine::Region;
use crate::plan::Coll;
use crate::schedule::{P2pOp, Schedule};
use ffi::bits;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

/// The types a Group event is started for: itself and every type below
/// it (as NCCL, whose Group is the parent of the rest, whatever the call's
/// tasks are).
const GROUP_AND_BELOW: u64 = bits::GROUP
    | bits::COLL
    | bits::P2P
    | bits::PROXY_OP
    | bits::PROXY_STEP
    | bits::KERNEL_CH
    | bits::NET_PLUGIN;

/// What a Coll event says of a collective.
pub(crate) struct CollInfo {
    pub(crate) coll: Coll,
    pub(crate) dtype: DataType,
    /// The user's buffers (before any staging).
    pub(crate) send: *const u8,
    pub(crate) recv: *mut u8,
    pub(crate) algo: &'static str,
    pub(crate) proto: &'static str,
    pub(crate) channels: usize,
}

impl CollInfo {
    /// The Coll event's facts of a call on `bufs` (the user's) planned as `plan`.
    pub(crate) fn of(
        coll: Coll,
        dtype: DataType,
        bufs: &crate::engine::CallBufs,
        plan: &crate::plan::CallPlan,
    ) -> CollInfo {
        let (algo, proto) = (plan.algo.algo, plan.algo.proto);
        CollInfo::on(coll, dtype, bufs, (algo, proto, plan.channels))
    }

    /// The facts of `coll` on `bufs`, run by `(algorithm, protocol, channels)`.
    fn on(
        coll: Coll,
        dtype: DataType,
        bufs: &crate::engine::CallBufs,
        (algo, proto, channels): (&'static str, &'static str, usize),
    ) -> CollInfo {
        CollInfo {
            coll,
            dtype,
            send: bufs.input.ptr.cast_const(),
            recv: bufs.output.ptr,
            algo,
            proto,
            channels,
        }
    }
}

impl CollInfo {
    /// The Coll event's facts of a call on the zero-copy path (ranks copy
    /// straight between each other's buffers: algorithm `ZeroCopy`).
    pub(crate) fn zero_copy(
        coll: Coll,
        dtype: DataType,
        bufs: &crate::engine::CallBufs,
    ) -> CollInfo {
        CollInfo::on(coll, dtype, bufs, ("ZeroCopy", "Simple", 1))
    }
}

/// One communicator's profiler context; finalized when dropped.
pub(crate) struct CommProfiler {
    plugin: &'static load::Plugin,
    /// The activation mask of the call in progress (read from `cell`).
    mask: u64,
    /// The mask the plugin set in init and may change at any time (NCCL
    /// reads it again for every call).
    cell: Box<AtomicI32>,
    /// Per rank, whether it is reached over a network transport (NCCL's
    /// proxy peers: only those have ProxyOps); empty where none is (no
    /// ProxyOps at all).
    net: Vec<bool>,
    nranks: usize,
    /// Per collective name, the next Coll `seqNumber` (NCCL counts per
    /// function, from 0).
    seq: Vec<(&'static str, u64)>,
    /// The trace of the next call (its buffers reused).
    spare: Option<Box<Trace>>,
    /// Algorithm and protocol names as C strings, by the address of the
    /// name (a few static names).
    names: Vec<((usize, usize), *const c_char)>,
    /// The last Coll's function, algorithm and protocol names (their
    /// addresses) and their C strings: a repeated call looks up none.
    last_names: ([usize; 3], [*const c_char; 3]),
    api: trace::Api,
    /// Per peer, a send/recv group's first send and receive P2p events
    /// (kept for the next group).
    first: Vec<[*mut c_void; 2]>,
}

// SAFETY: the context is the plugin's opaque pointer, used by one thread
// at a time (the communicator's core is behind a mutex); the interface
// allows calls from any thread.
unsafe impl Send for CommProfiler {}

/// A 64-bit FNV-1a hash of the communicator's unique id: the same on every
/// rank (`commHash`).
pub(crate) fn comm_hash(id: &[u8]) -> u64 {
    id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl CommProfiler {
    /// The profiler of a new communicator: `None` where no plugin is
    /// loaded (`NCCL_PROFILER_PLUGIN`) or its init failed. `net[p]`: rank
    /// `p` is reached over a network transport (not shared memory).
    pub(crate) fn init(
        plugin_var: Option<&str>,
        comm_hash: u64,
        nnodes: usize,
        (nranks, rank): (usize, usize),
        net: Vec<bool>,
    ) -> Option<Box<CommProfiler>> {
        let plugin = load::plugin(plugin_var)?;
        let cell = Box::new(AtomicI32::new(0));
        let ctx = plugin.init(comm_hash, (nnodes, nranks, rank), cell.as_ptr())?;
        let mask = cell.load(Ordering::Relaxed);
        tracing::info!(
            rank,
            "PROFILER/Plugin: {} v{}, event mask {mask:#x}",
            plugin.name,
            plugin.version
        );
        let api = trace::Api {
            ctx,
            start: plugin.start,
            stop: plugin.stop,
            record: plugin.record,
            rank: rank as c_int,
        };
        Some(Box::new(CommProfiler {
            plugin,
            mask: mask as u32 as u64,
            cell,
            nranks,
            net: if net.contains(&true) { net } else { Vec::new() },
            seq: Vec::new(),
            spare: None,
            names: Vec::new(),
            last_names: ([0; 3], [null_mut::<c_char>().cast_const(); 3]),
            api,
            first: Vec::new(),
        }))
    }

    /// Reads the plugin's current mask for a new call.
    fn refresh(&mut self) {
        self.mask = self.cell.load(Ordering::Relaxed) as u32 as u64;
    }

    fn active(&self, any: u64) -> bool {
        self.mask & any != 0
    }

    /// A trace for a new call, its Group event started where asked for.
    fn begin(&mut self) -> Box<Trace> {
        let mut t = self
            .spare
            .take()
            .unwrap_or_else(|| Box::new(Trace::new(self.api)));
        t.parents.clear();
        t.group = self.api.start(self.api.descr(bits::GROUP, null_mut()));
        t
    }

    /// The parent field of a Coll or P2p event: in v5 the API event (none
    /// is emitted) with the Group in `parentGroup`; in v4 the Group.
    fn task_parent(&self, group: *mut c_void) -> *mut c_void {
        match self.plugin.version {
            4 => group,
            _ => null_mut(),
        }
    }

    /// Starts a collective's events (Group, Coll, ProxyOps), to be handed
    /// to the engine for its steps and then to [`CommProfiler::finish`];
    /// `None` where the mask asks for none of them.
    pub(crate) fn coll(&mut self, c: &CollInfo, sched: &Schedule) -> Option<Box<Trace>> {
        self.refresh();
        if !self.active(GROUP_AND_BELOW) {
            return None;
        }
        let below =
            bits::COLL | bits::PROXY_OP | bits::PROXY_STEP | bits::KERNEL_CH | bits::NET_PLUGIN;
        let func = c.coll.nccl_name();
        let seq = match self.seq.iter_mut().find(|(f, _)| *f == func) {
            Some((_, n)) => {
                *n += 1;
                *n - 1
            }
            None => {
                self.seq.push((func, 1));
                0
            }
        };
        let mut t = self.begin();
        if self.active(below) {
            let (count, root) = counts(c.coll);
            let key = [func, c.algo, c.proto].map(|n| n.as_ptr() as usize);
            if key != self.last_names.0 {
                self.last_names = (
                    key,
                    [self.name(func), self.name(c.algo), self.name(c.proto)],
                );
            }
            let [func, algo, proto] = self.last_names.1;
            let mut d = self.api.descr(bits::COLL, self.task_parent(t.group));
            d.u.coll = ffi::CollDescr {
                seq_number: seq,
                func,
                send_buff: c.send.cast(),
                recv_buff: c.recv.cast(),
                count,
                root: root as c_int,
                datatype: dtype_name(c.dtype).as_ptr(),
                n_channels: u8::try_from(c.channels).unwrap_or(u8::MAX),
                // One thread drives a call.
                n_warps: 1,
                algo,
                proto,
                parent_group: t.group,
            };
            let h = self.api.start(d);
            t.parents.push(h);
            t.start_kernel(self.mask, h);
            t.start_ops(self.mask, sched, c.dtype.size(), &self.net, |_, _| h);
        }
        Some(t)
    }

    /// Starts the events of a collective on the zero-copy path: Group and
    /// Coll, and no ProxyOps (no messages: the ranks read and write each
    /// other's buffers).
    pub(crate) fn zero_copy(&mut self, c: &CollInfo) -> Option<Box<Trace>> {
        static NO_STEPS: Schedule = Schedule {
            steps: Vec::new(),
            scratch: 0,
        };
        self.coll(c, &NO_STEPS)
    }

    /// Starts a send/recv group's events (Group, a P2p per send or
    /// receive, ProxyOps): `ops` on `bufs`, of element types `dtypes`.
    pub(crate) fn p2p(
        &mut self,
        ops: &[P2pOp],
        dtypes: &[DataType],
        bufs: &[Region],
        sched: &Schedule,
    ) -> Option<Box<Trace>> {
        self.refresh();
        if !self.active(GROUP_AND_BELOW) {
            return None;
        }
        let below =
            bits::P2P | bits::PROXY_OP | bits::PROXY_STEP | bits::KERNEL_CH | bits::NET_PLUGIN;
        let mut t = self.begin();
        if !self.active(below) {
            return Some(t);
        }
        // Per peer, the first send's and first receive's P2p event: the
        // parents of that peer's ProxyOps.
        let mut first = std::mem::take(&mut self.first);
        first.clear();
        first.resize(self.nranks, [null_mut(); 2]);
        for (i, op) in ops.iter().enumerate() {
            let (peer, buf, bytes, d, func) = match *op {
                P2pOp::Send { peer, buf, count } => (peer, buf, count, 0, c"Send"),
                P2pOp::Recv { peer, buf, count } => (peer, buf, count, 1, c"Recv"),
            };
            let dtype = dtypes.get(i).copied().unwrap_or(DataType::Uint8);
            let mut descr = self.api.descr(bits::P2P, self.task_parent(t.group));
            descr.u.p2p = ffi::P2pDescr {
                func: func.as_ptr(),
                buff: bufs.get(buf).map_or(null_mut(), |r| r.ptr.cast()),
                datatype: dtype_name(dtype).as_ptr(),
                count: bytes / dtype.size(),
                peer: peer as c_int,
                n_channels: 1,
                parent_group: t.group,
            };
            let h = self.api.start(descr);
            t.parents.push(h);
            t.start_kernel(self.mask, h);
            if let Some(f) = first.get_mut(peer) {
                if f[d].is_null() {
                    f[d] = h;
                }
            }
        }
        t.start_ops(self.mask, sched, 1, &self.net, |peer, is_send| {
            first
                .get(peer)
                .map_or(null_mut(), |f| f[usize::from(!is_send)])
        });
        self.first = first;
        Some(t)
    }

    /// `s` as a C string, kept for the process.
    fn name(&mut self, s: &'static str) -> *const c_char {
        let key = (s.as_ptr() as usize, s.len());
        if let Some(&(_, c)) = self.names.iter().find(|(k, _)| *k == key) {
            return c;
        }
        let c = cstr(s);
        self.names.push((key, c));
        c
    }

    /// Stops the events of a call that ended (well or not).
    pub(crate) fn finish(&mut self, t: Option<Box<Trace>>) {
        if let Some(mut t) = t {
            t.stop_all();
            self.spare = Some(t);
        }
    }
}

impl Drop for CommProfiler {
    fn drop(&mut self) {
        // SAFETY: the context this plugin's init returned, finalized once.
        unsafe { (self.plugin.finalize)(self.api.ctx) };
    }
}

/// NCCL's `count` and `root` of a Coll event.
fn counts(c: Coll) -> (usize, usize) {
    match c {
        Coll::AllReduce { count } | Coll::AllToAll { count } => (count, 0),
        Coll::AllGather { send_count } => (send_count, 0),
        Coll::ReduceScatter { recv_count } => (recv_count, 0),
        Coll::Broadcast { count, root }
        | Coll::Reduce { count, root }
        | Coll::Gather { count, root }
        | Coll::Scatter { count, root } => (count, root),
    }
}

/// NCCL's name of a datatype (`ncclDatatypeToString`).
fn dtype_name(d: DataType) -> &'static CStr {
    match d {
        DataType::Int8 => c"ncclInt8",
        DataType::Uint8 => c"ncclUint8",
        DataType::Int32 => c"ncclInt32",
        DataType::Uint32 => c"ncclUint32",
        DataType::Int64 => c"ncclInt64",
        DataType::Uint64 => c"ncclUint64",
        DataType::Float16 => c"ncclFloat16",
        DataType::Float32 => c"ncclFloat32",
        DataType::Float64 => c"ncclFloat64",
        DataType::Bfloat16 => c"ncclBfloat16",
        DataType::Float8e4m3 => c"ncclFloat8e4m3",
        DataType::Float8e5m2 => c"ncclFloat8e5m2",
    }
}

/// A static name as a C string that lives for the process (the few
/// function, algorithm and protocol names, each made once).
fn cstr(s: &'static str) -> *const c_char {
    static NAMES: Mutex<Vec<(&'static str, &'static CStr)>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = names.iter().find(|(n, _)| std::ptr::eq(*n, s) || *n == s) {
        return c.as_ptr();
    }
    let owned = std::ffi::CString::new(s.replace('\0', "")).expect("NULs removed");
    let c: &'static CStr = Box::leak(owned.into_boxed_c_str());
    names.push((s, c));
    c.as_ptr()
}

#[cfg(test)]
#[test]
fn comm_hash_is_fnv1a() {
    assert_eq!(comm_hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(comm_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[cfg(test)]
mod cost {
    //! The cost of a plugin that does nothing, per 8 B all-reduce of two
    //! ranks driven in one thread over the in-memory transport's eager
    //! path (no waiting on another thread or process): the engine's run
    //! and the profiler's calls only, so the ratio is an upper bound of
    //! the share in a whole call. A measurement, not a check:
    //! `cargo test --release -p nccl-rs --lib profiler::cost -- --ignored --nocapture`.

    use super::*;
    use crate::engine::Engine;
    use crate::testing::{drive_engines, engine_mesh};
    use crate::transport::mem::MemNet;
    use crate::RedOp;
    use std::time::Instant;

    static HANDLE: u8 = 0;

    unsafe extern "C" fn start(_: *mut c_void, h: *mut *mut c_void, _: *mut ffi::Descr) -> c_int {
        // SAFETY: the caller passes a valid out-pointer.
        unsafe { *h = std::ptr::addr_of!(HANDLE).cast_mut().cast() };
        0
    }
    unsafe extern "C" fn stop(_: *mut c_void) -> c_int {
        0
    }
    unsafe extern "C" fn record(_: *mut c_void, _: c_int, _: *mut ffi::StateArgs) -> c_int {
        0
    }
    unsafe extern "C" fn finalize(_: *mut c_void) -> c_int {
        0
    }

    fn profiler(mask: u64, net: bool) -> CommProfiler {
        let plugin = load::fake(start, stop, record, finalize);
        CommProfiler {
            plugin,
            mask,
            cell: Box::new(AtomicI32::new(mask as i32)),
            net: if net { vec![true; 2] } else { Vec::new() },
            nranks: 2,
            seq: Vec::new(),
            spare: None,
            names: Vec::new(),
            last_names: ([0; 3], [null_mut::<c_char>().cast_const(); 3]),
            api: trace::Api {
                ctx: null_mut(),
                start,
                stop,
                record,
                rank: 0,
            },
            first: Vec::new(),
        }
    }

    /// Nanoseconds per call (the best of `rounds` of `calls`).
    fn time(profs: &mut [Option<CommProfiler>], rounds: usize, calls: usize) -> f64 {
        let n = 2;
        let mut engines: Vec<Engine> = engine_mesh(&MemNet::with_eager(4096), n, 4096);
        let scheds: Vec<Schedule> = (0..n)
            .map(|r| crate::schedule::all_reduce_direct(n, r, 2))
            .collect();
        let input = [1.0f32; 2];
        let mut out = vec![[0.0f32; 2]; n];
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..calls {
                for (r, e) in engines.iter_mut().enumerate() {
                    if let Some(p) = profs[r].as_mut() {
                        let info = CollInfo {
                            coll: Coll::AllReduce { count: 2 },
                            dtype: DataType::Float32,
                            send: input.as_ptr().cast(),
                            recv: out[r].as_mut_ptr().cast(),
                            algo: "Direct",
                            proto: "LL",
                            channels: 1,
                        };
                        e.trace = p.coll(&info, &scheds[r]);
                    }
                }
                let bufs = (0..n)
                    .map(|r| {
                        (
                            Region::read_only(input.as_ptr().cast(), 8),
                            Region::new(out[r].as_mut_ptr().cast(), 8),
                        )
                    })
                    .collect();
                drive_engines(
                    &mut engines,
                    &scheds,
                    DataType::Float32,
                    RedOp::Sum,
                    bufs,
                    "cost",
                );
                for (r, e) in engines.iter_mut().enumerate() {
                    if let Some(p) = profs[r].as_mut() {
                        p.finish(e.trace.take());
                    }
                }
            }
            best = best.min(t.elapsed().as_nanos() as f64 / calls as f64);
        }
        assert_eq!(out, vec![[2.0f32; 2]; n]);
        best
    }

    #[test]
    #[ignore = "a measurement"]
    fn cost_of_a_do_nothing_plugin() {
        // `PROF_COST=none|zero|all|allnet` runs that case alone (for a
        // per-case instruction count: `perf stat -e instructions`).
        let only = std::env::var("PROF_COST").ok();
        let (rounds, calls) = (15, 20_000);
        let case = |name: &str, mask: Option<u64>, net: bool| -> Option<f64> {
            if only.as_deref().is_some_and(|o| o != name) {
                return None;
            }
            let p = || mask.map(|m| profiler(m, net));
            Some(time(&mut [p(), p()], rounds, calls))
        };
        for _ in 0..2 {
            let none = case("none", None, false);
            let zero = case("zero", Some(0), false);
            let all = case("all", Some(0xfff), false);
            let allnet = case("allnet", Some(0xfff), true);
            let show = |t: Option<f64>| match (t, none) {
                (Some(t), Some(n)) => format!("{t:.0} ns ({:+.1}%)", (t / n - 1.0) * 100.0),
                (Some(t), None) => format!("{t:.0} ns"),
                _ => "-".into(),
            };
            println!(
                "8 B all-reduce, 2 ranks in one thread: no plugin {}, mask 0 {}, every event {}, every event with the peer on a network {}",
                none.map_or("-".into(), |n| format!("{n:.0} ns")),
                show(zero),
                show(all),
                show(allnet)
            );
        }
    }
}
