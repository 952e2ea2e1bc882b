// BF16 products on this CPU: whether `tdpbf16ps` (AMX) sums pairs as
// `vdpbf16ps` does (it does not: see docs/bench/long_context.md), and the
// issue rate of `vfmadd231ps`, `vdpbf16ps` (12 independent zmm chains each)
// and `tdpbf16ps` (4 independent tiles), in TSC ticks.
// Build and run (Linux, a CPU with AMX-BF16):
//   gcc -O2 -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 -o /tmp/bf16_throughput \
//       benches/bf16_throughput.c -lm && /tmp/bf16_throughput  # on an otherwise idle core
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <x86intrin.h>

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void){ rng ^= rng<<13; rng ^= rng>>7; rng ^= rng<<17; return rng; }
static uint16_t rbf(int spread){ // random bf16 with exponent spread
  float f = ((int)(next()%2000000)-1000000)/1000000.0f;
  int e = (int)(next()% (2*spread+1)) - spread;
  f = ldexpf(f, e);
  uint32_t b; memcpy(&b,&f,4); uint32_t bias = 0x7fff + ((b>>16)&1); return (uint16_t)((b+bias)>>16);
}
static float w(uint16_t b){ uint32_t x=(uint32_t)b<<16; float f; memcpy(&f,&x,4); return f;}
static float fl(float x){ return fpclassify(x)==FP_SUBNORMAL ? copysignf(0.0f,x) : x; }

typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;

int main(int argc, char** argv){
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { perror("arch_prctl"); return 1; }
  cfg_t cfg; memset(&cfg,0,sizeof cfg); cfg.palette=1;
  for(int t=0;t<8;t++){cfg.colsb[t]=64; cfg.rows[t]=16;}
  _tile_loadconfig(&cfg);
  uint16_t A[16][32], B[16][32]; float C[16][16], D[16][16];
  long bad_odd=0, bad_even=0, bad_one=0, total=0;
  for (int trial=0; trial<2000; trial++){
    int spread = trial%3==0 ? 2 : (trial%3==1 ? 10 : 20);
    for(int i=0;i<16;i++) for(int j=0;j<32;j++){A[i][j]=rbf(spread); B[i][j]=rbf(spread);}
    for(int i=0;i<16;i++) for(int j=0;j<16;j++) C[i][j]=w(rbf(spread));
    _tile_loadd(0, C, 64); _tile_loadd(1, A, 64); _tile_loadd(2, B, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, D, 64);
    for(int m=0;m<16;m++) for(int n=0;n<16;n++){
      float o=fl(C[m][n]), e=fl(C[m][n]); double one=fl(C[m][n]);
      float s1 = fl(C[m][n]);
      for(int k=0;k<16;k++){
        float a0=w(A[m][2*k]), a1=w(A[m][2*k+1]), b0=w(B[k][2*n]), b1=w(B[k][2*n+1]);
        o = fl(fmaf(a1,b1,o)); o = fl(fmaf(a0,b0,o));
        e = fl(fmaf(a0,b0,e)); e = fl(fmaf(a1,b1,e));
        // pair summed exactly, then one rounding
        s1 = fl((float)((double)s1 + ((double)a0*b0 + (double)a1*b1)));
      }
      (void)one;
      total++; if (memcmp(&o,&D[m][n],4)) bad_odd++; if (memcmp(&e,&D[m][n],4)) bad_even++; if (memcmp(&s1,&D[m][n],4)) bad_one++;
    }
  }
  printf("tdpbf16ps vs model: odd-first mismatches %ld, even-first %ld, pair-one-rounding %ld of %ld\n", bad_odd, bad_even, bad_one, total);
  // vdpbf16ps check of odd-first model
  long vbad=0;
  for(int trial=0; trial<20000; trial++){
    uint32_t a[16], b[16]; float c[16], d[16];
    for(int i=0;i<16;i++){a[i]=rbf(10)|(uint32_t)rbf(10)<<16; b[i]=rbf(10)|(uint32_t)rbf(10)<<16; c[i]=w(rbf(10));}
    __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps(c), (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
    _mm512_storeu_ps(d, r);
    for(int i=0;i<16;i++){ float o=fl(c[i]); o=fl(fmaf(w(a[i]>>16),w(b[i]>>16),o)); o=fl(fmaf(w(a[i]&0xffff),w(b[i]&0xffff),o)); if(memcmp(&o,&d[i],4)) vbad++; }
  }
  printf("vdpbf16ps vs odd-first model: %ld mismatches of 320000\n", vbad);
  // throughput
  const long N = 20000000;
  __m512 acc[12]; for(int i=0;i<12;i++) acc[i]=_mm512_set1_ps(0.f);
  __m512 x=_mm512_set1_ps(1e-9f), y=_mm512_set1_ps(1e-9f);
  uint64_t t0=__rdtsc();
  for(long i=0;i<N;i++){
    for(int g=0;g<12;g++) acc[g]=_mm512_fmadd_ps(x,y,acc[g]);
    __asm__ volatile("" : "+v"(x));
  }
  uint64_t t1=__rdtsc();
  for(long i=0;i<N;i++){
    for(int g=0;g<12;g++) acc[g]=_mm512_dpbf16_ps(acc[g],(__m512bh)x,(__m512bh)y);
    __asm__ volatile("" : "+v"(x));
  }
  uint64_t t2=__rdtsc();
  float s=0; for(int g=0;g<12;g++) s+=_mm512_reduce_add_ps(acc[g]);
  printf("ticks per zmm op: vfmadd231ps %.3f  vdpbf16ps %.3f  (sum %g)\n", (double)(t1-t0)/(N*12.0), (double)(t2-t1)/(N*12.0), s);
  const long M = 2000000;
  _tile_zero(0); _tile_zero(3); _tile_zero(4); _tile_zero(5); _tile_loadd(1, A, 64); _tile_loadd(2, B, 64);
  uint64_t t3=__rdtsc();
  for(long i=0;i<M;i++){ _tile_dpbf16ps(0,1,2); _tile_dpbf16ps(3,1,2); _tile_dpbf16ps(4,1,2); _tile_dpbf16ps(5,1,2);}
  uint64_t t4=__rdtsc();
  _tile_stored(0, D, 64);
  printf("ticks per tdpbf16ps %.2f (16x16x32: %.0f bf16 MACs per tick; fma zmm does 16/op)\n", (double)(t4-t3)/(M*4.0), 8192.0/((double)(t4-t3)/(M*4.0)));
  _tile_release();
  return 0;
}
