/* Helpers of the C tests: checks that print ncclGetLastError, a watchdog,
 * polling with a deadline, and exact small values in every datatype. */
#ifndef NCCL_TEST_UTIL_H
#define NCCL_TEST_UTIL_H

#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cmd)                                                                          \
  do {                                                                                      \
    ncclResult_t r_ = (cmd);                                                                \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #cmd, (int)r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                              \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

#define EXPECT(cond, ...)                                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, "\n");                                           \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

/* Whether `text` contains `needle` (a NULL needle matches anything). */
static inline int has_text(const char* text, const char* needle) {
  return needle == NULL || (text != NULL && strstr(text, needle) != NULL);
}

/* `cmd` must fail with `code` and leave a last-error message containing
 * `needle` (NULL: any non-empty message). */
#define EXPECT_FAIL(cmd, code, needle)                                                         \
  do {                                                                                         \
    ncclResult_t r_ = (cmd);                                                                   \
    const char* m_ = ncclGetLastError(NULL);                                                   \
    EXPECT(r_ == (code), "%s returned %d, not %d (%s)", #cmd, (int)r_, (int)(code), m_);       \
    EXPECT(m_ != NULL && m_[0] != 0, "%s left no last-error message", #cmd);                   \
    EXPECT(has_text(m_, (needle)), "message of %s lacks \"%s\": %s", #cmd, #needle, m_);       \
  } while (0)

/* Kills the test if it runs longer than `secs` (every wait is bounded). */
static inline void watchdog(unsigned secs) {
  signal(SIGALRM, SIG_DFL);
  alarm(secs);
}

static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Polls ncclCommGetAsyncError until it is no longer ncclInProgress (or
 * `secs` pass); returns the final state. */
static inline ncclResult_t wait_comm(ncclComm_t comm, double secs) {
  double end = now_s() + secs;
  ncclResult_t state = ncclInProgress;
  while (now_s() < end) {
    CHECK(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress) return state;
    usleep(1000);
  }
  fprintf(stderr, "communicator still in progress after %.0f s\n", secs);
  exit(1);
}

static inline size_t dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static inline const char* dtype_name(ncclDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                "float16", "float32", "float64", "bfloat16", "f8e4m3", "f8e5m2"};
  return (unsigned)t < 12 ? names[t] : "?";
}

static inline int dtype_is_int(ncclDataType_t t) { return t <= ncclUint64; }

/* Bit patterns of the values the tests use, in the narrow float types:
 * index 0..6 = 1, 1.5, 2, 3, 4, 6, 12 (all exact in every type). */
#define NSMALL 7
static const double kSmall[NSMALL] = {1, 1.5, 2, 3, 4, 6, 12};
static const uint16_t kHalf[NSMALL] = {0x3C00, 0x3E00, 0x4000, 0x4200, 0x4400, 0x4600, 0x4A00};
static const uint16_t kBf16[NSMALL] = {0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x4140};
static const uint8_t kE4m3[NSMALL] = {0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C, 0x54};
static const uint8_t kE5m2[NSMALL] = {0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, 0x4A};

static inline int small_index(double v) {
  for (int i = 0; i < NSMALL; i++)
    if (kSmall[i] == v) return i;
  fprintf(stderr, "value %g has no table entry\n", v);
  exit(1);
}

/* Writes value v (an integer, or one of kSmall for the narrow floats) as
 * element i of buf. */
static inline void put(ncclDataType_t t, void* buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = kHalf[small_index(v)]; break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = kBf16[small_index(v)]; break;
    case ncclFloat8e4m3: ((uint8_t*)buf)[i] = kE4m3[small_index(v)]; break;
    case ncclFloat8e5m2: ((uint8_t*)buf)[i] = kE5m2[small_index(v)]; break;
    default: fprintf(stderr, "bad type\n"); exit(1);
  }
}

/* Whether element i of buf is exactly v. */
static inline int is(ncclDataType_t t, const void* buf, size_t i, double v) {
  unsigned char want[8];
  put(t, want, 0, v);
  return memcmp((const char*)buf + i * dtype_size(t), want, dtype_size(t)) == 0;
}

#endif
