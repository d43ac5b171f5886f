/* A stand-in for the CUDA driver (libcuda.so.1), for testing the `cuda`
 * feature on machines without a GPU. Build:
 *   cc -shared -fPIC -O1 -pthread -Wl,-soname,libcuda.so.1 fake_libcuda.c -o libcuda.so.1
 *
 * It is strict where real bugs would hide:
 * - Device memory is an address range the CPU cannot touch (mmap
 *   PROT_NONE) backed by a hidden host copy. Reading or writing a device
 *   pointer on the host crashes, as it would on a GPU; only the copy
 *   functions reach the data.
 * - Each stream is a thread that runs its work later (with a delay,
 *   FAKE_CUDA_DELAY_US, default 200), in order. Host code that does not
 *   wait for the stream reads stale data.
 * - Calls that need a current context fail without one
 *   (CUDA_ERROR_INVALID_CONTEXT), and work on a stream of another context
 *   than the current one fails (CUDA_ERROR_INVALID_HANDLE).
 * - cuPointerGetAttribute fails with CUDA_ERROR_INVALID_VALUE for memory
 *   it did not allocate (pageable host memory), as the driver does.
 *
 * Not modelled: the legacy default stream's implicit synchronisation with
 * other streams (NULL, cudaStreamLegacy and cudaStreamPerThread are one
 * ordinary stream here), kernels, peer access.
 *
 * Environment: FAKE_CUDA_DEVICES (default 1; 0 makes cuInit fail with
 * CUDA_ERROR_NO_DEVICE), FAKE_CUDA_DELAY_US, FAKE_CUDA_DMABUF=1 (DMA-BUF
 * export supported: cuMemGetHandleForAddressRange returns a memfd),
 * FAKE_CUDA_MEMOPS=0 (no stream memory operations: cuStreamWaitValue32
 * fails with CUDA_ERROR_NOT_SUPPORTED; see the streamop block),
 * FAKE_CUDA_FREE_SYNCS=1 (frees synchronize implicitly; see the freesync
 * block). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fctx* CUcontext;
typedef struct fstream* CUstream;
typedef struct fevent* CUevent;
typedef void (*CUhostFn)(void*);

enum {
  OK = 0,
  E_INVALID_VALUE = 1,
  E_OUT_OF_MEMORY = 2,
  E_NOT_INITIALIZED = 3,
  E_NO_DEVICE = 100,
  E_INVALID_DEVICE = 101,
  E_INVALID_CONTEXT = 201,
  E_INVALID_HANDLE = 400,
  E_NOT_READY = 600,
  E_NOT_SUPPORTED = 801,
};

#define MAXDEV 8
struct fctx {
  int dev;
};
static struct fctx g_ctx[MAXDEV];
static int g_init;
static int g_ndev = 1;
static long g_delay_us = 200;
static __thread CUcontext t_cur;
static atomic_ullong g_async_copies;

/* ---------------------------------------------------------------- memory */

#define MAXALLOC 65536
struct alloc {
  uintptr_t base;
  size_t size;
  char* shadow; /* device memory: the hidden copy; NULL for host memory */
  int dev;
  int used;
};
static struct alloc g_allocs[MAXALLOC];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static struct alloc* find_locked(uintptr_t a) {
  for (int i = 0; i < MAXALLOC; i++) {
    struct alloc* x = &g_allocs[i];
    if (x->used && a >= x->base && a < x->base + (x->size ? x->size : 1)) return x;
  }
  return NULL;
}

