// RMSNorm: out = x / sqrt(mean(x²) + eps) · weight, per row (one block of
// 256 per row), and in place per head (Qwen3's and Gemma 3's query and
// key norms: one warp per head). The weight is read through the pointer
// table (sy_weights.cuh) like every other weight, so a captured step runs
// whichever checkpoint the table names.
#include "sy_warp.cuh"
#include "sy_weights.cuh"

extern "C" __global__ void __launch_bounds__(256) sy_rms_norm(const float *__restrict__ x,
                                                              const uint64_t *__restrict__ table,
                                                              uint32_t slot, float eps,
                                                              float *__restrict__ out, int cols) {
  __shared__ float scratch[32];
  const float *weight = (const float *)sy_weight(table, slot);
  const float *xr = x + (size_t)blockIdx.x * cols;
  float *o = out + (size_t)blockIdx.x * cols;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
  float inv = 1.0f / sqrtf(sy_block_sum(ss, scratch) / (float)cols + eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = xr[i] * inv * weight[i];
}

// x: rows × (heads · head_dim), normalised in place per head.
// grid (ceil(heads / 4), rows), block 128.
extern "C" __global__ void __launch_bounds__(128) sy_rms_norm_heads(float *__restrict__ x,
                                                                    const uint64_t *__restrict__ table,
                                                                    uint32_t slot, float eps,
                                                                    int heads, int head_dim) {
  const float *weight = (const float *)sy_weight(table, slot);
  int head = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (head >= heads) return;
  float *h = x + ((size_t)blockIdx.y * heads + head) * head_dim;
  float ss = 0.0f;
  for (int i = lane; i < head_dim; i += 32) ss += h[i] * h[i];
  float inv = 1.0f / sqrtf(sy_warp_sum(ss) / (float)head_dim + eps);
  for (int i = lane; i < head_dim; i += 32) h[i] = h[i] * inv * weight[i];
}
