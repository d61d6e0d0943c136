/*
 * cn_simd.h -- the kernels' SIMD intrinsics, a section per `simd` value of
 * meson.build's table of ISA levels. (The only other intrinsics are the SSE2
 * streaming copy of cn_pages.h, which the orchestration uses too.)
 *
 * It gives the kernels two vector types and a few operations on them:
 *   cn_vf : fp32 lanes (used for float32, bfloat16 and float16 data)
 *   cn_vd : fp64 lanes (used for float64 data)
 * plus loads and stores between those lanes and every storage format, with
 * tails (the first n lanes only), and fixed-order horizontal sums.
 *
 * The same source is compiled once per ISA level, with that level's flags and
 * -DCN_LEVEL=<name>; the level's row of the table picks the section (never
 * -march=native): avx512 (F/BW/VL/DQ, + BF16 where the level has hw_bf16) |
 * avx2 (+ FMA, F16C) | neon (aarch64's ASIMD) | generic. The generic section is plain C that any
 * compiler can auto-vectorize; it serves the baseline level, every
 * architecture without a section of its own, and the units compiled without
 * a level (the orchestration).
 *
 * Rounding contract (identical on every path, tested bit for bit):
 *   fp32 -> bf16 : round to nearest even; NaN stays NaN (made quiet, sign and top
 *                  payload kept); fp32 subnormal inputs become signed zero,
 *                  because the hardware instruction VCVTNEPS2BF16 does that.
 *   fp32 -> f16  : round to nearest even, IEEE subnormals, overflow to inf,
 *                  NaN made quiet (what VCVTPS2PH does).
 *   bf16/f16 -> fp32 : exact (f16 signalling NaNs come back quiet, as in F16C).
 */
#ifndef CN_SIMD_H
#define CN_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cn_tables.h"

/* ------------------------------------------------------------------ ISA -- */
#define CN_STR_(x) #x
#define CN_STR(x) CN_STR_(x)
#if defined(CN_LEVEL)
#  define CN_SIMD CN_LEVEL_FIELD(SIMD, CN_LEVEL)
#  define CN_HW_BF16 CN_LEVEL_FIELD(HW_BF16, CN_LEVEL)
#  define CN_MULTIROW_STREAM CN_LEVEL_FIELD(MULTIROW_STREAM, CN_LEVEL)
#  define CN_ISA_NAME CN_STR(CN_LEVEL)
#else
#  define CN_SIMD CN_SIMD_generic
#  define CN_HW_BF16 0
#  define CN_MULTIROW_STREAM 0
#endif
#if CN_SIMD == CN_SIMD_avx512
#  if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)) \
      || (CN_HW_BF16 && !defined(__AVX512BF16__))
#    error "this unit's compiler flags do not enable its level's instructions (meson.build's table)"
#  endif
#  define CN_AVX512 1
#elif CN_SIMD == CN_SIMD_avx2
#  if !(defined(__AVX2__) && (defined(__FMA__) || defined(_MSC_VER)))
#    error "this unit's compiler flags do not enable its level's instructions (meson.build's table)"
#  endif
#  define CN_AVX2 1
#elif CN_SIMD == CN_SIMD_neon
#  if !(defined(__aarch64__) || defined(_M_ARM64))
#    error "the neon level is for aarch64 (meson.build's table)"
#  endif
#  define CN_NEON 1
#else
#  define CN_GENERIC 1
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_ALIGNED64 __declspec(align(64))
#else
#  define CN_ALIGNED64 __attribute__((aligned(64)))
#endif

/* Sanitizer/debug builds, and the portable level, do not force inlining (any
 * compiler): forcing every helper inline makes a plain-C unit (8 scalar lanes
 * per vector operation) compile for minutes. */
#if defined(_MSC_VER) && !defined(__clang__)
#  if defined(CN_NO_FORCE_INLINE) || defined(CN_GENERIC)
#    define CN_INLINE static __inline
#  else
#    define CN_INLINE static __forceinline
#  endif
#  define CN_UNLIKELY(c) (c)
#  define CN_UNROLL
#elif defined(CN_NO_FORCE_INLINE) || defined(CN_GENERIC)
#  define CN_INLINE static inline
#  define CN_UNLIKELY(c) __builtin_expect(!!(c), 0)
#  define CN_UNROLL
#else
#  define CN_INLINE static inline __attribute__((always_inline))
#  define CN_UNLIKELY(c) __builtin_expect(!!(c), 0)
/* full unrolling keeps the small-row arrays of vectors in registers */
#  if defined(__clang__)
#    define CN_UNROLL _Pragma("unroll")
#  else
#    define CN_UNROLL _Pragma("GCC unroll 16")
#  endif
#endif

/* A loop nest called from several places, kept out of line so that it is
 * compiled once (each call does enough work to pay for the call). */
