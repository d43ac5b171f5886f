/*
 * A test profiler plugin: writes every callback it gets, with the fields
 * of each event, to $PROF_DIR/rank-RANK.log, one line each. Returns
 * $PROF_MASK (default: every type) as its activation mask, and sets it to
 * $PROF_MASK_LATER (if set) when its first Group stops. Built by
 * tests/tests/profiler.rs against nccl-rs's header; with -DRECORD_V4 it
 * exports only ncclProfiler_v4.
 */
#include "nccl_profiler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ctx {
  FILE* out;
  int next;
  int* mask;
  int changed;
};

struct ev {
  int id;
  uint64_t type;
  struct ctx* ctx;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static long long now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int id_of(void* h) { return h ? ((struct ev*)h)->id : 0; }

static const char* s(const char* p) { return p ? p : "(null)"; }

static ncclResult_t init_common(void** context, int* mask, const char* name, uint64_t hash,
                                int nNodes, int nranks, int rank, int version) {
  const char* dir = getenv("PROF_DIR");
  const char* m = getenv("PROF_MASK");
  char path[4096];
  struct ctx* c = calloc(1, sizeof *c);
  if (!c || !dir) return 1;
  snprintf(path, sizeof path, "%s/rank-%d.log", dir, rank);
  c->out = fopen(path, "w");
  if (!c->out) return 1;
  c->next = 1;
  *mask = m ? (int)strtol(m, NULL, 0) : 0xfff;
  c->mask = mask;
  fprintf(c->out, "init v=%d rank=%d nranks=%d nnodes=%d hash=%016llx name=%s mask=%d\n", version,
          rank, nranks, nNodes, (unsigned long long)hash, s(name), *mask);
  *context = c;
  return 0;
}

static ncclResult_t rec_stop(void* h) {
  struct ev* e = h;
  pthread_mutex_lock(&lock);
  fprintf(e->ctx->out, "stop id=%d t=%lld\n", e->id, now());
  const char* later = getenv("PROF_MASK_LATER");
  if (later && e->type == ncclProfileGroup && !e->ctx->changed) {
    e->ctx->changed = 1;
    __atomic_store_n(e->ctx->mask, (int)strtol(later, NULL, 0), __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static ncclResult_t rec_state(void* h, ncclProfilerEventState_t st,
                              ncclProfilerEventStateArgs_v5_t* args) {
  struct ev* e = h;
  pthread_mutex_lock(&lock);
  /* size: transSize of a ProxyStep, pTimer of a KernelCh. */
  long long size = -1;
  if (args && e->type == ncclProfileKernelCh) size = (long long)args->kernelCh.pTimer;
  else if (args) size = (long long)args->proxyStep.transSize;
  fprintf(e->ctx->out, "state id=%d s=%d size=%lld t=%lld\n", e->id, (int)st, size, now());
  pthread_mutex_unlock(&lock);
  return 0;
}

static ncclResult_t rec_finalize(void* context) {
  struct ctx* c = context;
  fprintf(c->out, "finalize\n");
  fclose(c->out);
  free(c);
  return 0;
}

#ifndef RECORD_V4
typedef ncclProfilerEventDescr_v5_t descr_t;
#define GROUP_OF(d, f) id_of((d)->f.parentGroup)
#else
typedef ncclProfilerEventDescr_v4_t descr_t;
#define GROUP_OF(d, f) -1
#endif

static ncclResult_t rec_start(void* context, void** h, descr_t* d) {
  struct ctx* c = context;
  struct ev* e = calloc(1, sizeof *e);
  if (!e) return 1;
  pthread_mutex_lock(&lock);
  e->id = c->next++;
  e->type = d->type;
  e->ctx = c;
  FILE* o = c->out;
  fprintf(o, "start id=%d parent=%d rank=%d ", e->id, id_of(d->parentObj), d->rank);
  switch (d->type) {
    case ncclProfileGroup:
      fprintf(o, "type=Group");
      break;
    case ncclProfileColl:
      fprintf(o,
              "type=Coll group=%d seq=%llu func=%s send=%p recv=%p count=%zu root=%d dtype=%s "
              "nch=%d nwarps=%d algo=%s proto=%s",
              GROUP_OF(d, coll), (unsigned long long)d->coll.seqNumber, s(d->coll.func),
              d->coll.sendBuff, d->coll.recvBuff, d->coll.count, d->coll.root,
              s(d->coll.datatype), d->coll.nChannels, d->coll.nWarps, s(d->coll.algo),
              s(d->coll.proto));
      break;
    case ncclProfileP2p:
      fprintf(o, "type=P2p group=%d func=%s buff=%p dtype=%s count=%zu peer=%d nch=%d",
              GROUP_OF(d, p2p), s(d->p2p.func), d->p2p.buff, s(d->p2p.datatype), d->p2p.count,
              d->p2p.peer, d->p2p.nChannels);
      break;
    case ncclProfileProxyOp:
      fprintf(o, "type=ProxyOp pid=%d ch=%d peer=%d nsteps=%d chunk=%d send=%d",
              (int)d->proxyOp.pid, d->proxyOp.channelId, d->proxyOp.peer, d->proxyOp.nSteps,
              d->proxyOp.chunkSize, d->proxyOp.isSend);
      break;
    case ncclProfileProxyStep:
      fprintf(o, "type=ProxyStep step=%d", d->proxyStep.step);
      break;
    case ncclProfileKernelCh:
      fprintf(o, "type=KernelCh ch=%d ptimer=%llu", d->kernelCh.channelId,
              (unsigned long long)d->kernelCh.pTimer);
      break;
    case ncclProfileNetPlugin: {
      long long id = (long long)d->netPlugin.id;
      fprintf(o, "type=NetPlugin plugin=%#llx", id);
      if (id == (NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER)) {
        ncclProfilerNetSockDescr_v1_t* n = d->netPlugin.data;
        fprintf(o, " kind=%d fd=%d op=%d len=%zu", n->type, n->sock.fd, n->sock.op,
                n->sock.length);
      } else if (id == (NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER)) {
        ncclProfilerNetIbDescr_v1_t* n = d->netPlugin.data;
        fprintf(o, " kind=%d dev=%d wr=%llu opcode=%d qp=%d len=%zu", n->type, n->qp.device,
                (unsigned long long)n->qp.wr_id, n->qp.opcode, n->qp.qpNum, n->qp.length);
      }
      break;
    }
    default:
      fprintf(o, "type=Other%llu", (unsigned long long)d->type);
  }
  fprintf(o, " t=%lld\n", now());
  pthread_mutex_unlock(&lock);
  *h = e;
  return 0;
}

#ifndef RECORD_V4
static ncclResult_t rec_init(void** context, uint64_t commId, int* mask, const char* name,
                             int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  return init_common(context, mask, name, commId, nNodes, nranks, rank, 5);
}

ncclProfiler_v5_t ncclProfiler_v5 = {"record", rec_init, rec_start, rec_stop, rec_state,
                                     rec_finalize};
#else
static ncclResult_t rec_init(void** context, int* mask, const char* name, uint64_t hash,
                             int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  return init_common(context, mask, name, hash, nNodes, nranks, rank, 4);
}

ncclProfiler_v4_t ncclProfiler_v4 = {"record-v4", rec_init, rec_start, rec_stop,
                                     (ncclResult_t(*)(void*, ncclProfilerEventState_v4_t,
                                                      ncclProfilerEventStateArgs_v4_t*))rec_state,
                                     rec_finalize};
#endif
