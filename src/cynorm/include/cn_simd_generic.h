/*
 * cn_simd_generic.h -- the portable section: the same lanes as fixed-width
 * structs of plain C, for the baseline level, other architectures, and units
 * without a level.
 * One section of cn_simd.h (which includes it for the units whose level's
 * `simd` is this section): the types cn_vf and cn_vd, their operations, and
 * their loads and stores for every storage format. cn_simd.h says what each
 * operation must compute; every section computes the same bits.
 */
#ifndef CN_SIMD_GENERIC_H
#define CN_SIMD_GENERIC_H

/* Fixed-width structs of plain C, as many lanes as AVX-512 (so the same order
 * of additions): compilers turn these loops into whatever vector unit the
 * target has (SSE2 on x86-64, NEON on arm64, ...). */
#define CN_VF_LANES 16
#define CN_VD_LANES 8
#define CN_VEC_REGS 4    /* registers a cn_vf or cn_vd takes (128-bit ones) */
#define CN_SIMD_REGS 16  /* vector registers there are (at least) */
typedef struct { float v[CN_VF_LANES]; } cn_vf;
typedef struct { double v[CN_VD_LANES]; } cn_vd;

#define CN_GEN_ARITH(V, S, L)                                                                   \
    CN_VEC_INLINE V V##_zero(void) { V r; for (int i = 0; i < L; i++) r.v[i] = 0; return r; }       \
    CN_VEC_INLINE V V##_set1(S s) { V r; for (int i = 0; i < L; i++) r.v[i] = s; return r; }        \
    CN_VEC_INLINE V V##_add(V a, V b) { for (int i = 0; i < L; i++) a.v[i] += b.v[i]; return a; }   \
    CN_VEC_INLINE V V##_sub(V a, V b) { for (int i = 0; i < L; i++) a.v[i] -= b.v[i]; return a; }   \
    CN_VEC_INLINE V V##_mul(V a, V b) { for (int i = 0; i < L; i++) a.v[i] *= b.v[i]; return a; }   \
    CN_VEC_INLINE V V##_keepn(V a, int64_t n) { for (int i = 0; i < L; i++) if (i >= n) a.v[i] = 0; return a; }

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
#define CN_GEN_IO_TAILS(V, L, SUFFIX, T, TO_LANE, FROM_LANE)                                     \
    static inline V V##_loadn_##SUFFIX(const T *p, int64_t n)                                    \
    { V r; for (int i = 0; i < L; i++) r.v[i] = i < n ? TO_LANE(p[i]) : 0; return r; }           \
    static inline void V##_storen_##SUFFIX(T *p, V a, int64_t n) { for (int i = 0; i < n; i++) p[i] = FROM_LANE(a.v[i]); }
#define CN_GEN_IO(V, L, SUFFIX, T, TO_LANE, FROM_LANE)                                           \
    static inline V V##_load_##SUFFIX(const T *p) { V r; for (int i = 0; i < L; i++) r.v[i] = TO_LANE(p[i]); return r; } \
    static inline void V##_store_##SUFFIX(T *p, V a) { for (int i = 0; i < L; i++) p[i] = FROM_LANE(a.v[i]); } \
    CN_GEN_IO_TAILS(V, L, SUFFIX, T, TO_LANE, FROM_LANE)

#define CN_SAME(x) (x)
CN_GEN_IO(cn_vf, CN_VF_LANES, f32, float, CN_SAME, CN_SAME)
CN_GEN_IO(cn_vf, CN_VF_LANES, f16, cn_f16, cn_f16_to_f32, cn_f32_to_f16)
CN_GEN_IO(cn_vd, CN_VD_LANES, f64, double, CN_SAME, CN_SAME)
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
/* bf16 full vectors in SSE2 integer steps (the scalar converters' branches do
 * not vectorize): widening is a shift, narrowing cn_f32_to_bf16 lane for lane */
