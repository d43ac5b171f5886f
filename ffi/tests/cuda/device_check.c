/* Collectives on device buffers through NCCL's C API, with NCCL's stream
 * semantics, checked exactly. Runs against our libnccl.so.2 (cuda feature)
 * or NVIDIA's (LD_LIBRARY_PATH), on a real GPU or on the fake driver of
 * fake_libcuda.c. Needs no CUDA headers: the driver API is loaded with
 * dlopen ($NCCL_RS_CUDA_DRIVER, else libcuda.so.1).
 *
 *   device_check N                 N ranks (threads of this process, one
 *                                   communicator each via ncclCommInitAll,
 *                                   sharing the visible GPUs round-robin):
 *                                   all-reduce, all-gather (also in place),
 *                                   reduce-scatter, broadcast, send/recv
 *                                   ring and self, ncclMemAlloc
 *                                   and the async checks below
 *   device_check N async-fail      a stream left blocked: the call's error
 *                                   (NCCL_RS_TIMEOUT, set it short) surfaces
 *                                   through ncclCommGetAsyncError and the
 *                                   stream is released; ncclCommAbort
 *                                   while calls wait on blocked streams
 *                                   returns and releases them
 *   device_check N nonblocking     (NCCL_COMM_BLOCKING=0) a group on held
 *                                   streams returns ncclInProgress, then
 *                                   finishes once they go; exact
 *   device_check N perf MIN MAX ITERS
 *                                   an all-reduce (float, sum) sweep on
 *                                   device buffers, sizes MIN..MAX bytes (x4),
 *                                   nccl-tests-style table, results checked
 *
 * Every input is written by an asynchronous host-to-device copy enqueued
 * on the rank's stream just before the NCCL call, and every result read by
 * an asynchronous copy enqueued just after it; only then is the stream
 * synchronized. So the library must order its work on the stream.
 *
 * Async checks (NCCL's "the call enqueues, the stream completes the
 * work"): each stream is first made to wait for a host flag of the test
 * (cuStreamWaitValue32 on mapped pinned memory), then collectives and
 * send/recv are called: they must return while their streams are still
 * blocked (a library that waits for the stream hangs here, and alarm()
 * fails the run), back to back, then the flag is set and the results are
 * checked exactly. Also host-memory calls interleaved with device ones.
 * Skipped when NCCL_RS_CUDA_ASYNC=0 or the driver lacks stream memory
 * operations. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE
#endif
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef cudaStream_t CUstream;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGetCount)(int*);
static CUresult (*cuDeviceGetName)(char*, int, int);
static CUresult (*cuDriverGetVersion)(int*);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuStreamCreate)(CUstream*, unsigned);
static CUresult (*cuStreamDestroy)(CUstream);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemAllocHost)(void**, size_t);
static CUresult (*cuMemFreeHost)(void*);
static CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
static CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
static CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
static CUresult (*cuGetErrorName)(CUresult, const char**);
static CUresult (*cuStreamQuery)(CUstream);
static CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
static CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
static CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);

#define CU(cmd)                                                                     \
  do {                                                                              \
    CUresult e_ = (cmd);                                                            \
    if (e_ != 0) {                                                                  \
      const char* n_ = "?";                                                         \
      cuGetErrorName(e_, &n_);                                                      \
      fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #cmd, n_, e_); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

#define NC(cmd)                                                                         \
  do {                                                                                  \
    ncclResult_t r_ = (cmd);                                                            \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #cmd, (int)r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                          \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static void load_driver(void) {
  const char* path = getenv("NCCL_RS_CUDA_DRIVER");
  void* h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    fprintf(stderr, "device_check: cannot load the CUDA driver: %s\n", dlerror());
    exit(2);
  }
#define SYM(var, name)                                              \
  do {                                                              \
    *(void**)&var = dlsym(h, name);                                 \
    if (!var) {                                                     \
      fprintf(stderr, "device_check: driver lacks %s\n", name);     \
      exit(2);                                                      \
    }                                                               \
  } while (0)
  SYM(cuInit, "cuInit");
  SYM(cuDeviceGetCount, "cuDeviceGetCount");
  SYM(cuDeviceGetName, "cuDeviceGetName");
  SYM(cuDriverGetVersion, "cuDriverGetVersion");
  SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(cuStreamCreate, "cuStreamCreate");
  SYM(cuStreamDestroy, "cuStreamDestroy_v2");
  SYM(cuStreamSynchronize, "cuStreamSynchronize");
  SYM(cuMemAlloc, "cuMemAlloc_v2");
  SYM(cuMemFree, "cuMemFree_v2");
  SYM(cuMemAllocHost, "cuMemAllocHost_v2");
  SYM(cuMemFreeHost, "cuMemFreeHost");
  SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  SYM(cuPointerGetAttribute, "cuPointerGetAttribute");
  SYM(cuGetErrorName, "cuGetErrorName");
  SYM(cuStreamQuery, "cuStreamQuery");
  SYM(cuMemHostAlloc, "cuMemHostAlloc");
  SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  *(void**)&cuStreamWaitValue32 = dlsym(h, "cuStreamWaitValue32_v2");
  if (!cuStreamWaitValue32) *(void**)&cuStreamWaitValue32 = dlsym(h, "cuStreamWaitValue32");
}

#define MAXR 16
static int n;
static ncclComm_t comms[MAXR];
static CUstream streams[MAXR];
static CUcontext ctxs[MAXR];
static int devs[MAXR];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Per rank: device buffers and pinned host staging for the test data. */
struct bufs {
  CUdeviceptr send, recv;
  void *hin, *hout;
  size_t bytes; /* of each */
};
static struct bufs B[MAXR];