static int add_alloc(uintptr_t base, size_t size, char* shadow, int dev) {
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < MAXALLOC; i++) {
    if (!g_allocs[i].used) {
      g_allocs[i] = (struct alloc){base, size, shadow, dev, 1};
      pthread_mutex_unlock(&g_lock);
      return 0;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return -1;
}

static void die(const char* what, uintptr_t a, size_t n) {
  fprintf(stderr, "fake libcuda: %s (address %#lx, %zu bytes)\n", what, (unsigned long)a, n);
  abort();
}

/* Where the CPU finds `n` bytes at address `a`: the hidden copy for device
 * memory, the address itself for host memory. */
static void* xlate(uintptr_t a, size_t n) {
  pthread_mutex_lock(&g_lock);
  struct alloc* x = find_locked(a);
  void* p = (void*)a;
  if (x && x->shadow) {
    if (a + n > x->base + x->size) die("copy past the end of a device allocation", a, n);
    p = x->shadow + (a - x->base);
  }
  pthread_mutex_unlock(&g_lock);
  return p;
}

static int need_ctx(void) { return g_init && t_cur != NULL; }

/* --------------------------------------------------------------- streams */

enum { OP_COPY, OP_RECORD, OP_WAITEV, OP_HOSTFN, OP_WAITVAL, OP_SET };
struct op {
  int kind;
  uintptr_t dst, src;
  size_t n;
  unsigned char byte;
  struct fevent* ev;
  unsigned long long gen;
  CUhostFn fn;
  void* data;
  uintptr_t addr;
  uint32_t val;
  unsigned flags;
  struct op* next;
};

struct fstream {
  pthread_mutex_t m;
  pthread_cond_t c;
  struct op *head, *tail;
  unsigned long long submitted, done;
  int stop;
  pthread_t th;
  CUcontext ctx; /* NULL: the default stream, any context */
};

struct fevent {
  pthread_mutex_t m;
  pthread_cond_t c;
  unsigned long long recorded, completed;
  CUcontext ctx;
};

/* freesync block */
static void freesync_register(struct fstream* s);
static int freesync_keeps(struct fstream* s);
static void freesync_wait(const char* what);

static void pause_us(long us) {
  if (us <= 0) return;
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, NULL);
}

static void run_op(struct op* o) {
  switch (o->kind) {
    case OP_COPY: {
      void* d = xlate(o->dst, o->n);
      void* s = xlate(o->src, o->n);
      memmove(d, s, o->n);
      break;
    }
    case OP_SET:
      memset(xlate(o->dst, o->n), o->byte, o->n);
      break;
    case OP_RECORD:
      pthread_mutex_lock(&o->ev->m);
      if (o->gen > o->ev->completed) o->ev->completed = o->gen;
      pthread_cond_broadcast(&o->ev->c);
      pthread_mutex_unlock(&o->ev->m);
      break;
    case OP_WAITEV:
      pthread_mutex_lock(&o->ev->m);
      while (o->ev->completed < o->gen) pthread_cond_wait(&o->ev->c, &o->ev->m);
      pthread_mutex_unlock(&o->ev->m);
      break;
    case OP_HOSTFN:
      o->fn(o->data);
      break;
    case OP_WAITVAL: {
      volatile uint32_t* p = (volatile uint32_t*)xlate(o->addr, 4);
      for (;;) {
        uint32_t v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
        int okv = (o->flags & 3) == 0   ? (int32_t)(v - o->val) >= 0 /* GEQ */
                  : (o->flags & 3) == 1 ? v == o->val               /* EQ */
                  : (o->flags & 3) == 2 ? (v & o->val) != 0         /* AND */
                                        : ~(v | ~o->val) != 0;      /* NOR */
        if (okv) break;
        pause_us(20);
      }
      break;
    }
  }
}

static void* stream_main(void* arg) {
  struct fstream* s = arg;
  unsigned seed = (unsigned)(uintptr_t)s;
  pthread_mutex_lock(&s->m);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->c, &s->m);
    if (!s->head) break;
    struct op* o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->m);
    if (o->kind == OP_COPY || o->kind == OP_SET) pause_us(g_delay_us ? rand_r(&seed) % (2 * g_delay_us) : 0);
    run_op(o);
    free(o);
    pthread_mutex_lock(&s->m);
    s->done++;
    pthread_cond_broadcast(&s->c);
  }
  pthread_mutex_unlock(&s->m);
  return NULL;
}

static struct fstream* new_stream(CUcontext ctx) {
  struct fstream* s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->m, NULL);
  pthread_cond_init(&s->c, NULL);
  s->ctx = ctx;
  pthread_create(&s->th, NULL, stream_main, s);
  freesync_register(s);
  return s;
}

