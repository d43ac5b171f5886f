/* P processes each memcpy the same N bytes (fixed buffers) ITER times at once;
 * each prints its median per-copy time.  ./copy_floor N P ITER */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* P processes each copy N bytes src->dst (fixed buffers) ITER times; prints median per-copy time. */
int main(int argc,char**argv){size_t n=atol(argv[1]);int P=atoi(argv[2]);int it=atoi(argv[3]);
 for(int p=0;p<P;p++) if(fork()==0){char*s=aligned_alloc(4096,n),*d=aligned_alloc(4096,n);memset(s,1,n);memset(d,2,n);
   double*ts=malloc(it*sizeof(double)); for(int i=0;i<it;i++){double t0=now();memcpy(d,s,n);ts[i]=now()-t0;}
   for(int i=0;i<it;i++)for(int j=i+1;j<it;j++)if(ts[j]<ts[i]){double x=ts[i];ts[i]=ts[j];ts[j]=x;}
   printf("proc %d: %zu bytes median %.0f us (%.1f GB/s)\n",p,n,ts[it/2]*1e6,n/ts[it/2]/1e9);exit(0);}
 while(wait(NULL)>0);}
