//! What `libnccl.so.2` exports, its SONAME and what it loads.

use crate::{lib_dir, tool_output};

/// Every function of nccl.h (each must also exist with a `p` prefix).
const API: &[&str] = &[
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommRevoke",
    "ncclCommSplit",
    "ncclCommShrink",
    "ncclCommGetUniqueId",
    "ncclCommGrow",
    "ncclCommInitRankScalable",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommRegister",
    "ncclCommDeregister",
    "ncclCommSuspend",
    "ncclCommResume",
    "ncclCommMemStats",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
    "ncclWinGetUserPtr",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclBcast",
    "ncclBroadcast",
    "ncclAllReduce",
    "ncclReduceScatter",
    "ncclAllGather",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclAllReduceConfig",
    "ncclBroadcastConfig",
    "ncclReduceConfig",
    "ncclAllGatherConfig",
    "ncclReduceScatterConfig",
    "ncclAlltoAllConfig",
    "ncclGatherConfig",
    "ncclScatterConfig",
    "ncclSend",
    "ncclRecv",
    "ncclPutSignal",
    "ncclSignal",
    "ncclWaitSignal",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclParamBind",
    "ncclParamGetI8",
    "ncclParamGetI16",
    "ncclParamGetI32",
    "ncclParamGetI64",
    "ncclParamGetU8",
    "ncclParamGetU16",
    "ncclParamGetU32",
    "ncclParamGetU64",
    "ncclParamGetStr",
    "ncclParamGet",
    "ncclParamGetParameter",
    "ncclParamGetAllParameterKeys",
    "ncclParamDumpAll",
    "ncclResetDebugInit",
];

#[test]
fn exports_only_nccl_names_with_soname_and_no_rdma_or_cuda() {
    let lib = lib_dir().join("libnccl.so.2");
    let nm = tool_output("nm", &["-D", "--defined-only"], &lib);
    let names: Vec<&str> = nm
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let stray: Vec<&&str> = names
        .iter()
        .filter(|n| !n.starts_with("nccl") && !n.starts_with("pnccl"))
        .collect();
    assert!(
        stray.is_empty(),
        "exported symbols other than nccl*/pnccl*: {stray:?}"
    );
    for f in API {
        assert!(names.contains(f), "{f} is not exported");
        let p = format!("p{f}");
        assert!(names.contains(&p.as_str()), "{p} is not exported");
    }
    assert_eq!(names.len(), 2 * API.len(), "exports: {names:?}");
    let dynamic = tool_output("readelf", &["-d"], &lib);
    assert!(
        dynamic.contains("Library soname: [libnccl.so.2]"),
        "SONAME:\n{dynamic}"
    );
    let ldd = tool_output("ldd", &[], &lib);
    for bad in ["libibverbs", "libcuda", "libcudart", "libmlx5", "librdmacm"] {
        assert!(!ldd.contains(bad), "libnccl.so.2 loads {bad}:\n{ldd}");
    }
}
