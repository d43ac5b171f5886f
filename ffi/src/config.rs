//! Reading `ncclConfig_t` and the environment into the settings of one
//! communicator.
//!
//! A caller's `ncclConfig_t` may come from an older NCCL header, whose
//! struct is shorter: fields are appended release after release. So the
//! struct is never read as a whole; each field is read only if it lies
//! inside the caller's `size` bytes, and `version` must be at least 2.14
//! (the first release with a config).

use crate::error::{invalid, FfiResult};
use crate::types::{ncclConfig_t, NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT};
use nccl_rs::Config;
use std::ffi::{c_char, c_int, CStr};
use std::mem::{offset_of, size_of};

/// The settings of one communicator.
#[derive(Clone, Debug)]
pub(crate) struct CommSettings {
    /// The core's configuration (`NCCL_*` environment, plus `netName`).
    pub(crate) core: Config,
    /// Whether calls complete before returning.
    pub(crate) blocking: bool,
    /// `commName`, for logs.
    pub(crate) name: Option<String>,
}

/// The first NCCL release with `ncclConfig_t` (2.14.0).
const FIRST_CONFIG_VERSION: u32 = 21400;
/// The smallest layout: 2.14's, ending with `netName`.
const MIN_SIZE: usize = offset_of!(ncclConfig_t, netName) + size_of::<*const c_char>();

/// Reads the environment into the core `Config` (`NCCL_COMM_BLOCKING`
/// included).
pub(crate) fn from_env() -> FfiResult<CommSettings> {
    let core = Config::from_env()?;
    Ok(CommSettings {
        blocking: core.comm_blocking.unwrap_or(true),
        core,
        name: None,
    })
}

/// Reads one field of `cfg` if it lies within `size` bytes.
///
/// # Safety
/// `cfg` must be valid for reads of `size` bytes.
unsafe fn field<T: Copy>(cfg: *const ncclConfig_t, offset: usize, size: usize) -> Option<T> {
    if offset + size_of::<T>() > size {
        return None;
    }
    // SAFETY: the field lies inside the `size` readable bytes (checked
    // above); `read_unaligned` needs no alignment.
    Some(unsafe { cfg.cast::<u8>().add(offset).cast::<T>().read_unaligned() })
}

