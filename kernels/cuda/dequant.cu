// Whole-matrix decoders, one thread per element, values bit for bit the
// CPU's (sy_dequant.cuh):
// - sy_dequant_f16_<type>: to F16 (round to nearest even) for prefill,
//   whose products cuBLAS takes in F16 with F32 accumulation;
// - sy_embed_<type>: selected rows to F32 (the embedding lookup; with
//   rows 0..n it is also the decoder the GPU check compares bit for bit).
// grid ceil(n·cols / 256), block 256.
#include "sy_dequant.cuh"
#include "sy_weights.cuh"

template <int T>
__device__ __forceinline__ float sy_matrix_value(const uint8_t *w, size_t row, int cols, int c) {
  size_t row_bytes = (size_t)(cols / sy_block_len(T)) * sy_block_bytes(T);
  const uint8_t *block = w + row * row_bytes + (size_t)(c / sy_block_len(T)) * sy_block_bytes(T);
  return sy_dequant_value(T, block, c % sy_block_len(T));
}

#define SY_DEQUANT(name, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(256) sy_dequant_f16_##name(                      \
      const uint64_t *__restrict__ table, uint32_t slot, uint16_t *__restrict__ out, int rows,  \
      int cols) {                                                                               \
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                   \
    if (i >= (size_t)rows * cols) return;                                                       \
    out[i] = sy_f32_to_half(sy_matrix_value<T>(sy_weight(table, slot), i / cols, cols, i % cols)); \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) sy_embed_##name(                            \
      const uint64_t *__restrict__ table, uint32_t slot, const uint32_t *__restrict__ tokens,   \
      float *__restrict__ out, int n, int cols) {                                               \
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                   \
    if (i >= (size_t)n * cols) return;                                                          \
    out[i] = sy_matrix_value<T>(sy_weight(table, slot), tokens[i / cols], cols, i % cols);      \
  }

SY_DEQUANT(f32, SY_F32)
SY_DEQUANT(f16, SY_F16)
SY_DEQUANT(bf16, SY_BF16)
SY_DEQUANT(q8_0, SY_Q8_0)
SY_DEQUANT(q4_0, SY_Q4_0)
SY_DEQUANT(q4_1, SY_Q4_1)
SY_DEQUANT(q5_0, SY_Q5_0)
SY_DEQUANT(q5_1, SY_Q5_1)
SY_DEQUANT(q2_k, SY_Q2_K)
SY_DEQUANT(q3_k, SY_Q3_K)
SY_DEQUANT(q4_k, SY_Q4_K)
SY_DEQUANT(q5_k, SY_Q5_K)
SY_DEQUANT(q6_k, SY_Q6_K)
SY_DEQUANT(iq4_nl, SY_IQ4_NL)
SY_DEQUANT(iq4_xs, SY_IQ4_XS)
