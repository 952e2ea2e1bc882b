// Activations quantized per block of 32 for the MMVQ kernels, bit for bit
// the CPU's (sy_quant_act.cuh): one warp per block, lane i element i. The
// max and the integer sums are order-free, so the warp reductions give the
// scalar loop's values exactly.
#include "sy_quant_act.cuh"
#include "sy_warp.cuh"

// x: rows × k f32; q: rows × k i8; ds: rows × (k/32) × (d, s).
// grid (ceil(k/32 / 4), rows), block 128.
extern "C" __global__ void sy_quantize_q8_1(const float *__restrict__ x, int8_t *__restrict__ q,
                                            float *__restrict__ ds, int k) {
  int nb = k / 32;
  int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (b >= nb) return;
  size_t at = (size_t)blockIdx.y * k + 32 * b + lane;
  float v = x[at];
  float amax = sy_warp_max(fabsf(v));
  float d = amax / 127.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  int r = sy_round_to_i8(__fmul_rn(v, id));
  q[at] = (int8_t)r;
  int total = sy_warp_isum(r, 32);
  if (lane == 0) {
    size_t o = 2 * ((size_t)blockIdx.y * nb + b);
    ds[o] = d;
    ds[o + 1] = __fmul_rn(d, (float)total);
  }
}
