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
 * avx2 (+ FMA, F16C) | generic. The generic section is plain C that any
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
#else
#  define CN_GENERIC 1
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_ALIGNED64 __declspec(align(64))
#else
#  define CN_ALIGNED64 __attribute__((aligned(64)))
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_INLINE static __forceinline
#  define CN_UNLIKELY(c) (c)
#  define CN_UNROLL
#elif defined(CN_NO_FORCE_INLINE) || defined(CN_GENERIC)
/* sanitizer/debug builds, and the portable level: forcing every helper inline
 * makes a plain-C unit (8 scalar lanes per vector operation) compile for minutes */
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

/* =================================================================== AVX-512 */
#if defined(CN_AVX512)

typedef __m512 cn_vf;
typedef __m512d cn_vd;
#define CN_VF_LANES 16
#define CN_VD_LANES 8

CN_INLINE __mmask16 cn_mask16(int64_t n) { return (__mmask16)((1u << n) - 1u); }
CN_INLINE __mmask8 cn_mask8(int64_t n) { return (__mmask8)((1u << n) - 1u); }

CN_INLINE cn_vf cn_vf_zero(void) { return _mm512_setzero_ps(); }
CN_INLINE cn_vf cn_vf_set1(float s) { return _mm512_set1_ps(s); }
CN_INLINE cn_vf cn_vf_add(cn_vf a, cn_vf b) { return _mm512_add_ps(a, b); }
CN_INLINE cn_vf cn_vf_sub(cn_vf a, cn_vf b) { return _mm512_sub_ps(a, b); }
CN_INLINE cn_vf cn_vf_mul(cn_vf a, cn_vf b) { return _mm512_mul_ps(a, b); }
CN_INLINE cn_vf cn_vf_keepn(cn_vf v, int64_t n) { return _mm512_maskz_mov_ps(cn_mask16(n), v); }
CN_INLINE float cn_vf_hsum(cn_vf v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}

CN_INLINE cn_vf cn_vf_load_f32(const float *p) { return _mm512_loadu_ps(p); }
CN_INLINE cn_vf cn_vf_loadn_f32(const float *p, int64_t n) { return _mm512_maskz_loadu_ps(cn_mask16(n), p); }
CN_INLINE void cn_vf_store_f32(float *p, cn_vf v) { _mm512_storeu_ps(p, v); }
CN_INLINE void cn_vf_storen_f32(float *p, cn_vf v, int64_t n) { _mm512_mask_storeu_ps(p, cn_mask16(n), v); }

CN_INLINE cn_vf cn_vf_from_bf16_bits(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
CN_INLINE __m256i cn_vf_to_bf16_bits(cn_vf v)
{
#if CN_HW_BF16
    /* VCVTNEPS2BF16: RNE, quiet NaN, subnormal inputs flushed -- same as the scalar path */
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    __m512i u = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __mmask16 sub = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    u = _mm512_mask_and_epi32(u, sub, u, _mm512_set1_epi32((int)0x80000000u));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
#endif
}
CN_INLINE cn_vf cn_vf_load_bf16(const cn_bf16 *p) { return cn_vf_from_bf16_bits(_mm256_loadu_si256((const __m256i *)p)); }
CN_INLINE cn_vf cn_vf_loadn_bf16(const cn_bf16 *p, int64_t n) { return cn_vf_from_bf16_bits(_mm256_maskz_loadu_epi16(cn_mask16(n), p)); }
CN_INLINE void cn_vf_store_bf16(cn_bf16 *p, cn_vf v) { _mm256_storeu_si256((__m256i *)p, cn_vf_to_bf16_bits(v)); }
CN_INLINE void cn_vf_storen_bf16(cn_bf16 *p, cn_vf v, int64_t n) { _mm256_mask_storeu_epi16(p, cn_mask16(n), cn_vf_to_bf16_bits(v)); }

#define CN_F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
CN_INLINE cn_vf cn_vf_load_f16(const cn_f16 *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
CN_INLINE cn_vf cn_vf_loadn_f16(const cn_f16 *p, int64_t n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(cn_mask16(n), p)); }
CN_INLINE void cn_vf_store_f16(cn_f16 *p, cn_vf v) { _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, CN_F16_RNE)); }
CN_INLINE void cn_vf_storen_f16(cn_f16 *p, cn_vf v, int64_t n) { _mm256_mask_storeu_epi16(p, cn_mask16(n), _mm512_cvtps_ph(v, CN_F16_RNE)); }