#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_OUTLINE static __declspec(noinline)
#else
#  define CN_OUTLINE static __attribute__((noinline))
#endif

/* Per-vector steps (a few operations on one vector, called from the hot
 * loops) are inlined at every level where the compiler allows it, the portable
 * one included: out of line, each call passes 64-byte structs through memory
 * and tests its flags at run time. (MSVC keeps its choice at the portable level.) */
#if defined(CN_NO_FORCE_INLINE) || (defined(_MSC_VER) && !defined(__clang__) && defined(CN_GENERIC))
#  define CN_VEC_INLINE CN_INLINE
#elif defined(_MSC_VER) && !defined(__clang__)
#  define CN_VEC_INLINE static __forceinline
#else
#  define CN_VEC_INLINE static inline __attribute__((always_inline))
#endif

#if defined(CN_AVX512) || defined(CN_AVX2)
#  include <immintrin.h>
#endif

/* Software prefetch into L1 (never faults, so it may point past the end). */
#if defined(CN_AVX512) || defined(CN_AVX2)
#  define cn_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#  define cn_prefetch_l2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#elif defined(__GNUC__)
#  define cn_prefetch(p) __builtin_prefetch((const void *)(p), 0, 3)
#  define cn_prefetch_l2(p) __builtin_prefetch((const void *)(p), 0, 2)
#else
#  define cn_prefetch(p) ((void)0)
#  define cn_prefetch_l2(p) ((void)0)
#endif
/* Into L2 when l2 is set, else into L1. */
#define cn_prefetch_to(p, l2) ((l2) ? cn_prefetch_l2(p) : cn_prefetch(p))

typedef uint16_t cn_bf16; /* bfloat16 bit pattern */
typedef uint16_t cn_f16;  /* IEEE binary16 bit pattern */

/* ------------------------------------------------- scalar conversions -- */
CN_INLINE uint32_t cn_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
CN_INLINE float cn_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

CN_INLINE float cn_bf16_to_f32(cn_bf16 h) { return cn_bits_f32((uint32_t)h << 16); }

CN_INLINE cn_bf16 cn_f32_to_bf16(float f)
{
    uint32_t u = cn_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: quiet it, keep sign/payload */
        return (cn_bf16)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0)                   /* subnormal -> signed zero (as the HW) */
        u &= 0x80000000u;
    u += 0x7fffu + ((u >> 16) & 1u);              /* round to nearest even */
    return (cn_bf16)(u >> 16);
}