CN_VEC_INLINE cn_vf cn_vf_load_bf16(const cn_bf16 *p)
{
    cn_vf r;
    for (int i = 0; i < CN_VF_LANES; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(p + i));
        _mm_storeu_si128((__m128i *)(r.v + i), _mm_unpacklo_epi16(_mm_setzero_si128(), h));
        _mm_storeu_si128((__m128i *)(r.v + i + 4), _mm_unpackhi_epi16(_mm_setzero_si128(), h));
    }
    return r;
}
/* cn_f32_to_bf16 of four lanes, each in the low half of its dword, sign-extended */
CN_VEC_INLINE __m128i cn_bf16x4_sse2(__m128i u)
{
    const __m128i mag = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
    const __m128i nan = _mm_cmpgt_epi32(mag, _mm_set1_epi32(0x7f800000));
    const __m128i sub = _mm_cmpeq_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7f800000)), _mm_setzero_si128());
    const __m128i v = _mm_andnot_si128(_mm_and_si128(sub, _mm_set1_epi32(0x7fffffff)), u);   /* subnormal: signed zero */
    const __m128i odd = _mm_and_si128(_mm_srli_epi32(v, 16), _mm_set1_epi32(1));
    const __m128i rounded = _mm_add_epi32(v, _mm_add_epi32(odd, _mm_set1_epi32(0x7fff)));
    const __m128i quiet = _mm_or_si128(u, _mm_set1_epi32(0x400000));                           /* NaN: quiet */
    const __m128i r = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(r, 16);
}
CN_VEC_INLINE void cn_vf_store_bf16(cn_bf16 *p, cn_vf a)
{
    for (int i = 0; i < CN_VF_LANES; i += 8) {
        const __m128i lo = cn_bf16x4_sse2(_mm_loadu_si128((const __m128i *)(a.v + i)));
        const __m128i hi = cn_bf16x4_sse2(_mm_loadu_si128((const __m128i *)(a.v + i + 4)));
        _mm_storeu_si128((__m128i *)(p + i), _mm_packs_epi32(lo, hi));   /* (exact: sign-extended halves) */
    }
}
CN_GEN_IO_TAILS(cn_vf, CN_VF_LANES, bf16, cn_bf16, cn_bf16_to_f32, cn_f32_to_bf16)
#else
CN_GEN_IO(cn_vf, CN_VF_LANES, bf16, cn_bf16, cn_bf16_to_f32, cn_f32_to_bf16)
#endif

/* no portable streaming store: plain stores */
#define cn_vf_stream_f32 cn_vf_store_f32
#define cn_vf_stream_bf16 cn_vf_store_bf16
#define cn_vf_stream_f16 cn_vf_store_f16
#define cn_vd_stream_f64 cn_vd_store_f64
#if defined(__SSE2__) || defined(_M_X64)
/* (cn_copy_stream, cn_pages.h, streams wherever SSE2 is there: x86-64) */
CN_INLINE void cn_stream_fence(void) { _mm_sfence(); }
#else
CN_INLINE void cn_stream_fence(void) {}
#endif

/* ---- fp32 lanes: multiply, then add, rounded once (cn_simd.h) ---- */
/* fmaf(a, b, c), rounded once. Without an FMA unit: a*b is exact in double and
 * TwoSum gives the exact error of s = a*b + c in double; s rounded to odd (its
 * last bit set where inexact) then rounds to float as a*b + c would (53 >= 24 + 2
 * bits: Boldo and Melquiond's rounding to odd). */
