#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 100000000L
int main(int argc,char**argv){
  __m256i x=_mm256_set1_epi8(argc), a[12]; for(int i=0;i<12;i++) a[i]=_mm256_set1_epi8(i);
  __m256 f[12]; for(int i=0;i<12;i++) f[i]=_mm256_set1_ps(i);
  __m256 fx=_mm256_set1_ps(1.0001f);
  double t=now();
  for(long n=0;n<N;n++){
    #pragma GCC unroll 12
    for(int i=0;i<12;i++) a[i]=_mm256_maddubs_epi16(a[i],x);
  }
  double d1=(now()-t)/N/12*1e9; printf("maddubs %.3f ns\n", d1);
  t=now();
  for(long n=0;n<N;n++){
    #pragma GCC unroll 12
    for(int i=0;i<12;i++) f[i]=_mm256_fmadd_ps(f[i],fx,fx);
  }
  double d2=(now()-t)/N/12*1e9; printf("fma %.3f ns\n", d2);
  t=now();
  for(long n=0;n<N;n++){
    #pragma GCC unroll 6
    for(int i=0;i<6;i++) a[i]=_mm256_maddubs_epi16(a[i],x);
    #pragma GCC unroll 6
    for(int i=6;i<12;i++) a[i]=_mm256_madd_epi16(a[i],x);
  }
  double d3=(now()-t)/N/12*1e9; printf("maddubs+maddwd mix %.3f ns per instr\n", d3);
  t=now();
  for(long n=0;n<N;n++){
    #pragma GCC unroll 6
    for(int i=0;i<6;i++) a[i]=_mm256_maddubs_epi16(a[i],x);
    #pragma GCC unroll 6
    for(int i=0;i<6;i++) f[i]=_mm256_fmadd_ps(f[i],fx,fx);
  }
  double d4=(now()-t)/N/12*1e9; printf("maddubs+fma mix %.3f ns per instr\n", d4);
  int r=0; for(int i=0;i<12;i++) r+=_mm256_extract_epi32(a[i],1)+(int)f[i][0];
  return r&1;
}
