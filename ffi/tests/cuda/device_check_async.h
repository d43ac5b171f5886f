/* The async checks of device_check.c (NCCL's "the call enqueues, the
 * stream completes the work"): included by device_check.c after its
 * helpers (ranks, streams, buffers, h2d/d2h, val, fail, CU/NC), which it
 * uses; not a standalone header. See device_check.c's header comment. */

/* The test's host flag (mapped pinned memory) that holds every stream. */
static volatile uint32_t* hold_host;
static CUdeviceptr hold_dev;

/* Makes every rank's stream wait until the hold flag reaches `v`; 0 when
 * the driver cannot (no stream memory operations). */
static int hold_streams(uint32_t v) {
  if (!cuStreamWaitValue32) return 0;
  if (!hold_host) {
    void* p = NULL;
    CU(cuCtxSetCurrent(ctxs[0]));
    CU(cuMemHostAlloc(&p, 4096, 0x1 | 0x2 /* PORTABLE | DEVICEMAP */));
    CU(cuMemHostGetDevicePointer(&hold_dev, p, 0));
    hold_host = p;
    *hold_host = 0;
  }
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CUresult e = cuStreamWaitValue32(streams[r], hold_dev, v, 0 /* GEQ */);
    if (e != 0) {
      if (r == 0) return 0;
      CU(e);
    }
  }
  return 1;
}

static void release_streams(uint32_t v) { __atomic_store_n(hold_host, v, __ATOMIC_RELEASE); }

/* Every stream is still blocked (the calls did not wait for them). */
static void expect_blocked(const char* what) {
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CUresult e = cuStreamQuery(streams[r]);
    if (e != 600 /* CUDA_ERROR_NOT_READY */) {
      fprintf(stderr, "device_check: %s: rank %d's stream is not blocked any more (%d)\n", what, r, e);
      exit(1);
    }
  }
}

static int async_wanted(void) {
  const char* a = getenv("NCCL_RS_CUDA_ASYNC");
  return !(a && strcmp(a, "0") == 0);
}

static uint32_t hold_seq;

/* All-reduce, all-reduce in place, all-gather and a send/recv ring plus
 * self, called while the streams wait for the test: they return at once;
 * then the streams go and the results are exact. */
static void test_async_return(size_t count) {
  if (!async_wanted() || !hold_streams(++hold_seq)) {
    printf("device_check: async checks skipped (NCCL_RS_CUDA_ASYNC=0 or no stream memory operations)\n");
    return;
  }
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    memset(B[r].hout, 0xff, B[r].bytes);
  }
  /* The inputs are written behind the hold: the library must read them
   * after the stream got there. */
  for (int r = 0; r < n; r++) h2d(r, B[r].send, count * 4);
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  /* Back to back on the same streams, each rank's calls on its own. */
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].recv, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllGather((void*)B[r].recv, (void*)B[r].send, count / n, ncclFloat, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].send, (count / n) * n * 4);
  expect_blocked("after all-reduce, all-reduce in place and all-gather");
  release_streams(hold_seq);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t i = 0; i < (count / n) * n; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += val(q, i % (count / n));
      want *= n;
      if (out[i] != want) fail("async all-reduce twice then all-gather", r, i, out[i], want);
    }
  }
  /* Send/recv ring and self while blocked. */
  if (!hold_streams(++hold_seq)) exit(1);
  for (int r = 0; r < n; r++) h2d(r, B[r].send, count * 4);
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    NC(ncclSend((void*)B[r].send, count, ncclFloat, (r + 1) % n, comms[r], streams[r]));
    NC(ncclRecv((void*)B[r].recv, count, ncclFloat, (r + n - 1) % n, comms[r], streams[r]));
    NC(ncclSend((void*)B[r].send, count, ncclFloat, r, comms[r], streams[r]));
    NC(ncclRecv((void*)(B[r].recv + count * 4), count, ncclFloat, r, comms[r], streams[r]));
  }
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, 2 * count * 4);
  expect_blocked("after send/recv");
  release_streams(hold_seq);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    int prev = (r + n - 1) % n;
    for (size_t i = 0; i < count; i++) {
      if (out[i] != val(prev, i)) fail("async recv from the previous rank", r, i, out[i], val(prev, i));
      if (out[count + i] != val(r, i)) fail("async recv from self", r, i, out[count + i], val(r, i));
    }
  }
  printf("device_check: async: calls returned while their streams were blocked; %zu floats at %d ranks: exact\n",
         count, n);
}

