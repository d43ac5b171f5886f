//! Device pointers and streams (the `cuda` feature). Without the feature,
//! or without a usable CUDA driver, every function here gives the
//! host-memory behaviour, and no CUDA call is made.
//!
//! With it, a collective or send/recv on device memory runs through the
//! communicator's [`Stager`](nccl_rs::cuda::Stager): its input is copied
//! to pinned host memory on the call's stream (after the work already
//! there), the host collective runs, and the copies back are enqueued on
//! the stream. Where stream memory operations work (and `NCCL_RS_CUDA_ASYNC`
//! is not 0) that happens on the communicator's proxy thread, on a stream
//! of ours ordered after the call's stream, and the call returns at once
//! (`gate.rs`); otherwise the call returns once the network part is done.
//! Either way `cudaStreamSynchronize(stream)` (or any later work on the
//! stream) sees the result, as with NCCL.

use crate::error::FfiResult;
use crate::redop::Scalar;
use crate::work::P2pWork;
use nccl_rs::comm::raw::{RawArgs, RawP2p};
use nccl_rs::{Communicator, DataType};
use std::ffi::c_int;

/// A communicator's staging state (pinned buffers, events).
#[cfg(feature = "cuda")]
pub(crate) type Stager = nccl_rs::cuda::Stager;

/// Nothing to stage without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) struct Stager;

#[cfg(feature = "cuda")]
fn stream(s: usize) -> nccl_rs::cuda::Stream {
    nccl_rs::cuda::Stream(s)
}

/// Whether this call touches device memory (needs staging).
pub(crate) fn coll_on_device(core: &Communicator, a: &RawArgs) -> bool {
    #[cfg(feature = "cuda")]
    {
        let (sb, rb) = core.raw_sizes(a);
        let mut ptrs = Vec::with_capacity(2);
        if sb > 0 {
            ptrs.push(a.send);
        }
        if rb > 0 {
            ptrs.push(a.recv.cast_const());
        }
        nccl_rs::cuda::Stager::needs_staging(&ptrs)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (core, a);
        false
    }
}

/// The bytes of a PreMulSum scalar now: read from the application's
/// pointer (host or device memory, ordered on `stream`) or kept at
/// creation.
pub(crate) fn scalar_bytes(s: &Scalar, dtype: DataType, stream_raw: usize) -> FfiResult<Vec<u8>> {
    match s {
        Scalar::Value(v) => Ok(v.clone()),
        Scalar::Pointer(p) => {
            #[cfg(feature = "cuda")]
            {
                // SAFETY: the application keeps the scalar valid until
                // ncclRedOpDestroy (ncclScalarDevice's contract).
                unsafe { nccl_rs::cuda::read_bytes(p.0, dtype.size(), stream(stream_raw)) }
                    .map_err(|e| e.into_error(0))
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = stream_raw;
                // SAFETY: as above; host memory in this build.
                Ok(unsafe { std::slice::from_raw_parts(p.0, dtype.size()) }.to_vec())
            }
        }
    }
}

/// Runs a collective on device memory through the communicator's stager
/// (created on first use from the environment).
pub(crate) fn run_coll(
    core: &mut Communicator,
    stager: &mut Option<Stager>,
    a: &RawArgs,
    stream_raw: usize,
    prescale: Option<&[u8]>,
) -> FfiResult<()> {
    #[cfg(feature = "cuda")]
    {
        let st = match stager {
            Some(s) => s,
            None => stager.insert(Stager::from_env()?),
        };
        // SAFETY: the application's buffers, valid (as device or host
        // memory) until the work this call enqueues on `stream` has run,
        // by NCCL's contract.
        unsafe { st.collective(core, a, stream(stream_raw), prescale) }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (core, stager, a, stream_raw, prescale);
        unreachable!("device memory without the cuda feature")
    }
}

/// Runs sends and receives: through the stager when one of the buffers is
/// device memory, else `host` on them directly.
pub(crate) fn run_p2p(
    core: &mut Communicator,
    stager: &mut Option<Stager>,
    ops: Vec<P2pWork>,
    host: impl FnOnce(&mut Communicator, Vec<RawP2p>) -> FfiResult<()>,
) -> FfiResult<()> {
    #[cfg(feature = "cuda")]
    {
        let device = nccl_rs::cuda::Stager::needs_staging(
            &ops.iter()
                .filter(|o| o.op.bytes > 0)
                .map(|o| o.op.ptr.cast_const())
                .collect::<Vec<_>>(),
        );
        if device {
            let st = match stager {
                Some(s) => s,
                None => stager.insert(Stager::from_env()?),
            };
            let with_streams: Vec<_> = ops.iter().map(|o| (o.op, stream(o.stream))).collect();
            let rank = core.rank();
            // SAFETY: every buffer is lent for its `bytes` until the copies
            // this call enqueues on its stream have run (NCCL's contract).
            return unsafe { st.p2p(rank, &with_streams, |h| host(core, h.to_vec())) };
        }
    }
    let _ = stager;
    host(core, ops.into_iter().map(|o| o.op).collect())
}

