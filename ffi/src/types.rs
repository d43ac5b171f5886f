//! The C types of `nccl.h`, with the same layouts and values.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclResult_t`. A transparent `int`, so values the C side invents (a
/// corrupted or future code) can be received without undefined behaviour.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclResult_t(pub c_int);

impl ncclResult_t {
    /// `ncclSuccess`.
    pub const Success: Self = Self(0);
    /// `ncclUnhandledCudaError`.
    pub const UnhandledCudaError: Self = Self(1);
    /// `ncclSystemError`.
    pub const SystemError: Self = Self(2);
    /// `ncclInternalError`.
    pub const InternalError: Self = Self(3);
    /// `ncclInvalidArgument`.
    pub const InvalidArgument: Self = Self(4);
    /// `ncclInvalidUsage`.
    pub const InvalidUsage: Self = Self(5);
    /// `ncclRemoteError`.
    pub const RemoteError: Self = Self(6);
    /// `ncclInProgress`.
    pub const InProgress: Self = Self(7);
    /// `ncclTimeout`.
    pub const Timeout: Self = Self(8);
    /// `ncclNumResults`.
    pub const NumResults: Self = Self(9);
}

/// The opaque communicator type of `ncclComm_t`. C sees only a pointer;
/// what it points to is private to the library (see `handle.rs`).
#[repr(C)]
pub struct ncclComm {
    _private: [u8; 0],
}

/// `ncclComm_t`.
pub type ncclComm_t = *mut ncclComm;

/// `cudaStream_t`: ignored (host memory).
pub type cudaStream_t = *mut c_void;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The opaque bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `NCCL_API_MAGIC`.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `ncclNumOps`: the first id of a user-created reduction.
pub const ncclNumOps: c_int = 5;
/// `ncclMaxRedOp` (with a 4-byte enum).
pub const ncclMaxRedOp: c_int = c_int::MAX;

/// `ncclConfig_t`, newest layout. Only the leading `size` bytes of a
/// caller's struct may be read (see `config.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

/// `ncclConfigExt_t` (only passed through).
#[repr(C)]
#[allow(missing_docs)]
pub struct ncclConfigExt_t {
    pub next: *mut ncclConfigExt_t,
    pub vendorId: c_int,
    pub optionId: c_int,
    pub val: *mut c_void,
}

/// `ncclCollConfig_t`.
#[repr(C)]
#[allow(missing_docs)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut ncclConfigExt_t,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[allow(missing_docs)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[allow(missing_docs)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}

/// `ncclWindow_t` (opaque).
pub type ncclWindow_t = *mut c_void;
/// `ncclParamHandle_t` (opaque).
pub type ncclParamHandle_t = *mut c_void;

/// `ncclScalarDevice`.
pub const ncclScalarDevice: c_int = 0;
/// `ncclScalarHostImmediate`.
pub const ncclScalarHostImmediate: c_int = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets a 64-bit Linux C compiler gives the header's structs.
    #[test]
    fn layouts_match_the_header() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, splitShare), 40);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, numRmaCtx), 84);
        assert_eq!(offset_of!(ncclConfig_t, nvlsHostMode), 112);
        assert_eq!(size_of::<ncclConfig_t>(), 120);
        assert_eq!(size_of::<ncclCollConfig_t>(), 64);
    }
}
