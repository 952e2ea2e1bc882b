// Per-block dot products of a quantized weight row with activations
// quantized per 32 (sy_quant_act.cuh): the term that activation block `b`
// adds to the row's dot product, under the CPU's contract
// (kernels/src/cpu/dot/scalar.rs, scalar_low_bit.rs): an exact integer sum
// scaled once, plus the block's offset times s = d_a·Σq_a. Summed in block
// order from 0 these give the CPU's scalar dot bit for bit; the kernels sum
// them in another order (within the per-type tolerance).
//
// `row` is the weight row, `qa` activation block b's 32 quants, `da` its
// scale and `sa` its d_a·Σq_a.
#pragma once
#include "sy_blocks.cuh"


// Four signed bytes of a times those of b, summed into c: __dp4a on the
// device, its twin on the host. Integer sums are exact, so the order and
// grouping of the products never change a block's term.
SY_HD int sy_dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
#endif
}

// Activation quants i·4 .. i·4+3 of a block as one word (activation blocks
// are 32-byte aligned: q8_1 rows are whole blocks in a 256-aligned buffer).
SY_HD int sy_qa4(const int8_t *qa, int i) {
#if defined(__CUDA_ARCH__)
  return ((const int *)qa)[i];
#else
  return (int)sy_u32((const uint8_t *)qa + 4 * i);
#endif
}

// Four weight bytes at p, which the block layout puts on a 4-byte boundary
// (Q2_K's quants at 16 of 84-byte blocks, IQ4_XS's at 8 of 136; rows start
// 256-aligned): one 32-bit load on the device instead of four byte loads.
// (Q4_K/Q5_K keep their byte loads: with word loads their eight-row
// kernels spill on sm_90.)
SY_HD uint32_t sy_w4(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
  return *(const uint32_t *)p;
#else
  return sy_u32(p);
#endif
}

// Σ qa over activation words i0 .. i0+n-1 (four quants each).
SY_HD int sy_qa_sum(const int8_t *qa, int i0, int n) {
  int acc = 0;
  for (int i = i0; i < i0 + n; i++) acc = sy_dp4a(0x01010101, sy_qa4(qa, i), acc);
  return acc;
}

// Bits 0..3 of `bits` as bit 4 of bytes 0..3 (the fifth bit of Q5 quants).
SY_HD uint32_t sy_bit4_bytes(uint32_t bits) {
  return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// Σ q_j·qa_j of a Q4_0/Q4_1 (qh 0) or Q5_0/Q5_1 block: quant j is the low
// nibble of qs[j] (j < 16) or the high nibble of qs[j - 16], plus bit j of
// qh as its fifth bit; four at a time.
SY_HD int sy_isum_nibbles(const uint8_t *qs, uint32_t qh, const int8_t *qa) {
  int acc = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t q = sy_u32(qs + 4 * i);
    uint32_t lo = (q & 0x0F0F0F0Fu) | sy_bit4_bytes(qh >> (4 * i));
    uint32_t hi = ((q >> 4) & 0x0F0F0F0Fu) | sy_bit4_bytes(qh >> (16 + 4 * i));
    acc = sy_dp4a((int)lo, sy_qa4(qa, i), acc);
    acc = sy_dp4a((int)hi, sy_qa4(qa, 4 + i), acc);
  }
  return acc;
}

// Four IQ4 values, of the nibbles at bits 0, 8, 16, 24 of `nibbles`, as
// the bytes of one word.
SY_HD int sy_iq4_word(uint32_t nibbles) {
  uint32_t w = 0;
  for (int i = 0; i < 4; i++) w |= (uint32_t)(uint8_t)sy_iq4_value((nibbles >> (8 * i)) & 0x0F) << (8 * i);
  return (int)w;
}

// Σ value(q_j)·qa_j of an IQ4_NL/IQ4_XS run of 32 quants (low nibbles of
// qs[0..16], then the high ones), four at a time.
SY_HD int sy_isum_iq4(const uint8_t *qs, const int8_t *qa) {
  int acc = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t q = sy_u32(qs + 4 * i);
    acc = sy_dp4a(sy_iq4_word(q), sy_qa4(qa, i), acc);
    acc = sy_dp4a(sy_iq4_word(q >> 4), sy_qa4(qa, 4 + i), acc);
  }
  return acc;
}

