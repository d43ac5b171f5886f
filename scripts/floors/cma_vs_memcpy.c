/* process_vm_readv of N bytes (in CHUNK pieces) from a forked child vs memcpy
 * of the same buffers.  ./cma_vs_memcpy N [CHUNK]; HP=1 asks for huge pages. */
#define _GNU_SOURCE
#include <sys/uio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <signal.h>
#include <sys/mman.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]); size_t chunk=argc>2?atol(argv[2]):n;
  char*src=aligned_alloc(2<<20,n); if(getenv("HP"))madvise(src,n,MADV_HUGEPAGE); memset(src,1,n);
  char*dst=aligned_alloc(2<<20,n); if(getenv("HP"))madvise(dst,n,MADV_HUGEPAGE); memset(dst,2,n);
  pid_t me=getpid();
  int iters=(int)(2e9/n); if(iters<5)iters=5;
  pid_t c=fork();
  if(c==0){ pause(); return 0;}
  double t0=now();
  for(int i=0;i<iters;i++) for(size_t o=0;o<n;o+=chunk){size_t l=n-o<chunk?n-o:chunk;
    struct iovec L={dst+o,l},R={src+o,l}; if(process_vm_readv(c,&L,1,&R,1,0)!=(ssize_t)l){perror("cma");return 1;}}
  double t1=now();
  for(int i=0;i<iters;i++) memcpy(dst,src,n);
  double t2=now();
  printf("%zu chunk %zu: cma %.2f GB/s memcpy %.2f GB/s\n",n,chunk,n*(double)iters/(t1-t0)/1e9,n*(double)iters/(t2-t1)/1e9);
  kill(c,9); return 0;}
