/*
 * A profiler plugin that does nothing but hand out one handle, with every
 * event type activated ($PROF_MASK overrides): the cost of the interface
 * itself (scripts/profiler_cost.sh).
 */
#include "nccl_profiler.h"

#include <stdlib.h>

static int handle;

static ncclResult_t noop_init(void** context, uint64_t commId, int* mask, const char* name,
                              int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commId; (void)name; (void)nNodes; (void)nranks; (void)rank; (void)logfn;
  const char* m = getenv("PROF_MASK");
  *mask = m ? (int)strtol(m, NULL, 0) : 0xfff;
  *context = &handle;
  return 0;
}

static ncclResult_t noop_start(void* context, void** h, ncclProfilerEventDescr_v5_t* d) {
  (void)context; (void)d;
  *h = &handle;
  return 0;
}

static ncclResult_t noop_stop(void* h) { (void)h; return 0; }

static ncclResult_t noop_state(void* h, ncclProfilerEventState_v5_t s,
                               ncclProfilerEventStateArgs_v5_t* a) {
  (void)h; (void)s; (void)a;
  return 0;
}

static ncclResult_t noop_finalize(void* context) { (void)context; return 0; }

ncclProfiler_v5_t ncclProfiler_v5 = {"noop", noop_init, noop_start, noop_stop, noop_state,
                                     noop_finalize};
