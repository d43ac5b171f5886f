//! The collectives, `ncclSend` and `ncclRecv`. Each entry point checks its
//! arguments (with NCCL's count meanings), builds one `Work` and issues
//! it; nothing else happens here (as NCCL's `collectives.cc`). The
//! `cudaStream_t` travels with the work: with the `cuda` feature, work on
//! device memory is ordered on it (`device.rs`); otherwise it is unused.

use crate::comm::CommShared;
use crate::error::{invalid, FfiResult};
use crate::group::{code, issue};
use crate::handle::lookup;
use crate::panic::nccl_api;
use crate::redop::OpChoice;
use crate::types::{cudaStream_t, ncclCollConfig_t, ncclComm_t, ncclResult_t, NCCL_API_MAGIC};
use crate::work::{sizes, CollWork, P2pWork, Work};
use nccl_rs::comm::raw::{RawColl, RawP2p};
use nccl_rs::{DataType, RedOp};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

fn dtype_of(name: &str, dtype: c_int) -> FfiResult<DataType> {
    DataType::from_raw(dtype).ok_or_else(|| {
        invalid(format!(
            "{name}: invalid datatype {dtype} (ncclDataType_t is 0..=11)"
        ))
    })
}

fn check_buf(
    name: &str,
    what: &str,
    p: *const c_void,
    bytes: usize,
    dtype: DataType,
    rank: usize,
) -> FfiResult<()> {
    if bytes > 0 && p.is_null() {
        return Err(invalid(format!(
            "{name}: {what} is NULL but rank {rank} uses {bytes} bytes of it"
        )));
    }
    // Element sizes are powers of two.
    if bytes > 0 && (p as usize) & (dtype.size() - 1) != 0 {
        return Err(invalid(format!(
            "{name}: {what} {p:?} is not aligned for {dtype}"
        )));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn collective(
    name: &str,
    coll: RawColl,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> FfiResult<ncclResult_t> {
    let shared: Arc<CommShared> = lookup(comm)?;
    let dtype = dtype_of(name, dtype)?;
    let op = match op {
        Some(op) => shared.red_ops().resolve(op, dtype).map_err(|e| match e {
            nccl_rs::Error::InvalidArgument(m) => invalid(format!("{name}: {m}")),
            other => other,
        })?,
        None => OpChoice::Builtin(RedOp::Sum),
    };
    let rooted = matches!(
        coll,
        RawColl::Broadcast | RawColl::Reduce | RawColl::Gather | RawColl::Scatter
    );
    let root_ok = |n: usize| usize::try_from(root).ok().filter(|&r| r < n);
    let root = match shared.ident_if_known() {
        Some((rank, n)) => {
            let root = match (rooted, root_ok(n)) {
                (true, None) => {
                    return Err(invalid(format!("{name}: root {root} is not a rank of {n}")))
                }
                (_, r) => r.unwrap_or(0),
            };
            let (sb, rb) = sizes(coll, rank, n, root, count, dtype.size()).ok_or_else(|| {
                invalid(format!(
                    "{name}: count {count} of {dtype} overflows the address space"
                ))
            })?;
            check_buf(name, "sendbuff", send, sb, dtype, rank)?;
            check_buf(name, "recvbuff", recv, rb, dtype, rank)?;
            root
        }
        None if rooted && root < 0 => {
            return Err(invalid(format!("{name}: root {root} is negative")))
        }
        None => usize::try_from(root).unwrap_or(0),
    };
    let work = CollWork {
        coll,
        send: send.cast(),
        recv: recv.cast(),
        count,
        dtype,
        op,
        root,
        stream: stream as usize,
    };
    issue(&shared, Work::Coll(work))
}

#[allow(clippy::too_many_arguments)]
fn p2p(
    name: &str,
    is_send: bool,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> FfiResult<ncclResult_t> {
    let shared = lookup(comm)?;
    let dtype = dtype_of(name, dtype)?;
    let bytes = count
        .checked_mul(dtype.size())
        .ok_or_else(|| invalid(format!("{name}: count {count} overflows")))?;
    let n = shared.ident_if_known().map_or(usize::MAX, |i| i.1);
    let peer = usize::try_from(peer)
        .ok()
        .filter(|&p| p < n)
        .ok_or_else(|| invalid(format!("{name}: peer {peer} is not a rank of {n}")))?;
    let rank = shared.ident_if_known().map_or(0, |i| i.0);
    check_buf(
        name,
        if is_send { "sendbuff" } else { "recvbuff" },
        buf,
        bytes,
        dtype,
        rank,
    )?;
    issue(
        &shared,
        Work::P2p(vec![P2pWork {
            op: RawP2p {
                is_send,
                peer,
                ptr: buf.cast(),
                bytes,
            },
            stream: stream as usize,
        }]),
    )
}

/// Checks an `ncclCollConfig_t` (NULL allowed); its hints are ignored.
///
/// # Safety
/// `config` is NULL or readable for at least its 16-byte header.
unsafe fn check_coll_config(name: &str, config: *const ncclCollConfig_t) -> FfiResult<()> {
    if config.is_null() {
        return Ok(());
    }
    // SAFETY: non-NULL and readable (contract); every layout starts with
    // size, magic and version.
    let magic = unsafe { std::ptr::addr_of!((*config).magic).read_unaligned() };
    if magic != NCCL_API_MAGIC {
        return Err(invalid(format!(
            "{name}: ncclCollConfig_t not initialized with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    Ok(())
}

const RS: RawColl = RawColl::ReduceScatter;

nccl_api! {
    /// Reduce to `root`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclReduce", RawColl::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream))
    }

    /// In-place broadcast from `root`.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclBcast", RawColl::Broadcast, buff, buff, count, datatype, None, root, comm, stream))
    }

    /// Broadcast from `root`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclBroadcast", RawColl::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream))
    }

    /// All-reduce.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclAllReduce", RawColl::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream))
    }

    /// Reduce-scatter (`recvcount` elements per rank).
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclReduceScatter", RS, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream))
    }

    /// All-gather (`sendcount` elements per rank).
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclAllGather", RawColl::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream))
    }

    /// All-to-all (`count` elements to and from each rank).
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclAlltoAll", RawColl::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, comm, stream))
    }

    /// Gather to `root`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclGather", RawColl::Gather, sendbuff, recvbuff, count, datatype, None, root, comm, stream))
    }

    /// Scatter from `root`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(collective("ncclScatter", RawColl::Scatter, sendbuff, recvbuff, count, datatype, None, root, comm, stream))
    }

    /// Sends `count` elements to `peer`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(p2p("ncclSend", true, sendbuff.cast_mut(), count, datatype, peer, comm, stream))
    }

    /// Receives `count` elements from `peer`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        code(p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream))
    }

    /// [`ncclAllReduce`] with a per-call config (hints ignored).
    fn ncclAllReduceConfig / pncclAllReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclAllReduceConfig", config) }.and_then(|()| {
            collective("ncclAllReduceConfig", RawColl::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream)
        }))
    }

    /// [`ncclBroadcast`] with a per-call config (hints ignored).
    fn ncclBroadcastConfig / pncclBroadcastConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclBroadcastConfig", config) }.and_then(|()| {
            collective("ncclBroadcastConfig", RawColl::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
        }))
    }

    /// [`ncclReduce`] with a per-call config (hints ignored).
    fn ncclReduceConfig / pncclReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclReduceConfig", config) }.and_then(|()| {
            collective("ncclReduceConfig", RawColl::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream)
        }))
    }

    /// [`ncclAllGather`] with a per-call config (hints ignored).
    fn ncclAllGatherConfig / pncclAllGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: ncclComm_t,
        stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclAllGatherConfig", config) }.and_then(|()| {
            collective("ncclAllGatherConfig", RawColl::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream)
        }))
    }

    /// [`ncclReduceScatter`] with a per-call config (hints ignored).
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclReduceScatterConfig", config) }.and_then(|()| {
            collective("ncclReduceScatterConfig", RS, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream)
        }))
    }

    /// [`ncclAlltoAll`] with a per-call config (hints ignored).
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: ncclComm_t,
        stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclAlltoAllConfig", config) }.and_then(|()| {
            collective("ncclAlltoAllConfig", RawColl::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, comm, stream)
        }))
    }

    /// [`ncclGather`] with a per-call config (hints ignored).
    fn ncclGatherConfig / pncclGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclGatherConfig", config) }.and_then(|()| {
            collective("ncclGatherConfig", RawColl::Gather, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
        }))
    }

    /// [`ncclScatter`] with a per-call config (hints ignored).
    fn ncclScatterConfig / pncclScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: `config` is NULL or a readable ncclCollConfig_t (contract).
        code(unsafe { check_coll_config("ncclScatterConfig", config) }.and_then(|()| {
            collective("ncclScatterConfig", RawColl::Scatter, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
        }))
    }
}
