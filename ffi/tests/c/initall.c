/* ncclCommInitAll: 4 ranks as threads of this process, all driven from
 * this one thread through groups, as a single-process multi-GPU NCCL
 * program would. Checks every collective, every datatype and op, send/recv
 * rings, PreMulSum and split, with exact results. */
#include "util.h"

#define N 4
#define COUNT 7

static ncclComm_t comms[N];
static const ncclRedOp_t kOps[5] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

/* Rank r's element i: two ranks hold 1 and two hold 2 at every position,
 * so sum 6, prod 4, max 2, min 1, avg 1.5 (integers: 1), and every partial
 * result is exact even in fp8. */
static double val(int r, size_t i) { return ((r + i) % N) < 2 ? 1 : 2; }

static double expected(ncclDataType_t t, ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return 6;
    case ncclProd: return 4;
    case ncclMax: return 2;
    case ncclMin: return 1;
    default: return dtype_is_int(t) ? 1 : 1.5;
  }
}

static void allreduce_every_type_and_op(void) {
  for (int t = 0; t < ncclNumTypes; t++) {
    size_t es = dtype_size((ncclDataType_t)t);
    for (int o = 0; o < 6; o++) {
      void *send[N], *recv[N];
      ncclRedOp_t ops[N];
      for (int r = 0; r < N; r++) {
        send[r] = malloc(COUNT * es);
        recv[r] = malloc(COUNT * es);
        for (size_t i = 0; i < COUNT; i++) put((ncclDataType_t)t, send[r], i, val(r, i));
        if (o < 5) {
          ops[r] = kOps[o];
        } else { /* PreMulSum by 2, scalar read at creation */
          unsigned char two[8];
          put((ncclDataType_t)t, two, 0, 2);
          CHECK(ncclRedOpCreatePreMulSum(&ops[r], two, (ncclDataType_t)t, ncclScalarHostImmediate, comms[r]));
          EXPECT(ops[r] == ncclNumOps, "first user op is %d, not ncclNumOps", (int)ops[r]);
        }
      }
      CHECK(ncclGroupStart());
      for (int r = 0; r < N; r++)
        CHECK(ncclAllReduce(send[r], recv[r], COUNT, (ncclDataType_t)t, ops[r], comms[r], NULL));
      CHECK(ncclGroupEnd());
      double want = o < 5 ? expected((ncclDataType_t)t, kOps[o]) : 12;
      for (int r = 0; r < N; r++) {
        for (size_t i = 0; i < COUNT; i++)
          EXPECT(is((ncclDataType_t)t, recv[r], i, want), "allreduce %s op %d rank %d elem %zu", dtype_name(t), o, r, i);
        if (o == 5) CHECK(ncclRedOpDestroy(ops[r], comms[r]));
        free(send[r]);
        free(recv[r]);
      }
    }
  }
}

/* Reduce and reduce-scatter, in place and not, float and int64. */
static void reduce_and_reduce_scatter(void) {
  const ncclDataType_t types[2] = {ncclFloat32, ncclInt64};
  for (int k = 0; k < 2; k++) {
    ncclDataType_t t = types[k];
    size_t es = dtype_size(t);
    for (int o = 0; o < 5; o++) {
      void *buf[N], *rs[N], *red[N];
      for (int r = 0; r < N; r++) {
        buf[r] = malloc(N * COUNT * es);
        rs[r] = malloc(N * COUNT * es);
        red[r] = malloc((N + 1) * COUNT * es);
        for (size_t i = 0; i < N * COUNT; i++) put(t, buf[r], i, val(r, i));
        memcpy(rs[r], buf[r], N * COUNT * es);
      }
      CHECK(ncclGroupStart());
      for (int r = 0; r < N; r++) {
        /* out of place into red; in place (recvbuff = sendbuff + rank*count) in rs */
        CHECK(ncclReduceScatter(buf[r], red[r], COUNT, t, kOps[o], comms[r], NULL));
        CHECK(ncclReduceScatter(rs[r], (char*)rs[r] + r * COUNT * es, COUNT, t, kOps[o], comms[r], NULL));
        CHECK(ncclReduce(buf[r], (char*)red[r] + COUNT * es, N * COUNT, t, kOps[o], 3, comms[r], NULL));
      }
      CHECK(ncclGroupEnd());
      double want = expected(t, kOps[o]);
      for (int r = 0; r < N; r++) {
        for (size_t i = 0; i < COUNT; i++) {
          EXPECT(is(t, red[r], i, want), "reduce_scatter %s op %d rank %d", dtype_name(t), o, r);
          EXPECT(is(t, rs[r], r * COUNT + i, want), "in-place reduce_scatter %s op %d rank %d", dtype_name(t), o, r);
        }
        if (r == 3)
          for (size_t i = 0; i < N * COUNT; i++)
            EXPECT(is(t, red[r], COUNT + i, want), "reduce %s op %d elem %zu", dtype_name(t), o, i);
        free(buf[r]);
        free(rs[r]);
        free(red[r]);
      }
    }
  }
}