static struct fstream* g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static void make_default(void) { g_default = new_stream(NULL); }

/* The stream behind a handle (NULL, 1 and 2 are the default stream), or
 * NULL with *err set. */
static struct fstream* stream_of(CUstream h, CUresult* err) {
  if (!need_ctx()) {
    *err = E_INVALID_CONTEXT;
    return NULL;
  }
  if ((uintptr_t)h <= 2) {
    pthread_once(&g_default_once, make_default);
    return g_default;
  }
  if (h->ctx != t_cur) {
    *err = E_INVALID_HANDLE;
    return NULL;
  }
  return h;
}

static void submit(struct fstream* s, struct op o) {
  struct op* p = malloc(sizeof *p);
  *p = o;
  p->next = NULL;
  pthread_mutex_lock(&s->m);
  if (s->tail)
    s->tail->next = p;
  else
    s->head = p;
  s->tail = p;
  s->submitted++;
  pthread_cond_broadcast(&s->c);
  pthread_mutex_unlock(&s->m);
}

static void drain(struct fstream* s) {
  pthread_mutex_lock(&s->m);
  unsigned long long target = s->submitted;
  while (s->done < target) pthread_cond_wait(&s->c, &s->m);
  pthread_mutex_unlock(&s->m);
}

/* ------------------------------------------------------------ init, devices */

API CUresult cuInit(unsigned flags) {
  (void)flags;
  const char* n = getenv("FAKE_CUDA_DEVICES");
  if (n) g_ndev = atoi(n);
  if (g_ndev > MAXDEV) g_ndev = MAXDEV;
  const char* d = getenv("FAKE_CUDA_DELAY_US");
  if (d) g_delay_us = atol(d);
  if (g_ndev <= 0) return E_NO_DEVICE;
  for (int i = 0; i < MAXDEV; i++) g_ctx[i].dev = i;
  g_init = 1;
  return OK;
}

API CUresult cuDriverGetVersion(int* v) {
  if (!v) return E_INVALID_VALUE;
  *v = 13000;
  return OK;
}

API CUresult cuDeviceGetCount(int* n) {
  if (!g_init) return E_NOT_INITIALIZED;
  *n = g_ndev;
  return OK;
}

API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!g_init) return E_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= g_ndev) return E_INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  if (!g_init) return E_NOT_INITIALIZED;
  snprintf(name, (size_t)len, "Fake CUDA Device %d", d);
  return OK;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  (void)d;
  *bytes = (size_t)16 << 30;
  return OK;
}

static int memops_on(void); /* streamop block */

API CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
  if (!g_init) return E_NOT_INITIALIZED;
  if (d < 0 || d >= g_ndev) return E_INVALID_DEVICE;
  switch (attr) {
    case 33: *v = 0x10 + d; break;           /* PCI bus */
    case 34: case 50: *v = 0; break;         /* PCI device, domain */
    case 41: *v = 1; break;                  /* unified addressing */
    case 75: *v = 9; break;                  /* compute capability */
    case 76: *v = 0; break;
    case 116: *v = getenv("FAKE_CUDA_DMABUF") ? 1 : 0; break; /* GPUDirect RDMA */
    case 124: *v = getenv("FAKE_CUDA_DMABUF") ? 1 : 0; break; /* DMA-BUF */
    case 92: case 94: case 123: *v = memops_on(); break; /* stream memory ops (streamop block) */
    default: *v = 0; break;
  }
  return OK;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  if (!g_init) return E_NOT_INITIALIZED;
  if (d < 0 || d >= g_ndev) return E_INVALID_DEVICE;
  *c = &g_ctx[d];
  return OK;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  (void)d;
  return OK;
}

API CUresult cuCtxSetCurrent(CUcontext c) {
  if (!g_init) return E_NOT_INITIALIZED;
  t_cur = c;
  return OK;
}

API CUresult cuCtxGetCurrent(CUcontext* c) {
  if (!g_init) return E_NOT_INITIALIZED;
  *c = t_cur;
  return OK;
}