/// Reads a NUL-terminated string field.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Applies a caller's `ncclConfig_t` (NULL: none) over `base`.
///
/// # Safety
/// `cfg` is NULL or points to a struct made from `NCCL_CONFIG_INITIALIZER`
/// of some NCCL header, readable for its `size` bytes, whose string fields
/// are NULL or NUL-terminated.
pub(crate) unsafe fn apply(
    mut base: CommSettings,
    cfg: *const ncclConfig_t,
) -> FfiResult<CommSettings> {
    if cfg.is_null() {
        return Ok(base);
    }
    // SAFETY: every layout begins with size, magic and version (16 bytes).
    let (size, magic, version) = unsafe {
        (
            field::<usize>(cfg, offset_of!(ncclConfig_t, size), 16).unwrap_or(0),
            field::<u32>(cfg, offset_of!(ncclConfig_t, magic), 16).unwrap_or(0),
            field::<u32>(cfg, offset_of!(ncclConfig_t, version), 16).unwrap_or(0),
        )
    };
    if magic != NCCL_API_MAGIC {
        return Err(invalid(format!(
            "ncclConfig_t has magic {magic:#x}, not {NCCL_API_MAGIC:#x}: initialize it with NCCL_CONFIG_INITIALIZER"
        )));
    }
    if version < FIRST_CONFIG_VERSION {
        return Err(invalid(format!(
            "ncclConfig_t version {version} predates NCCL 2.14, the first with a config"
        )));
    }
    if size < MIN_SIZE {
        return Err(invalid(format!(
            "ncclConfig_t size {size} is below the smallest layout ({MIN_SIZE} bytes)"
        )));
    }
    // SAFETY: `size` bytes are readable by the caller's contract; `field`
    // reads nothing beyond them.
    let (blocking, net, name) = unsafe {
        (
            field::<c_int>(cfg, offset_of!(ncclConfig_t, blocking), size),
            field::<*const c_char>(cfg, offset_of!(ncclConfig_t, netName), size),
            field::<*const c_char>(cfg, offset_of!(ncclConfig_t, commName), size),
        )
    };
    match blocking {
        None | Some(NCCL_CONFIG_UNDEF_INT) => {}
        Some(0) => base.blocking = false,
        Some(1) => base.blocking = true,
        Some(v) => {
            return Err(invalid(format!(
                "ncclConfig_t.blocking is {v}: expected 0 or 1"
            )))
        }
    }
    // `NCCL_COMM_BLOCKING` overrides the config's `blocking`, as in NCCL.
    if let Some(b) = base.core.comm_blocking {
        base.blocking = b;
    }
    // SAFETY: string fields are NULL or NUL-terminated (caller's contract).
    if let Some(net) = unsafe { text(net.unwrap_or(std::ptr::null())) } {
        if !net.eq_ignore_ascii_case("socket") {
            return Err(invalid(format!(
                "ncclConfig_t.netName {net:?} is not available: this build has \"Socket\""
            )));
        }
        base.core.net = Some(net);
    }
    // SAFETY: as above.
    if let Some(name) = unsafe { text(name.unwrap_or(std::ptr::null())) } {
        base.name = Some(name);
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initializer() -> ncclConfig_t {
        let u = NCCL_CONFIG_UNDEF_INT;
        let null = std::ptr::null();
        ncclConfig_t {
            size: size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: 23007,
            blocking: u,
            cgaClusterSize: u,
            minCTAs: u,
            maxCTAs: u,
            netName: null,
            splitShare: u,
            trafficClass: u,
            commName: null,
            collnetEnable: u,
            CTAPolicy: u,
            shrinkShare: u,
            nvlsCTAs: u,
            nChannelsPerNetPeer: u,
            nvlinkCentricSched: u,
            graphUsageMode: u,
            numRmaCtx: u,
            maxP2pPeers: u,
            graphStreamOrdering: u,
            launchOrderImplicit: u,
            numRmaSig: u,
            rmaEagerInit: u,
            hostCftMode: u,
            nvlsHostMode: u,
        }
    }

    fn base() -> CommSettings {
        CommSettings {
            core: Config::default(),
            blocking: true,
            name: None,
        }
    }

    #[test]
    fn reads_only_inside_size() {
        let mut c = initializer();
        c.blocking = 0;
        c.commName = c"ignored: beyond size".as_ptr();
        c.size = MIN_SIZE; // a 2.14 layout: commName is not there
        c.version = 21400;
        // SAFETY: `c` is a whole struct, readable for more than `size`.
        let s = unsafe { apply(base(), &c) }.unwrap();
        assert!(!s.blocking);
        assert_eq!(s.name, None);
        c.size = size_of::<ncclConfig_t>();
        // SAFETY: as above.
        let s = unsafe { apply(base(), &c) }.unwrap();
        assert_eq!(s.name.as_deref(), Some("ignored: beyond size"));
    }

    #[test]
    fn nccl_comm_blocking_overrides_the_config_and_rejects_garbage() {
        let of = |v: &str| Config::from_lookup(|k| (k == "NCCL_COMM_BLOCKING").then(|| v.into()));
        assert_eq!(of("0").unwrap().comm_blocking, Some(false));
        assert_eq!(of(" 1 ").unwrap().comm_blocking, Some(true));
        assert_eq!(of("").unwrap().comm_blocking, None, "empty: unset");
        for v in ["yes", "2", "-1", "true"] {
            let e = of(v).unwrap_err().to_string();
            assert!(e.contains("NCCL_COMM_BLOCKING"), "{v:?}: {e}");
        }
        let mut set = base();
        set.core.comm_blocking = Some(false);
        let mut c = initializer();
        c.blocking = 1;
        // SAFETY: `c` is a whole struct.
        assert!(!unsafe { apply(set, &c) }.unwrap().blocking);
    }

    #[test]
    fn rejects_uninitialized_and_bad_values() {
        let mut c = initializer();
        c.magic = 0;
        // SAFETY: `c` is a whole struct.
        assert!(unsafe { apply(base(), &c) }.is_err());
        let mut c = initializer();
        c.blocking = 7;
        // SAFETY: as above.
        assert!(unsafe { apply(base(), &c) }.is_err());
        let mut c = initializer();
        c.netName = c"IB".as_ptr();
        // SAFETY: as above.
        assert!(unsafe { apply(base(), &c) }.is_err());
    }
}
