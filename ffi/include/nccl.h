/*
 * nccl.h -- the C interface of nccl-rs, a collective communication library
 * with NVIDIA NCCL's semantics. This header is written for nccl-rs; it
 * carries NCCL's public names, function signatures, enum values and struct
 * layouts, so that a program written against NVIDIA's nccl.h compiles and
 * links against libnccl.so.2 from nccl-rs without source changes.
 *
 * Version: NCCL 2.30 API level. The types follow the newest public NCCL
 * header (a superset of 2.30's); ncclConfig_t is append-only and is read
 * through its `size` field, so programs built against older, shorter
 * layouts keep working.
 *
 * HOST-MEMORY SEMANTICS (no `cuda` feature yet)
 *   - Every buffer argument is HOST memory. The cudaStream_t argument is
 *     accepted and ignored.
 *   - Blocking communicators (the default) finish an operation before the
 *     call returns, or at the outermost ncclGroupEnd() when the call was
 *     made inside a group. Buffers may be reused as soon as that returns.
 *   - Non-blocking communicators (config.blocking = 0, or the environment
 *     variable NCCL_COMM_BLOCKING=0, which overrides the config) return
 *     ncclInProgress from init, split, collectives and ncclGroupEnd; the
 *     work runs on one background thread per communicator, in issue order.
 *     Poll ncclCommGetAsyncError() until it reports ncclSuccess (or an
 *     error) before touching the buffers or using a new communicator.
 *   - One thread driving several communicators (ncclCommInitAll style) must
 *     put the calls for all of them between ncclGroupStart/ncclGroupEnd, as
 *     NCCL documents: the group runs each communicator's work concurrently.
 *     Inside a group, collectives of a communicator run in issue order, and
 *     all its ncclSend/ncclRecv run together after them, so send/recv rings
 *     cannot deadlock.
 *   - ncclMemAlloc returns 64-byte aligned host memory. ncclCommRegister
 *     accepts any buffer and returns a handle; registration changes nothing
 *     for host memory.
 *   - ncclCommCuDevice reports the device index the communicator stands for:
 *     devlist[i] (or i) for ncclCommInitAll, 0 otherwise. No CUDA device is
 *     used.
 *   - Functions that are declared here but not implemented yet return
 *     ncclInvalidUsage, and ncclGetLastError() names the missing feature.
 *     None of them reports success without doing its job.
 *
 * ERRORS
 *   Every function returns an ncclResult_t. On failure ncclGetLastError()
 *   gives a full message (naming the rank, peer and operation where they
 *   apply). The message is kept per thread; ncclCommGetAsyncError() also
 *   copies a communicator's background error there. Output arguments are
 *   written only on success (and, for ncclInProgress, the new handle).
 *   Bad handles, including a communicator used after ncclCommDestroy or
 *   ncclCommAbort, give ncclInvalidArgument instead of a crash.
 *
 * ENVIRONMENT
 *   NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE control logging (through
 *   Rust's `tracing`); NCCL_COMM_ID, NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY,
 *   NCCL_RS_TIMEOUT, NCCL_RS_BOOTSTRAP_TIMEOUT, NCCL_BUFFSIZE and the other settings
 *   of nccl-rs' Config are read at init.
 */

#ifndef NCCL_H_
#define NCCL_H_

/* ---- CUDA types ----------------------------------------------------------
 * With CUDA's headers included first, their cudaStream_t is used. Without
 * them, cudaStream_t is declared here as the same opaque pointer type CUDA
 * uses, so including cuda_runtime.h afterwards is also fine. */
#if !defined(__CUDA_RUNTIME_H__) && !defined(CUDART_VERSION) && !defined(NCCL_RS_CUDA_STREAM_DECLARED)
#define NCCL_RS_CUDA_STREAM_DECLARED 1
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
#endif

/* ---- Version ------------------------------------------------------------- */
#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

/* Versions up to 2.8 were coded X*1000 + Y*100 + Z, later ones
 * X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 23007

/* Set by this header only: lets a program tell nccl-rs from NVIDIA's NCCL. */
#define NCCL_RS 1

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Handles and ids ----------------------------------------------------- */