API CUresult cuCtxGetDevice(CUdevice* d) {
  if (!need_ctx()) return E_INVALID_CONTEXT;
  *d = t_cur->dev;
  return OK;
}

API CUresult cuCtxSynchronize(void) {
  if (!need_ctx()) return E_INVALID_CONTEXT;
  pthread_once(&g_default_once, make_default);
  drain(g_default);
  return OK;
}

API CUresult cuGetErrorName(CUresult e, const char** s) {
  switch (e) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case E_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case E_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case E_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case E_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case E_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case E_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case E_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case E_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case E_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *s = NULL; return E_INVALID_VALUE;
  }
  return OK;
}

API CUresult cuGetErrorString(CUresult e, const char** s) { return cuGetErrorName(e, s); }

/* ---------------------------------------------------------------- alloc */

API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  if (!need_ctx()) return E_INVALID_CONTEXT;
  if (bytes == 0) return E_INVALID_VALUE;
  size_t span = (bytes + 4095) & ~(size_t)4095;
  void* base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  char* shadow = calloc(1, bytes);
  if (base == MAP_FAILED || !shadow) return E_OUT_OF_MEMORY;
  /* Fill with garbage, as fresh device memory is. */
  memset(shadow, 0xA5, bytes);
  if (add_alloc((uintptr_t)base, bytes, shadow, t_cur->dev)) return E_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)base;
  return OK;
}

API CUresult cuMemFree_v2(CUdeviceptr p) {
  if (!need_ctx()) return E_INVALID_CONTEXT;
  freesync_wait("cuMemFree");
  pthread_mutex_lock(&g_lock);
  struct alloc* x = find_locked((uintptr_t)p);
  if (!x || !x->shadow || x->base != (uintptr_t)p) {
    pthread_mutex_unlock(&g_lock);
    return E_INVALID_VALUE;
  }
  munmap((void*)x->base, (x->size + 4095) & ~(size_t)4095);
  free(x->shadow);
  x->used = 0;
  pthread_mutex_unlock(&g_lock);
  return OK;
}

API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
  (void)flags;
  if (!need_ctx()) return E_INVALID_CONTEXT;
  void* m = NULL;
  if (posix_memalign(&m, 4096, bytes ? bytes : 1)) return E_OUT_OF_MEMORY;
  if (add_alloc((uintptr_t)m, bytes, NULL, t_cur->dev)) return E_OUT_OF_MEMORY;
  *p = m;
  return OK;
}

API CUresult cuMemAllocHost_v2(void** p, size_t bytes) { return cuMemHostAlloc(p, bytes, 0); }

API CUresult cuMemFreeHost(void* p) {
  freesync_wait("cuMemFreeHost");
  pthread_mutex_lock(&g_lock);
  struct alloc* x = find_locked((uintptr_t)p);
  if (!x || x->shadow || x->base != (uintptr_t)p) {
    pthread_mutex_unlock(&g_lock);
    return E_INVALID_VALUE;
  }
  x->used = 0;
  pthread_mutex_unlock(&g_lock);
  free(p);
  return OK;
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned flags) {
  (void)flags;
  *d = (CUdeviceptr)(uintptr_t)p;
  return OK;
}

API CUresult cuPointerGetAttribute(void* data, int attr, CUdeviceptr ptr) {
  if (!g_init) return E_NOT_INITIALIZED;
  pthread_mutex_lock(&g_lock);
  struct alloc* x = find_locked((uintptr_t)ptr);
  struct alloc a = x ? *x : (struct alloc){0};
  pthread_mutex_unlock(&g_lock);
  if (!x) return E_INVALID_VALUE;
  switch (attr) {
    case 1: *(CUcontext*)data = &g_ctx[a.dev]; break;
    case 2: *(unsigned*)data = a.shadow ? 2 : 1; break;
    case 8: *(unsigned*)data = 0; break;
    case 9: *(int*)data = a.dev; break;
    case 11: *(CUdeviceptr*)data = a.base; break;
    case 12: *(size_t*)data = a.size; break;
    default: return E_NOT_SUPPORTED;
  }
  return OK;
}

API CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr p, size_t size, int type,
                                           unsigned long long flags) {
  (void)flags;
  if (!need_ctx()) return E_INVALID_CONTEXT;
  if (!getenv("FAKE_CUDA_DMABUF") || type != 1) return E_NOT_SUPPORTED;
  pthread_mutex_lock(&g_lock);
  struct alloc* x = find_locked((uintptr_t)p);
  int ok = x && x->shadow && (uintptr_t)p + size <= x->base + ((x->size + 4095) & ~(size_t)4095) &&
           (p & 4095) == 0 && (size & 4095) == 0;
  pthread_mutex_unlock(&g_lock);
  if (!ok) return E_INVALID_VALUE;
  int fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
  if (fd < 0) return E_OUT_OF_MEMORY;
  *(int*)handle = fd;
  return OK;
}

/* --------------------------------------------------------------- streams */

API CUresult cuStreamCreate(CUstream* s, unsigned flags) {
  (void)flags;
  if (!need_ctx()) return E_INVALID_CONTEXT;
  *s = new_stream(t_cur);
  return OK;
}

API CUresult cuStreamCreateWithPriority(CUstream* s, unsigned flags, int prio) {
  (void)prio;
  return cuStreamCreate(s, flags);
}

API CUresult cuStreamDestroy_v2(CUstream s) {
  if ((uintptr_t)s <= 2) return E_INVALID_HANDLE;
  drain(s);
  pthread_mutex_lock(&s->m);
  s->stop = 1;
  pthread_cond_broadcast(&s->c);
  pthread_mutex_unlock(&s->m);
  pthread_join(s->th, NULL);
  if (!freesync_keeps(s)) free(s);
  return OK;
}

API CUresult cuStreamGetCtx(CUstream h, CUcontext* c) {
  if (!g_init) return E_NOT_INITIALIZED;
  if ((uintptr_t)h <= 2) {
    if (!t_cur) return E_INVALID_CONTEXT;
    *c = t_cur;
    return OK;
  }
  *c = h->ctx;
  return OK;
}

API CUresult cuStreamSynchronize(CUstream h) {
  CUresult e = OK;
  struct fstream* s = (uintptr_t)h > 2 ? h : stream_of(h, &e);
  if (!s) return e;
  drain(s);
  return OK;
}

API CUresult cuStreamQuery(CUstream h) {
  CUresult e = OK;
  struct fstream* s = (uintptr_t)h > 2 ? h : stream_of(h, &e);
  if (!s) return e;
  pthread_mutex_lock(&s->m);
  int idle = s->done == s->submitted;
  pthread_mutex_unlock(&s->m);
  return idle ? OK : E_NOT_READY;
}

/* Whether the driver knows this address (device or pinned host memory). */
static int known(CUdeviceptr a) {
  pthread_mutex_lock(&g_lock);
  int k = find_locked((uintptr_t)a) != NULL;
  pthread_mutex_unlock(&g_lock);
  return k;
}

static CUresult copy_on(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, int wait) {
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  /* Fail now, as the driver does, for a device range that is not there. */
  xlate((uintptr_t)dst, n);
  xlate((uintptr_t)src, n);
  if (!known(dst) || !known(src)) {
    /* Pageable host memory: the driver waits for the stream, copies, and
     * returns when the host side is done with (cudaMemcpyAsync's rules). */
    drain(s);
    memmove(xlate((uintptr_t)dst, n), xlate((uintptr_t)src, n), n);
    return OK;
  }
  atomic_fetch_add(&g_async_copies, 1);
  submit(s, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
  if (wait) drain(s);
  return OK;
}

API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h) { return copy_on(d, s, n, h, 0); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, CUstream h) {
  return copy_on(d, (CUdeviceptr)(uintptr_t)s, n, h, 0);
}
API CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, CUstream h) {
  return copy_on((CUdeviceptr)(uintptr_t)d, s, n, h, 0);
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h) { return copy_on(d, s, n, h, 0); }
API CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy_on(d, s, n, NULL, 1); }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) {
  return copy_on(d, (CUdeviceptr)(uintptr_t)s, n, NULL, 1);
}
API CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) {
  return copy_on((CUdeviceptr)(uintptr_t)d, s, n, NULL, 1);
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy_on(d, s, n, NULL, 1); }