/// The device a new communicator stands for: the calling thread's
/// current CUDA device (what NCCL takes from `cudaGetDevice`), else 0.
pub(crate) fn current_device() -> c_int {
    #[cfg(feature = "cuda")]
    {
        nccl_rs::cuda::current_device().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The devices of `ncclCommInitAll`'s ranks. With a CUDA driver several
/// ranks may share one device (unlike NCCL): `devlist` NULL gives rank i
/// device `i % count`, and `devlist` entries may repeat. Without one they
/// must be distinct. Either way they only say what `ncclCommCuDevice`
/// reports: staging runs in the context of each call's stream or buffer.
pub(crate) fn initall_devices(n: usize, devlist: Option<&[c_int]>) -> FfiResult<Vec<c_int>> {
    use crate::error::{invalid, usage};
    #[cfg(feature = "cuda")]
    if let Ok(count) = nccl_rs::cuda::device_count() {
        let count = c_int::try_from(count).unwrap_or(c_int::MAX);
        let devices: Vec<c_int> = match devlist {
            None => (0..n).map(|i| (i as c_int) % count).collect(),
            Some(d) => d.to_vec(),
        };
        for (i, d) in devices.iter().enumerate() {
            if *d < 0 {
                return Err(invalid(format!(
                    "ncclCommInitAll: devlist[{i}] = {d} is negative"
                )));
            }
            if *d >= count {
                tracing::warn!(
                    "ncclCommInitAll: devlist[{i}] = {d} is not a visible CUDA device (0..{count}); \
                     it is only reported by ncclCommCuDevice"
                );
            }
        }
        tracing::info!("ncclCommInitAll: {n} ranks on CUDA devices {devices:?}");
        return Ok(devices);
    }
    let devices: Vec<c_int> = match devlist {
        None => (0..n as c_int).collect(),
        Some(d) => d.to_vec(),
    };
    for (i, d) in devices.iter().enumerate() {
        if *d < 0 {
            return Err(invalid(format!(
                "ncclCommInitAll: devlist[{i}] = {d} is negative"
            )));
        }
        if devices[..i].contains(d) {
            return Err(usage(format!(
                "ncclCommInitAll: device {d} appears twice in devlist"
            )));
        }
    }
    Ok(devices)
}

/// `ncclMemAlloc` in device mode: device memory when a GPU is usable
/// (`None`: use host memory).
pub(crate) fn mem_alloc(size: usize) -> Option<FfiResult<*mut std::ffi::c_void>> {
    #[cfg(feature = "cuda")]
    if nccl_rs::cuda::available() {
        return Some(nccl_rs::cuda::device_alloc(size).map_err(|e| e.into_error(0)));
    }
    let _ = size;
    None
}

/// `ncclMemFree` of memory from [`mem_alloc`].
///
/// # Safety
/// `p` came from [`mem_alloc`] and is freed once.
pub(crate) unsafe fn mem_free(p: *mut std::ffi::c_void) -> FfiResult<()> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: forwarded contract.
        unsafe { nccl_rs::cuda::device_free(p) }.map_err(|e| e.into_error(0))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = p;
        Ok(())
    }
}

/// `ncclCommRegister` of device memory: logs (INFO) how it would reach the
/// network. This build's network is TCP sockets, so it is staged.
pub(crate) fn note_registration(buff: *const std::ffi::c_void, size: usize) {
    #[cfg(feature = "cuda")]
    if nccl_rs::cuda::classify(buff) != nccl_rs::cuda::MemKind::Host {
        match nccl_rs::cuda::gdr::GdrConfig::from_env() {
            // SAFETY: the application registers memory it owns; with
            // `rdma_nic` false nothing is exported.
            Ok(cfg) => drop(unsafe { nccl_rs::cuda::gdr::choose(buff, size, &cfg, false, None) }),
            Err(e) => tracing::warn!("ncclCommRegister: {e}"),
        }
    }
    let _ = (buff, size);
}