// IQ4_XS's quants are 4-aligned (sy_w4): the same sum with word loads.
SY_HD int sy_isum_iq4_xs(const uint8_t *qs, const int8_t *qa) {
  int acc = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t q = sy_w4(qs + 4 * i);
    acc = sy_dp4a(sy_iq4_word(q), sy_qa4(qa, i), acc);
    acc = sy_dp4a(sy_iq4_word(q >> 4), sy_qa4(qa, 4 + i), acc);
  }
  return acc;
}

SY_HD float sy_dot_block(int t, const uint8_t *row, int b, const int8_t *qa, float da, float sa) {
  switch (t) {
    case SY_Q8_0: {
      const uint8_t *w = row + 34 * b;
      int acc = 0;
      for (int i = 0; i < 8; i++) acc = sy_dp4a((int)sy_u32(w + 2 + 4 * i), sy_qa4(qa, i), acc);
      return SY_MUL(SY_MUL(sy_f16_at(w), da), (float)acc);
    }
    case SY_Q4_0: case SY_Q4_1: case SY_Q5_0: case SY_Q5_1: {
      int bytes = sy_block_bytes(t);
      const uint8_t *w = row + bytes * b;
      float d = sy_f16_at(w);
      float m;
      uint32_t qh = 0;
      int qs;
      if (t == SY_Q4_0) { m = SY_MUL(-8.0f, d); qs = 2; }
      else if (t == SY_Q4_1) { m = sy_f16_at(w + SY_Q4_1_M); qs = SY_Q4_1_QS; }
      else if (t == SY_Q5_0) { m = SY_MUL(-16.0f, d); qh = sy_u32(w + SY_Q5_0_QH); qs = SY_Q5_0_QS; }
      else { m = sy_f16_at(w + SY_Q5_1_M); qh = sy_u32(w + SY_Q5_1_QH); qs = SY_Q5_1_QS; }
      int acc = sy_isum_nibbles(w + qs, qh, qa);
      return SY_ADD(SY_MUL(SY_MUL(d, da), (float)acc), SY_MUL(m, sa));
    }
    case SY_Q4_K: case SY_Q5_K: {
      const uint8_t *w = row + sy_block_bytes(t) * (b / 8);
      int sub = b % 8, sc, m;
      sy_q4k_scale_min(w + SY_Q4K_SCALES, sub, &sc, &m);
      // Sub-block `sub`'s quants: nibble (sub & 1) of 32 bytes from
      // 32·(sub / 2), Q5_K's fifth bit bit `sub` of qh[l] (sy_q4k_quant,
      // sy_q5k_quant), four at a time.
      const uint8_t *qs = w + (t == SY_Q4_K ? SY_Q4K_QS : SY_Q5K_QS) + 32 * (sub / 2);
      int shift = 4 * (sub & 1), acc = 0;
      for (int i = 0; i < 8; i++) {
        uint32_t q = (sy_u32(qs + 4 * i) >> shift) & 0x0F0F0F0Fu;
        if (t == SY_Q5_K) q |= ((sy_u32(w + SY_Q5K_QH + 4 * i) >> sub) & 0x01010101u) << 4;
        acc = sy_dp4a((int)q, sy_qa4(qa, i), acc);
      }
      float scale = SY_MUL(sy_f16_at(w), (float)sc);
      float min = -SY_MUL(sy_f16_at(w + SY_Q4K_DMIN), (float)m);
      return SY_ADD(SY_MUL(SY_MUL(scale, da), (float)acc), SY_MUL(min, sa));
    }
    case SY_Q6_K: {
      // Sub-block `sub` (sy_q6k_quant): quarter q = sub % 4 of half
      // sub / 4; element l's low nibble is nibble q / 2 of ql[64·half +
      // 32·(q & 1) + l], its high two bits bits 2q of qh[32·half + l]. The
      // 6-bit quants (0..63) go through __dp4a, the offset 32 as 32·Σqa.
      const uint8_t *w = row + 210 * (b / 8);
      int sub = b % 8, half = sub / 4, q = sub % 4, acc = 0;
      const uint8_t *ql = w + 64 * half + 32 * (q & 1), *qh = w + SY_Q6K_QH + 32 * half;
      for (int h16 = 0; h16 < 2; h16++) {
        int part = 0;
        for (int i = 4 * h16; i < 4 * h16 + 4; i++) {
          uint32_t lo = (sy_u32(ql + 4 * i) >> (4 * (q / 2))) & 0x0F0F0F0Fu;
          uint32_t hi = ((sy_u32(qh + 4 * i) >> (2 * q)) & 0x03030303u) << 4;
          part = sy_dp4a((int)(lo | hi), sy_qa4(qa, i), part);
        }
        part -= 32 * sy_qa_sum(qa, 4 * h16, 4);
        acc += (int)(int8_t)w[SY_Q6K_SCALES + 8 * half + 2 * q + h16] * part;
      }
      return SY_MUL(SY_MUL(sy_f16_at(w + SY_Q6K_D), da), (float)acc);
    }
    case SY_Q2_K: {
      // Element l of sub-block `sub`: bits 2·(sub % 4) of qs[32·(sub / 4)
      // + l] (sy_two_bits); 16-element groups j = 2·sub + h16 carry a
      // 4-bit scale and min each.
      const uint8_t *w = row + 84 * (b / 8);
      int sub = b % 8, scaled = 0, mins = 0, shift = 2 * (sub % 4);
      const uint8_t *qs = w + SY_Q2K_QS + 32 * (sub / 4);
      for (int h16 = 0; h16 < 2; h16++) {
        int sc, m, part = 0;
        sy_q2k_scale_min(w, 2 * sub + h16, &sc, &m);
        for (int i = 4 * h16; i < 4 * h16 + 4; i++)
          part = sy_dp4a((int)((sy_w4(qs + 4 * i) >> shift) & 0x03030303u), sy_qa4(qa, i), part);
        scaled += sc * part;
        mins += m * sy_qa_sum(qa, 4 * h16, 4);
      }
      float d = sy_f16_at(w + SY_Q2K_D), dmin = sy_f16_at(w + SY_Q2K_DMIN);
      return SY_SUB(SY_MUL(SY_MUL(d, da), (float)scaled), SY_MUL(SY_MUL(dmin, da), (float)mins));
    }
    case SY_Q3_K: {
      // As Q2_K's two bits, plus bit `sub` of hmask[l]: set, the quant is
      // the two bits; clear, the two bits - 4. So q + 4 = bits | hbit << 2
      // (0..7) goes through __dp4a and the 4 comes off as 4·Σqa.
      const uint8_t *w = row + 110 * (b / 8);
      int sub = b % 8, scaled = 0, shift = 2 * (sub % 4);
      const uint8_t *qs = w + SY_Q3K_QS + 32 * (sub / 4);
      for (int h16 = 0; h16 < 2; h16++) {
        int part = 0;
        for (int i = 4 * h16; i < 4 * h16 + 4; i++) {
          uint32_t low = (sy_u32(qs + 4 * i) >> shift) & 0x03030303u;
          uint32_t high = ((sy_u32(w + 4 * i) >> sub) & 0x01010101u) << 2;
          part = sy_dp4a((int)(low | high), sy_qa4(qa, i), part);
        }
        part -= 4 * sy_qa_sum(qa, 4 * h16, 4);
        scaled += sy_q3k_scale(w + SY_Q3K_SCALES, 2 * sub + h16) * part;
      }
      return SY_MUL(SY_MUL(sy_f16_at(w + SY_Q3K_D), da), (float)scaled);
    }
    case SY_IQ4_NL: {
      const uint8_t *w = row + 18 * b;
      return SY_MUL(SY_MUL(sy_f16_at(w), da), (float)sy_isum_iq4(w + 2, qa));
    }
    case SY_IQ4_XS: {
      const uint8_t *w = row + 136 * (b / 8);
      int sub = b % 8;
      int scaled = sy_iq4xs_scale(w, sub) * sy_isum_iq4_xs(w + SY_IQ4XS_QS + 16 * sub, qa);
      return SY_MUL(SY_MUL(sy_f16_at(w), da), (float)scaled);
    }
    default: return 0.0f;
  }
}

// A float weight row's element i (F32, F16, BF16), for the float dot.
SY_HD float sy_float_weight(int t, const uint8_t *row, int i) {
  return t == SY_F32 ? sy_f32_at(row + 4 * i)
                     : (t == SY_F16 ? sy_f16_at(row + 2 * i) : sy_bf16_to_f32(sy_u16(row + 2 * i)));
}
