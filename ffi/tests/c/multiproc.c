/* One rank per process, as an MPI or torchrun NCCL program: rank 0 writes
 * the ncclGetUniqueId bytes to a file, the others wait for it.
 *
 *   multiproc RANK NRANKS IDFILE
 *   multiproc RANK NRANKS -        every rank calls ncclGetUniqueId (NCCL_COMM_ID)
 *
 * Runs every collective with every datatype and op, send/recv rings in a
 * group, split, a non-blocking communicator (init and collectives return
 * ncclInProgress, then ncclCommGetAsyncError is polled), and abort. */
#include "util.h"

static int rank, nranks;

/* MULTIPROC_MEMALLOC=1: collective buffers from ncclMemAlloc (shared host
 * memory, which co-located ranks copy between directly). */
static void* buf_alloc(size_t bytes) {
  const char* m = getenv("MULTIPROC_MEMALLOC");
  if (m && strcmp(m, "1") == 0) {
    void* p = NULL;
    CHECK(ncclMemAlloc(&p, bytes));
    return p;
  }
  void* p = malloc(bytes);
  EXPECT(p != NULL, "malloc");
  return p;
}

static void buf_free(void* p) {
  const char* m = getenv("MULTIPROC_MEMALLOC");
  if (m && strcmp(m, "1") == 0) CHECK(ncclMemFree(p));
  else free(p);
}

static void exchange_id(const char* path, ncclUniqueId* id) {
  if (strcmp(path, "-") == 0) {
    EXPECT(getenv("NCCL_COMM_ID") != NULL, "IDFILE - needs NCCL_COMM_ID");
    CHECK(ncclGetUniqueId(id));
    return;
  }
  if (rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(ncclGetUniqueId(id));
    FILE* f = fopen(tmp, "wb");
    EXPECT(f && fwrite(id, sizeof *id, 1, f) == 1 && fclose(f) == 0, "writing %s", tmp);
    EXPECT(rename(tmp, path) == 0, "renaming %s", tmp);
    return;
  }
  double end = now_s() + 60;
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    EXPECT(now_s() < end, "no unique id in %s after 60 s", path);
    usleep(10000);
  }
}

/* Every (rank, element) value is 1 or 2, half of the ranks each (so sums,
 * products and averages stay exact in every type); see initall.c. */
static double val(int r, size_t i) { return ((r + i) % nranks) < (size_t)nranks / 2 ? 1 : 2; }

static void every_type_and_op(ncclComm_t comm) {
  const ncclRedOp_t ops[5] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const size_t count = 1000;
  for (int t = 0; t < ncclNumTypes; t++) {
    size_t es = dtype_size((ncclDataType_t)t);
    unsigned char* send = buf_alloc(nranks * count * es);
    unsigned char* recv = buf_alloc(nranks * count * es);
    for (size_t i = 0; i < nranks * count; i++) put((ncclDataType_t)t, send, i, val(rank, i));
    for (int o = 0; o < 5; o++) {
      double ones = 0, twos = 0;
      for (int r = 0; r < nranks; r++) {
        if (val(r, 0) == 1) ones++;
        else twos++;
      }
      double sum = ones + 2 * twos, prod = 1;
      for (int k = 0; k < twos; k++) prod *= 2;
      double want[5] = {sum, prod, 2, 1, dtype_is_int(t) ? (double)(long)(sum / nranks) : sum / nranks};
      CHECK(ncclAllReduce(send, recv, count, (ncclDataType_t)t, ops[o], comm, NULL));
      for (size_t i = 0; i < count; i++)
        EXPECT(is((ncclDataType_t)t, recv, i, want[o]), "allreduce %s op %d elem %zu", dtype_name(t), o, i);
      CHECK(ncclReduceScatter(send, recv, count, (ncclDataType_t)t, ops[o], comm, NULL));
      for (size_t i = 0; i < count; i++)
        EXPECT(is((ncclDataType_t)t, recv, i, want[o]), "reducescatter %s op %d elem %zu", dtype_name(t), o, i);
      CHECK(ncclReduce(send, recv, count, (ncclDataType_t)t, ops[o], nranks - 1, comm, NULL));
      if (rank == nranks - 1)
        for (size_t i = 0; i < count; i++)
          EXPECT(is((ncclDataType_t)t, recv, i, want[o]), "reduce %s op %d elem %zu", dtype_name(t), o, i);
    }
    /* Data movement in this type: a rank's value pattern must arrive intact. */
    CHECK(ncclAllGather(send, recv, count, (ncclDataType_t)t, comm, NULL));
    for (int p = 0; p < nranks; p++)
      for (size_t i = 0; i < count; i++)
        EXPECT(is((ncclDataType_t)t, recv, p * count + i, val(p, i)), "allgather %s", dtype_name(t));
    CHECK(ncclBroadcast(send, recv, count, (ncclDataType_t)t, 1 % nranks, comm, NULL));
    for (size_t i = 0; i < count; i++) EXPECT(is((ncclDataType_t)t, recv, i, val(1 % nranks, i)), "broadcast %s", dtype_name(t));
    buf_free(send);
    buf_free(recv);
  }
}

