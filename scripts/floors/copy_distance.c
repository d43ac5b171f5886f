/* Cache-hot copies of L bytes at distances d = (dst - src) mod 4096: rep movsb, glibc's memcpy and
 * an AVX2 loop, best of 5 runs, GB/s.  gcc -O2 -fno-builtin -o copy_distance copy_distance.c && ./copy_distance 65536
 * On AMD Zen rep movsb (and memcpy from about 4 KiB to 1 MiB, which uses it) falls to a few GB/s at
 * d = 1..15 (and loses up to a half at 16..31); the vector loop does not. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void rep(char *d, const char *s, size_t n) { __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory"); }
__attribute__((target("avx2"))) static void vec(char *d, const char *s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (int k = 0; k < 4; k++) _mm256_storeu_si256((void *)(d + i + 32 * k), _mm256_loadu_si256((const void *)(s + i + 32 * k)));
  memcpy(d + i, s + i, n - i);
}
int main(int argc, char **argv) {
  size_t L = argc > 1 ? strtoul(argv[1], 0, 0) : 65536;
  char *src = aligned_alloc(4096, L + 8192), *dst = aligned_alloc(4096, L + 8192);
  memset(src, 1, L + 8192); memset(dst, 2, L + 8192);
  int ds[] = {0, 4, 8, 12, 16, 24, 32, 48, 64, 1024, 4080};
  const char *names[] = {"rep movsb", "memcpy", "avx2 loop"};
  printf("%zu bytes, GB/s at distance:", L);
  for (unsigned k = 0; k < sizeof ds / sizeof *ds; k++) printf(" %5d", ds[k]);
  printf("\n");
  for (int m = 0; m < 3; m++) {
    printf("  %-28s", names[m]);
    for (unsigned k = 0; k < sizeof ds / sizeof *ds; k++) {
      char *s = src + 16, *d = dst + ((16 + ds[k]) & 4095);
      int it = (int)(4e8 / L); if (it < 1) it = 1;
      double best = 1e9;
      for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (int i = 0; i < it; i++) {
          if (m == 0) rep(d, s, L); else if (m == 1) memcpy(d, s, L); else vec(d, s, L);
          __asm__ volatile("" : : "r"(d) : "memory");
        }
        double t = (now() - t0) / it; if (t < best) best = t;
      }
      printf(" %5.0f", L / best / 1e9);
    }
    printf("\n");
  }
  return 0;
}