/* Sends on each rank's stream, receives on a second stream, both held:
 * one call gated on two streams. */
static void test_async_two_streams(size_t count) {
  static CUstream second[MAXR];
  if (!async_wanted() || !hold_streams(++hold_seq)) return;
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    if (!second[r]) CU(cuStreamCreate(&second[r], 1 /* CU_STREAM_NON_BLOCKING */));
    CU(cuStreamWaitValue32(second[r], hold_dev, hold_seq, 0));
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i) + 1;
    h2d(r, B[r].send, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    NC(ncclSend((void*)B[r].send, count, ncclFloat, (r + 1) % n, comms[r], streams[r]));
    NC(ncclRecv((void*)B[r].recv, count, ncclFloat, (r + n - 1) % n, comms[r], second[r]));
  }
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuMemcpyDtoHAsync(B[r].hout, B[r].recv, count * 4, second[r]));
    if (cuStreamQuery(second[r]) != 600) {
      fprintf(stderr, "device_check: rank %d's second stream is not blocked any more\n", r);
      exit(1);
    }
  }
  expect_blocked("after send/recv on two streams");
  release_streams(hold_seq);
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuStreamSynchronize(second[r]));
  }
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    int prev = (r + n - 1) % n;
    for (size_t i = 0; i < count; i++)
      if (out[i] != val(prev, i) + 1) fail("async recv on a second stream", r, i, out[i], val(prev, i) + 1);
  }
  for (int r = 0; r < n; r++) {
    CU(cuCtxSetCurrent(ctxs[r]));
    CU(cuStreamDestroy(second[r]));
    second[r] = NULL;
  }
  printf("device_check: async: send and recv on two held streams each, %zu floats at %d ranks: exact\n", count, n);
}

/* Host-memory and device-memory calls interleaved, in and out of groups:
 * one order on every rank, exact results. */
static void test_host_device_interleaved(size_t count) {
  if (getenv("DEVICE_CHECK_LIB")) {
    /* Another library (NVIDIA's NCCL) may not take pageable host memory. */
    printf("device_check: host and device calls interleaved: skipped (DEVICE_CHECK_LIB)\n");
    return;
  }
  float* hs[MAXR];
  float* hr[MAXR];
  for (int r = 0; r < n; r++) {
    hs[r] = malloc(count * 4);
    hr[r] = malloc(count * 4);
    for (size_t i = 0; i < count; i++) hs[r][i] = val(r, i) * 2;
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    h2d(r, B[r].send, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    NC(ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
    NC(ncclAllReduce(hs[r], hr[r], count, ncclFloat, ncclSum, comms[r], streams[r]));
    NC(ncclAllReduce((void*)B[r].recv, (void*)B[r].recv, count, ncclFloat, ncclMax, comms[r], streams[r]));
  }
  NC(ncclGroupEnd());
  /* The host-memory result is there when the group returns. */
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += val(q, i) * 2;
      if (hr[r][i] != want) fail("host all-reduce between device ones", r, i, hr[r][i], want);
    }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].recv, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) NC(ncclBroadcast(hs[r], hr[r], count, ncclFloat, 0, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, count * 4);
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += val(q, i);
      want *= n;
      if (out[i] != want) fail("device all-reduces around host ones", r, i, out[i], want);
      if (hr[r][i] != val(0, i) * 2) fail("host broadcast after device calls", r, i, hr[r][i], val(0, i) * 2);
    }
    free(hs[r]);
    free(hr[r]);
  }
  printf("device_check: host and device calls interleaved, %zu floats at %d ranks: exact\n", count, n);
}

/* A call whose stream stays blocked past NCCL_RS_TIMEOUT fails through
 * ncclCommGetAsyncError and releases its stream; then ncclCommAbort (rank
 * 0) and ncclCommDestroy (the others) while calls wait on blocked streams
 * return and release them. */