/* The data-movement collectives on int32 with distinct values. */
static void data_movement(void) {
  int32_t in[N][N * COUNT], ag[N][N * COUNT], agi[N][N * COUNT], a2a[N][N * COUNT];
  int32_t bc[N][COUNT], bci[N][COUNT], ga[N][N * COUNT], sc[N][COUNT];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < N * COUNT; i++) {
      in[r][i] = 1000 * r + i;
      agi[r][i] = -1;
      ga[r][i] = -1;
    }
  for (int r = 0; r < N; r++) {
    memcpy(&agi[r][r * COUNT], in[r], COUNT * sizeof(int32_t));
    memcpy(bci[r], r == 1 ? in[r] : in[0] + 3 * COUNT, sizeof bci[r]);
  }
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    CHECK(ncclAllGather(in[r], ag[r], COUNT, ncclInt32, comms[r], NULL));
    CHECK(ncclAllGather(&agi[r][r * COUNT], agi[r], COUNT, ncclInt32, comms[r], NULL));
    CHECK(ncclAlltoAll(in[r], a2a[r], COUNT, ncclInt32, comms[r], NULL));
    CHECK(ncclBroadcast(in[r], bc[r], COUNT, ncclInt32, 2, comms[r], NULL));
    CHECK(ncclBcast(bci[r], COUNT, ncclInt32, 1, comms[r], NULL));
    CHECK(ncclGather(in[r], r == 1 ? ga[r] : NULL, COUNT, ncclInt32, 1, comms[r], NULL));
    CHECK(ncclScatter(r == 2 ? in[r] : NULL, sc[r], COUNT, ncclInt32, 2, comms[r], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++)
    for (int p = 0; p < N; p++)
      for (int i = 0; i < COUNT; i++) {
        EXPECT(ag[r][p * COUNT + i] == 1000 * p + i, "allgather rank %d", r);
        EXPECT(agi[r][p * COUNT + i] == 1000 * p + i, "in-place allgather rank %d", r);
        EXPECT(a2a[r][p * COUNT + i] == 1000 * p + r * COUNT + i, "alltoall rank %d", r);
        if (p == 0) {
          EXPECT(bc[r][i] == 2000 + i, "broadcast rank %d", r);
          EXPECT(bci[r][i] == 1000 + i, "bcast rank %d", r);
          EXPECT(sc[r][i] == 2000 + r * COUNT + i, "scatter rank %d", r);
        }
        if (r == 1) EXPECT(ga[r][p * COUNT + i] == 1000 * p + i, "gather");
      }
}

/* A send/recv ring in both directions plus a send to self, in one group
 * over all communicators. */
static void send_recv_rings(void) {
  double out[N][COUNT], right[N][COUNT], left[N][COUNT], self[N][COUNT];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) out[r][i] = r + i / 10.0;
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    CHECK(ncclSend(out[r], COUNT, ncclDouble, (r + 1) % N, comms[r], NULL));
    CHECK(ncclRecv(left[r], COUNT, ncclDouble, (r + N - 1) % N, comms[r], NULL));
    CHECK(ncclRecv(right[r], COUNT, ncclDouble, (r + 1) % N, comms[r], NULL));
    CHECK(ncclSend(out[r], COUNT, ncclDouble, (r + N - 1) % N, comms[r], NULL));
    CHECK(ncclSend(out[r], COUNT, ncclDouble, r, comms[r], NULL));
    CHECK(ncclRecv(self[r], COUNT, ncclDouble, r, comms[r], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) {
      EXPECT(left[r][i] == (r + N - 1) % N + i / 10.0, "ring from left, rank %d", r);
      EXPECT(right[r][i] == (r + 1) % N + i / 10.0, "ring from right, rank %d", r);
      EXPECT(self[r][i] == r + i / 10.0, "self send, rank %d", r);
    }
}

