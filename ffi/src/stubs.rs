//! NCCL functions nccl-rs does not implement yet. Each returns
//! `ncclInvalidUsage` and makes `ncclGetLastError` name the missing
//! feature: never a silent success. (Two `void` functions cannot report an
//! error: `ncclParamDumpAll` logs the configuration for real, and
//! `ncclResetDebugInit`, kept for programs built against old headers, logs
//! that it does nothing.)

#![allow(clippy::unused_unit)]

use crate::error::{usage, FfiResult};
use crate::group::code;
use crate::panic::nccl_api;
use crate::types::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

fn not_implemented(name: &str, feature: &str) -> ncclResult_t {
    let e: FfiResult<ncclResult_t> = Err(usage(format!(
        "{name} is not implemented in nccl-rs yet ({feature}); no operation was performed"
    )));
    code(e)
}

macro_rules! stubs {
    ($( $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* ) => $feature:literal; )*) => {
        nccl_api! { $(
            #[doc = concat!("Not implemented yet: ", $feature, ". Returns `ncclInvalidUsage`.")]
            fn $name / $pname($($arg: $ty),*) -> ncclResult_t {
                $(let _ = $arg;)*
                not_implemented(stringify!($name), $feature)
            }
        )* }
    };
}

stubs! {
    ncclCommShrink / pncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) => "communicator shrink";
    ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) => "communicator grow ids";
    ncclCommGrow / pncclCommGrow(comm: ncclComm_t, nRanks: c_int, uniqueId: *const ncclUniqueId, rank: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) => "communicator grow";
    ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) => "communicator revoke";
    ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) => "communicator suspend";
    ncclCommResume / pncclCommResume(comm: ncclComm_t) => "communicator resume";
    ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) => "GPU memory statistics";
    ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize,
        win: *mut ncclWindow_t, winFlags: c_int) => "memory windows";
    ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) => "memory windows";
    ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) => "memory windows";
    ncclPutSignal / pncclPutSignal(localbuff: *const c_void, count: usize, datatype: c_int, peer: c_int,
        peerWin: ncclWindow_t, peerWinOffset: usize, sigIdx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t,
        stream: cudaStream_t) => "one-sided put/signal";
    ncclSignal / pncclSignal(peer: c_int, sigIdx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t,
        stream: cudaStream_t) => "one-sided put/signal";
    ncclWaitSignal / pncclWaitSignal(nDesc: c_int, signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t,
        stream: cudaStream_t) => "one-sided put/signal";
    ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) => "group simulation";
    ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) => "the parameter API";
    ncclParamGetI8 / pncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) => "the parameter API";
    ncclParamGetI16 / pncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) => "the parameter API";
    ncclParamGetI32 / pncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) => "the parameter API";
    ncclParamGetI64 / pncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) => "the parameter API";
    ncclParamGetU8 / pncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) => "the parameter API";
    ncclParamGetU16 / pncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) => "the parameter API";
    ncclParamGetU32 / pncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) => "the parameter API";
    ncclParamGetU64 / pncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) => "the parameter API";
    ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) => "the parameter API";
    ncclParamGet / pncclParamGet(h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int) => "the parameter API";
    ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value: *mut *const c_char,
        valueLen: *mut c_int) => "the parameter API";
    ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *mut *const c_char,
        tableLen: *mut c_int) => "the parameter API";
}

nccl_api! {
    /// Logs the parsed configuration (`NCCL_*` environment) at INFO level.
    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        match crate::config::from_env() {
            Ok(s) => tracing::info!("nccl-rs configuration: {:?} (blocking: {})", s.core, s.blocking),
            Err(e) => tracing::warn!("nccl-rs configuration: {e}"),
        }
    }

    /// Kept for programs built against old NCCL headers: logging settings
    /// are read once, so this only logs that it changed nothing.
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        tracing::warn!("ncclResetDebugInit: nccl-rs reads NCCL_DEBUG* once; nothing was reloaded");
    }
}