/* Non-temporal stores (p aligned to the store width): large outputs skip the
 * read-for-ownership of every destination line. */
CN_INLINE void cn_vf_stream_f32(float *p, cn_vf v) { _mm512_stream_ps(p, v); }
CN_INLINE void cn_vf_stream_bf16(cn_bf16 *p, cn_vf v) { _mm256_stream_si256((__m256i *)p, cn_vf_to_bf16_bits(v)); }
CN_INLINE void cn_vf_stream_f16(cn_f16 *p, cn_vf v) { _mm256_stream_si256((__m256i *)p, _mm512_cvtps_ph(v, CN_F16_RNE)); }

CN_INLINE cn_vd cn_vd_zero(void) { return _mm512_setzero_pd(); }
CN_INLINE cn_vd cn_vd_set1(double s) { return _mm512_set1_pd(s); }
CN_INLINE cn_vd cn_vd_add(cn_vd a, cn_vd b) { return _mm512_add_pd(a, b); }
CN_INLINE cn_vd cn_vd_sub(cn_vd a, cn_vd b) { return _mm512_sub_pd(a, b); }
CN_INLINE cn_vd cn_vd_mul(cn_vd a, cn_vd b) { return _mm512_mul_pd(a, b); }
CN_INLINE cn_vd cn_vd_keepn(cn_vd v, int64_t n) { return _mm512_maskz_mov_pd(cn_mask8(n), v); }
CN_INLINE double cn_vd_hsum(cn_vd v)
{
    __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

/* out[i] = the sum of the lanes of a[i], for LANES vectors at once: a
 * transpose-and-add tree (about 3 operations per vector instead of a whole
 * reduction each). Every vector's lanes are added in the same order, whatever
 * its slot, and never mixed with another vector's, so out[i] depends on a[i]
 * alone. */
CN_INLINE void cn_vf_hsum_lanes(const cn_vf *a, float *out)
{
    __m512 u[8], v[4], t[2], f;
    for (int j = 0; j < 8; j++)   /* 256-bit halves: lanes 0-7 <- a[2j], 8-15 <- a[2j+1] */
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
    for (int j = 0; j < 4; j++)   /* 128-bit lane k <- vector 4j + k */
        v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; j++)   /* 128-bit lane k: [8j + k (2 sums), 8j + 4 + k (2 sums)] */
        t[j] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(v[2 * j], v[2 * j + 1], 0xEE));
    f = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x88), _mm512_shuffle_ps(t[0], t[1], 0xDD));
    /* element 4k + p holds vector 4p + k: put them in order */
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f));
}
CN_INLINE void cn_vd_hsum_lanes(const cn_vd *a, double *out)
{
    __m512d u[4], v[2], f;
    double buf[8];
    for (int j = 0; j < 4; j++)   /* lanes 0-3 <- a[2j], 4-7 <- a[2j+1] */
        u[j] = _mm512_add_pd(_mm512_shuffle_f64x2(a[2 * j], a[2 * j + 1], 0x44),
                             _mm512_shuffle_f64x2(a[2 * j], a[2 * j + 1], 0xEE));
    for (int j = 0; j < 2; j++)   /* 128-bit lane k <- vector 4j + k */
        v[j] = _mm512_add_pd(_mm512_shuffle_f64x2(u[2 * j], u[2 * j + 1], 0x88),
                             _mm512_shuffle_f64x2(u[2 * j], u[2 * j + 1], 0xDD));
    f = _mm512_add_pd(_mm512_unpacklo_pd(v[0], v[1]), _mm512_unpackhi_pd(v[0], v[1]));
    _mm512_storeu_pd(buf, f);     /* element 2k + p holds vector 4p + k */
    for (int i = 0; i < 8; i++) out[i] = buf[2 * (i & 3) + (i >> 2)];
}
CN_INLINE cn_vd cn_vd_load_f64(const double *p) { return _mm512_loadu_pd(p); }
CN_INLINE cn_vd cn_vd_loadn_f64(const double *p, int64_t n) { return _mm512_maskz_loadu_pd(cn_mask8(n), p); }
CN_INLINE void cn_vd_store_f64(double *p, cn_vd v) { _mm512_storeu_pd(p, v); }
CN_INLINE void cn_vd_storen_f64(double *p, cn_vd v, int64_t n) { _mm512_mask_storeu_pd(p, cn_mask8(n), v); }
CN_INLINE void cn_vd_stream_f64(double *p, cn_vd v) { _mm512_stream_pd(p, v); }
CN_INLINE void cn_stream_fence(void) { _mm_sfence(); }

