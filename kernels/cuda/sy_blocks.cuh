// ggml's block layouts (the GGUF formats), byte for byte, as the CPU
// backend reads them (kernels/src/cpu/blocks*.rs): the type ids, sizes and
// per-element accessors. One accessor per layout detail, shared by the
// decoders (sy_dequant.cuh) and the per-block dot products (sy_dot.cuh).
#pragma once
#include "sy_common.cuh"

// ggml type ids, as in GGUF files and kernels/src/dtype.rs.
enum SyType {
  SY_F32 = 0,
  SY_F16 = 1,
  SY_Q4_0 = 2,
  SY_Q4_1 = 3,
  SY_Q5_0 = 6,
  SY_Q5_1 = 7,
  SY_Q8_0 = 8,
  SY_Q2_K = 10,
  SY_Q3_K = 11,
  SY_Q4_K = 12,
  SY_Q5_K = 13,
  SY_Q6_K = 14,
  SY_IQ4_NL = 20,
  SY_IQ4_XS = 23,
  SY_BF16 = 30,
};

#define SY_QK 32
#define SY_QK_K 256

// Elements per block (0 for an unknown id).
SY_HD int sy_block_len(int t) {
  switch (t) {
    case SY_F32: case SY_F16: case SY_BF16: return 1;
    case SY_Q4_0: case SY_Q4_1: case SY_Q5_0: case SY_Q5_1: case SY_Q8_0: case SY_IQ4_NL: return 32;
    case SY_Q2_K: case SY_Q3_K: case SY_Q4_K: case SY_Q5_K: case SY_Q6_K: case SY_IQ4_XS: return 256;
    default: return 0;
  }
}

// Bytes per block (0 for an unknown id).
SY_HD int sy_block_bytes(int t) {
  switch (t) {
    case SY_F32: return 4;
    case SY_F16: case SY_BF16: return 2;
    case SY_Q8_0: return 34;
    case SY_Q4_0: return 18;
    case SY_Q4_1: return 20;
    case SY_Q5_0: return 22;
    case SY_Q5_1: return 24;
    case SY_Q2_K: return 84;
    case SY_Q3_K: return 110;
    case SY_Q4_K: return 144;
    case SY_Q5_K: return 176;
    case SY_Q6_K: return 210;
    case SY_IQ4_NL: return 18;
    case SY_IQ4_XS: return 136;
    default: return 0;
  }
}

// Byte offsets inside a block (kernels/src/formats/types/, one file per type).
#define SY_Q4_1_M 2
#define SY_Q4_1_QS 4
#define SY_Q5_0_QH 2
#define SY_Q5_0_QS 6
#define SY_Q5_1_M 2
#define SY_Q5_1_QH 4
#define SY_Q5_1_QS 8
#define SY_Q4K_DMIN 2
#define SY_Q4K_SCALES 4
#define SY_Q4K_QS 16
#define SY_Q6K_QH 128
#define SY_Q6K_SCALES 192
#define SY_Q6K_D 208
#define SY_Q2K_QS 16
#define SY_Q2K_D 80
#define SY_Q2K_DMIN 82
#define SY_Q3K_QS 32
#define SY_Q3K_SCALES 96
#define SY_Q3K_D 108
#define SY_Q5K_SCALES 4
#define SY_Q5K_QH 16
#define SY_Q5K_QS 48
#define SY_IQ4XS_SCALES_H 2
#define SY_IQ4XS_SCALES_L 4
#define SY_IQ4XS_QS 8

// ggml's kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13,
// 25, 38, 53, 69, 89, 113}, packed as i8 into two u64 words: a table in
// memory would not exist on the host (__constant__) or would cost local
// memory on the device (a switch compiles to a jump table and spills).
SY_HD int sy_iq4_value(int q) {
  uint64_t word = (q & 8) ? 0x7159453526190d01ull : 0xf6eaddcfbfad9881ull;
  return (int)(int8_t)(uint8_t)(word >> (8 * (q & 7)));
}

// Q4_0/Q4_1/IQ4_NL (and Q5's low bits): element j low nibble of byte j,
// element j+16 high nibble.
SY_HD int sy_q4_quant(const uint8_t *qs, int j) {
  return j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
}

SY_HD int sy_q5_quant(uint32_t qh, const uint8_t *qs, int j) {
  return sy_q4_quant(qs, j) | (int)(((qh >> j) & 1) << 4);
}

// Q4_K/Q5_K sub-block j's 6-bit (scale, min): ggml's get_scale_min_k4.
SY_HD void sy_q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

SY_HD int sy_q4k_quant(const uint8_t *block, int e) {
  uint8_t byte = block[SY_Q4K_QS + 32 * (e / 64) + e % 32];
  return (e % 64) < 32 ? (byte & 0x0F) : (byte >> 4);
}

// Q6_K: the 6-bit quant (0..64) of element e and its 16-element scale index.
SY_HD int sy_q6k_quant(const uint8_t *block, int e, int *scale_index) {
  int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  uint8_t low = block[64 * half + l + 32 * (quarter & 1)];
  int nibble = quarter < 2 ? (low & 0x0F) : (low >> 4);
  int high = (block[SY_Q6K_QH + 32 * half + l] >> (2 * quarter)) & 3;
  *scale_index = 8 * half + r / 16;
  return nibble | (high << 4);
}

// Q2_K/Q3_K: the 2-bit field of element e in the 64 bytes at qs.
SY_HD int sy_two_bits(const uint8_t *qs, int e) {
  int half = e / 128, r = e % 128;
  return (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3;
}

SY_HD int sy_q2k_quant(const uint8_t *block, int e) { return sy_two_bits(block + SY_Q2K_QS, e); }

SY_HD void sy_q2k_scale_min(const uint8_t *block, int j, int *sc, int *m) {
  *sc = block[j] & 0x0F;
  *m = block[j] >> 4;
}

SY_HD int sy_q3k_quant(const uint8_t *block, int e) {
  int low = sy_two_bits(block + SY_Q3K_QS, e);
  int high = (block[e % 32] >> (e / 32)) & 1;
  return high ? low : low - 4;
}

SY_HD int sy_q3k_scale(const uint8_t *s, int j) {
  int low = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
  int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

SY_HD int sy_q5k_quant(const uint8_t *block, int e) {
  uint8_t byte = block[SY_Q5K_QS + 32 * (e / 64) + e % 32];
  int low = (e % 64) < 32 ? (byte & 0x0F) : (byte >> 4);
  int high = (block[SY_Q5K_QH + e % 32] >> (e / 32)) & 1;
  return low | (high << 4);
}

SY_HD int sy_iq4xs_scale(const uint8_t *block, int j) {
  int low = (block[SY_IQ4XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0x0F;
  int high = (sy_u16(block + SY_IQ4XS_SCALES_H) >> (2 * j)) & 3;
  return (low | (high << 4)) - 32;
}