CN_INLINE float cn_f16_to_f32(cn_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)                               /* inf, or NaN made quiet */
        return cn_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
    if (exp == 0) {                                /* zero or subnormal: man * 2^-24, exact */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return cn_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

CN_INLINE cn_f16 cn_f32_to_f16(float f)
{
    uint32_t u = cn_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                           /* NaN: quiet, keep top payload bits */
        return (cn_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                          /* >= 65520 rounds to inf */
        return (cn_f16)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                        /* normal f16: rebias, round to nearest even */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (cn_f16)(sign | (r >> 13));
    }
    /* f16 subnormal or zero: an fp32 add with 0.5 rounds at exactly the right bit */
    {
        float t = cn_bits_f32(a) + 0.5f;
        return (cn_f16)(sign | (cn_f32_bits(t) - 0x3f000000u));
    }
}

/* scalars between each storage and the accumulator: cn_scalar_from_<kernel>,
 * cn_scalar_to_<kernel> (from double: rounded once to float32 first for 16-bit) */
CN_INLINE float cn_scalar_from_f32(float v) { return v; }
CN_INLINE double cn_scalar_from_f64(double v) { return v; }
CN_INLINE float cn_scalar_from_bf16(cn_bf16 v) { return cn_bf16_to_f32(v); }
CN_INLINE float cn_scalar_from_f16(cn_f16 v) { return cn_f16_to_f32(v); }
CN_INLINE float cn_scalar_to_f32(double v) { return (float)v; }
CN_INLINE double cn_scalar_to_f64(double v) { return v; }
CN_INLINE cn_bf16 cn_scalar_to_bf16(double v) { return cn_f32_to_bf16((float)v); }
CN_INLINE cn_f16 cn_scalar_to_f16(double v) { return cn_f32_to_f16((float)v); }

/* The lanes that accumulate for each accumulator kernel of meson.build's table
 * (CN_LANES_<kernel>: cn_vf or cn_vd), and their width (CN_WIDTH_vf/vd). */
#define CN_LANES_f32 vf
#define CN_LANES_f64 vd
#define CN_WIDTH_vf CN_VF_LANES
#define CN_WIDTH_vd CN_VD_LANES

/* ---------------------------------------------------------- sections -- */
#if defined(CN_AVX512)
#  include "cn_simd_avx512.h"
#elif defined(CN_AVX2)
#  include "cn_simd_avx2.h"
#elif defined(CN_NEON)
#  include "cn_simd_neon.h"
#else
#  include "cn_simd_generic.h"
#endif

/* ------------------------------------------------ multiply, then add -- */
/* fp32 lanes: a*b + c and c - a*b rounded once (FMA) at every level: each
 * section's cn_vf_mul_add and cn_vf_mul_sub_from; the portable section
 * computes it exactly without an FMA unit (cn_fmaf).
 * fp64 lanes: rounded twice (multiply, then add) at every level: an exact
 * fp64 FMA without the hardware would cost far more than the FMA saves.
 * Either way the bits do not depend on the level. */
CN_INLINE cn_vd cn_vd_mul_add(cn_vd a, cn_vd b, cn_vd c) { return cn_vd_add(cn_vd_mul(a, b), c); }
CN_INLINE cn_vd cn_vd_mul_sub_from(cn_vd a, cn_vd b, cn_vd c) { return cn_vd_sub(c, cn_vd_mul(a, b)); }

/* ----------------------------------------------------- pairs of vectors -- */
/* Two vectors to consecutive storage, p + LANES after p. The kernels' store
 * loops go two vectors at a time through these, so that a level can convert
 * both at once (cn_simd_avx2.h's bf16); elsewhere they are two plain stores. */
#define CN_PAIR_STORES(V, SUFFIX, T, L)                                                    \
    CN_INLINE void V##_store2_##SUFFIX(T *p, V a, V b) { V##_store_##SUFFIX(p, a); V##_store_##SUFFIX(p + L, b); } \
    CN_INLINE void V##_stream2_##SUFFIX(T *p, V a, V b) { V##_stream_##SUFFIX(p, a); V##_stream_##SUFFIX(p + L, b); }
CN_PAIR_STORES(cn_vf, f32, float, CN_VF_LANES)
CN_PAIR_STORES(cn_vf, f16, cn_f16, CN_VF_LANES)
CN_PAIR_STORES(cn_vd, f64, double, CN_VD_LANES)
CN_PAIR_STORES(cn_vf, bf16, cn_bf16, CN_VF_LANES)

/* ------------------------------------- non-temporal partial vectors -- */
/* The first n lanes of a vector, written with non-temporal stores: the partial
 * vectors at both ends of a streamed row, whose cache lines the neighbouring
 * rows' streams also write: a plain store to such a line costs a round trip
 * to DRAM. The largest aligned pieces (16, 8, 4 bytes: one 16-byte store for
 * the usual 16-byte misalignment of short rows, where 4-byte pieces took a
 * quarter of the time of rows of 256 bytes); p is element-aligned
 * (stream_peel). A 2-byte element off a 4-byte boundary takes a plain store;
 * the policy streams longer 16-bit rows only where they need no pieces at all
 * (core/policy.c). */
CN_INLINE void cn_stream_bytes(void *dst, const void *src, size_t nbytes)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    if (((uintptr_t)d & 2) && nbytes >= 2) { memcpy(d, s, 2); d += 2; s += 2; nbytes -= 2; }
#if defined(CN_AVX512) || defined(CN_AVX2)
    int v4;
    long long v8;
    if (((uintptr_t)d & 4) && nbytes >= 4) { memcpy(&v4, s, 4); _mm_stream_si32((int *)d, v4); d += 4; s += 4; nbytes -= 4; }
    if (((uintptr_t)d & 8) && nbytes >= 8) { memcpy(&v8, s, 8); _mm_stream_si64((long long *)d, v8); d += 8; s += 8; nbytes -= 8; }
    for (; nbytes >= 16; d += 16, s += 16, nbytes -= 16) _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    if (nbytes >= 8) { memcpy(&v8, s, 8); _mm_stream_si64((long long *)d, v8); d += 8; s += 8; nbytes -= 8; }
    if (nbytes >= 4) { memcpy(&v4, s, 4); _mm_stream_si32((int *)d, v4); d += 4; s += 4; nbytes -= 4; }
#endif
    if (nbytes) memcpy(d, s, nbytes);
}
#define CN_PARTIAL_STREAM(V, SUFFIX, T, L)                                                  \
    CN_INLINE void V##_streamn_##SUFFIX(T *p, V a, int64_t n)                               \
    { T buf[L]; V##_store_##SUFFIX(buf, a); cn_stream_bytes(p, buf, (size_t)n * sizeof(T)); }
CN_PARTIAL_STREAM(cn_vf, f32, float, CN_VF_LANES)
CN_PARTIAL_STREAM(cn_vf, bf16, cn_bf16, CN_VF_LANES)
CN_PARTIAL_STREAM(cn_vf, f16, cn_f16, CN_VF_LANES)
CN_PARTIAL_STREAM(cn_vd, f64, double, CN_VD_LANES)
#undef CN_PARTIAL_STREAM
#undef CN_PAIR_STORES

#endif /* CN_SIMD_H */
