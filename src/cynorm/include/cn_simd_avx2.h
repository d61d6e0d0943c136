/*
 * cn_simd_avx2.h -- the AVX2 section (+ FMA, F16C): the same 16 fp32 / 8 fp64
 * lanes as AVX-512, as two 256-bit registers each.
 * One section of cn_simd.h (which includes it for the units whose level's
 * `simd` is this section): the types cn_vf and cn_vd, their operations, and
 * their loads and stores for every storage format. cn_simd.h says what each
 * operation must compute; every section computes the same bits.
 */
#ifndef CN_SIMD_AVX2_H
#define CN_SIMD_AVX2_H

/* The same 16 fp32 / 8 fp64 lanes as AVX-512, as two registers each: every
 * level adds in one order (lane i with lane i + 8, then i + 4, ...). */
typedef struct { __m256 lo, hi; } cn_vf;
typedef struct { __m256d lo, hi; } cn_vd;
#define CN_VF_LANES 16
#define CN_VD_LANES 8
#define CN_VEC_REGS 2    /* registers a cn_vf or cn_vd takes */
#define CN_SIMD_REGS 16  /* vector registers there are */

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

/* ---- fp32 lanes: multiply, then add, rounded once (cn_simd.h) ---- */
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

#endif /* CN_SIMD_AVX2_H */