API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream h) {
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  xlate((uintptr_t)d, n);
  submit(s, (struct op){.kind = OP_SET, .dst = d, .n = n, .byte = v});
  return OK;
}

API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  CUresult e = cuMemsetD8Async(d, v, n, NULL);
  if (e == OK) drain(g_default);
  return e;
}

API CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void* data) {
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  submit(s, (struct op){.kind = OP_HOSTFN, .fn = fn, .data = data});
  return OK;
}

API CUresult cuStreamWaitValue32_v2(CUstream h, CUdeviceptr addr, uint32_t value, unsigned flags) {
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  if (!memops_on()) return E_NOT_SUPPORTED;
  if (!known(addr)) return E_INVALID_VALUE; /* pageable memory: not mapped for the device */
  submit(s, (struct op){.kind = OP_WAITVAL, .addr = addr, .val = value, .flags = flags});
  return OK;
}

/* ------------------------------------------------ stream memory operations
 * (streamop block) The v1 entry point, and FAKE_CUDA_MEMOPS=0: stream
 * memory operations unavailable (the attributes CAN_USE_STREAM_MEM_OPS_V1
 * (92), CAN_USE_STREAM_WAIT_VALUE_NOR (94, 123) read 0, and the wait
 * functions fail with CUDA_ERROR_NOT_SUPPORTED), as on a driver where
 * they are disabled. The wait runs on the stream's thread, which polls
 * the 32-bit word (GEQ is the wrap-around comparison the driver uses). */
static int memops_on(void) {
  const char* m = getenv("FAKE_CUDA_MEMOPS");
  return !(m && strcmp(m, "0") == 0);
}

API CUresult cuStreamWaitValue32(CUstream h, CUdeviceptr addr, uint32_t value, unsigned flags) {
  return cuStreamWaitValue32_v2(h, addr, value, flags);
}

/* ------------------------------------------------ end of streamop block */

/* ---------------------------------------------------------------- events */

API CUresult cuEventCreate(CUevent* ev, unsigned flags) {
  (void)flags;
  if (!need_ctx()) return E_INVALID_CONTEXT;
  struct fevent* e = calloc(1, sizeof *e);
  pthread_mutex_init(&e->m, NULL);
  pthread_cond_init(&e->c, NULL);
  e->ctx = t_cur;
  *ev = e;
  return OK;
}

API CUresult cuEventDestroy_v2(CUevent ev) {
  if (!ev) return E_INVALID_HANDLE;
  /* Events may be destroyed while recorded work is pending; keep it simple:
   * wait for it (the driver defers the release instead). */
  pthread_mutex_lock(&ev->m);
  while (ev->completed < ev->recorded) pthread_cond_wait(&ev->c, &ev->m);
  pthread_mutex_unlock(&ev->m);
  free(ev);
  return OK;
}

API CUresult cuEventRecord(CUevent ev, CUstream h) {
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  if (ev->ctx != t_cur) return E_INVALID_HANDLE;
  pthread_mutex_lock(&ev->m);
  unsigned long long gen = ++ev->recorded;
  pthread_mutex_unlock(&ev->m);
  submit(s, (struct op){.kind = OP_RECORD, .ev = ev, .gen = gen});
  return OK;
}

API CUresult cuEventRecordWithFlags(CUevent ev, CUstream h, unsigned flags) {
  (void)flags;
  return cuEventRecord(ev, h);
}

API CUresult cuEventSynchronize(CUevent ev) {
  pthread_mutex_lock(&ev->m);
  unsigned long long target = ev->recorded;
  while (ev->completed < target) pthread_cond_wait(&ev->c, &ev->m);
  pthread_mutex_unlock(&ev->m);
  return OK;
}