static void rooted_and_alltoall(ncclComm_t comm) {
  enum { C = 333 };
  int64_t* in = buf_alloc(nranks * C * sizeof *in);
  int64_t* out = buf_alloc(nranks * C * sizeof *out);
  for (int i = 0; i < nranks * C; i++) in[i] = 100000 * rank + i;
  CHECK(ncclAlltoAll(in, out, C, ncclInt64, comm, NULL));
  for (int p = 0; p < nranks; p++)
    for (int i = 0; i < C; i++) EXPECT(out[p * C + i] == 100000 * p + rank * C + i, "alltoall");
  /* In place, larger than the transports' buffers, twice (the second call
   * reuses the staged copy's memory). */
  enum { BIG = 1 << 18 };
  int64_t* both = buf_alloc(nranks * BIG * sizeof *both);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < nranks * BIG; i++) both[i] = 10000000 * rank + i + k;
    CHECK(ncclAlltoAll(both, both, BIG, ncclInt64, comm, NULL));
    for (int p = 0; p < nranks; p++)
      for (int i = 0; i < BIG; i++)
        EXPECT(both[p * BIG + i] == 10000000 * p + rank * BIG + i + k, "alltoall in place");
  }
  buf_free(both);
  int root = nranks - 1;
  CHECK(ncclGather(in, rank == root ? out : NULL, C, ncclInt64, root, comm, NULL));
  if (rank == root)
    for (int p = 0; p < nranks; p++)
      for (int i = 0; i < C; i++) EXPECT(out[p * C + i] == 100000 * p + i, "gather");
  CHECK(ncclScatter(rank == 0 ? in : NULL, out, C, ncclInt64, 0, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(out[i] == rank * C + i, "scatter");
  /* In-place broadcast through ncclBcast. */
  for (int i = 0; i < C; i++) out[i] = rank == 0 ? 7 * i : -1;
  CHECK(ncclBcast(out, C, ncclInt64, 0, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(out[i] == 7 * i, "bcast");
  buf_free(in);
  buf_free(out);
}

/* Send/recv rings in a group: a small message and one past the 2 MiB
 * single-copy cap (with MULTIPROC_MEMALLOC=1 read from a mapping of the
 * sender's buffer at any size). */
static void ring(ncclComm_t comm) {
  const size_t sizes[2] = {4096, (1 << 20) + 3};
  for (int k = 0; k < 2; k++) {
    size_t C = sizes[k];
    float *a = buf_alloc(C * sizeof *a), *fromleft = buf_alloc(C * sizeof *a),
          *fromright = buf_alloc(C * sizeof *a);
    for (size_t i = 0; i < C; i++) a[i] = rank + 0.5f * (float)(i % 4096) + 4096.0f * (float)(i / 4096);
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    CHECK(ncclGroupStart());
    CHECK(ncclSend(a, C, ncclFloat, next, comm, NULL));
    CHECK(ncclSend(a, C, ncclFloat, prev, comm, NULL));
    CHECK(ncclRecv(fromleft, C, ncclFloat, prev, comm, NULL));
    CHECK(ncclRecv(fromright, C, ncclFloat, next, comm, NULL));
    CHECK(ncclGroupEnd());
    for (size_t i = 0; i < C; i++) {
      float base = 0.5f * (float)(i % 4096) + 4096.0f * (float)(i / 4096);
      EXPECT(fromleft[i] == prev + base, "ring from %d, element %zu", prev, i);
      EXPECT(fromright[i] == next + base, "ring from %d, element %zu", next, i);
    }
    buf_free(a);
    buf_free(fromleft);
    buf_free(fromright);
  }
}

static void split(ncclComm_t comm) {
  ncclComm_t half;
  CHECK(ncclCommSplit(comm, rank % 2, rank, &half, NULL));
  int r, n;
  CHECK(ncclCommUserRank(half, &r));
  CHECK(ncclCommCount(half, &n));
  EXPECT(r == rank / 2 && n == (nranks + 1 - rank % 2) / 2, "split: rank %d of %d", r, n);
  int32_t x = rank, sum = -1, want = 0;
  for (int k = rank % 2; k < nranks; k += 2) want += k;
  CHECK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, half, NULL));
  EXPECT(sum == want, "split allreduce %d != %d", sum, want);
  CHECK(ncclCommDestroy(half));
}

/* A second communicator, non-blocking, whose id travels over the first. */
static void nonblocking(ncclComm_t comm) {
  ncclUniqueId id2;
  if (rank == 0) CHECK(ncclGetUniqueId(&id2));
  CHECK(ncclBroadcast(&id2, &id2, sizeof id2, ncclChar, 0, comm, NULL));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "nonblocking";
  ncclComm_t nb = NULL;
  ncclResult_t res = ncclCommInitRankConfig(&nb, nranks, id2, rank, &config);
  EXPECT(res == ncclInProgress || res == ncclSuccess, "non-blocking init returned %d", (int)res);
  EXPECT(nb != NULL, "handle written");
  EXPECT(wait_comm(nb, 60) == ncclSuccess, "non-blocking init failed: %s", ncclGetLastError(nb));
  enum { C = 100000 };
  double* buf = malloc(C * sizeof *buf);
  for (int i = 0; i < C; i++) buf[i] = rank;
  res = ncclAllReduce(buf, buf, C, ncclDouble, ncclSum, nb, NULL);
  EXPECT(res == ncclInProgress, "non-blocking allreduce returned %d", (int)res);
  EXPECT(wait_comm(nb, 60) == ncclSuccess, "non-blocking allreduce failed: %s", ncclGetLastError(nb));
  for (int i = 0; i < C; i++) EXPECT(buf[i] == nranks * (nranks - 1) / 2.0, "non-blocking allreduce result");
  /* Everyone is done with nb before anyone aborts it. */
  CHECK(ncclAllReduce(buf, buf, 1, ncclDouble, ncclSum, comm, NULL));
  CHECK(ncclCommAbort(nb));
  EXPECT_FAIL(ncclAllReduce(buf, buf, C, ncclDouble, ncclSum, nb, NULL), ncclInvalidArgument, "not a live communicator");
  free(buf);
}

int main(int argc, char** argv) {
  watchdog(300);
  EXPECT(argc == 4, "usage: multiproc RANK NRANKS IDFILE");
  rank = atoi(argv[1]);
  nranks = atoi(argv[2]);
  ncclUniqueId id;
  exchange_id(argv[3], &id);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  every_type_and_op(comm);
  rooted_and_alltoall(comm);
  ring(comm);
  split(comm);
  /* With NCCL_COMM_ID, ncclGetUniqueId names the same root for a second
   * communicator, whose address the first one's root still holds. */
  if (strcmp(argv[3], "-") != 0) nonblocking(comm);
  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  printf("multiproc rank %d: OK\n", rank);
  return 0;
}