/* ====================================================================== AVX2 */
#elif defined(CN_AVX2)

/* The same 16 fp32 / 8 fp64 lanes as AVX-512, as two registers each: every
 * level adds in one order (lane i with lane i + 8, then i + 4, ...). */
typedef struct { __m256 lo, hi; } cn_vf;
typedef struct { __m256d lo, hi; } cn_vd;
#define CN_VF_LANES 16
#define CN_VD_LANES 8

/* Sliding windows: loading at (table + 8 - n) gives a mask of n leading ones. */
static const int32_t cn_mask32_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static const int64_t cn_mask64_table[8] = {-1, -1, -1, -1, 0, 0, 0, 0};
CN_INLINE __m256i cn_mask32(int64_t n) { return _mm256_loadu_si256((const __m256i *)(cn_mask32_table + 8 - n)); }
CN_INLINE __m256i cn_mask64(int64_t n) { return _mm256_loadu_si256((const __m256i *)(cn_mask64_table + 4 - n)); }
/* lanes of the low register and of the high one among the first n of 2*half */
#define CN_LO_N(n, half) ((n) < (half) ? (n) : (half))
#define CN_HI_N(n, half) ((n) > (half) ? (n) - (half) : 0)

#define CN_AVX2_ARITH(V, R, S, PS)                                                              \
    CN_INLINE V V##_zero(void) { V r = {_mm256_setzero_##PS(), _mm256_setzero_##PS()}; return r; } \
    CN_INLINE V V##_set1(S s) { V r = {_mm256_set1_##PS(s), _mm256_set1_##PS(s)}; return r; }  \
    CN_INLINE V V##_add(V a, V b) { V r = {_mm256_add_##PS(a.lo, b.lo), _mm256_add_##PS(a.hi, b.hi)}; return r; } \
    CN_INLINE V V##_sub(V a, V b) { V r = {_mm256_sub_##PS(a.lo, b.lo), _mm256_sub_##PS(a.hi, b.hi)}; return r; } \
    CN_INLINE V V##_mul(V a, V b) { V r = {_mm256_mul_##PS(a.lo, b.lo), _mm256_mul_##PS(a.hi, b.hi)}; return r; }
