// Rotary position embedding in place, both pairings of the CPU's RopeStyle:
// interleaved (dimension 2i with 2i+1: GGUF Llama files) and NeoX
// (i with i + head_dim/2: Hugging Face's rotate_half, GGUF Qwen2/Gemma).
// Row r is at positions[r]; inv_freq has head_dim/2 entries (scaling
// applied). One thread per rotated pair; grid (ceil(width/2 / 256), rows).
#include "sy_common.cuh"

extern "C" __global__ void __launch_bounds__(256) sy_rope(float *__restrict__ x, int width,
                                                          int head_dim,
                                                          const uint32_t *__restrict__ positions,
                                                          const float *__restrict__ inv_freq,
                                                          int neox) {
  int pair = blockIdx.x * blockDim.x + threadIdx.x;
  int half = head_dim / 2;
  if (pair >= width / 2) return;
  int head = pair / half, i = pair % half;
  float angle = (float)positions[blockIdx.y] * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  float *h = x + (size_t)blockIdx.y * width + (size_t)head * head_dim;
  int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
  float x0 = h[a], x1 = h[b];
  h[a] = x0 * c - x1 * s;
  h[b] = x0 * s + x1 * c;
}
