// Elementwise steps of a forward pass, one thread per element
// (grid ceil(n / 256), block 256): the gated activations of the MLP
// (SwiGLU: silu(gate)·up; GeGLU: gelu_tanh(gate)·up, as Gemma), the
// residual add, scaling and Gemma 2's soft cap.
#include "sy_common.cuh"
#include "sy_weights.cuh"

extern "C" __global__ void sy_silu_mul(float *__restrict__ gate, const float *__restrict__ up, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = gate[i];
  gate[i] = g / (1.0f + expf(-g)) * up[i];
}

extern "C" __global__ void sy_gelu_mul(float *__restrict__ gate, const float *__restrict__ up, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = gate[i];
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  gate[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
}

extern "C" __global__ void sy_add(float *__restrict__ x, const float *__restrict__ y, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

extern "C" __global__ void sy_scale(float *__restrict__ x, float factor, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}

extern "C" __global__ void sy_softcap(float *__restrict__ x, float cap, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// A bias row added to every row of x (n = rows · cols elements); the bias
// is read through the pointer table (sy_weights.cuh).
extern "C" __global__ void sy_add_bias(float *__restrict__ x, const uint64_t *__restrict__ table,
                                       uint32_t slot, int cols, size_t n) {
  const float *bias = (const float *)sy_weight(table, slot);
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += bias[i % cols];
}

// Activations rounded to F16 (nearest even, as the F16 decoders round) for
// the prefill's cuBLAS product against weights decoded to F16.
extern "C" __global__ void sy_f32_to_f16(const float *__restrict__ x, uint16_t *__restrict__ out,
                                         size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sy_f32_to_half(x[i]);
}