CN_INLINE float cn_fmaf(float a, float b, float c)
{
#  if defined(__FP_FAST_FMAF) || defined(__ARM_FEATURE_FMA)   /* (clang on aarch64 defines only the latter) */
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
#if !(defined(__FP_FAST_FMAF) || defined(__ARM_FEATURE_FMA)) && (defined(__SSE2__) || defined(_M_X64))
#  if defined(__GNUC__)
/* inlined even here (a call passes three 64-byte structs through memory): a
 * few dozen SSE2 instructions per use */
#    define CN_FMA_INLINE static inline __attribute__((always_inline))
#  else
#    define CN_FMA_INLINE static inline
#  endif
/* x86-64 without FMA (the baseline level): cn_fmaf two lanes at a time in SSE2
 * doubles, without branches. Rounding to odd as one step: s - 1 (in its bits)
 * where s lies further from zero than the exact sum, then the last bit set
 * where inexact; that is the odd neighbour towards the exact sum or s itself
 * when s is odd, as in cn_fmaf. Inf and NaN sums are kept as they are. */
CN_FMA_INLINE __m128 cn_fma2_sse2(__m128d p, __m128d c)   /* (float)round_to_odd(p + c), in the low two lanes */
{
    const __m128d s = _mm_add_pd(p, c), bv = _mm_sub_pd(s, p);
    const __m128d err = _mm_add_pd(_mm_sub_pd(p, _mm_sub_pd(s, bv)), _mm_sub_pd(c, bv));
    const __m128d zero = _mm_setzero_pd();
    const __m128d abs_s = _mm_andnot_pd(_mm_set1_pd(-0.0), s);
    const __m128d inexact = _mm_and_pd(_mm_cmpneq_pd(err, zero), _mm_cmple_pd(abs_s, _mm_set1_pd(1.7976931348623157e308)));
    const __m128d down = _mm_and_pd(inexact, _mm_xor_pd(_mm_cmplt_pd(err, zero), _mm_cmplt_pd(s, zero)));
    __m128i u = _mm_add_epi64(_mm_castpd_si128(s), _mm_castpd_si128(down));       /* all ones: -1 */
    u = _mm_or_si128(u, _mm_and_si128(_mm_castpd_si128(inexact), _mm_set_epi64x(1, 1)));
    return _mm_cvtpd_ps(_mm_castsi128_pd(u));
}
/* Whether either pair of double sums would round to float differently from
 * the exact sums they stand for: a sum on a float rounding midpoint (the low 29
 * bits of its significand 1 followed by zeros: those bits lie in the low dword)
 * or in the float subnormal range (a coarser grid; 0 < |s| < 2^-126, read from
 * the high dword: s is never a double subnormal, as a*b is exact and >= 2^-298
 * or 0). Elsewhere (float)s is the float nearest the exact sum: rounding to
 * double cannot step over a midpoint, which is a double, without landing on it.
 * All four lanes at once: their low and their high dwords side by side. */
CN_FMA_INLINE int cn_fma4_needs_odd(__m128d slo, __m128d shi)
{
    const __m128i low = _mm_castps_si128(_mm_shuffle_ps(_mm_castpd_ps(slo), _mm_castpd_ps(shi), _MM_SHUFFLE(2, 0, 2, 0)));
    const __m128i high = _mm_castps_si128(_mm_shuffle_ps(_mm_castpd_ps(slo), _mm_castpd_ps(shi), _MM_SHUFFLE(3, 1, 3, 1)));
    const __m128i mid = _mm_cmpeq_epi32(_mm_and_si128(low, _mm_set1_epi32(0x1FFFFFFF)), _mm_set1_epi32(0x10000000));
    const __m128i mag = _mm_and_si128(high, _mm_set1_epi32(0x7FFFFFFF));
    const __m128i tiny = _mm_andnot_si128(_mm_cmpeq_epi32(mag, _mm_setzero_si128()),
                                          _mm_cmplt_epi32(mag, _mm_set1_epi32(0x38100000)));   /* 2^-126's high dword */
    return _mm_movemask_ps(_mm_castsi128_ps(_mm_or_si128(mid, tiny)));
}
/* a*b + c (negate: c - a*b), four lanes: a*b is exact in double, and the sum in
 * double rounds to float correctly unless cn_fma4_needs_odd (rare: then both
 * pairs round to odd first) */
CN_FMA_INLINE __m128 cn_fma4_sse2(__m128 a, __m128 b, __m128 c, int negate)
{
    if (negate) a = _mm_xor_ps(a, _mm_set1_ps(-0.0f));
    const __m128 ah = _mm_movehl_ps(a, a), bh = _mm_movehl_ps(b, b), ch = _mm_movehl_ps(c, c);
    const __m128d plo = _mm_mul_pd(_mm_cvtps_pd(a), _mm_cvtps_pd(b)), clo = _mm_cvtps_pd(c);
    const __m128d phi = _mm_mul_pd(_mm_cvtps_pd(ah), _mm_cvtps_pd(bh)), chi = _mm_cvtps_pd(ch);
    const __m128d slo = _mm_add_pd(plo, clo), shi = _mm_add_pd(phi, chi);
    if (CN_UNLIKELY(cn_fma4_needs_odd(slo, shi)))
        return _mm_movelh_ps(cn_fma2_sse2(plo, clo), cn_fma2_sse2(phi, chi));
    return _mm_movelh_ps(_mm_cvtpd_ps(slo), _mm_cvtpd_ps(shi));
}
CN_FMA_INLINE cn_vf cn_vf_fma_sse2(cn_vf a, cn_vf b, cn_vf c, int negate)
{
    for (int i = 0; i < CN_VF_LANES; i += 4)
        _mm_storeu_ps(c.v + i, cn_fma4_sse2(_mm_loadu_ps(a.v + i), _mm_loadu_ps(b.v + i), _mm_loadu_ps(c.v + i), negate));
    return c;
}
CN_FMA_INLINE cn_vf cn_vf_mul_add(cn_vf a, cn_vf b, cn_vf c) { return cn_vf_fma_sse2(a, b, c, 0); }
CN_FMA_INLINE cn_vf cn_vf_mul_sub_from(cn_vf a, cn_vf b, cn_vf c) { return cn_vf_fma_sse2(a, b, c, 1); }
#else
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

#endif /* CN_SIMD_GENERIC_H */
