// Float weights (F32, F16, BF16) times up to eight f32 activation rows, as
// the CPU pairs them (no activation quantization). One warp per weight row,
// lanes striding the elements; coalesced loads of the row.
//
// out[r·rows + row] (= or +=) W[row] · x[r]. grid ceil(rows / 4), block 128.
#include "sy_dot.cuh"
#include "sy_warp.cuh"
#include "sy_weights.cuh"

template <int T, int NACT>
__device__ __forceinline__ void sy_mmv_float(const uint64_t *__restrict__ table, uint32_t slot,
                                             const float *__restrict__ x, float *__restrict__ out,
                                             int rows, int k, int accumulate) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint8_t *w = sy_weight(table, slot) + (size_t)row * k * sy_block_bytes(T);
  float acc[NACT];
#pragma unroll
  for (int r = 0; r < NACT; r++) acc[r] = 0.0f;
  for (int i = lane; i < k; i += 32) {
    float wi = sy_float_weight(T, w, i);
#pragma unroll
    for (int r = 0; r < NACT; r++) acc[r] += wi * x[(size_t)r * k + i];
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

#define SY_MMV(name, T, N)                                                                     \
  extern "C" __global__ void __launch_bounds__(128) sy_mmv_##name##_n##N(                      \
      const uint64_t *__restrict__ table, uint32_t slot, const float *__restrict__ x,          \
      float *__restrict__ out, int rows, int k, int accumulate) {                              \
    sy_mmv_float<T, N>(table, slot, x, out, rows, k, accumulate);                              \
  }
#define SY_MMV_ALL(name, T) SY_MMV(name, T, 1) SY_MMV(name, T, 2) SY_MMV(name, T, 4) SY_MMV(name, T, 8)

SY_MMV_ALL(f32, SY_F32)
SY_MMV_ALL(f16, SY_F16)
SY_MMV_ALL(bf16, SY_BF16)
