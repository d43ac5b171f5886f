/* Reduction kernels of nccl-rs, compiled at run time with NVRTC (see
 * nvrtc.rs) and, in the tests, with the host C++ compiler through
 * kernels_cpu_shim.h. Bit-identical to the host kernels (src/reduce/):
 *
 * - integers: sum and prod wrap, max/min in natural order; avg divides
 *   truncating (in 64 bits, exact for every n that fits);
 * - f32/f64: IEEE round-to-nearest-even with explicit _rn intrinsics (no
 *   FMA contraction, no flush to zero); max/min as C's fmax/fmin with
 *   -0 < +0;
 * - f16/bf16/fp8: widen exactly to f32, operate in f32, round back once
 *   per step with the host's rounding (f16/bf16 nearest even with
 *   overflow to infinity, fp8 nearest even saturating to +-max finite).
 *
 * NaN results are NaN; their payload bits are not specified (the host's
 * depend on the CPU too).
 *
 * Only builtin types are used, so NVRTC needs no headers. */

#ifndef NCCLRS_CPU_SHIM
#define NCCLRS_KERNEL extern "C" __global__
#define NCCLRS_DEV static __device__ __forceinline__
#define F2U(x) __float_as_uint(x)
#define U2F(x) __uint_as_float(x)
#define D2U(x) ((unsigned long long)__double_as_longlong(x))
#define U2D(x) __longlong_as_double((long long)(x))
#define FADD(a, b) __fadd_rn(a, b)
#define FSUB(a, b) __fsub_rn(a, b)
#define FMUL(a, b) __fmul_rn(a, b)
#define FDIV(a, b) __fdiv_rn(a, b)
#define DADD(a, b) __dadd_rn(a, b)
#define DMUL(a, b) __dmul_rn(a, b)
#define DDIV(a, b) __ddiv_rn(a, b)
#define U64_TO_F(n) __ull2float_rn(n)
#define U64_TO_D(n) __ull2double_rn(n)
#endif

typedef signed char ncclrs_i8;
typedef unsigned char ncclrs_u8;
typedef int ncclrs_i32;
typedef unsigned int ncclrs_u32;
typedef long long ncclrs_i64;
typedef unsigned long long ncclrs_u64;
typedef unsigned short ncclrs_h16; /* f16 / bf16 bits */

