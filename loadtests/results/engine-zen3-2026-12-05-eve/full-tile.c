#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
unsigned short S[18*32];
float XD[8*18*2];
__m256 ACC[2][8], MACC[2][8];
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
    __m256i ones=_mm256_set1_epi16(1); __m256i A[8]={a0,a1,a2,a3,a4,a5,a6,a7};
    for(int h=0;h<2;h++){
      __m256 d=_mm256_cvtph_ps(_mm_loadu_si128((void*)(S+b*32+8*h)));
      __m256 m=_mm256_cvtph_ps(_mm_loadu_si128((void*)(S+b*32+16+8*h)));
      for(int c=0;c<4;c++){
        __m256i dot=_mm256_madd_epi16(A[2*c+h],ones);
        float dx=XD[(c*18+b)*2], sx=XD[(c*18+b)*2+1];
        __m256 sc=_mm256_mul_ps(d,_mm256_set1_ps(dx));
        ACC[h][c]=_mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),sc,ACC[h][c]);
        MACC[h][c]=_mm256_fmadd_ps(m,_mm256_set1_ps(sx),MACC[h][c]);
      }
    }
   }
  }
  double dt=now()-t; double macs=(double)N*18*4*512;
  printf("full G=4: %.1f GMAC/s, %.2f ns per token-block\n", macs/dt/1e9, dt/(N*18.0*4)*1e9);
  __m256i s=_mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(s0,s1),_mm256_add_epi32(s2,s3)),_mm256_add_epi32(_mm256_add_epi32(s4,s5),_mm256_add_epi32(s6,s7)));
  return _mm256_extract_epi32(s,1)&1 + (int)ACC[1][3][2] + (int)MACC[0][1][3];
}