static void alloc_bufs(size_t bytes) {
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    B[r].bytes = bytes;
    CU(cuMemAlloc(&B[r].send, bytes));
    CU(cuMemAlloc(&B[r].recv, bytes));
    CU(cuMemAllocHost(&B[r].hin, bytes));
    CU(cuMemAllocHost(&B[r].hout, bytes));
  }
}

static void free_bufs(void) {
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuMemFree(B[r].send));
    CU(cuMemFree(B[r].recv));
    CU(cuMemFreeHost(B[r].hin));
    CU(cuMemFreeHost(B[r].hout));
  }
}

/* Element i of rank r's input: small integers, exact in float sums. */
static float val(int r, size_t i) { return (float)((r + 1) * 100 + (int)(i % 113)); }

static void fail(const char* what, int r, size_t i, double got, double want) {
  fprintf(stderr, "device_check: %s: rank %d element %zu is %g, expected %g\n", what, r, i, got, want);
  exit(1);
}

/* Enqueues hin -> dst (bytes) on rank r's stream. */
static void h2d(int r, CUdeviceptr dst, size_t bytes) {
  CU(cuCtxSetCurrent(ctxs[r]));
  CU(cuMemcpyHtoDAsync(dst, B[r].hin, bytes, streams[r]));
}

/* Enqueues src -> hout (bytes) on rank r's stream. */
static void d2h(int r, CUdeviceptr src, size_t bytes) {
  CU(cuCtxSetCurrent(ctxs[r]));
  CU(cuMemcpyDtoHAsync(B[r].hout, src, bytes, streams[r]));
}

static void sync_all(void) {
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuStreamSynchronize(streams[r]));
  }
}

static void test_all_reduce(size_t count) {
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    memset(B[r].hout, 0xff, count * 4);
    h2d(r, B[r].send, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += val(q, i);
      if (out[i] != want) fail("all-reduce", r, i, out[i], want);
    }
  }
  /* In place, int32 max. */
  for (int r = 0; r < n; r++) {
    int32_t* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = (int32_t)(i % 1000) * (r == (int)(i % n) ? 7 : 1);
    h2d(r, B[r].recv, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].recv, (void*)B[r].recv, count, ncclInt32, ncclMax, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    int32_t* out = B[r].hout;
    for (size_t i = 0; i < count; i++)
      if (out[i] != (int32_t)(i % 1000) * 7) fail("in-place all-reduce max", r, i, out[i], (double)(i % 1000) * 7);
  }
  printf("device_check: all-reduce of %zu floats (and in place, int32 max) at %d ranks: exact\n", count, n);
}

