/*
 * cn_simd_avx512.h -- the AVX-512 section: 16 fp32 / 8 fp64 lanes in one
 * register each (F/BW/VL/DQ; BF16 conversions in hardware where the level has
 * hw_bf16).
 * One section of cn_simd.h (which includes it for the units whose level's
 * `simd` is this section): the types cn_vf and cn_vd, their operations, and
 * their loads and stores for every storage format. cn_simd.h says what each
 * operation must compute; every section computes the same bits.
 */
#ifndef CN_SIMD_AVX512_H
#define CN_SIMD_AVX512_H

typedef __m512 cn_vf;
typedef __m512d cn_vd;
#define CN_VF_LANES 16
#define CN_VD_LANES 8
#define CN_VEC_REGS 1    /* registers a cn_vf or cn_vd takes */
#define CN_SIMD_REGS 32  /* vector registers there are */

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

/* ---- fp32 lanes: multiply, then add, rounded once (cn_simd.h) ---- */
CN_INLINE cn_vf cn_vf_mul_add(cn_vf a, cn_vf b, cn_vf c) { return _mm512_fmadd_ps(a, b, c); }
CN_INLINE cn_vf cn_vf_mul_sub_from(cn_vf a, cn_vf b, cn_vf c) { return _mm512_fnmadd_ps(a, b, c); }

#endif /* CN_SIMD_AVX512_H */
