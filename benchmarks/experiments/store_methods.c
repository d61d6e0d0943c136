// Store methods for an output of MB megabytes, one core, best of 15: what a kernel that
// reads x and writes y could get. dst written by plain AVX-512 stores, non-temporal
// stores, both after a first pass over each 8 KB row (as the kernels read a row twice),
// and rep movsb (glibc's memcpy below its non-temporal threshold, as np.copyto).
//   gcc -O2 -mavx512f -o store_methods store_methods.c && ./store_methods 32
// (results/intel_spr/onednn/probes.md)
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void repmovsb(void*d,const void*s,size_t n){__asm__ volatile("rep movsb":"+D"(d),"+S"(s),"+c"(n)::"memory");}
static void plain(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64)_mm512_storeu_ps((float*)(d+i),_mm512_add_ps(_mm512_loadu_ps((const float*)(s+i)),_mm512_set1_ps(1)));}
static void nt(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64)_mm512_stream_ps((float*)(d+i),_mm512_add_ps(_mm512_loadu_ps((const float*)(s+i)),_mm512_set1_ps(1)));_mm_sfence();}
static float sink;
static void twopass(char*d,const char*s,size_t n,int ntst){__m512 acc=_mm512_setzero_ps();for(size_t r=0;r<n;r+=8192){for(size_t i=0;i<8192;i+=64)acc=_mm512_add_ps(acc,_mm512_loadu_ps((const float*)(s+r+i)));if(ntst)nt(d+r,s+r,8192);else plain(d+r,s+r,8192);}sink+=_mm512_reduce_add_ps(acc);}
int main(int argc,char**argv){
  size_t bytes=(size_t)atol(argv[1])<<20; int off=argc>2?atoi(argv[2]):0;
  char*s=aligned_alloc(4096,bytes+4096),*d=aligned_alloc(4096,bytes+4096); d+=off;
  memset(s,1,bytes);memset(d,1,bytes);
  const char*names[]={"plain","nt","2pass plain","2pass nt","movsb"};
  double best[5]={1e9,1e9,1e9,1e9,1e9};
  for(int r=0;r<15;r++)for(int m=0;m<5;m++){double t=now();
    if(m==0)plain(d,s,bytes);else if(m==1)nt(d,s,bytes);else if(m==2)twopass(d,s,bytes,0);else if(m==3)twopass(d,s,bytes,1);else repmovsb(d,s,bytes);
    t=now()-t;if(t<best[m])best[m]=t;}
  for(int m=0;m<5;m++)printf("%zu MB dst+%d: %-16s %.2f ms  %.1f GB/s (read+write)\n",bytes>>20,off,names[m],best[m]*1e3,2*bytes/best[m]/1e9);
}