CN_AVX2_ARITH(cn_vf, __m256, float, ps)
CN_AVX2_ARITH(cn_vd, __m256d, double, pd)
#undef CN_AVX2_ARITH
CN_INLINE cn_vf cn_vf_keepn(cn_vf v, int64_t n)
{
    cn_vf r = {_mm256_and_ps(v.lo, _mm256_castsi256_ps(cn_mask32(CN_LO_N(n, 8)))),
               _mm256_and_ps(v.hi, _mm256_castsi256_ps(cn_mask32(CN_HI_N(n, 8))))};
    return r;
}
CN_INLINE cn_vd cn_vd_keepn(cn_vd v, int64_t n)
{
    cn_vd r = {_mm256_and_pd(v.lo, _mm256_castsi256_pd(cn_mask64(CN_LO_N(n, 4)))),
               _mm256_and_pd(v.hi, _mm256_castsi256_pd(cn_mask64(CN_HI_N(n, 4))))};
    return r;
}
/* the AVX-512 tree: (i, i+8), then (i, i+4), (i, i+2), (0, 1) */
CN_INLINE float cn_hsum8_ps(__m256 s8)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}
CN_INLINE float cn_vf_hsum(cn_vf v) { return cn_hsum8_ps(_mm256_add_ps(v.lo, v.hi)); }
CN_INLINE double cn_vd_hsum(cn_vd v)
{
    __m256d s4 = _mm256_add_pd(v.lo, v.hi);
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

CN_INLINE cn_vf cn_vf_load_f32(const float *p) { cn_vf r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; return r; }
CN_INLINE cn_vf cn_vf_loadn_f32(const float *p, int64_t n)
{
    cn_vf r = {_mm256_maskload_ps(p, cn_mask32(CN_LO_N(n, 8))), _mm256_maskload_ps(p + 8, cn_mask32(CN_HI_N(n, 8)))};
    return r;
}
CN_INLINE void cn_vf_store_f32(float *p, cn_vf v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
CN_INLINE void cn_vf_storen_f32(float *p, cn_vf v, int64_t n)
{
    _mm256_maskstore_ps(p, cn_mask32(CN_LO_N(n, 8)), v.lo);
    if (n > 8) _mm256_maskstore_ps(p + 8, cn_mask32(n - 8), v.hi);
}
CN_INLINE void cn_vf_stream_f32(float *p, cn_vf v) { _mm256_stream_ps(p, v.lo); _mm256_stream_ps(p + 8, v.hi); }

/* 16-bit tails: AVX2 has no 16-bit masked moves, so pairs of elements move as
 * masked 32-bit lanes and an odd last element on its own. (A copy through a
 * stack buffer stalled store forwarding: rows of 56 bf16 ran 2x slower.) */
static const int16_t cn_lane16_index[8] = {0, 1, 2, 3, 4, 5, 6, 7};
CN_INLINE __m128i cn_load8n(const uint16_t *p, int64_t n)   /* 0 <= n <= 8; lanes from n on: zero */
{
    if (n == 8) return _mm_loadu_si128((const __m128i *)p);   /* a row of 8k + 8 elements */
    __m128i v = _mm_maskload_epi32((const int *)p, _mm256_castsi256_si128(cn_mask32(n / 2)));
    if (n & 1) {
        const __m128i last = _mm_cmpeq_epi16(_mm_set1_epi16((short)(n - 1)),
                                             _mm_loadu_si128((const __m128i *)cn_lane16_index));
        v = _mm_blendv_epi8(v, _mm_set1_epi16((short)p[n - 1]), last);
    }
    return v;
}
CN_INLINE void cn_store8n(uint16_t *p, __m128i v, int64_t n)   /* 0 <= n <= 8 */
{
    if (n == 8) { _mm_storeu_si128((__m128i *)p, v); return; }
    _mm_maskstore_epi32((int *)p, _mm256_castsi256_si128(cn_mask32(n / 2)), v);
    if (n & 1) {
        uint16_t buf[8];
        _mm_storeu_si128((__m128i *)buf, v);
        p[n - 1] = buf[n - 1];
    }
}
CN_INLINE __m256i cn_load16n(const uint16_t *p, int64_t n)
{
    if (n <= 8) return _mm256_set_m128i(_mm_setzero_si128(), cn_load8n(p, n));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                   cn_load8n(p + 8, n - 8), 1);
}
CN_INLINE void cn_store16n(uint16_t *p, __m256i h, int64_t n)
{
    if (n <= 8) { cn_store8n(p, _mm256_castsi256_si128(h), n); return; }
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(h));
    cn_store8n(p + 8, _mm256_extracti128_si256(h, 1), n - 8);
}

