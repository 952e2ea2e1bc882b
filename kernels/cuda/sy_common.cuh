// Shared by every kernel and by the host test harness: fixed-width types,
// the __host__ __device__ marker, little-endian readers, f16/bf16 widening
// and narrowing, and arithmetic that is never contracted into an FMA.
//
// Why no FMA: the block decoders and per-block dot products must equal the
// CPU backend's (Rust, which never contracts) bit for bit, on the host and
// on the device. nvcc contracts `a * b + c` by default; __fmul_rn/__fadd_rn
// are never contracted.
#pragma once

#ifdef __CUDACC_RTC__
// NVRTC has no C library headers.
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t_sy;
#define INFINITY __int_as_float(0x7f800000)
#else
#include <stdint.h>
#include <string.h>
typedef uintptr_t uintptr_t_sy;
#endif

#ifdef __CUDACC__
#define SY_HD __host__ __device__ __forceinline__
#else
#define SY_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define SY_MUL(a, b) __fmul_rn((a), (b))
#define SY_ADD(a, b) __fadd_rn((a), (b))
#define SY_SUB(a, b) __fsub_rn((a), (b))
#else
#define SY_MUL(a, b) ((a) * (b))
#define SY_ADD(a, b) ((a) + (b))
#define SY_SUB(a, b) ((a) - (b))
#endif

SY_HD uint32_t sy_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

SY_HD float sy_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

SY_HD uint16_t sy_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

SY_HD uint32_t sy_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// IEEE half to float, exactly (every half is a float), subnormals included.
SY_HD float sy_half_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t man = h & 0x3FF;
  if (exp == 0x1F) return sy_bits_f32(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return sy_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return sy_bits_f32(sign);
  // Subnormal: normalise the mantissa.
  int e = -1;
  do {
    man <<= 1;
    e++;
  } while ((man & 0x400) == 0);
  return sy_bits_f32(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13));
}

// Float to IEEE half, rounding to nearest even (as `half::f16::from_f32`).
SY_HD uint16_t sy_f32_to_half(float f) {
  uint32_t x = sy_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t exp = (x >> 23) & 0xFF;
  uint32_t man = x & 0x7FFFFF;
  if (exp == 0xFF) return (uint16_t)(sign | 0x7C00 | (man ? (0x200 | (man >> 13)) : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 0x1F) return (uint16_t)(sign | 0x7C00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t half_man = man >> shift;
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_man & 1))) half_man++;
    return (uint16_t)(sign | half_man);
  }
  uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
  uint32_t rest = man & 0x1FFF;
  // A carry out of the mantissa correctly bumps the exponent (to inf at the top).
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}

SY_HD float sy_bf16_to_f32(uint16_t b) { return sy_bits_f32((uint32_t)b << 16); }

SY_HD float sy_f16_at(const uint8_t *p) { return sy_half_to_f32(sy_u16(p)); }

SY_HD float sy_f32_at(const uint8_t *p) { return sy_bits_f32(sy_u32(p)); }
