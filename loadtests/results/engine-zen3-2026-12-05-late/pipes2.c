#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 50000000L
#define RUN(name, body) { double t=now(); for(long n=0;n<N;n++){ body } double d=(now()-t)/N/12*1e9; printf("%-28s %.3f ns/instr\n", name, d); }
int main(int argc,char**argv){
  __m256i x=_mm256_set1_epi8(argc), a[12]; for(int i=0;i<12;i++) a[i]=_mm256_set1_epi8(i);
  __m256 f[12]; for(int i=0;i<12;i++) f[i]=_mm256_set1_ps(i);
  __m256 fx=_mm256_set1_ps(1.0001f);
  RUN("maddubs x12", for(int i=0;i<12;i++) a[i]=_mm256_maddubs_epi16(a[i],x);)
  RUN("maddwd x12", for(int i=0;i<12;i++) a[i]=_mm256_madd_epi16(a[i],x);)
  RUN("maddubs6+maddwd6", for(int i=0;i<6;i++) a[i]=_mm256_maddubs_epi16(a[i],x); for(int i=6;i<12;i++) a[i]=_mm256_madd_epi16(a[i],x);)
  RUN("srai/slli x12", for(int i=0;i<6;i++) a[i]=_mm256_srai_epi32(a[i],16); for(int i=6;i<12;i++) a[i]=_mm256_slli_epi32(a[i],16);)
  RUN("maddubs6+srai6", for(int i=0;i<6;i++) a[i]=_mm256_maddubs_epi16(a[i],x); for(int i=6;i<12;i++) a[i]=_mm256_srai_epi32(a[i],16);)
  RUN("paddd x12", for(int i=0;i<12;i++) a[i]=_mm256_add_epi32(a[i],x);)
  RUN("maddubs6+paddd6", for(int i=0;i<6;i++) a[i]=_mm256_maddubs_epi16(a[i],x); for(int i=6;i<12;i++) a[i]=_mm256_add_epi32(a[i],x);)
  RUN("sign x12", for(int i=0;i<12;i++) a[i]=_mm256_sign_epi8(a[i],x);)
  RUN("maddubs6+sign6", for(int i=0;i<6;i++) a[i]=_mm256_maddubs_epi16(a[i],x); for(int i=6;i<12;i++) a[i]=_mm256_sign_epi8(a[i],x);)
  RUN("fma x12", for(int i=0;i<12;i++) f[i]=_mm256_fmadd_ps(f[i],fx,fx);)
  RUN("maddwd6+fma6", for(int i=0;i<6;i++) a[i]=_mm256_madd_epi16(a[i],x); for(int i=0;i<6;i++) f[i]=_mm256_fmadd_ps(f[i],fx,fx);)
  int r=0; for(int i=0;i<12;i++) r+=_mm256_extract_epi32(a[i],1)+(int)f[i][0];
  return r&1;
}
