#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
unsigned char W[18*256] __attribute__((aligned(64)));
signed char X[8*576] __attribute__((aligned(64)));
int main(){
  for(int i=0;i<sizeof W;i++) W[i]=i*7; for(int i=0;i<sizeof X;i++) X[i]=(i*13)%100;
  long N=2000000; __m256i mask=_mm256_set1_epi8(15);
  __m256i s0=_mm256_setzero_si256(),s1=s0,s2=s0,s3=s0,s4=s0,s5=s0,s6=s0,s7=s0;
  double t=now();
  for(long n=0;n<N;n++){
   for(int b=0;b<18;b++){
    __m256i a0=_mm256_setzero_si256(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
    const unsigned char* vp=W+b*256;
    #define TOK(A0,A1,c) { const signed char* xb=X+(c)*576+b*32; __m256i x=_mm256_set1_epi32(*(int*)(xb+4*k)); \
      A0=_mm256_add_epi16(A0,_mm256_maddubs_epi16(l0,x)); A1=_mm256_add_epi16(A1,_mm256_maddubs_epi16(l1,x)); \
      x=_mm256_set1_epi32(*(int*)(xb+16+4*k)); \
      A0=_mm256_add_epi16(A0,_mm256_maddubs_epi16(u0,x)); A1=_mm256_add_epi16(A1,_mm256_maddubs_epi16(u1,x)); }
    for(int k=0;k<4;k++){
      __m256i t0=_mm256_loadu_si256((void*)(vp+64*k)), t1=_mm256_loadu_si256((void*)(vp+64*k+32));
      __m256i l0=_mm256_and_si256(t0,mask), l1=_mm256_and_si256(t1,mask);
      __m256i u0=_mm256_and_si256(_mm256_srli_epi16(t0,4),mask), u1=_mm256_and_si256(_mm256_srli_epi16(t1,4),mask);
      TOK(a0,a1,0) TOK(a2,a3,1) TOK(a4,a5,2) TOK(a6,a7,3)
    }
    s0=_mm256_add_epi32(s0,_mm256_madd_epi16(a0,a0)); s1=_mm256_add_epi32(s1,_mm256_madd_epi16(a1,a1));
    s2=_mm256_add_epi32(s2,_mm256_madd_epi16(a2,a2)); s3=_mm256_add_epi32(s3,_mm256_madd_epi16(a3,a3));
    s4=_mm256_add_epi32(s4,_mm256_madd_epi16(a4,a4)); s5=_mm256_add_epi32(s5,_mm256_madd_epi16(a5,a5));
    s6=_mm256_add_epi32(s6,_mm256_madd_epi16(a6,a6)); s7=_mm256_add_epi32(s7,_mm256_madd_epi16(a7,a7));
   }
  }
  double dt=now()-t; double macs=(double)N*18*4*512;
  printf("int part G=4: %.1f GMAC/s, %.2f ns per token-block\n", macs/dt/1e9, dt/(N*18.0*4)*1e9);
  __m256i s=_mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(s0,s1),_mm256_add_epi32(s2,s3)),_mm256_add_epi32(_mm256_add_epi32(s4,s5),_mm256_add_epi32(s6,s7)));
  return _mm256_extract_epi32(s,1)&1;
}
