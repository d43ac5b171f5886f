//! Creating communicators: `ncclGetUniqueId`, `ncclCommInitRank*`,
//! `ncclCommInitAll` and `ncclCommSplit`.
//!
//! A handle is written only once its call succeeded. For a blocking
//! communicator outside a group that means after the init finished; inside
//! a group, or for a non-blocking communicator, the call succeeds by
//! queueing the init, so the handle is written at once and the init
//! finishes at `ncclGroupEnd` or in the background (as in NCCL).

use crate::comm::CommShared;
use crate::config;
use crate::error::{invalid, usage, FfiResult};
use crate::group::{code, issue};
use crate::handle::{lookup, new_handle};
use crate::panic::nccl_api;
use crate::types::{
    ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId, NCCL_SPLIT_NOCOLOR, NCCL_UNIQUE_ID_BYTES,
};
use crate::work::{SplitChild, Work};
use nccl_rs::{Communicator, Error, UniqueId};
use std::ffi::c_int;
use std::sync::Arc;

fn id_bytes(id: &ncclUniqueId) -> [u8; NCCL_UNIQUE_ID_BYTES] {
    id.internal.map(|c| c as u8)
}

fn get_unique_id(out: *mut ncclUniqueId) -> FfiResult<ncclResult_t> {
    if out.is_null() {
        return Err(invalid("ncclGetUniqueId: uniqueId is NULL"));
    }
    let settings = config::from_env()?;
    // With NCCL_COMM_ID every rank may ask for the id (that is its point),
    // so only rank 0's init starts the root there (see `init_rank`), as
    // NCCL does. Otherwise the root starts here, in the caller's process.
    let id = match &settings.core.comm_id {
        Some(addr) => UniqueId::from_rendezvous(addr, &settings.core),
        None => UniqueId::new(&settings.core),
    };
    let id = id.map_err(|source| Error::Bootstrap { rank: 0, source })?;
    let internal = id.to_bytes().map(|b| b as std::ffi::c_char);
    // SAFETY: `out` is non-NULL and points to an ncclUniqueId (contract).
    unsafe { out.write(ncclUniqueId { internal }) };
    Ok(ncclResult_t::Success)
}

/// # Safety
/// `out` is NULL or writable; `config` as for [`config::apply`].
unsafe fn init_rank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> FfiResult<ncclResult_t> {
    if out.is_null() {
        return Err(invalid(
            "ncclCommInitRank: comm (the output pointer) is NULL",
        ));
    }
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| invalid(format!("ncclCommInitRank: nranks {nranks} < 1")))?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| invalid(format!("ncclCommInitRank: rank {rank} is not in 0..{n}")))?;
    // SAFETY: forwarded contract.
    let settings = unsafe { config::apply(config::from_env()?, config) }?;
    let uid = UniqueId::from_bytes(&id_bytes(id))
        .map_err(|source| Error::Bootstrap { rank: r, source })?;
    if r == 0 {
        start_comm_id_root(&settings, &uid, n)
            .map_err(|source| Error::Bootstrap { rank: r, source })?;
    }
    let shared = CommShared::new(settings, Some((r, n)), crate::device::current_device());
    let res = issue(&shared, Work::Init(uid))?;
    // SAFETY: `out` is non-NULL and writable (contract).
    unsafe { out.write(new_handle(shared)) };
    Ok(res)
}

/// Rank 0 starts the root of an `NCCL_COMM_ID` id (one made by
/// `ncclGetUniqueId` from that variable: same address, no secret).
fn start_comm_id_root(
    settings: &config::CommSettings,
    id: &UniqueId,
    nranks: usize,
) -> Result<(), nccl_rs::error::BootstrapError> {
    let Some(addr) = &settings.core.comm_id else {
        return Ok(());
    };
    let env_id = UniqueId::from_rendezvous(addr, &settings.core)?;
    if env_id == *id {
        id.start_root_for_job(&settings.core, nranks)?;
    }
    Ok(())
}

