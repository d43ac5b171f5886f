//! The plugin interface's C layout (`include/nccl_profiler.h`, NCCL's
//! `profiler_v5.h` / `profiler_v4.h`): event type bits, states, the event
//! descriptor, the state arguments and the exported function tables.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// Event type bits (`ncclProfile*`), also the activation mask's bits.
pub(crate) mod bits {
    pub(crate) const GROUP: u64 = 1 << 0;
    pub(crate) const COLL: u64 = 1 << 1;
    pub(crate) const P2P: u64 = 1 << 2;
    pub(crate) const PROXY_OP: u64 = 1 << 3;
    pub(crate) const PROXY_STEP: u64 = 1 << 4;
    pub(crate) const KERNEL_CH: u64 = 1 << 6;
    pub(crate) const NET_PLUGIN: u64 = 1 << 7;
}

/// States (`ncclProfilerEventState_t`) this library records.
pub(crate) mod state {
    use std::ffi::c_int;
    pub(crate) const STEP_SEND_WAIT: c_int = 9;
    pub(crate) const STEP_RECV_WAIT: c_int = 10;
    pub(crate) const STEP_RECV_GPU_WAIT: c_int = 12;
    pub(crate) const OP_IN_PROGRESS: c_int = 19;
    pub(crate) const STEP_SEND_PEER_WAIT: c_int = 20;
    pub(crate) const KERNEL_CH_STOP: c_int = 22;
}

/// `ncclProfilerEventDescr_v5_t`. Passed as `ncclProfilerEventDescr_v4_t`
/// too: the v4 layout is the same up to the v5-only trailing fields, but
/// for `type`, a `uint8_t` there, which on a little-endian host is the low
/// byte of this `u64` (v4 is only accepted on such hosts).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Descr {
    pub(crate) ty: u64,
    pub(crate) parent: *mut c_void,
    pub(crate) rank: c_int,
    pub(crate) u: DescrUnion,
}

/// The descriptor's per-type part.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union DescrUnion {
    pub(crate) coll: CollDescr,
    pub(crate) p2p: P2pDescr,
    pub(crate) proxy_op: ProxyOpDescr,
    pub(crate) proxy_step: ProxyStepDescr,
    pub(crate) kernel_ch: KernelChDescr,
    pub(crate) net_plugin: NetPluginDescr,
    pub(crate) none: (),
}

/// `coll`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CollDescr {
    pub(crate) seq_number: u64,
    pub(crate) func: *const c_char,
    pub(crate) send_buff: *const c_void,
    pub(crate) recv_buff: *mut c_void,
    pub(crate) count: usize,
    pub(crate) root: c_int,
    pub(crate) datatype: *const c_char,
    pub(crate) n_channels: u8,
    pub(crate) n_warps: u8,
    pub(crate) algo: *const c_char,
    pub(crate) proto: *const c_char,
    /// v5 only.
    pub(crate) parent_group: *mut c_void,
}

/// `p2p`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct P2pDescr {
    pub(crate) func: *const c_char,
    pub(crate) buff: *mut c_void,
    pub(crate) datatype: *const c_char,
    pub(crate) count: usize,
    pub(crate) peer: c_int,
    pub(crate) n_channels: u8,
    /// v5 only.
    pub(crate) parent_group: *mut c_void,
}

/// `proxyOp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProxyOpDescr {
    pub(crate) pid: libc::pid_t,
    pub(crate) channel_id: u8,
    pub(crate) peer: c_int,
    pub(crate) n_steps: c_int,
    pub(crate) chunk_size: c_int,
    pub(crate) is_send: c_int,
}

/// `proxyStep`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProxyStepDescr {
    pub(crate) step: c_int,
}

/// `kernelCh`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct KernelChDescr {
    pub(crate) channel_id: u8,
    /// The start's timestamp (NCCL: the kernel's, in nanoseconds).
    pub(crate) p_timer: u64,
}

