/* Non-blocking communicators driven from one thread: two ranks of one job,
 * each call returning ncclInProgress and finishing in the background.
 *
 *   nonblocking config   use ncclConfig_t.blocking = 0
 *   nonblocking env      use plain ncclCommInitRank (run with NCCL_COMM_BLOCKING=0)
 *
 * Then abort: rank 0 aborts while its all-reduce waits for a peer that never
 * joins; rank 1's next all-reduce then fails because its peer is gone. */
#include "util.h"

int main(int argc, char** argv) {
  watchdog(120);
  EXPECT(argc == 2, "usage: nonblocking config|env");
  int use_env = strcmp(argv[1], "env") == 0;
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclComm_t c[2] = {NULL, NULL};
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  for (int r = 0; r < 2; r++) {
    /* One thread creates both ranks: possible only because init does not block. */
    ncclResult_t res = use_env ? ncclCommInitRank(&c[r], 2, id, r) : ncclCommInitRankConfig(&c[r], 2, id, r, &config);
    EXPECT(res == ncclInProgress, "init of rank %d returned %d (%s)", r, (int)res, ncclGetLastError(NULL));
    EXPECT(c[r] != NULL, "handle written with ncclInProgress");
  }
  for (int r = 0; r < 2; r++) EXPECT(wait_comm(c[r], 60) == ncclSuccess, "init %d: %s", r, ncclGetLastError(NULL));

  /* Collectives outside a group: each returns at once, both progress. */
  enum { C = 50000 };
  static int32_t a[2][C], b[2][C];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < C; i++) a[r][i] = (r + 1) * i;
  for (int r = 0; r < 2; r++)
    EXPECT(ncclAllReduce(a[r], b[r], C, ncclInt32, ncclSum, c[r], NULL) == ncclInProgress, "allreduce in progress");
  for (int r = 0; r < 2; r++) EXPECT(wait_comm(c[r], 60) == ncclSuccess, "allreduce %d: %s", r, ncclGetLastError(NULL));
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < C; i++) EXPECT(b[r][i] == 3 * i, "allreduce result");

  /* A group over both: ncclGroupEnd returns ncclInProgress. */
  EXPECT(ncclGroupStart() == ncclSuccess, "group start");
  for (int r = 0; r < 2; r++) {
    CHECK(ncclSend(a[r], C, ncclInt32, 1 - r, c[r], NULL));
    CHECK(ncclRecv(b[r], C, ncclInt32, 1 - r, c[r], NULL));
  }
  EXPECT(ncclGroupEnd() == ncclInProgress, "group end in progress");
  for (int r = 0; r < 2; r++) EXPECT(wait_comm(c[r], 60) == ncclSuccess, "sendrecv %d: %s", r, ncclGetLastError(NULL));
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < C; i++) EXPECT(b[r][i] == (2 - r) * i, "sendrecv result");

  /* Abort while an operation waits. */
  EXPECT(ncclAllReduce(a[0], b[0], C, ncclInt32, ncclSum, c[0], NULL) == ncclInProgress, "lonely allreduce");
  usleep(100000);
  ncclResult_t state;
  CHECK(ncclCommGetAsyncError(c[0], &state));
  EXPECT(state == ncclInProgress, "the lonely allreduce still waits");
  double t0 = now_s();
  CHECK(ncclCommAbort(c[0]));
  EXPECT(now_s() - t0 < 10, "abort took %.1f s", now_s() - t0);
  EXPECT_FAIL(ncclCommGetAsyncError(c[0], &state), ncclInvalidArgument, "not a live communicator");
  ncclResult_t res = ncclAllReduce(a[1], b[1], C, ncclInt32, ncclSum, c[1], NULL);
  EXPECT(res == ncclInProgress, "allreduce after the peer aborted returned %d", (int)res);
  state = wait_comm(c[1], 60);
  EXPECT(state == ncclRemoteError, "peer of an aborted rank got %d: %s", (int)state,
         ncclGetLastError(NULL));
  printf("peer of the aborted rank: %s\n", ncclGetLastError(NULL));
  CHECK(ncclCommDestroy(c[1]));
  printf("nonblocking %s: OK\n", argv[1]);
  return 0;
}
