// Activation quantization per block of 32 (ggml's q8_1: i8 quants, the
// scale d and s = d·Σq), the CPU's contract (kernels/src/cpu/quant_act.rs)
// bit for bit: amax = max|x|, d = amax / 127, id = 1/d (0 when d == 0),
// q = round_ties_even(x·id) saturated to i8.
#pragma once
#include "sy_common.cuh"

// x·id rounded to the nearest integer, ties to even, saturated to i8.
SY_HD int sy_round_to_i8(float v) {
#if defined(__CUDA_ARCH__)
  int r = __float2int_rn(v);
#else
  // Adding and removing 1.5·2^23 rounds to an integer in the current
  // (default: nearest-even) mode; exact for |v| < 2^22.
  float big = 12582912.0f;
  int r = (v != v) ? 0 : (v > 4194304.0f ? 4194304 : (v < -4194304.0f ? -4194304 : (int)((v + big) - big)));
#endif
  return r > 127 ? 127 : (r < -128 ? -128 : r);
}

// One block: q[0..32], returns d; *s = d·Σq, half_sums = Σq over each 16.
SY_HD float sy_quantize_block_q8_1(const float *x, int8_t *q, float *s, int *half_sums) {
  float amax = 0.0f;
  for (int i = 0; i < 32; i++) {
    float a = x[i] < 0.0f ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  float d = amax / 127.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  half_sums[0] = half_sums[1] = 0;
  for (int i = 0; i < 32; i++) {
    int r = sy_round_to_i8(SY_MUL(x[i], id));
    q[i] = (int8_t)r;
    half_sums[i / 16] += r;
  }
  *s = SY_MUL(d, (float)(half_sums[0] + half_sums[1]));
  return d;
}