CN_INLINE cn_vf cn_vf_from_bf16_bits(__m256i h)
{
    cn_vf r = {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16)),
               _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16))};
    return r;
}
/* bf16 bits of each lane (in its low 16 bits), every input handled */
CN_INLINE __m256i cn_bf16_lanes_exact(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m256i sub = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
    u = _mm256_blendv_epi8(u, _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)), sub);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    return _mm256_srli_epi32(r, 16);
}
/* The same for lanes that are neither NaN nor fp32 subnormals: round to nearest even alone */
CN_INLINE __m256i cn_bf16_lanes_plain(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}
/* Lanes the plain rounding may get wrong: NaN, subnormal (and, harmlessly, zero) */
CN_INLINE __m256 cn_bf16_unusual(__m256 v)
{
    return _mm256_cmp_ps(_mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))),
                         _mm256_set1_ps(1.17549435e-38f), _CMP_NGE_UQ);
}
/* 16 bf16 from two registers of 8, in order: one pack and one permute (the
 * values fit in 16 bits, so the saturating pack is exact) */
#define CN_PACK_BF16(lo, hi) _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8)
#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_COLD static __declspec(noinline)
#else
#  define CN_COLD static __attribute__((noinline, cold))
#endif
/* Every lane rounded exactly: rare (a NaN or an fp32 subnormal among 16 lanes),
 * so out of line. Inlined into every store, it made the AVX2 bf16 units the
 * build's largest (benchmarks/README.md, build size). */
CN_COLD __m256i cn_vf_to_bf16_bits_exact(cn_vf v)
{
    return CN_PACK_BF16(cn_bf16_lanes_exact(v.lo), cn_bf16_lanes_exact(v.hi));
}
/* round to nearest even alone unless a lane needs the exact path (a third less time per element) */
CN_INLINE __m256i cn_vf_to_bf16_bits(cn_vf v)
{
    __m256 odd = _mm256_or_ps(cn_bf16_unusual(v.lo), cn_bf16_unusual(v.hi));
    if (CN_UNLIKELY(!_mm256_testz_ps(odd, odd))) return cn_vf_to_bf16_bits_exact(v);
    return CN_PACK_BF16(cn_bf16_lanes_plain(v.lo), cn_bf16_lanes_plain(v.hi));
}
CN_INLINE cn_vf cn_vf_load_bf16(const cn_bf16 *p) { return cn_vf_from_bf16_bits(_mm256_loadu_si256((const __m256i *)p)); }
CN_INLINE cn_vf cn_vf_loadn_bf16(const cn_bf16 *p, int64_t n) { return cn_vf_from_bf16_bits(cn_load16n(p, n)); }
CN_INLINE void cn_vf_store_bf16(cn_bf16 *p, cn_vf v) { _mm256_storeu_si256((__m256i *)p, cn_vf_to_bf16_bits(v)); }
CN_INLINE void cn_vf_storen_bf16(cn_bf16 *p, cn_vf v, int64_t n) { cn_store16n(p, cn_vf_to_bf16_bits(v), n); }
CN_INLINE void cn_vf_stream_bf16(cn_bf16 *p, cn_vf v) { _mm256_stream_si256((__m256i *)p, cn_vf_to_bf16_bits(v)); }

#define CN_F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
CN_INLINE cn_vf cn_vf_from_f16_bits(__m256i h)
{
    cn_vf r = {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
    return r;
}
CN_INLINE __m256i cn_vf_to_f16_bits(cn_vf v)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm256_cvtps_ph(v.lo, CN_F16_RNE)),
                                   _mm256_cvtps_ph(v.hi, CN_F16_RNE), 1);
}
CN_INLINE cn_vf cn_vf_load_f16(const cn_f16 *p) { return cn_vf_from_f16_bits(_mm256_loadu_si256((const __m256i *)p)); }
CN_INLINE cn_vf cn_vf_loadn_f16(const cn_f16 *p, int64_t n) { return cn_vf_from_f16_bits(cn_load16n(p, n)); }
CN_INLINE void cn_vf_store_f16(cn_f16 *p, cn_vf v) { _mm256_storeu_si256((__m256i *)p, cn_vf_to_f16_bits(v)); }
CN_INLINE void cn_vf_storen_f16(cn_f16 *p, cn_vf v, int64_t n) { cn_store16n(p, cn_vf_to_f16_bits(v), n); }
CN_INLINE void cn_vf_stream_f16(cn_f16 *p, cn_vf v) { _mm256_stream_si256((__m256i *)p, cn_vf_to_f16_bits(v)); }

