/* The header in plain C (also compiled as C++ by header.cpp, and after or
 * before a CUDA runtime header with -DWITH_CUDA_FIRST / -DWITH_CUDA_AFTER):
 * NCCL's names, values and layouts, checked at compile time, then a few
 * calls that need no peers. */
#ifdef WITH_CUDA_FIRST
#include <cuda_runtime.h>
#endif
#include <nccl.h>
#ifdef WITH_CUDA_AFTER
#include <cuda_runtime.h>
#endif
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
#define STATIC_ASSERT static_assert
#else
#define STATIC_ASSERT _Static_assert
#endif

STATIC_ASSERT(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2, "results");
STATIC_ASSERT(ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5, "results");
STATIC_ASSERT(ncclRemoteError == 6 && ncclInProgress == 7 && ncclTimeout == 8 && ncclNumResults == 9, "results");
STATIC_ASSERT(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2, "types");
STATIC_ASSERT(ncclUint32 == 3 && ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclHalf == 6, "types");
STATIC_ASSERT(ncclFloat32 == 7 && ncclFloat == 7 && ncclFloat64 == 8 && ncclDouble == 8, "types");
STATIC_ASSERT(ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11 && ncclNumTypes == 12, "types");
STATIC_ASSERT(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "ops");
STATIC_ASSERT(ncclNumOps == 5 && ncclMaxRedOp == 0x7fffffff && sizeof(ncclRedOp_t) == 4, "ops");
STATIC_ASSERT(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "residence");
STATIC_ASSERT(NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128, "unique id");
STATIC_ASSERT(NCCL_VERSION(2, 30, 7) == 23007 && NCCL_VERSION(2, 8, 4) == 2804, "version macro");
STATIC_ASSERT(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), "version code");
STATIC_ASSERT(NCCL_SPLIT_NOCOLOR == -1 && NCCL_CONFIG_UNDEF_INT == INT_MIN, "constants");
STATIC_ASSERT(offsetof(ncclConfig_t, blocking) == 16 && offsetof(ncclConfig_t, netName) == 32, "config");
STATIC_ASSERT(offsetof(ncclConfig_t, commName) == 48 && offsetof(ncclConfig_t, numRmaCtx) == 84, "config");
STATIC_ASSERT(sizeof(ncclConfig_t) == 120 && sizeof(ncclCollConfig_t) == 64, "config");

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  cudaStream_t stream = NULL;
  ncclComm_t comm = NCCL_COMM_NULL;
  int version = 0;
  (void)stream;
  (void)comm;
  if (config.size != sizeof config || config.magic != NCCL_API_MAGIC || config.blocking != NCCL_CONFIG_UNDEF_INT ||
      config.netName != NULL || config.nvlsHostMode != NCCL_CONFIG_UNDEF_INT || cc.forceAlgSelection != 1 ||
      sim.estimatedTime != NCCL_UNDEF_FLOAT) {
    fprintf(stderr, "initializers\n");
    return 1;
  }
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  if (pncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  for (int r = 0; r < ncclNumResults; r++)
    if (strlen(ncclGetErrorString((ncclResult_t)r)) == 0) return 1;
  if (strcmp(ncclGetLastError(NULL), "") != 0) return 1;
  ncclResetDebugInit();
  printf("header: OK (NCCL %d.%d.%d)\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  return 0;
}