/* PreMulSum with the scalar read when the collective runs. */
static void premulsum_device_scalar(void) {
  int32_t scalar[N], send[N][COUNT], recv[N][COUNT];
  ncclRedOp_t op[N];
  for (int r = 0; r < N; r++) {
    scalar[r] = 1;
    CHECK(ncclRedOpCreatePreMulSum(&op[r], &scalar[r], ncclInt32, ncclScalarDevice, comms[r]));
    for (int i = 0; i < COUNT; i++) send[r][i] = r + 1;
  }
  for (int round = 0; round < 2; round++) {
    for (int r = 0; r < N; r++) scalar[r] = round == 0 ? 3 : r; /* read at run time */
    CHECK(ncclGroupStart());
    for (int r = 0; r < N; r++) CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclInt32, op[r], comms[r], NULL));
    CHECK(ncclGroupEnd());
    int want = round == 0 ? 3 * (1 + 2 + 3 + 4) : 0 * 1 + 1 * 2 + 2 * 3 + 3 * 4;
    for (int r = 0; r < N; r++)
      for (int i = 0; i < COUNT; i++) EXPECT(recv[r][i] == want, "premulsum round %d rank %d: %d", round, r, recv[r][i]);
  }
  for (int r = 0; r < N; r++) CHECK(ncclRedOpDestroy(op[r], comms[r]));
}

/* Split by parity, keys reversing the order; rank 3 opts out. */
static void split(void) {
  ncclComm_t sub[N];
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++)
    CHECK(ncclCommSplit(comms[r], r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2, -r, &sub[r], NULL));
  CHECK(ncclGroupEnd());
  EXPECT(sub[3] == NULL, "NOCOLOR gives NULL");
  int want_rank[3] = {1, 0, 0}, want_size[3] = {2, 1, 2};
  int32_t x[3] = {10, 20, 30}, y[3];
  for (int r = 0; r < 3; r++) {
    int rank, size;
    CHECK(ncclCommUserRank(sub[r], &rank));
    CHECK(ncclCommCount(sub[r], &size));
    EXPECT(rank == want_rank[r] && size == want_size[r], "split rank %d: %d of %d", r, rank, size);
  }
  CHECK(ncclGroupStart());
  for (int r = 0; r < 3; r++) CHECK(ncclAllReduce(&x[r], &y[r], 1, ncclInt32, ncclSum, sub[r], NULL));
  CHECK(ncclGroupEnd());
  EXPECT(y[0] == 40 && y[2] == 40 && y[1] == 20, "split allreduce: %d %d %d", y[0], y[1], y[2]);
  for (int r = 0; r < 3; r++) CHECK(ncclCommDestroy(sub[r]));
}

/* The other single-thread pattern: ncclCommInitRank for every rank inside
 * one group (the inits run together at ncclGroupEnd). */
static void grouped_init_rank(void) {
  enum { M = 3 };
  ncclUniqueId id;
  ncclComm_t c[M];
  float x[M], y[M];
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < M; r++) CHECK(ncclCommInitRank(&c[r], M, id, r));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int r = 0; r < M; r++) {
    x[r] = (float)(r + 1);
    CHECK(ncclAllReduce(&x[r], &y[r], 1, ncclFloat, ncclProd, c[r], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < M; r++) {
    ncclResult_t state;
    CHECK(ncclCommGetAsyncError(c[r], &state));
    EXPECT(state == ncclSuccess && y[r] == 6, "grouped init rank %d: %d %g", r, (int)state, y[r]);
    CHECK(ncclCommDestroy(c[r]));
  }
}

int main(void) {
  watchdog(240);
  int devs[N] = {3, 2, 1, 0};
  CHECK(ncclCommInitAll(comms, N, devs));
  for (int r = 0; r < N; r++) {
    int rank, size, dev;
    CHECK(ncclCommUserRank(comms[r], &rank));
    CHECK(ncclCommCount(comms[r], &size));
    CHECK(ncclCommCuDevice(comms[r], &dev));
    EXPECT(rank == r && size == N && dev == devs[r], "comm %d: rank %d size %d dev %d", r, rank, size, dev);
  }
  allreduce_every_type_and_op();
  reduce_and_reduce_scatter();
  data_movement();
  send_recv_rings();
  premulsum_device_scalar();
  split();
  grouped_init_rank();
  for (int r = 0; r < N; r++) {
    CHECK(ncclCommFinalize(comms[r]));
    CHECK(ncclCommDestroy(comms[r]));
  }
  printf("initall: OK\n");
  return 0;
}
