// Fused dequantize-and-dot decode kernels (MMVQ, as llama.cpp and candle):
// a quantized weight matrix times up to eight activation rows quantized
// per block of 32 (quantize.cu), reading the weights straight from their
// GGUF blocks. One warp per weight row; lane l takes activation blocks l,
// l+32, ...; each block's term is sy_dot_block's, the CPU's per-block
// term, so the result differs from the CPU's only in summation order.
//
// out[r·rows + row] (= or +=) W[row] · a[r], W from the pointer table.
// grid ceil(rows / 4), block 128.
#include "sy_dot.cuh"
#include "sy_warp.cuh"
#include "sy_weights.cuh"

template <int T, int NACT>
__device__ __forceinline__ void sy_mmvq(const uint64_t *__restrict__ table, uint32_t slot,
                                        const int8_t *__restrict__ qa, const float *__restrict__ ads,
                                        float *__restrict__ out, int rows, int k, int accumulate) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  int nb = k / 32;
  size_t row_bytes = (size_t)(k / sy_block_len(T)) * sy_block_bytes(T);
  const uint8_t *w = sy_weight(table, slot) + (size_t)row * row_bytes;
  float acc[NACT];
#pragma unroll
  for (int r = 0; r < NACT; r++) acc[r] = 0.0f;
  for (int b = lane; b < nb; b += 32) {
#pragma unroll
    for (int r = 0; r < NACT; r++) {
      const float *ds = ads + 2 * ((size_t)r * nb + b);
      acc[r] += sy_dot_block(T, w, b, qa + (size_t)r * k + 32 * b, ds[0], ds[1]);
    }
  }
#pragma unroll
  for (int r = 0; r < NACT; r++) {
    float v = sy_warp_sum(acc[r]);
    if (lane == 0) {
      float *o = out + (size_t)r * rows + row;
      *o = accumulate ? *o + v : v;
    }
  }
}

#define SY_MMVQ(name, T, N)                                                                      \
  extern "C" __global__ void __launch_bounds__(128) sy_mmvq_##name##_n##N(                       \
      const uint64_t *__restrict__ table, uint32_t slot, const int8_t *__restrict__ qa,          \
      const float *__restrict__ ads, float *__restrict__ out, int rows, int k, int accumulate) { \
    sy_mmvq<T, N>(table, slot, qa, ads, out, rows, k, accumulate);                               \
  }
#define SY_MMVQ_ALL(name, T) SY_MMVQ(name, T, 1) SY_MMVQ(name, T, 2) SY_MMVQ(name, T, 4) SY_MMVQ(name, T, 8)

SY_MMVQ_ALL(q8_0, SY_Q8_0)
SY_MMVQ_ALL(q4_0, SY_Q4_0)
SY_MMVQ_ALL(q4_1, SY_Q4_1)
SY_MMVQ_ALL(q5_0, SY_Q5_0)
SY_MMVQ_ALL(q5_1, SY_Q5_1)
SY_MMVQ_ALL(q2_k, SY_Q2_K)
SY_MMVQ_ALL(q3_k, SY_Q3_K)
SY_MMVQ_ALL(q4_k, SY_Q4_K)
SY_MMVQ_ALL(q5_k, SY_Q5_K)
SY_MMVQ_ALL(q6_k, SY_Q6_K)
SY_MMVQ_ALL(iq4_nl, SY_IQ4_NL)
SY_MMVQ_ALL(iq4_xs, SY_IQ4_XS)
