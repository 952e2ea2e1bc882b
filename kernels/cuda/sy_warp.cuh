// Warp and block reductions (device only).
#pragma once
#include "sy_common.cuh"

#define SY_FULL_MASK 0xffffffffu

__device__ __forceinline__ float sy_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SY_FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float sy_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(SY_FULL_MASK, v, o));
  return v;
}

__device__ __forceinline__ int sy_warp_isum(int v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(SY_FULL_MASK, v, o);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float sy_block_sum(float v, float *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = sy_warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return sy_warp_sum(v);
}

__device__ __forceinline__ float sy_block_max(float v, float *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = sy_warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return sy_warp_max(v);
}