/// `netPlugin`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NetPluginDescr {
    /// The network plugin's type and version (`nccl_net::profile`).
    pub(crate) id: i64,
    /// Its event descriptor, valid during the start call.
    pub(crate) data: *mut c_void,
}

/// `ncclProfilerEventStateArgs_v5_t` (and v4: the same).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union StateArgs {
    /// `proxyStep.transSize`.
    pub(crate) trans_size: usize,
    /// `kernelCh.pTimer`.
    pub(crate) p_timer: u64,
}

/// `ncclDebugLogger_t`, as called with its fixed arguments (see
/// `load::log_fn`).
pub(crate) type Logger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char);

pub(crate) type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut Descr) -> c_int;
pub(crate) type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub(crate) type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut StateArgs) -> c_int;
pub(crate) type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// v5 `init(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn)`.
pub(crate) type ProfilerV5Init = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Option<Logger>,
) -> c_int;

/// v4 `init(context, eActivationMask, commName, commHash, nNodes, nranks, rank, logfn)`.
pub(crate) type ProfilerV4Init = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    Option<Logger>,
) -> c_int;

/// `ncclProfiler_v5_t`.
#[repr(C)]
pub(crate) struct ProfilerV5 {
    pub(crate) name: *const c_char,
    pub(crate) init: Option<ProfilerV5Init>,
    pub(crate) start_event: Option<StartFn>,
    pub(crate) stop_event: Option<StopFn>,
    pub(crate) record_event_state: Option<RecordFn>,
    pub(crate) finalize: Option<FinalizeFn>,
}

/// `ncclProfiler_v4_t`: as v5 but for `init`'s argument order.
#[repr(C)]
pub(crate) struct ProfilerV4 {
    pub(crate) name: *const c_char,
    pub(crate) init: Option<ProfilerV4Init>,
    pub(crate) start_event: Option<StartFn>,
    pub(crate) stop_event: Option<StopFn>,
    pub(crate) record_event_state: Option<RecordFn>,
    pub(crate) finalize: Option<FinalizeFn>,
}

#[cfg(test)]
#[test]
fn layout_matches_the_c_header() {
    use std::mem::{offset_of, size_of};
    // x86-64 and aarch64 Linux (LP64): the offsets a C compiler gives
    // `ncclProfilerEventDescr_v5_t`.
    assert_eq!(offset_of!(Descr, parent), 8);
    assert_eq!(offset_of!(Descr, rank), 16);
    assert_eq!(offset_of!(Descr, u), 24);
    assert_eq!(
        [
            offset_of!(CollDescr, root),
            offset_of!(CollDescr, datatype),
            offset_of!(CollDescr, n_channels),
            offset_of!(CollDescr, n_warps),
            offset_of!(CollDescr, algo),
            offset_of!(CollDescr, parent_group),
        ],
        [40, 48, 56, 57, 64, 80]
    );
    assert_eq!(
        [
            offset_of!(P2pDescr, count),
            offset_of!(P2pDescr, peer),
            offset_of!(P2pDescr, n_channels),
            offset_of!(P2pDescr, parent_group)
        ],
        [24, 32, 36, 40]
    );
    assert_eq!(
        [
            offset_of!(ProxyOpDescr, channel_id),
            offset_of!(ProxyOpDescr, peer),
            offset_of!(ProxyOpDescr, n_steps),
            offset_of!(ProxyOpDescr, chunk_size),
            offset_of!(ProxyOpDescr, is_send),
        ],
        [4, 8, 12, 16, 20]
    );
    assert_eq!(
        [
            offset_of!(KernelChDescr, p_timer),
            offset_of!(NetPluginDescr, data)
        ],
        [8, 8]
    );
    assert_eq!(size_of::<Descr>(), 24 + 88);
    assert_eq!(size_of::<StateArgs>(), 8);
    assert_eq!(size_of::<ProfilerV5>(), 6 * 8);
}
