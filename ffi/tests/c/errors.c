/* Bad arguments and bad usage get NCCL's codes and a last-error message;
 * nothing crashes. Uses one-rank communicators (no peers needed). */
#include "util.h"

/* The ncclConfig_t of NCCL 2.14: the shortest layout that exists. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char* netName;
} config_v21400;

static ncclComm_t one_rank(ncclConfig_t* config) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  CHECK(ncclGetUniqueId(&id));
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, config);
  EXPECT(r == ncclSuccess || r == ncclInProgress, "init returned %d: %s", (int)r, ncclGetLastError(NULL));
  EXPECT(comm != NULL, "handle written");
  return comm;
}

int main(void) {
  watchdog(120);
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE && v == NCCL_VERSION(2, 30, 7), "version %d", v);
  EXPECT_FAIL(ncclGetVersion(NULL), ncclInvalidArgument, "NULL");
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "error string");
  EXPECT(strlen(ncclGetErrorString((ncclResult_t)1234)) > 0, "unknown code string");

  ncclComm_t comm = one_rank(NULL);
  float x[4] = {1, 2, 3, 4}, y[4];

  /* NULL and dead communicators. */
  EXPECT_FAIL(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, "comm is NULL");
  EXPECT_FAIL(ncclCommCount(NULL, &v), ncclInvalidArgument, "NULL");
  EXPECT_FAIL(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, (ncclComm_t)x, NULL), ncclInvalidArgument, "not a live communicator");

  /* Bad datatypes, ops, roots, buffers, peers. */
  EXPECT_FAIL(ncclAllReduce(x, y, 4, (ncclDataType_t)12, ncclSum, comm, NULL), ncclInvalidArgument, "datatype");
  EXPECT_FAIL(ncclAllReduce(x, y, 4, (ncclDataType_t)-1, ncclSum, comm, NULL), ncclInvalidArgument, "datatype");
  EXPECT_FAIL(ncclAllReduce(x, y, 4, ncclFloat, (ncclRedOp_t)5, comm, NULL), ncclInvalidArgument, "reduction op");
  EXPECT_FAIL(ncclAllReduce(x, y, 4, ncclFloat, (ncclRedOp_t)-3, comm, NULL), ncclInvalidArgument, "reduction op");
  EXPECT_FAIL(ncclBroadcast(x, y, 4, ncclFloat, 1, comm, NULL), ncclInvalidArgument, "root 1");
  EXPECT_FAIL(ncclReduce(x, y, 4, ncclFloat, ncclSum, -1, comm, NULL), ncclInvalidArgument, "root -1");
  EXPECT_FAIL(ncclAllReduce(NULL, y, 4, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument, "sendbuff is NULL");
  EXPECT_FAIL(ncclAllGather(x, NULL, 4, ncclFloat, comm, NULL), ncclInvalidArgument, "recvbuff is NULL");
  EXPECT_FAIL(ncclAllReduce(x, y, (size_t)-1, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument, "overflow");
  EXPECT_FAIL(ncclAllReduce((char*)x + 1, y, 2, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument, "aligned");
  EXPECT_FAIL(ncclSend(x, 4, ncclFloat, 1, comm, NULL), ncclInvalidArgument, "peer 1");
  EXPECT_FAIL(ncclRecv(y, 4, ncclFloat, -2, comm, NULL), ncclInvalidArgument, "peer -2");
  CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL)); /* count 0 needs no buffers */

  /* A one-rank communicator works, including send/recv to itself. */
  CHECK(ncclAllReduce(x, y, 4, ncclFloat, ncclAvg, comm, NULL));
  EXPECT(y[0] == 1 && y[3] == 4, "one-rank allreduce");
  memset(y, 0, sizeof y);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(x, 4, ncclFloat, 0, comm, NULL));
  CHECK(ncclRecv(y, 4, ncclFloat, 0, comm, NULL));
  CHECK(ncclGroupEnd());
  EXPECT(y[2] == 3, "self send/recv");

  /* Ops. */
  ncclRedOp_t op;
  float two = 2;
  EXPECT_FAIL(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat, (ncclScalarResidence_t)7, comm), ncclInvalidArgument, "residence");
  EXPECT_FAIL(ncclRedOpCreatePreMulSum(NULL, &two, ncclFloat, ncclScalarHostImmediate, comm), ncclInvalidArgument, NULL);
  CHECK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat, ncclScalarHostImmediate, comm));
  EXPECT(op == ncclNumOps, "first op id %d", (int)op);
  EXPECT_FAIL(ncclAllReduce(x, y, 4, ncclDouble, op, comm, NULL), ncclInvalidArgument, "created for float");
  CHECK(ncclAllReduce(x, y, 4, ncclFloat, op, comm, NULL));
  EXPECT(y[1] == 4 && x[1] == 2, "premulsum on one rank");
  EXPECT_FAIL(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "built in");
  CHECK(ncclRedOpDestroy(op, comm));
  EXPECT_FAIL(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "not a live op");

  /* Unimplemented functions say so. */
  ncclComm_t other = NULL;
  EXPECT_FAIL(ncclCommShrink(comm, NULL, 0, &other, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidUsage, "ncclCommShrink is not implemented");
  EXPECT(other == NULL, "no output on failure");
  EXPECT_FAIL(ncclCommRevoke(comm, 0), ncclInvalidUsage, "ncclCommRevoke");
  EXPECT_FAIL(pncclCommWindowRegister(comm, x, sizeof x, NULL, 0), ncclInvalidUsage, "ncclCommWindowRegister");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_FAIL(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "group simulation");
  ncclParamDumpAll();

  /* Group misuse: an end without a start; a failing call poisons its group. */
  EXPECT_FAIL(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, comm, NULL));
  EXPECT_FAIL(ncclAllReduce(x, y, 4, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument, "datatype");
  EXPECT_FAIL(ncclGroupEnd(), ncclInvalidArgument, "datatype");
  CHECK(ncclGroupStart());
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(x, y, 4, ncclFloat, ncclMax, comm, NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupEnd());

  /* Memory and registration. */
  void* mem = NULL;
  CHECK(ncclMemAlloc(&mem, 1000));
  EXPECT(mem != NULL && ((uintptr_t)mem % 64) == 0, "aligned allocation");
  void* reg = NULL;
  CHECK(ncclCommRegister(comm, mem, 1000, &reg));
  EXPECT_FAIL(ncclCommDeregister(comm, mem), ncclInvalidArgument, "registration handle");
  CHECK(ncclCommDeregister(comm, reg));
  EXPECT_FAIL(ncclCommDeregister(comm, reg), ncclInvalidArgument, NULL);
  CHECK(ncclMemFree(mem));
  EXPECT_FAIL(ncclMemFree(mem), ncclInvalidArgument, "ncclMemAlloc");
  /* A heap buffer: moved onto huge pages where the kernel allows, its bytes
     unchanged. */
  size_t heap_len = (size_t)5 << 20;
  unsigned char* heap = malloc(heap_len);
  EXPECT(heap != NULL, "malloc");
  for (size_t i = 0; i < heap_len; i++) heap[i] = (unsigned char)(i * 7 % 253);
  CHECK(ncclCommRegister(comm, heap, heap_len, &reg));
  int same = 1;
  for (size_t i = 0; i < heap_len; i++) same &= heap[i] == (unsigned char)(i * 7 % 253);
  EXPECT(same, "a registered heap buffer keeps its bytes");
  CHECK(ncclCommDeregister(comm, reg));
  free(heap);
  EXPECT_FAIL(ncclMemFree(x), ncclInvalidArgument, NULL);

  /* Configs: uninitialized, bad values, and an old shorter layout. */
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclComm_t c2 = NULL;
  EXPECT_FAIL(ncclCommInitRankConfig(&c2, 1, id, 0, &bad), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 5;
  EXPECT_FAIL(ncclCommInitRankConfig(&c2, 1, id, 0, &nb), ncclInvalidArgument, "blocking");
  nb.blocking = 1;
  nb.netName = "IB";
  EXPECT_FAIL(ncclCommInitRankConfig(&c2, 1, id, 0, &nb), ncclInvalidArgument, "netName");
  EXPECT(c2 == NULL, "no handle written on failure");
  EXPECT_FAIL(ncclCommInitRank(&c2, 2, id, 2), ncclInvalidArgument, "rank 2");
  EXPECT_FAIL(ncclCommInitRank(&c2, 0, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_FAIL(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument, "NULL");
  ncclUniqueId junk;
  memset(&junk, 0x5a, sizeof junk);
  EXPECT_FAIL(ncclCommInitRank(&c2, 1, junk, 0), ncclInvalidArgument, "unique id");
  config_v21400 old = {sizeof(config_v21400), NCCL_API_MAGIC, 21400, 0, NCCL_CONFIG_UNDEF_INT,
                       NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, "Socket"};
  ncclComm_t c3 = one_rank((ncclConfig_t*)&old); /* non-blocking, from the old layout */
  EXPECT(wait_comm(c3, 30) == ncclSuccess, "old-layout comm");
  EXPECT(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, c3, NULL) == ncclInProgress, "old layout read blocking = 0");
  EXPECT(wait_comm(c3, 30) == ncclSuccess, "old-layout allreduce");
  CHECK(ncclCommDestroy(c3));

  /* Split on one rank; finalize then use; destroy twice. */
  ncclComm_t sub;
  CHECK(ncclCommSplit(comm, 0, 0, &sub, NULL));
  CHECK(ncclCommCount(sub, &v));
  EXPECT(v == 1, "split count");
  EXPECT_FAIL(ncclCommSplit(comm, -7, 0, &sub, NULL), ncclInvalidArgument, "color");
  CHECK(ncclCommDestroy(sub));
  CHECK(ncclCommFinalize(comm));
  EXPECT_FAIL(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage, "finalized");
  CHECK(ncclCommDestroy(comm));
  EXPECT_FAIL(ncclCommDestroy(comm), ncclInvalidArgument, "not a live communicator");
  EXPECT_FAIL(ncclCommAbort(comm), ncclInvalidArgument, "not a live communicator");
  EXPECT_FAIL(ncclCommUserRank(comm, &v), ncclInvalidArgument, "not a live communicator");
  printf("errors: OK\n");
  return 0;
}