static void test_all_gather(size_t count, int in_place) {
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    h2d(r, in_place ? B[r].recv + (CUdeviceptr)r * count * 4 : B[r].send, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    CUdeviceptr s = in_place ? B[r].recv + (CUdeviceptr)r * count * 4 : B[r].send;
    NC(ncclAllGather((void*)s, (void*)B[r].recv, count, ncclFloat, comms[r], streams[r]));
  }
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, n * count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t j = 0; j < n * count; j++)
      if (out[j] != val(j / count, j % count)) fail("all-gather", r, j, out[j], val(j / count, j % count));
  }
  printf("device_check: all-gather of %zu floats per rank%s at %d ranks: exact\n", count,
         in_place ? " (in place)" : "", n);
}

static void test_reduce_scatter_and_broadcast(size_t count) {
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t j = 0; j < n * count; j++) in[j] = val(r, j);
    h2d(r, B[r].send, n * count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclReduceScatter((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += val(q, r * count + i);
      if (out[i] != want) fail("reduce-scatter", r, i, out[i], want);
    }
  }
  int root = n - 1;
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    h2d(r, B[r].recv, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclBroadcast((void*)B[r].recv, (void*)B[r].recv, count, ncclFloat, root, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t i = 0; i < count; i++)
      if (out[i] != val(root, i)) fail("broadcast", r, i, out[i], val(root, i));
  }
  printf("device_check: reduce-scatter and broadcast of %zu floats at %d ranks: exact\n", count, n);
}

static void test_send_recv(size_t count) {
  /* Ring: send to r+1, receive from r-1 into the first half of recv;
   * plus a send to self into the second half. */
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    h2d(r, B[r].send, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    NC(ncclSend((void*)B[r].send, count, ncclFloat, (r + 1) % n, comms[r], streams[r]));
    NC(ncclRecv((void*)B[r].recv, count, ncclFloat, (r + n - 1) % n, comms[r], streams[r]));
    NC(ncclSend((void*)B[r].send, count, ncclFloat, r, comms[r], streams[r]));
    NC(ncclRecv((void*)(B[r].recv + count * 4), count, ncclFloat, r, comms[r], streams[r]));
  }
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, 2 * count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    int prev = (r + n - 1) % n;
    for (size_t i = 0; i < count; i++) {
      if (out[i] != val(prev, i)) fail("recv from the previous rank", r, i, out[i], val(prev, i));
      if (out[count + i] != val(r, i)) fail("recv from self", r, i, out[count + i], val(r, i));
    }
  }
  printf("device_check: send/recv ring and self of %zu floats at %d ranks: exact\n", count, n);
}

static void test_mem_alloc(void) {
  void* p = NULL;
  CU(cuCtxSetCurrent(ctxs[0]));
  NC(ncclMemAlloc(&p, 1 << 20));
  unsigned type = 0;
  CU(cuPointerGetAttribute(&type, 2 /* MEMORY_TYPE */, (CUdeviceptr)(uintptr_t)p));
  if (type != 2) {
    fprintf(stderr, "device_check: ncclMemAlloc returned memory of type %u, not device memory\n", type);
    exit(1);
  }
  void* reg = NULL;
  NC(ncclCommRegister(comms[0], p, 1 << 20, &reg));
  NC(ncclCommDeregister(comms[0], reg));
  NC(ncclMemFree(p));
  printf("device_check: ncclMemAlloc gives device memory\n");
}

#include "device_check_async.h"

static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  }
  return (size_t)v;
}