/* Every thread of the grid visits i = its index, + grid size, ... */
#define FOR_EACH(i, n)                                                            \
  for (ncclrs_u64 i = (ncclrs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (ncclrs_u64)blockDim.x * gridDim.x)

/* ------------------------------------------------------------ integers */

#define INT_OPS(T, U)                                                        \
  NCCLRS_DEV T T##_sum(T a, T b) { return (T)(U)((U)a + (U)b); }             \
  NCCLRS_DEV T T##_prod(T a, T b) { return (T)(U)((U)a * (U)b); }            \
  NCCLRS_DEV T T##_max(T a, T b) { return a > b ? a : b; }                   \
  NCCLRS_DEV T T##_min(T a, T b) { return a < b ? a : b; }                   \
  NCCLRS_DEV T T##_ld(T x) { return x; }                                     \
  NCCLRS_DEV T T##_st(T x) { return x; }                                     \
  NCCLRS_DEV T T##_bits(ncclrs_u64 b) { return (T)b; }

INT_OPS(ncclrs_i8, ncclrs_u8)
INT_OPS(ncclrs_u8, ncclrs_u8)
INT_OPS(ncclrs_i32, ncclrs_u32)
INT_OPS(ncclrs_u32, ncclrs_u32)
INT_OPS(ncclrs_i64, ncclrs_u64)
INT_OPS(ncclrs_u64, ncclrs_u64)

/* Truncating division by n >= 1, exact in 64 bits. */
NCCLRS_DEV ncclrs_i8 ncclrs_i8_div(ncclrs_i8 x, ncclrs_u64 n) { return (ncclrs_i8)((ncclrs_i64)x / (ncclrs_i64)n); }
NCCLRS_DEV ncclrs_u8 ncclrs_u8_div(ncclrs_u8 x, ncclrs_u64 n) { return (ncclrs_u8)((ncclrs_u64)x / n); }
NCCLRS_DEV ncclrs_i32 ncclrs_i32_div(ncclrs_i32 x, ncclrs_u64 n) { return (ncclrs_i32)((ncclrs_i64)x / (ncclrs_i64)n); }
NCCLRS_DEV ncclrs_u32 ncclrs_u32_div(ncclrs_u32 x, ncclrs_u64 n) { return (ncclrs_u32)((ncclrs_u64)x / n); }
NCCLRS_DEV ncclrs_i64 ncclrs_i64_div(ncclrs_i64 x, ncclrs_u64 n) { return x / (ncclrs_i64)n; }
NCCLRS_DEV ncclrs_u64 ncclrs_u64_div(ncclrs_u64 x, ncclrs_u64 n) { return x / n; }

/* --------------------------------------------------------------- f32/f64 */

NCCLRS_DEV int f32_is_nan(float x) { return (F2U(x) & 0x7FFFFFFFu) > 0x7F800000u; }
NCCLRS_DEV int f64_is_nan(double x) { return (D2U(x) & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull; }

/* fmax/fmin with -0 < +0, as the host: a NaN operand is ignored; equal
 * operands (identical, or +0/-0) combine their bits with AND (max) or OR
 * (min). */
NCCLRS_DEV float f32_max(float a, float b) {
  float m = b > a ? b : a;
  if (f32_is_nan(a)) m = b;
  return a == b ? U2F(F2U(a) & F2U(b)) : m;
}
NCCLRS_DEV float f32_min(float a, float b) {
  float m = b < a ? b : a;
  if (f32_is_nan(a)) m = b;
  return a == b ? U2F(F2U(a) | F2U(b)) : m;
}
NCCLRS_DEV double f64_max(double a, double b) {
  double m = b > a ? b : a;
  if (f64_is_nan(a)) m = b;
  return a == b ? U2D(D2U(a) & D2U(b)) : m;
}
NCCLRS_DEV double f64_min(double a, double b) {
  double m = b < a ? b : a;
  if (f64_is_nan(a)) m = b;
  return a == b ? U2D(D2U(a) | D2U(b)) : m;
}
NCCLRS_DEV float f32_sum(float a, float b) { return FADD(a, b); }
NCCLRS_DEV float f32_prod(float a, float b) { return FMUL(a, b); }
NCCLRS_DEV float f32_div(float a, ncclrs_u64 n) { return FDIV(a, U64_TO_F(n)); }
NCCLRS_DEV double f64_sum(double a, double b) { return DADD(a, b); }
NCCLRS_DEV double f64_prod(double a, double b) { return DMUL(a, b); }
NCCLRS_DEV double f64_div(double a, ncclrs_u64 n) { return DDIV(a, U64_TO_D(n)); }

NCCLRS_DEV float float_ld(float x) { return x; }
NCCLRS_DEV float float_st(float x) { return x; }
NCCLRS_DEV float float_bits(ncclrs_u64 b) { return U2F((ncclrs_u32)b); }
NCCLRS_DEV double double_ld(double x) { return x; }
NCCLRS_DEV double double_st(double x) { return x; }
NCCLRS_DEV double double_bits(ncclrs_u64 b) { return U2D(b); }

/* ------------------------------------------------------------------- f16 */

/* Exact widening (NaN made quiet, payload kept), as half's f16::to_f32. */
NCCLRS_DEV float f16_ld(ncclrs_h16 h) {
  ncclrs_u32 i = h;
  ncclrs_u32 sign = (i & 0x8000u) << 16;
  ncclrs_u32 exp = i & 0x7C00u;
  ncclrs_u32 man = i & 0x03FFu;
  if ((i & 0x7FFFu) == 0) return U2F(sign);
  if (exp == 0x7C00u) return U2F(man == 0 ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | (man << 13)));
  if (exp == 0) {
    /* Subnormal: normalise. */
    ncclrs_u32 e = 0;
    while ((man & 0x0400u) == 0) {
      man <<= 1;
      e++;
    }
    return U2F(sign | ((127u - 15u - e + 1u) << 23) | ((man & 0x03FFu) << 13));
  }
  return U2F(sign | (((exp >> 10) + 127u - 15u) << 23) | (man << 13));
}

/* Round to nearest even; overflow to infinity; NaN stays NaN (quiet). */
NCCLRS_DEV ncclrs_h16 f16_st(float f) {
  ncclrs_u32 x = F2U(f);
  ncclrs_u32 sign = x & 0x80000000u;
  ncclrs_u32 exp = x & 0x7F800000u;
  ncclrs_u32 man = x & 0x007FFFFFu;
  if (exp == 0x7F800000u) return (ncclrs_h16)((sign >> 16) | 0x7C00u | (man ? 0x0200u : 0u) | (man >> 13));
  ncclrs_u32 hs = sign >> 16;
  int he = (int)(exp >> 23) - 127 + 15;
  if (he >= 0x1F) return (ncclrs_h16)(hs | 0x7C00u);
  if (he <= 0) {
    if (14 - he > 24) return (ncclrs_h16)hs;
    ncclrs_u32 m = man | 0x00800000u;
    ncclrs_u32 hm = m >> (14 - he);
    ncclrs_u32 rb = 1u << (13 - he);
    if ((m & rb) != 0 && (m & (3u * rb - 1u)) != 0) hm += 1;
    return (ncclrs_h16)(hs | hm);
  }
  ncclrs_u32 r = hs | ((ncclrs_u32)he << 10) | (man >> 13);
  if ((man & 0x1000u) != 0 && (man & 0x2FFFu) != 0) r += 1;
  return (ncclrs_h16)r;
}

/* ------------------------------------------------------------------ bf16 */

NCCLRS_DEV float bf16_ld(ncclrs_h16 b) {
  ncclrs_u32 w = (ncclrs_u32)b << 16;
  if ((b & 0x7FFFu) > 0x7F80u) w |= 0x400000u;
  return U2F(w);
}

NCCLRS_DEV ncclrs_h16 bf16_st(float f) {
  ncclrs_u32 x = F2U(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (ncclrs_h16)((x >> 16) | 0x40u);
  return (ncclrs_h16)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/* ------------------------------------------------------------------- fp8 */

/* As fp8.rs: MAN mantissa bits, bias BIAS, IEEE-style specials (E5M2) or
 * the single NaN S.1111.111 (E4M3). */
NCCLRS_DEV float fp8_ld(ncclrs_u8 b8, ncclrs_u32 MAN, ncclrs_u32 BIAS, int IEEE) {
  ncclrs_u32 shift = 23u - MAN;
  ncclrs_u32 magic = ((127u - BIAS) + shift + 1u) << 23;
  ncclrs_u32 b = b8;
  ncclrs_u32 sign = (b & 0x80u) << 24;
  ncclrs_u32 abs = b & 0x7Fu;
  ncclrs_u32 r;
  if (abs < (1u << MAN)) {
    r = F2U(FSUB(U2F(magic | abs), U2F(magic)));
  } else {
    r = (abs << shift) + ((127u - BIAS) << 23);
  }
  if (IEEE) {
    ncclrs_u32 man = abs & ((1u << MAN) - 1u);
    if (abs >= (0x7Fu & ~((1u << MAN) - 1u))) r = 0x7F800000u | (man ? 0x400000u : 0u) | (man << shift);
  } else if (abs == 0x7Fu) {
    r = 0x7FC00000u;
  }
  return U2F(r | sign);
}

NCCLRS_DEV ncclrs_u8 fp8_st(float x, ncclrs_u32 MAN, ncclrs_u32 BIAS, ncclrs_u32 MAX, int IEEE) {
  ncclrs_u32 shift = 23u - MAN;
  ncclrs_u32 magic = ((127u - BIAS) + shift + 1u) << 23;
  ncclrs_u32 min_normal = (127u + 1u - BIAS) << 23;
  ncclrs_u32 bits = F2U(x);
  ncclrs_u32 sign = (bits >> 24) & 0x80u;
  ncclrs_u32 abs = bits & 0x7FFFFFFFu;
  ncclrs_u32 enc;
  if (abs < min_normal) {
    enc = F2U(FADD(U2F(abs), U2F(magic))) - magic;
  } else {
    ncclrs_u32 odd = (abs >> shift) & 1u;
    enc = (abs - ((127u - BIAS) << 23) + ((1u << (shift - 1u)) - 1u + odd)) >> shift;
  }
  if (enc > MAX) enc = MAX;
  if (abs > 0x7F800000u) enc = IEEE ? (0x7Eu | ((abs >> 21) & 0x3u)) : 0x7Fu;
  return (ncclrs_u8)(enc | sign);
}

NCCLRS_DEV float e4m3_ld(ncclrs_u8 b) { return fp8_ld(b, 3u, 7u, 0); }
NCCLRS_DEV ncclrs_u8 e4m3_st(float x) { return fp8_st(x, 3u, 7u, 0x7Eu, 0); }
NCCLRS_DEV float e5m2_ld(ncclrs_u8 b) { return fp8_ld(b, 2u, 15u, 1); }
NCCLRS_DEV ncclrs_u8 e5m2_st(float x) { return fp8_st(x, 2u, 15u, 0x7Bu, 1); }

NCCLRS_DEV ncclrs_h16 h16_bits(ncclrs_u64 b) { return (ncclrs_h16)b; }
NCCLRS_DEV ncclrs_u8 u8_bits(ncclrs_u64 b) { return (ncclrs_u8)b; }

/* --------------------------------------------------------------- kernels */

/* ncclrs_reduce_<type>_<op>(dst, src, stride, nsrc, count, avg_n):
 *   dst[i] = src[0*stride+i] op src[1*stride+i] op ... op src[(nsrc-1)*stride+i],
 * combined left to right (rank order) and stored after every step, then
 * divided by avg_n when it is not 0 (ncclAvg). dst may be one of the
 * sources' rows only if it is row 0. */
#define REDUCE(NAME, T, LD, ST, OP, OPNAME, DIV)                                           \
  NCCLRS_KERNEL void ncclrs_reduce_##NAME##_##OPNAME(T* dst, const T* src, ncclrs_u64 stride, \
                                                     ncclrs_u32 nsrc, ncclrs_u64 count,      \
                                                     ncclrs_u64 avg_n) {                     \
    FOR_EACH(i, count) {                                                                   \
      T acc = src[i];                                                                      \
      for (ncclrs_u32 k = 1; k < nsrc; ++k) acc = ST(OP(LD(acc), LD(src[k * stride + i])));  \
      if (avg_n != 0) acc = ST(DIV(LD(acc), avg_n));                                       \
      dst[i] = acc;                                                                        \
    }                                                                                      \
  }

/* ncclrs_scale_<type>(dst, src, count, scalar_bits): dst[i] = src[i] * s,
 * s being the element whose little-endian bits are scalar_bits
 * (ncclRedOpCreatePreMulSum). */
#define SCALE(NAME, T, LD, ST, MUL, BITS)                                                 \
  NCCLRS_KERNEL void ncclrs_scale_##NAME(T* dst, const T* src, ncclrs_u64 count,          \
                                         ncclrs_u64 scalar_bits) {                        \
    T s = BITS(scalar_bits);                                                              \
    FOR_EACH(i, count) { dst[i] = ST(MUL(LD(src[i]), LD(s))); }                           \
  }

/* One type: four reductions and the scale. */
#define TYPE(NAME, T, LD, ST, C, BITS)                \
  REDUCE(NAME, T, LD, ST, C##_sum, sum, C##_div)      \
  REDUCE(NAME, T, LD, ST, C##_prod, prod, C##_div)    \
  REDUCE(NAME, T, LD, ST, C##_max, max, C##_div)      \
  REDUCE(NAME, T, LD, ST, C##_min, min, C##_div)      \
  SCALE(NAME, T, LD, ST, C##_prod, BITS)

TYPE(int8, ncclrs_i8, ncclrs_i8_ld, ncclrs_i8_st, ncclrs_i8, ncclrs_i8_bits)
TYPE(uint8, ncclrs_u8, ncclrs_u8_ld, ncclrs_u8_st, ncclrs_u8, ncclrs_u8_bits)
TYPE(int32, ncclrs_i32, ncclrs_i32_ld, ncclrs_i32_st, ncclrs_i32, ncclrs_i32_bits)
TYPE(uint32, ncclrs_u32, ncclrs_u32_ld, ncclrs_u32_st, ncclrs_u32, ncclrs_u32_bits)
TYPE(int64, ncclrs_i64, ncclrs_i64_ld, ncclrs_i64_st, ncclrs_i64, ncclrs_i64_bits)
TYPE(uint64, ncclrs_u64, ncclrs_u64_ld, ncclrs_u64_st, ncclrs_u64, ncclrs_u64_bits)
TYPE(f16, ncclrs_h16, f16_ld, f16_st, f32, h16_bits)
TYPE(f32, float, float_ld, float_st, f32, float_bits)
TYPE(f64, double, double_ld, double_st, f64, double_bits)
TYPE(bf16, ncclrs_h16, bf16_ld, bf16_st, f32, h16_bits)
TYPE(f8e4m3, ncclrs_u8, e4m3_ld, e4m3_st, f32, u8_bits)
TYPE(f8e5m2, ncclrs_u8, e5m2_ld, e5m2_st, f32, u8_bits)