/* A communicator: an opaque pointer owned by the library. */
typedef struct ncclComm* ncclComm_t;
/* A registered memory window (window functions are not implemented yet). */
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* The rendezvous token. Create it with ncclGetUniqueId on one rank and give
 * the same bytes to every rank (the bytes are opaque). */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ---- Result codes ---------------------------------------------------------- */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1, /* never returned without CUDA */
  ncclSystemError = 2,        /* a system call failed (socket, thread, memory) */
  ncclInternalError = 3,      /* a bug in the library (including a caught panic) */
  ncclInvalidArgument = 4,    /* a bad argument: NULL pointer, bad count/type/op/root, dead handle */
  ncclInvalidUsage = 5,       /* bad call sequence, mismatched calls, or an unimplemented function */
  ncclRemoteError = 6,        /* a peer left or the network failed */
  ncclInProgress = 7,         /* a non-blocking operation is still running */
  ncclTimeout = 8,            /* a deadline (NCCL_RS_TIMEOUT, NCCL_RS_BOOTSTRAP_TIMEOUT) passed */
  ncclNumResults = 9
} ncclResult_t;

/* ---- Configuration constants ---------------------------------------------- */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* The magic value NCCL_CONFIG_INITIALIZER puts in ncclConfig_t.magic. */
#define NCCL_API_MAGIC 0xcafebeef

/* Window registration flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* CTA policy flags (GPU tuning; accepted and ignored). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags (must be 0). */
#define NCCL_REVOKE_DEFAULT 0x00

typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* ---- Communicator configuration -------------------------------------------
 * Always start from NCCL_CONFIG_INITIALIZER, then set fields. nccl-rs reads
 * only the fields inside `size` bytes, and needs `magic` to be
 * NCCL_API_MAGIC. It honours `blocking` and `netName` ("Socket" is the one
 * network of this build); `commName` names the communicator in logs; every
 * other field is a GPU tuning knob that is accepted and ignored. */