static void perf(size_t min, size_t max, int iters) {
  const char* lib = getenv("DEVICE_CHECK_LIB");
  printf("# all_reduce on device buffers, float sum, %d rank(s)%s%s\n", n, lib ? ", library " : "", lib ? lib : "");
  printf("#%12s %12s %10s %10s %10s %7s\n", "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong");
  double bus_sum = 0;
  int rows = 0;
  for (size_t bytes = min; bytes <= max; bytes *= 4) {
    size_t count = bytes / 4;
    for (int r = 0; r < n; r++) {
      float* in = B[r].hin;
      for (size_t i = 0; i < count; i++) in[i] = val(r, i);
      h2d(r, B[r].send, bytes);
    }
    sync_all();
    double t = 0;
    for (int it = -2; it < iters; it++) {
      double t0 = now_s();
      NC(ncclGroupStart());
      for (int r = 0; r < n; r++)
        NC(ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
      NC(ncclGroupEnd());
      sync_all();
      if (it >= 0) t += now_s() - t0;
    }
    t /= iters;
    for (int r = 0; r < n; r++) d2h(r, B[r].recv, bytes);
    sync_all();
    long wrong = 0;
    for (int r = 0; r < n; r++) {
      float* out = B[r].hout;
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += val(q, i);
        wrong += out[i] != want;
      }
    }
    double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
    printf(" %12zu %12zu %10.1f %10.3f %10.3f %7ld\n", bytes, count, t * 1e6, algbw, busbw, wrong);
    fflush(stdout);
    if (wrong) {
      fprintf(stderr, "device_check: %ld wrong elements at %zu bytes\n", wrong, bytes);
      exit(1);
    }
    bus_sum += busbw;
    rows++;
  }
  printf("# Avg bus bandwidth    : %g\n", rows ? bus_sum / rows : 0);
}

int main(int argc, char** argv) {
  alarm(400);
  if (argc < 2) {
    fprintf(stderr, "usage: %s NRANKS [perf MIN MAX ITERS | async-fail | nonblocking]\n", argv[0]);
    return 2;
  }
  n = atoi(argv[1]);
  if (n < 1 || n > MAXR) return 2;
  load_driver();
  CU(cuInit(0));
  int ndev = 0, ver = 0;
  CU(cuDeviceGetCount(&ndev));
  CU(cuDriverGetVersion(&ver));
  char name[256] = "";
  CU(cuDeviceGetName(name, sizeof name, 0));
  int nccl_ver = 0;
  NC(ncclGetVersion(&nccl_ver));
  printf("device_check: %d rank(s), CUDA driver %d.%d, %d device(s), device 0: %s; NCCL version code %d\n", n,
         ver / 1000, ver % 1000 / 10, ndev, name, nccl_ver);
  for (int r = 0; r < n; r++) {
    devs[r] = r % ndev;
    CU(cuDevicePrimaryCtxRetain(&ctxs[r], devs[r]));
  }
  CU(cuCtxSetCurrent(ctxs[0]));
  NC(ncclCommInitAll(comms, n, devs));
  for (int r = 0; r < n; r++) {
    int dev = -1;
    NC(ncclCommCuDevice(comms[r], &dev));
    if (dev != devs[r]) {
      fprintf(stderr, "device_check: ncclCommCuDevice of rank %d is %d, expected %d\n", r, dev, devs[r]);
      return 1;
    }
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuStreamCreate(&streams[r], 1 /* CU_STREAM_NON_BLOCKING */));
  }
  if (argc >= 6 && strcmp(argv[2], "perf") == 0) {
    size_t min = parse_size(argv[3]), max = parse_size(argv[4]);
    if (min < 4) min = 4;
    alloc_bufs(max);
    perf(min, max, atoi(argv[5]));
  } else if (argc >= 3 && strcmp(argv[2], "nonblocking") == 0) {
    alloc_bufs(100003 * 4);
    test_async_nonblocking(100003);
  } else if (argc >= 3 && strcmp(argv[2], "async-fail") == 0) {
    alloc_bufs(4096 * 4);
    test_async_failures();
  } else {
    size_t count = (size_t)(1 << 20) + 3; /* several staging chunks, odd tail */
    alloc_bufs((size_t)(n < 2 ? 2 : n) * count * 4);
    test_all_reduce(count);
    test_all_gather(300001, 0);
    test_all_gather(300001, 1);
    test_reduce_scatter_and_broadcast(200003);
    test_send_recv(count);
    test_send_recv(1);
    test_mem_alloc();
    test_async_return(count);
    test_async_two_streams(300007);
    test_host_device_interleaved(200003);
  }
  free_bufs();
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuStreamDestroy(streams[r]));
    if (comms[r]) NC(ncclCommDestroy(comms[r]));
  }
  printf("device_check: OK\n");
  return 0;
}