/* out[i] = the sum of the lanes of a[i], for 16 vectors: (i, i+8) in each, then
 * a transpose-and-add tree over eight at a time, in the same order as cn_vf_hsum */
CN_INLINE void cn_hsum8_lanes_ps(const __m256 *a, float *out)
{
    __m256 u[4], t[2], f;
    float buf[8];
    for (int j = 0; j < 4; j++)   /* 128-bit halves: lanes 0-3 <- a[2j], 4-7 <- a[2j+1] */
        u[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * j], a[2 * j + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * j], a[2 * j + 1], 0x31));
    for (int j = 0; j < 2; j++)   /* half h: [4j + h (2 sums), 4j + 2 + h (2 sums)] */
        t[j] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44),
                             _mm256_shuffle_ps(u[2 * j], u[2 * j + 1], 0xEE));
    f = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x88), _mm256_shuffle_ps(t[0], t[1], 0xDD));
    _mm256_storeu_ps(buf, f);     /* element 4h + p holds vector 2p + h */
    for (int i = 0; i < 8; i++) out[i] = buf[4 * (i & 1) + (i >> 1)];
}
CN_INLINE void cn_vf_hsum_lanes(const cn_vf *a, float *out)
{
    __m256 s8[16];
    for (int i = 0; i < 16; i++) s8[i] = _mm256_add_ps(a[i].lo, a[i].hi);
    cn_hsum8_lanes_ps(s8, out);
    cn_hsum8_lanes_ps(s8 + 8, out + 8);
}
CN_INLINE void cn_vd_hsum_lanes(const cn_vd *a, double *out)
{
    for (int g = 0; g < 8; g += 4) {
        __m256d s4[4], u[2], f;
        double buf[4];
        for (int i = 0; i < 4; i++) s4[i] = _mm256_add_pd(a[g + i].lo, a[g + i].hi);
        for (int j = 0; j < 2; j++)   /* halves: lanes 0-1 <- s4[2j], 2-3 <- s4[2j+1] */
            u[j] = _mm256_add_pd(_mm256_permute2f128_pd(s4[2 * j], s4[2 * j + 1], 0x20),
                                 _mm256_permute2f128_pd(s4[2 * j], s4[2 * j + 1], 0x31));
        f = _mm256_add_pd(_mm256_unpacklo_pd(u[0], u[1]), _mm256_unpackhi_pd(u[0], u[1]));
        _mm256_storeu_pd(buf, f);     /* element 2h + p holds vector 2p + h */
        for (int i = 0; i < 4; i++) out[g + i] = buf[2 * (i & 1) + (i >> 1)];
    }
}
CN_INLINE cn_vd cn_vd_load_f64(const double *p) { cn_vd r = {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; return r; }
CN_INLINE cn_vd cn_vd_loadn_f64(const double *p, int64_t n)
{
    cn_vd r = {_mm256_maskload_pd(p, cn_mask64(CN_LO_N(n, 4))), _mm256_maskload_pd(p + 4, cn_mask64(CN_HI_N(n, 4)))};
    return r;
}
CN_INLINE void cn_vd_store_f64(double *p, cn_vd v) { _mm256_storeu_pd(p, v.lo); _mm256_storeu_pd(p + 4, v.hi); }
CN_INLINE void cn_vd_storen_f64(double *p, cn_vd v, int64_t n)
{
    _mm256_maskstore_pd(p, cn_mask64(CN_LO_N(n, 4)), v.lo);
    if (n > 4) _mm256_maskstore_pd(p + 4, cn_mask64(n - 4), v.hi);
}
CN_INLINE void cn_vd_stream_f64(double *p, cn_vd v) { _mm256_stream_pd(p, v.lo); _mm256_stream_pd(p + 4, v.hi); }
CN_INLINE void cn_stream_fence(void) { _mm_sfence(); }

/* =================================================================== generic */
#else

/* Fixed-width structs of plain C, as many lanes as AVX-512 (so the same order
 * of additions): compilers turn these loops into whatever vector unit the
 * target has (SSE2 on x86-64, NEON on arm64, ...). */
#define CN_VF_LANES 16
#define CN_VD_LANES 8
typedef struct { float v[CN_VF_LANES]; } cn_vf;
typedef struct { double v[CN_VD_LANES]; } cn_vd;

#define CN_GEN_ARITH(V, S, L)                                                                   \
    CN_INLINE V V##_zero(void) { V r; for (int i = 0; i < L; i++) r.v[i] = 0; return r; }       \
    CN_INLINE V V##_set1(S s) { V r; for (int i = 0; i < L; i++) r.v[i] = s; return r; }        \
    CN_INLINE V V##_add(V a, V b) { for (int i = 0; i < L; i++) a.v[i] += b.v[i]; return a; }   \
    CN_INLINE V V##_sub(V a, V b) { for (int i = 0; i < L; i++) a.v[i] -= b.v[i]; return a; }   \
    CN_INLINE V V##_mul(V a, V b) { for (int i = 0; i < L; i++) a.v[i] *= b.v[i]; return a; }   \
    CN_INLINE V V##_keepn(V a, int64_t n) { for (int i = 0; i < L; i++) if (i >= n) a.v[i] = 0; return a; }

CN_GEN_ARITH(cn_vf, float, CN_VF_LANES)
CN_GEN_ARITH(cn_vd, double, CN_VD_LANES)

/* the AVX-512 tree: lane i with i + L/2, then i + L/4, ... */
#define CN_GEN_HSUM(V, S, L)                                                                    \
    CN_INLINE S V##_hsum(V a)                                                                   \
    {                                                                                           \
        for (int half = L / 2; half >= 1; half /= 2)                                            \
            for (int i = 0; i < half; i++) a.v[i] = a.v[i] + a.v[i + half];                     \
        return a.v[0];                                                                          \
    }
CN_GEN_HSUM(cn_vf, float, CN_VF_LANES)
CN_GEN_HSUM(cn_vd, double, CN_VD_LANES)
/* out[i] = the sum of the lanes of a[i], for LANES vectors */
CN_INLINE void cn_vf_hsum_lanes(const cn_vf *a, float *out) { for (int i = 0; i < CN_VF_LANES; i++) out[i] = cn_vf_hsum(a[i]); }
CN_INLINE void cn_vd_hsum_lanes(const cn_vd *a, double *out) { for (int i = 0; i < CN_VD_LANES; i++) out[i] = cn_vd_hsum(a[i]); }

/* load/store between lanes V of scalar S and storage T through converters TO/FROM.
 * Left to the compiler to inline: forcing the bit-twiddling f16 converters
 * into every unrolled kernel makes the fallback build huge and slow to compile. */
#define CN_GEN_IO(V, L, SUFFIX, T, TO_LANE, FROM_LANE)                                           \
    static inline V V##_load_##SUFFIX(const T *p) { V r; for (int i = 0; i < L; i++) r.v[i] = TO_LANE(p[i]); return r; } \
    static inline V V##_loadn_##SUFFIX(const T *p, int64_t n)                                    \
    { V r; for (int i = 0; i < L; i++) r.v[i] = i < n ? TO_LANE(p[i]) : 0; return r; }           \
    static inline void V##_store_##SUFFIX(T *p, V a) { for (int i = 0; i < L; i++) p[i] = FROM_LANE(a.v[i]); } \
    static inline void V##_storen_##SUFFIX(T *p, V a, int64_t n) { for (int i = 0; i < n; i++) p[i] = FROM_LANE(a.v[i]); }

#define CN_SAME(x) (x)
CN_GEN_IO(cn_vf, CN_VF_LANES, f32, float, CN_SAME, CN_SAME)
CN_GEN_IO(cn_vf, CN_VF_LANES, bf16, cn_bf16, cn_bf16_to_f32, cn_f32_to_bf16)
CN_GEN_IO(cn_vf, CN_VF_LANES, f16, cn_f16, cn_f16_to_f32, cn_f32_to_f16)
CN_GEN_IO(cn_vd, CN_VD_LANES, f64, double, CN_SAME, CN_SAME)

/* no portable streaming store: plain stores */
#define cn_vf_stream_f32 cn_vf_store_f32
#define cn_vf_stream_bf16 cn_vf_store_bf16
#define cn_vf_stream_f16 cn_vf_store_f16
#define cn_vd_stream_f64 cn_vd_store_f64
#if defined(__SSE2__)
#include <emmintrin.h>
/* (cn_copy_stream, cn_pages.h, streams wherever SSE2 is there: x86-64) */
CN_INLINE void cn_stream_fence(void) { _mm_sfence(); }
#else
CN_INLINE void cn_stream_fence(void) {}
#endif

#endif /* ISA */

/* ------------------------------------------------ multiply, then add -- */
/* fp32 lanes: a*b + c and c - a*b rounded once (FMA) at every level; the
 * portable level computes it exactly without an FMA unit (cn_fmaf).
 * fp64 lanes: rounded twice (multiply, then add) at every level: an exact
 * fp64 FMA without the hardware would cost far more than the FMA saves.
 * Either way the bits do not depend on the level. */
#if defined(CN_AVX512)
CN_INLINE cn_vf cn_vf_mul_add(cn_vf a, cn_vf b, cn_vf c) { return _mm512_fmadd_ps(a, b, c); }
CN_INLINE cn_vf cn_vf_mul_sub_from(cn_vf a, cn_vf b, cn_vf c) { return _mm512_fnmadd_ps(a, b, c); }
#elif defined(CN_AVX2)
CN_INLINE cn_vf cn_vf_mul_add(cn_vf a, cn_vf b, cn_vf c)
{
    cn_vf r = {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
    return r;
}
CN_INLINE cn_vf cn_vf_mul_sub_from(cn_vf a, cn_vf b, cn_vf c)
{
    cn_vf r = {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
    return r;
}
#else
/* fmaf(a, b, c), rounded once. Without an FMA unit: a*b is exact in double and
 * TwoSum gives the exact error of s = a*b + c in double; s rounded to odd (its
 * last bit set where inexact) then rounds to float as a*b + c would (53 >= 24 + 2
 * bits: Boldo and Melquiond's rounding to odd). */
CN_INLINE float cn_fmaf(float a, float b, float c)
{
#  if defined(__FP_FAST_FMAF)
    return fmaf(a, b, c);
#  else
    const double p = (double)a * (double)b, s = p + (double)c;
    const double bv = s - p, err = (p - (s - bv)) + ((double)c - bv);
    uint64_t u;
    memcpy(&u, &s, 8);
    if ((u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull && err != 0.0 && !(u & 1)) {
        u += (err > 0.0) == (s > 0.0) ? 1 : (uint64_t)-1;   /* the odd neighbour towards the exact value */
        double r;
        memcpy(&r, &u, 8);
        return (float)r;
    }
    return (float)s;
#  endif
}
CN_INLINE cn_vf cn_vf_mul_add(cn_vf a, cn_vf b, cn_vf c)
{
    for (int i = 0; i < CN_VF_LANES; i++) c.v[i] = cn_fmaf(a.v[i], b.v[i], c.v[i]);
    return c;
}
CN_INLINE cn_vf cn_vf_mul_sub_from(cn_vf a, cn_vf b, cn_vf c)
{
    for (int i = 0; i < CN_VF_LANES; i++) c.v[i] = cn_fmaf(-a.v[i], b.v[i], c.v[i]);
    return c;
}
#endif
CN_INLINE cn_vd cn_vd_mul_add(cn_vd a, cn_vd b, cn_vd c) { return cn_vd_add(cn_vd_mul(a, b), c); }
CN_INLINE cn_vd cn_vd_mul_sub_from(cn_vd a, cn_vd b, cn_vd c) { return cn_vd_sub(c, cn_vd_mul(a, b)); }

/* ----------------------------------------------------- pairs of vectors -- */
/* Two vectors to consecutive storage, p + LANES after p. The kernels' store
 * loops go two vectors at a time through these, so that a level can convert
 * both at once (AVX2 bf16, above); elsewhere they are two plain stores. */
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