typedef struct ncclConfig_v23100 {
  size_t size;          /* sizeof(ncclConfig_t) of the caller's header */
  unsigned int magic;   /* NCCL_API_MAGIC */
  unsigned int version; /* NCCL_VERSION_CODE of the caller's header */
  int blocking;         /* 1 (default) or 0 */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER {                                          \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,               \
    NCCL_CONFIG_UNDEF_INT, /* blocking */                                  \
    NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                            \
    NCCL_CONFIG_UNDEF_INT, /* minCTAs */                                   \
    NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                                   \
    NCCL_CONFIG_UNDEF_PTR, /* netName */                                   \
    NCCL_CONFIG_UNDEF_INT, /* splitShare */                                \
    NCCL_CONFIG_UNDEF_INT, /* trafficClass */                              \
    NCCL_CONFIG_UNDEF_PTR, /* commName */                                  \
    NCCL_CONFIG_UNDEF_INT, /* collnetEnable */                             \
    NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                                 \
    NCCL_CONFIG_UNDEF_INT, /* shrinkShare */                               \
    NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                                  \
    NCCL_CONFIG_UNDEF_INT, /* nChannelsPerNetPeer */                       \
    NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */                        \
    NCCL_CONFIG_UNDEF_INT, /* graphUsageMode */                            \
    NCCL_CONFIG_UNDEF_INT, /* numRmaCtx */                                 \
    NCCL_CONFIG_UNDEF_INT, /* maxP2pPeers */                               \
    NCCL_CONFIG_UNDEF_INT, /* graphStreamOrdering */                       \
    NCCL_CONFIG_UNDEF_INT, /* launchOrderImplicit */                       \
    NCCL_CONFIG_UNDEF_INT, /* numRmaSig */                                 \
    NCCL_CONFIG_UNDEF_INT, /* rmaEagerInit */                              \
    NCCL_CONFIG_UNDEF_INT, /* hostCftMode */                               \
    NCCL_CONFIG_UNDEF_INT  /* nvlsHostMode */                              \
  }

/* A vendor option for ncclCollConfig_t.ext (a NULL-terminated list). */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

/* Per-call configuration of the nccl*Config collectives. nccl-rs checks
 * `magic` and otherwise ignores it (all fields are GPU tuning hints). */
typedef struct ncclCollConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER {                                      \
    sizeof(ncclCollConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,           \
    NCCL_CONFIG_UNDEF_PTR, /* ext */                                       \
    NCCL_CONFIG_UNDEF_INT, /* minCTAs */                                   \
    NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                                   \
    NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                                  \
    NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                            \
    NCCL_CONFIG_UNDEF_PTR, /* algSelection */                              \
    1,                     /* forceAlgSelection */                         \
    NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                                 \
    0                      /* userProfilerTag */                           \
  }

/* Result of ncclGroupSimulateEnd (not implemented yet). */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

/* ---- Memory ----------------------------------------------------------------- */

/* Allocates `size` bytes of 64-byte aligned host memory (size 0 gives NULL). */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);

/* Frees memory from ncclMemAlloc (NULL is accepted). */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ---- Library information ----------------------------------------------------- */

/* Writes NCCL_VERSION_CODE of the library. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Creates a unique id and starts its rendezvous root in this process: call
 * it on one rank, keep the process alive until every rank has joined, and
 * pass the bytes to the other ranks. With NCCL_COMM_ID=host:port the root
 * listens there instead. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* A fixed text for a result code. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* The full message of the last error seen by the calling thread ("" if
 * none). `comm` may be NULL. The text stays valid until the next failing
 * call on this thread. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Reloads logging settings in NVIDIA's library; a no-op macro here. */
#define ncclResetDebugInit()
#define pncclResetDebugInit()

/* ---- Communicator creation ------------------------------------------------------ */

/* Joins the job of `commId` as `rank` of `nranks` (blocking: returns when
 * every rank has joined and all connections are up). Inside a group, the
 * handle is written at once and the init runs at ncclGroupEnd, so one
 * thread can create several ranks' communicators. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* As ncclCommInitRank with a configuration (NULL: defaults). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/* As ncclCommInitRankConfig with several ids (every rank passes the same
 * list); nccl-rs rendezvouses through the first one. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* Creates `ndev` communicators of one job in this process, ranks as threads,
 * into comm[0..ndev). devlist (may be NULL) only sets what ncclCommCuDevice
 * reports; its entries must be distinct. Always completes before returning. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* Ranks passing the same color form a new communicator, ordered by key then
 * by old rank; NCCL_SPLIT_NOCOLOR takes part and gets NULL. Every rank of
 * `comm` must call it. config NULL: the new communicator inherits comm's. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/* Not implemented yet (ncclInvalidUsage). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                           ncclComm_t* newcomm, ncclConfig_t* config);

/* ---- Communicator teardown ----------------------------------------------------- */

/* Waits until every operation issued on comm has finished; later
 * operations fail with ncclInvalidUsage. Blocking even on a non-blocking
 * communicator (it returns ncclSuccess or the communicator's error). */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Waits for comm's queued operations, then frees it. The handle is dead
 * afterwards (using it gives ncclInvalidArgument). */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Stops comm's operations in flight (on any thread; they return an error)
 * and frees it. Peers see ncclRemoteError when their connections close. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Not implemented yet (ncclInvalidUsage). */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* ---- Communicator queries ------------------------------------------------------- */

/* ncclInProgress while queued/background work (or init) is unfinished,
 * then ncclSuccess or the first error (whose message it also makes the
 * thread's ncclGetLastError). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ---- Buffer registration --------------------------------------------------------- */

/* Accepts any buffer and returns an opaque handle (nothing to do for host
 * memory); release it with ncclCommDeregister on the same communicator. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* Not implemented yet (ncclInvalidUsage): suspend, resume, memory
 * statistics and memory windows. */
#define NCCL_SUSPEND_MEM 0x01
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

/* ---- Reduction operations and data types ----------------------------------------- */

/* Sizes ncclRedOp_t like NCCL does, so that ncclMaxRedOp is the largest
 * value an enum of that size holds. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,     /* sum / nranks (integers truncate) */
  ncclNumOps = 5,  /* the built-in count; ops made by ncclRedOpCreate* start here */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. With host memory
 * both mean host memory: HostImmediate is read once, at creation; Device is
 * read each time a collective using the op runs (so it must stay valid
 * until ncclRedOpDestroy). */
typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Creates an op for `comm` and `datatype`: each rank's input is multiplied
 * by *scalar, then the results are summed. Ops are numbered from ncclNumOps
 * per communicator. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- Collectives -------------------------------------------------------------------
 * Counts are in elements of `datatype`. Every rank of `comm` calls the same
 * collectives in the same order. `stream` is ignored (host memory). */

/* `count` elements of every rank reduced into recvbuff on `root`
 * (recvbuff may be NULL elsewhere). In place if sendbuff == recvbuff. */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* In-place broadcast of `count` elements of buff from `root` (deprecated
 * form of ncclBroadcast). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/* Copies `count` elements of root's sendbuff to every recvbuff. sendbuff is
 * read on the root only. In place if sendbuff == recvbuff. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

/* `count` elements reduced across ranks into every recvbuff. In place if
 * sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* sendbuff holds nranks*recvcount elements; rank i gets block i of the
 * reduction. In place if recvbuff == sendbuff + rank*recvcount. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* recvbuff (nranks*sendcount elements) gets rank i's sendbuff at offset
 * i*sendcount. In place if sendbuff == recvbuff + rank*sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Block j of sendbuff (count elements) goes to rank j; block i of recvbuff
 * comes from rank i. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Every rank's `count` elements land at recvbuff + i*count on `root`. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Block i of root's sendbuff (count elements) goes to rank i's recvbuff. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* The collectives with a per-call configuration: `config` (NULL allowed)
 * must come from NCCL_COLLCONFIG_INITIALIZER; its hints are ignored. */
ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t* config);
ncclResult_t pncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                  const ncclCollConfig_t* config);
ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                const ncclCollConfig_t* config);
ncclResult_t pncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t* config);
ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream, const ncclCollConfig_t* config);