static void test_async_failures(void) {
  size_t count = 1000;
  if (!async_wanted() || !hold_streams(++hold_seq)) {
    printf("device_check: async checks skipped (NCCL_RS_CUDA_ASYNC=0 or no stream memory operations)\n");
    return;
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    ncclResult_t st = ncclSuccess;
    /* Blocking communicators report ncclSuccess until the proxy fails the
     * call (after NCCL_RS_TIMEOUT); the alarm bounds this loop. */
    while (st == ncclSuccess) {
      NC(ncclCommGetAsyncError(comms[r], &st));
      if (st == ncclSuccess) usleep(10000);
    }
    if (st != ncclTimeout) {
      fprintf(stderr, "device_check: rank %d: async error %d (%s), expected ncclTimeout\n", r, (int)st,
              ncclGetErrorString(st));
      exit(1);
    }
  }
  expect_blocked("after the timeout (the test still holds the streams)");
  release_streams(hold_seq);
  sync_all(); /* the library released its gates: no hang */
  printf("device_check: async: a timed-out call surfaced as ncclTimeout and released its stream\n");
  if (!hold_streams(++hold_seq)) exit(1);
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NC(ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]));
  NC(ncclGroupEnd());
  /* Rank 0 aborts; the others destroy, which waits for their calls: those
   * fail after NCCL_RS_TIMEOUT (their streams are still held). */
  for (int r = 0; r < n; r++) {
    NC(r == 0 ? ncclCommAbort(comms[r]) : ncclCommDestroy(comms[r]));
    comms[r] = NULL;
  }
  expect_blocked("after abort and destroy (the test still holds the streams)");
  release_streams(hold_seq);
  sync_all();
  printf("device_check: async: ncclCommAbort with calls waiting on blocked streams returned and released them\n");
  printf("device_check: async: ncclCommDestroy with calls waiting on blocked streams returned and released them\n");
}

/* Non-blocking communicators (run with NCCL_COMM_BLOCKING=0): the group
 * returns ncclInProgress while the streams are held, the calls finish
 * once the streams go, results exact. */
static void test_async_nonblocking(size_t count) {
  if (!async_wanted() || !hold_streams(++hold_seq)) {
    printf("device_check: async checks skipped (NCCL_RS_CUDA_ASYNC=0 or no stream memory operations)\n");
    return;
  }
  for (int r = 0; r < n; r++) {
    float* in = B[r].hin;
    for (size_t i = 0; i < count; i++) in[i] = val(r, i);
    h2d(r, B[r].send, count * 4);
  }
  NC(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    ncclResult_t e = ncclAllReduce((void*)B[r].send, (void*)B[r].recv, count, ncclFloat, ncclSum, comms[r], streams[r]);
    if (e != ncclSuccess && e != ncclInProgress) NC(e);
  }
  ncclResult_t e = ncclGroupEnd();
  if (e != ncclInProgress) {
    fprintf(stderr, "device_check: non-blocking group returned %d, expected ncclInProgress\n", (int)e);
    exit(1);
  }
  for (int r = 0; r < n; r++) d2h(r, B[r].recv, count * 4);
  expect_blocked("after a non-blocking all-reduce");
  ncclResult_t st = ncclInProgress;
  NC(ncclCommGetAsyncError(comms[0], &st));
  if (st != ncclInProgress) {
    fprintf(stderr, "device_check: non-blocking call reported %d while its stream is held\n", (int)st);
    exit(1);
  }
  release_streams(hold_seq);
  for (int r = 0; r < n; r++) {
    do NC(ncclCommGetAsyncError(comms[r], &st));
    while (st == ncclInProgress);
    NC(st);
  }
  sync_all();
  for (int r = 0; r < n; r++) {
    float* out = B[r].hout;
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += val(q, i);
      if (out[i] != want) fail("async non-blocking all-reduce", r, i, out[i], want);
    }
  }
  printf("device_check: async: non-blocking communicators returned ncclInProgress with held streams; exact\n");
}

