/* rlk_host_prelude.h - what every host (CPU) template includes.
 *
 * Host templates are C11, compiled by clang into a shared object, one per kernel spec. The
 * spec's parameters arrive as -DRLK_P_<NAME>=<value> (dtypes as C type names). The entry is
 * `void rlk_<entry>(void **args)`: args holds one pointer per kernel argument, in the order of
 * the CUDA kernel's parameters, and the function does the whole problem (there is no grid). */
#ifndef RLK_HOST_PRELUDE_H
#define RLK_HOST_PRELUDE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The one exported symbol of a host kernel object. */
#define RLK_HOST_KERNEL __attribute__((visibility("default"))) void

/* Reads kernel argument i of type T from the argument array. */
#define RLK_ARG(T, i) (*(T const *)args[(i)])

typedef int64_t rlk_i64;

static inline float rlk_bits_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t rlk_float_as_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* bf16 is the top half of an fp32. */
static inline float rlk_bf16_to_float(uint16_t b) { return rlk_bits_as_float((uint32_t)b << 16); }

/* Round to nearest even; NaN stays a quiet NaN of the same sign. */
static inline uint16_t rlk_float_to_bf16(float f) {
  uint32_t u = rlk_float_as_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* IEEE binary16 -> fp32, exact (subnormals included). */
static inline float rlk_f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return rlk_bits_as_float(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return rlk_bits_as_float(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return rlk_bits_as_float(sign);
  /* Subnormal: normalize. */
  uint32_t e = 113u;
  while ((man & 0x400u) == 0) {
    man <<= 1;
    e--;
  }
  return rlk_bits_as_float(sign | (e << 23) | ((man & 0x3ffu) << 13));
}

/* fp32 -> IEEE binary16, round to nearest even, overflow to infinity. */
static inline uint16_t rlk_float_to_f16(float f) {
  const uint32_t u = rlk_float_as_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {                                   /* below the smallest normal */
    if (a < 0x33000000u) return sign;                      /* rounds to zero */
    const uint32_t shift = 126u - (a >> 23);               /* 14 .. 24 */
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((a >> 13) - (112u << 10));
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

/* Square roots: the hardware instruction (host kernels compile with -fno-math-errno). */
static inline double rlk_sqrt(double x) { return __builtin_sqrt(x); }
static inline float rlk_sqrtf(float x) { return __builtin_sqrtf(x); }

#endif /* RLK_HOST_PRELUDE_H */
