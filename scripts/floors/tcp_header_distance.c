/* Both processes send N bytes to each other per round over one TCP loopback socket, busy-polling,
 * each message preceded by an H-byte header (one writev); buffers at page offset O (16: malloc's).
 * Prints microseconds per round.  gcc -O2 -o tcp_header_distance tcp_header_distance.c
 *   for h in 12 16 40 64; do ./tcp_header_distance 524288 300 $h 16; done
 * The kernel copies the payload into page fragments right after the header and out of them into
 * the receiver's buffer with rep movsb: with H = 12 and O = 16 the receive copy runs at distance 4,
 * rep movsb's slow case on AMD Zen (the reason transport-tcp lays its stream out in 64-byte units).
 * Optional 5th argument 1: poll() before each read. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sched.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static size_t n; static int rounds,H,O,usepoll;
static double run(int s){
  char*sb=aligned_alloc(4096,n+8192)+O, *rb=aligned_alloc(4096,n+8192)+O; memset(sb-O,7,n+8192); memset(rb-O,0,n+8192);
  char hdr[256]={0}, rh[256];
  double t0=0;
  for(int r=0;r<rounds;r++){ if(r==3)t0=now();
    size_t sent=0, got=0, tot=H+n;
    while(sent<tot||got<tot){
      if(sent<tot){ struct iovec v[2]; int k=0; if(sent<(size_t)H){v[k].iov_base=hdr+sent;v[k].iov_len=H-sent;k++;}
        size_t d=sent>(size_t)H?sent-H:0; v[k].iov_base=sb+d; v[k].iov_len=n-d; k++;
        ssize_t m=writev(s,v,k); if(m>0)sent+=m; else if(errno!=EAGAIN){perror("writev");exit(1);} }
      if(got<tot){ struct iovec v[2]; int k=0; if(got<(size_t)H){v[k].iov_base=rh+got;v[k].iov_len=H-got;k++;}
        size_t d=got>(size_t)H?got-H:0; v[k].iov_base=rb+d; v[k].iov_len=n-d; k++;
        if(usepoll){struct pollfd p={s,POLLIN,0}; poll(&p,1,0);}
        ssize_t m=readv(s,v,k); if(m>0)got+=m; else if(m==0||errno!=EAGAIN){perror("readv");exit(1);} }
    }
  }
  return (now()-t0)/(rounds-3);
}
int main(int argc,char**argv){
  if(argc<5){fprintf(stderr,"usage: N ROUNDS H(0-256) O(0-4095) [poll]\n");return 2;}
  n=atol(argv[1]); rounds=atoi(argv[2]); H=atoi(argv[3]); O=atoi(argv[4]); usepoll=argc>5?atoi(argv[5]):0;
  if(n<1||rounds<4||H<0||H>256||O<0||O>4095){fprintf(stderr,"usage: N ROUNDS(>=4) H(0-256) O(0-4095) [poll]\n");return 2;}
  int port=20000+(getpid()%40000); int one=1;
  int ls=socket(AF_INET,SOCK_STREAM,0); setsockopt(ls,SOL_SOCKET,SO_REUSEADDR,&one,4);
  struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(port),.sin_addr.s_addr=htonl(0x7f000001)};
  if(bind(ls,(void*)&a,sizeof a)){perror("bind");return 1;} listen(ls,1);
  pid_t c=fork();
  if(c==0){ pin(1); int s=socket(AF_INET,SOCK_STREAM,0); while(connect(s,(void*)&a,sizeof a))usleep(1000);
    setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4); fcntl(s,F_SETFL,O_NONBLOCK); run(s); return 0;}
  pin(0); int s=accept(ls,0,0); setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4); fcntl(s,F_SETFL,O_NONBLOCK);
  double t=run(s); waitpid(c,0,0); printf("%.1f\n",t*1e6); return 0;}