fn init_all(out: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> FfiResult<ncclResult_t> {
    if out.is_null() {
        return Err(invalid("ncclCommInitAll: comm (the output array) is NULL"));
    }
    let n = usize::try_from(ndev)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| invalid(format!("ncclCommInitAll: ndev {ndev} < 1")))?;
    let listed = (!devlist.is_null()).then(|| {
        // SAFETY: a non-NULL devlist has ndev entries (contract).
        unsafe { std::slice::from_raw_parts(devlist, n) }
    });
    let devices = crate::device::initall_devices(n, listed)?;
    let settings = config::from_env()?;
    let id =
        UniqueId::new(&settings.core).map_err(|source| Error::Bootstrap { rank: 0, source })?;
    let results: Vec<FfiResult<Communicator>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..n)
            .map(|rank| {
                let (id, cfg) = (&id, &settings.core);
                std::thread::Builder::new()
                    .name(format!("nccl-init-{rank}"))
                    .spawn_scoped(s, move || Communicator::init(id, n, rank, cfg))
                    .map_err(|e| Error::System {
                        rank,
                        what: "starting an init thread".into(),
                        source: e,
                    })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.and_then(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(usage("an init thread panicked")))
                })
            })
            .collect()
    });
    let mut comms = Vec::with_capacity(n);
    for r in results {
        comms.push(r?);
    }
    for (i, (core, dev)) in comms.into_iter().zip(devices).enumerate() {
        let shared = CommShared::with_core(settings.clone(), core, dev);
        // SAFETY: `out` has room for ndev handles (contract).
        unsafe { out.add(i).write(new_handle(shared)) };
    }
    Ok(ncclResult_t::Success)
}

/// # Safety
/// `newcomm` is NULL or writable; `config` as for [`config::apply`].
unsafe fn split(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *const ncclConfig_t,
) -> FfiResult<ncclResult_t> {
    let parent = lookup(comm)?;
    if newcomm.is_null() {
        return Err(invalid("ncclCommSplit: newcomm is NULL"));
    }
    let color = match color {
        NCCL_SPLIT_NOCOLOR => None,
        c => Some(u32::try_from(c).map_err(|_| {
            invalid(format!(
                "ncclCommSplit: color {c} is negative and not NCCL_SPLIT_NOCOLOR"
            ))
        })?),
    };
    // SAFETY: forwarded contract.
    let settings = unsafe { config::apply(parent.settings.clone(), config) }?;
    let child = color.map(|_| {
        let c = CommShared::new(settings, None, parent.device);
        c.begin(1);
        c
    });
    let res = issue(
        &parent,
        Work::Split {
            color,
            key,
            child: child.clone().map(|c| -> Arc<dyn SplitChild> { c }),
        },
    )?;
    let handle = child.map_or(std::ptr::null_mut(), new_handle);
    // SAFETY: `newcomm` is non-NULL and writable (contract).
    unsafe { newcomm.write(handle) };
    Ok(res)
}

nccl_api! {
    /// Creates a unique id and starts its rendezvous root in this process.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        code(get_unique_id(uniqueId))
    }

    /// Joins a job as `rank` of `nranks`.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t {
        // SAFETY: forwarded contract; no config.
        code(unsafe { init_rank(comm, nranks, &commId, rank, std::ptr::null()) })
    }

    /// Joins a job with a configuration.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: forwarded contract.
        code(unsafe { init_rank(comm, nranks, &commId, rank, config) })
    }

    /// Joins a job given several ids; rendezvous goes through the first.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        if nId < 1 || commIds.is_null() {
            return code(Err(invalid(format!("ncclCommInitRankScalable: need nId >= 1 ids (nId {nId}, commIds {commIds:?})"))));
        }
        // SAFETY: commIds is non-NULL and holds nId >= 1 ids (contract).
        let first = unsafe { commIds.read() };
        // SAFETY: forwarded contract.
        code(unsafe { init_rank(newcomm, nranks, &first, myrank, config) })
    }

    /// Creates `ndev` communicators of one job in this process.
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
        code(init_all(comm, ndev, devlist))
    }

    /// Splits `comm` by color and key.
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: forwarded contract.
        code(unsafe { split(comm, color, key, newcomm, config) })
    }
}
