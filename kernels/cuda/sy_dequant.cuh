// Block decoders: element e of one block of type t, as an f32, with the
// CPU backend's formulas in its order of f32 operations
// (kernels/src/formats/types/, each type's dequantize), so every value equals
// the CPU's bit for bit. A kernel calls these with a constant `t`, which
// folds the switch away.
#pragma once
#include "sy_blocks.cuh"

SY_HD float sy_dequant_value(int t, const uint8_t *block, int e) {
  switch (t) {
    case SY_F32: return sy_f32_at(block);
    case SY_F16: return sy_f16_at(block);
    case SY_BF16: return sy_bf16_to_f32(sy_u16(block));
    case SY_Q8_0: return SY_MUL((float)(int8_t)block[2 + e], sy_f16_at(block));
    case SY_Q4_0: return SY_MUL((float)(sy_q4_quant(block + 2, e) - 8), sy_f16_at(block));
    case SY_Q4_1:
      return SY_ADD(SY_MUL((float)sy_q4_quant(block + SY_Q4_1_QS, e), sy_f16_at(block)),
                    sy_f16_at(block + SY_Q4_1_M));
    case SY_Q5_0: {
      int q = sy_q5_quant(sy_u32(block + SY_Q5_0_QH), block + SY_Q5_0_QS, e);
      return SY_MUL((float)(q - 16), sy_f16_at(block));
    }
    case SY_Q5_1: {
      int q = sy_q5_quant(sy_u32(block + SY_Q5_1_QH), block + SY_Q5_1_QS, e);
      return SY_ADD(SY_MUL((float)q, sy_f16_at(block)), sy_f16_at(block + SY_Q5_1_M));
    }
    case SY_Q2_K: {
      int sc, m;
      sy_q2k_scale_min(block, e / 16, &sc, &m);
      float dl = SY_MUL(sy_f16_at(block + SY_Q2K_D), (float)sc);
      float ml = SY_MUL(sy_f16_at(block + SY_Q2K_DMIN), (float)m);
      return SY_SUB(SY_MUL(dl, (float)sy_q2k_quant(block, e)), ml);
    }
    case SY_Q3_K: {
      float dl = SY_MUL(sy_f16_at(block + SY_Q3K_D), (float)sy_q3k_scale(block + SY_Q3K_SCALES, e / 16));
      return SY_MUL(dl, (float)sy_q3k_quant(block, e));
    }
    case SY_Q4_K: case SY_Q5_K: {
      int sc, m;
      sy_q4k_scale_min(block + SY_Q4K_SCALES, e / 32, &sc, &m);
      float scale = SY_MUL(sy_f16_at(block), (float)sc);
      float min = SY_MUL(sy_f16_at(block + SY_Q4K_DMIN), (float)m);
      int q = t == SY_Q4_K ? sy_q4k_quant(block, e) : sy_q5k_quant(block, e);
      return SY_SUB(SY_MUL(scale, (float)q), min);
    }
    case SY_Q6_K: {
      int si;
      int q = sy_q6k_quant(block, e, &si);
      float dsc = SY_MUL(sy_f16_at(block + SY_Q6K_D), (float)(int8_t)block[SY_Q6K_SCALES + si]);
      return SY_MUL(dsc, (float)(q - 32));
    }
    case SY_IQ4_NL:
      return SY_MUL(sy_f16_at(block), (float)sy_iq4_value(sy_q4_quant(block + 2, e)));
    case SY_IQ4_XS: {
      int j = e / 32;
      float dl = SY_MUL(sy_f16_at(block), (float)sy_iq4xs_scale(block, j));
      int q = sy_q4_quant(block + SY_IQ4XS_QS + 16 * j, e % 32);
      return SY_MUL(dl, (float)sy_iq4_value(q));
    }
    default: return 0.0f;
  }
}

// The whole block: out[0 .. sy_block_len(t)].
SY_HD void sy_dequant_block(int t, const uint8_t *block, float *out) {
  int n = sy_block_len(t);
  for (int e = 0; e < n; e++) out[e] = sy_dequant_value(t, block, e);
}
