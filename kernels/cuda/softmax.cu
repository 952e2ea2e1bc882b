// Softmax of each row in place (sampling's probabilities over the logits,
// scaled by 1/temperature first): one block of 256 per row.
#include "sy_warp.cuh"

extern "C" __global__ void __launch_bounds__(256) sy_softmax(float *__restrict__ x, int cols,
                                                             float inv_temperature) {
  __shared__ float scratch[32];
  float *r = x + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, r[i] * inv_temperature);
  m = sy_block_max(m, scratch);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float e = expf(r[i] * inv_temperature - m);
    r[i] = e;
    sum += e;
  }
  float inv = 1.0f / sy_block_sum(sum, scratch);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) r[i] *= inv;
}