API CUresult cuEventQuery(CUevent ev) {
  pthread_mutex_lock(&ev->m);
  int done = ev->completed >= ev->recorded;
  pthread_mutex_unlock(&ev->m);
  return done ? OK : E_NOT_READY;
}

API CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned flags) {
  (void)flags;
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  pthread_mutex_lock(&ev->m);
  unsigned long long gen = ev->recorded;
  pthread_mutex_unlock(&ev->m);
  submit(s, (struct op){.kind = OP_WAITEV, .ev = ev, .gen = gen});
  return OK;
}

/* ------------------------------------------------ implicitly synchronizing
 * frees (freesync block). With FAKE_CUDA_FREE_SYNCS=1, cuMemFree and
 * cuMemFreeHost first wait for the work enqueued on every stream before
 * the call, as the real driver may ("this API may perform implicit
 * synchronization"). A free while a stream waits for the caller (a gate
 * the caller would release) never returns on a GPU; here the wait ends
 * after FAKE_CUDA_FREE_SYNC_TIMEOUT_S seconds (default 20) and the process
 * aborts with a message saying so. Streams are then never freed (a waiting
 * free may still look at a destroyed one: it is drained, so idle). */

#define FREESYNC_MAX 4096
static pthread_mutex_t g_fs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fstream* g_fs_streams[FREESYNC_MAX];
static int g_fs_count;

static int freesync_on(void) {
  const char* v = getenv("FAKE_CUDA_FREE_SYNCS");
  return v && strcmp(v, "1") == 0;
}

static void freesync_register(struct fstream* s) {
  if (!freesync_on()) return;
  pthread_mutex_lock(&g_fs_lock);
  if (g_fs_count == FREESYNC_MAX) {
    fprintf(stderr, "fake libcuda: FAKE_CUDA_FREE_SYNCS=1 tracks at most %d streams\n", FREESYNC_MAX);
    abort();
  }
  g_fs_streams[g_fs_count++] = s;
  pthread_mutex_unlock(&g_fs_lock);
}

static int freesync_keeps(struct fstream* s) {
  (void)s;
  return freesync_on();
}

static void freesync_wait(const char* what) {
  if (!freesync_on()) return;
  const char* t = getenv("FAKE_CUDA_FREE_SYNC_TIMEOUT_S");
  long secs = t && atol(t) > 0 ? atol(t) : 20;
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += secs;
  pthread_mutex_lock(&g_fs_lock);
  int count = g_fs_count;
  pthread_mutex_unlock(&g_fs_lock);
  for (int i = 0; i < count; i++) {
    struct fstream* s = g_fs_streams[i];
    pthread_mutex_lock(&s->m);
    unsigned long long target = s->submitted;
    while (s->done < target) {
      if (pthread_cond_timedwait(&s->c, &s->m, &deadline) == ETIMEDOUT && s->done < target) {
        fprintf(stderr,
                "fake libcuda: %s waited %ld s for the work enqueued on stream %p before it (an implicitly "
                "synchronizing free, FAKE_CUDA_FREE_SYNCS=1): the stream waits for the freeing thread, "
                "a deadlock on a real GPU\n",
                what, secs, (void*)s);
        abort();
      }
    }
    pthread_mutex_unlock(&s->m);
  }
}

/* ------------------------------------------------ end of freesync block */

/* ------------------------------------------------------------ test hooks */

/* How many copies went through streams (tests check staging happened). */
API unsigned long long fakeCudaAsyncCopies(void) { return atomic_load(&g_async_copies); }

/* ------------------------------------------------------------- modules
 * (gpured block) Real PTX cannot run here: cuModuleLoadData fails with
 * CUDA_ERROR_NOT_SUPPORTED, so staged reductions take the host path
 * (NCCL_RS_CUDA_REDUCE=auto) or fail cleanly (=gpu). For tests of the GPU
 * reduction path, an image "FAKECPU:<path>" loads <path>, the reduction
 * kernels built for the CPU (nccl-rs/src/cuda/kernels_cpu_shim.h; a test
 * NVRTC hands out such images), and cuLaunchKernel runs them on the
 * stream's thread: kernels ncclrs_reduce_* (dst, src, u64, u32, u64, u64)
 * and ncclrs_scale_* (dst, src, u64, u64), the two pointers translated to
 * the hidden copies. */

