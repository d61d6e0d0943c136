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

#endif /* CN_SIMD_GENERIC_H */
