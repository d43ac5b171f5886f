/* Compiles kernels.cu for the CPU (tests only; kernels/tests/cpu.rs):
 *   g++ -std=c++11 -O2 -ffp-contract=off -shared -fPIC \
 *       -include kernels_cpu_shim.h kernels.cu -o libkernels.so
 * A kernel becomes a plain C function; ncclrs_cpu_set_index() sets the
 * block and thread it runs as, so a caller runs a launch by calling it
 * once per (block, thread). Arithmetic is the CPU's IEEE arithmetic
 * (SSE2 on x86-64: round to nearest even, no flush to zero). */
#define NCCLRS_CPU_SHIM 1
#include <string.h>

#define NCCLRS_KERNEL extern "C" __attribute__((visibility("default")))
#define NCCLRS_DEV static inline

struct ncclrs_dim3 {
  unsigned x, y, z;
};
/* Per thread: fake streams run launches on their own threads. */
static thread_local ncclrs_dim3 threadIdx, blockIdx, blockDim, gridDim;

extern "C" __attribute__((visibility("default"))) void ncclrs_cpu_set_index(unsigned grid, unsigned block,
                                                                            unsigned b, unsigned t) {
  gridDim.x = grid;
  blockDim.x = block;
  blockIdx.x = b;
  threadIdx.x = t;
}

static inline unsigned ncclrs_f2u(float x) {
  unsigned u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float ncclrs_u2f(unsigned u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static inline unsigned long long ncclrs_d2u(double x) {
  unsigned long long u;
  memcpy(&u, &x, 8);
  return u;
}
static inline double ncclrs_u2d(unsigned long long u) {
  double x;
  memcpy(&x, &u, 8);
  return x;
}
#define F2U(x) ncclrs_f2u(x)
#define U2F(x) ncclrs_u2f(x)
#define D2U(x) ncclrs_d2u(x)
#define U2D(x) ncclrs_u2d((unsigned long long)(x))
#define FADD(a, b) ((float)(a) + (float)(b))
#define FSUB(a, b) ((float)(a) - (float)(b))
#define FMUL(a, b) ((float)(a) * (float)(b))
#define FDIV(a, b) ((float)(a) / (float)(b))
#define DADD(a, b) ((double)(a) + (double)(b))
#define DMUL(a, b) ((double)(a) * (double)(b))
#define DDIV(a, b) ((double)(a) / (double)(b))
#define U64_TO_F(n) ((float)(unsigned long long)(n))
#define U64_TO_D(n) ((double)(unsigned long long)(n))