#include <dlfcn.h>

typedef struct fmodule {
  void* lib;
}* CUmodule;
typedef struct ffunction {
  void* fn;
  void (*set_index)(unsigned, unsigned, unsigned, unsigned);
  int scale; /* 1: ncclrs_scale_*, 0: ncclrs_reduce_* */
}* CUfunction;

/* NVRTC opens libcuda.so.1 itself (this library, when it is loaded under
 * that name) and asks for the driver's private tables: there are none. */
API CUresult cuGetExportTable(const void** table, const void* id) {
  (void)id;
  if (table) *table = NULL;
  return E_NOT_SUPPORTED;
}

API CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  if (!need_ctx()) return E_INVALID_CONTEXT;
  if (!m || !image) return E_INVALID_VALUE;
  *m = NULL;
  if (strncmp(image, "FAKECPU:", 8) != 0) return E_NOT_SUPPORTED;
  void* lib = dlopen((const char*)image + 8, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return E_INVALID_VALUE;
  *m = calloc(1, sizeof **m);
  (*m)->lib = lib;
  return OK;
}

API CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  if (!f || !m || !name) return E_INVALID_VALUE;
  void* fn = dlsym(m->lib, name);
  void* set = dlsym(m->lib, "ncclrs_cpu_set_index");
  int scale = strncmp(name, "ncclrs_scale_", 13) == 0;
  if (!fn || !set || (!scale && strncmp(name, "ncclrs_reduce_", 14) != 0)) return 500; /* NOT_FOUND */
  *f = calloc(1, sizeof **f);
  (*f)->fn = fn;
  *(void**)&(*f)->set_index = set;
  (*f)->scale = scale;
  return OK;
}

API CUresult cuModuleUnload(CUmodule m) {
  if (!m) return E_INVALID_HANDLE;
  return OK; /* the library stays loaded: functions may still be queued */
}

struct launch {
  CUfunction f;
  unsigned grid, block;
  uint64_t dst, src, a, c, d;
  uint32_t b;
};

static void run_launch(void* arg) {
  struct launch* l = arg;
  void* dst = xlate((uintptr_t)l->dst, 1);
  void* src = xlate((uintptr_t)l->src, 1);
  for (unsigned b = 0; b < l->grid; b++) {
    for (unsigned t = 0; t < l->block; t++) {
      l->f->set_index(l->grid, l->block, b, t);
      if (l->f->scale) {
        ((void (*)(void*, const void*, uint64_t, uint64_t))l->f->fn)(dst, src, l->a, l->c);
      } else {
        ((void (*)(void*, const void*, uint64_t, uint32_t, uint64_t, uint64_t))l->f->fn)(dst, src, l->a, l->b,
                                                                                      l->c, l->d);
      }
    }
  }
  free(l);
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shmem, CUstream h, void** params, void** extra) {
  (void)shmem;
  (void)extra;
  CUresult e = OK;
  struct fstream* s = stream_of(h, &e);
  if (!s) return e;
  if (!f || !params || gx == 0 || bx == 0 || gy != 1 || gz != 1 || by != 1 || bz != 1) return E_INVALID_VALUE;
  struct launch* l = calloc(1, sizeof *l);
  l->f = f;
  l->grid = gx;
  l->block = bx;
  l->dst = *(uint64_t*)params[0];
  l->src = *(uint64_t*)params[1];
  l->a = *(uint64_t*)params[2];
  if (f->scale) {
    l->c = *(uint64_t*)params[3];
  } else {
    l->b = *(uint32_t*)params[3];
    l->c = *(uint64_t*)params[4];
    l->d = *(uint64_t*)params[5];
  }
  submit(s, (struct op){.kind = OP_HOSTFN, .fn = run_launch, .data = l});
  return OK;
}