/* ---- Point to point ------------------------------------------------------------------
 * A send matches the peer's receive of the same count and type. Several
 * sends/receives that depend on each other go in one group. peer may be
 * the calling rank (a local copy, matched in issue order). */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* One-sided operations: not implemented yet (ncclInvalidUsage). */
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                            unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                         cudaStream_t stream);

typedef struct {
  int opCnt;  /* signals to wait for */
  int peer;   /* from this rank */
  int sigIdx; /* on this signal index */
  int ctx;    /* in this context */
} ncclWaitSignalDesc_t;

ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                             cudaStream_t stream);

/* ---- Groups ------------------------------------------------------------------------------
 * Calls between ncclGroupStart and the matching ncclGroupEnd (groups nest;
 * the outermost end counts) are queued per thread and run at ncclGroupEnd:
 * each communicator's work on its own thread, all communicators together.
 * ncclGroupEnd returns the first error, or ncclInProgress if a non-blocking
 * communicator took part. If a call inside the group failed, ncclGroupEnd
 * returns that error and runs nothing. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Not implemented yet (ncclInvalidUsage). */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

/* ---- Parameters ---------------------------------------------------------------------------
 * Not implemented yet (ncclInvalidUsage), except ncclParamDumpAll, which
 * logs the parsed configuration at INFO level. */
typedef struct ncclParamHandle* ncclParamHandle_t;

ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key);
ncclResult_t pncclParamBind(ncclParamHandle_t* out, const char* key);
ncclResult_t ncclParamGetI8(ncclParamHandle_t h, int8_t* out);
ncclResult_t pncclParamGetI8(ncclParamHandle_t h, int8_t* out);
ncclResult_t ncclParamGetI16(ncclParamHandle_t h, int16_t* out);
ncclResult_t pncclParamGetI16(ncclParamHandle_t h, int16_t* out);
ncclResult_t ncclParamGetI32(ncclParamHandle_t h, int32_t* out);
ncclResult_t pncclParamGetI32(ncclParamHandle_t h, int32_t* out);
ncclResult_t ncclParamGetI64(ncclParamHandle_t h, int64_t* out);
ncclResult_t pncclParamGetI64(ncclParamHandle_t h, int64_t* out);
ncclResult_t ncclParamGetU8(ncclParamHandle_t h, uint8_t* out);
ncclResult_t pncclParamGetU8(ncclParamHandle_t h, uint8_t* out);
ncclResult_t ncclParamGetU16(ncclParamHandle_t h, uint16_t* out);
ncclResult_t pncclParamGetU16(ncclParamHandle_t h, uint16_t* out);
ncclResult_t ncclParamGetU32(ncclParamHandle_t h, uint32_t* out);
ncclResult_t pncclParamGetU32(ncclParamHandle_t h, uint32_t* out);
ncclResult_t ncclParamGetU64(ncclParamHandle_t h, uint64_t* out);
ncclResult_t pncclParamGetU64(ncclParamHandle_t h, uint64_t* out);
ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char** out);
ncclResult_t pncclParamGetStr(ncclParamHandle_t h, const char** out);
ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len);
ncclResult_t pncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len);
ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen);
ncclResult_t pncclParamGetParameter(const char* key, const char** value, int* valueLen);
ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen);
ncclResult_t pncclParamGetAllParameterKeys(const char*** table, int* tableLen);
void ncclParamDumpAll(void);
void pncclParamDumpAll(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
