// Paged attention over block tables, for decode and prefill alike: every
// query row carries its sequence and position, and attends causally over
// its sequence's positions lo..=pos (lo > 0 inside a sliding window),
// reading keys and values through the sequence's block table.
//
// KV pool of one layer: blocks of `block_positions` positions, F16, each
// block [K | V], each half [kv_head][position][head_dim]. Block ids come
// from the engine's allocator; the kernels know no policy.
//
// sy_kv_write_f16: the step's new keys and values into their blocks
//   (grid (ceil(kv_width / 256), rows), block 256).
// sy_attention_hd<D>: one block of four warps per (query head, row); each
//   warp runs an online softmax over every fourth position, the four are
//   merged through shared memory (grid (n_heads, rows), block 128).
#include "sy_warp.cuh"

struct SyAttention {
  const float *q;            // rows × n_heads·head_dim
  const float *k;            // rows × n_kv_heads·head_dim (sy_kv_write_f16)
  const float *v;            // as k
  uint16_t *pool;            // the layer's KV blocks
  const int32_t *block_tables;  // n_seqs × max_blocks block ids
  const int32_t *row_seq;    // rows: the row's sequence
  const int32_t *row_pos;    // rows: the row's position
  float *out;                // rows × n_heads·head_dim
  int32_t max_blocks;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t block_positions;
  int32_t window;            // 0: none
  float scale;
  float softcap;             // 0: none
};

__device__ __forceinline__ size_t sy_kv_offset(const SyAttention &p, int seq, int pos, int kv_head,
                                               int is_v) {
  int block = p.block_tables[(size_t)seq * p.max_blocks + pos / p.block_positions];
  size_t half = (size_t)p.n_kv_heads * p.block_positions * p.head_dim;
  return (size_t)block * 2 * half + is_v * half +
         ((size_t)kv_head * p.block_positions + pos % p.block_positions) * p.head_dim;
}

extern "C" __global__ void __launch_bounds__(256) sy_kv_write_f16(SyAttention p) {
  int kv_width = p.n_kv_heads * p.head_dim;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kv_width) return;
  int row = blockIdx.y;
  size_t at = sy_kv_offset(p, p.row_seq[row], p.row_pos[row], i / p.head_dim, 0) + i % p.head_dim;
  size_t half = (size_t)p.n_kv_heads * p.block_positions * p.head_dim;
  p.pool[at] = sy_f32_to_half(p.k[(size_t)row * kv_width + i]);
  p.pool[at + half] = sy_f32_to_half(p.v[(size_t)row * kv_width + i]);
}

template <int D>
__device__ __forceinline__ void sy_attention(const SyAttention &p) {
  constexpr int PER_LANE = D / 32;
  constexpr int WARPS = 4;
  __shared__ float merge_acc[WARPS][D];
  __shared__ float merge_ml[WARPS][2];
  int head = blockIdx.x, row = blockIdx.y;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int seq = p.row_seq[row], pos = p.row_pos[row];
  int kv_head = head / (p.n_heads / p.n_kv_heads);
  int lo = (p.window > 0 && pos + 1 > p.window) ? pos + 1 - p.window : 0;
  const float *q = p.q + ((size_t)row * p.n_heads + head) * D;
  float qr[PER_LANE], acc[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; i++) {
    qr[i] = q[lane + 32 * i] * p.scale;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int t = lo + warp; t <= pos; t += WARPS) {
    const uint16_t *key = p.pool + sy_kv_offset(p, seq, t, kv_head, 0);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) s += qr[i] * sy_half_to_f32(key[lane + 32 * i]);
    s = sy_warp_sum(s);
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    float m_new = fmaxf(m, s);
    float correction = expf(m - m_new), weight = expf(s - m_new);
    l = l * correction + weight;
    const uint16_t *value = p.pool + sy_kv_offset(p, seq, t, kv_head, 1);
#pragma unroll
    for (int i = 0; i < PER_LANE; i++)
      acc[i] = acc[i] * correction + weight * sy_half_to_f32(value[lane + 32 * i]);
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < PER_LANE; i++) merge_acc[warp][lane + 32 * i] = acc[i];
  if (lane == 0) {
    merge_ml[warp][0] = m;
    merge_ml[warp][1] = l;
  }
  __syncthreads();
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < WARPS; w++) m_all = fmaxf(m_all, merge_ml[w][0]);
  float l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < WARPS; w++)
    if (merge_ml[w][1] > 0.0f) l_all += merge_ml[w][1] * expf(merge_ml[w][0] - m_all);
  float *o = p.out + ((size_t)row * p.n_heads + head) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++)
      if (merge_ml[w][1] > 0.0f) sum += merge_acc[w][d] * expf(merge_ml[w][0] - m_all);
    o[d] = sum / l_all;
  }
}

#define SY_ATTENTION(D) \
  extern "C" __global__ void __launch_bounds__(128) sy_attention_hd##D(SyAttention p) { sy_attention<D>(p); }

SY_ATTENTION(64)
SY_ATTENTION(128)
SY_ATTENTION(256)
