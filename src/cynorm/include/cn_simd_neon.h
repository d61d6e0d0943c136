/*
 * cn_simd_neon.h -- the aarch64 NEON (ASIMD) section: the same 16 fp32 / 8 fp64
 * lanes as AVX-512, as four 128-bit registers each.
 * One section of cn_simd.h (which includes it for the units whose level's
 * `simd` is this section): the types cn_vf and cn_vd, their operations, and
 * their loads and stores for every storage format. cn_simd.h says what each
 * operation must compute; every section computes the same bits.
 *
 * Notes on the bits:
 *  - horizontal sums add lane i and i + 8, then i + 4, i + 2, i + 1 (the
 *    AVX-512 tree); vaddvq_f32 adds in another order, so it is not used;
 *  - fp32 FMA is vfmaq_f32 / vfmsq_f32 (fused, as every level's);
 *  - fp32 -> bf16 is the integer sequence (round to nearest even, NaN quieted,
 *    fp32 subnormals to signed zero): FEAT_BF16's BFCVT would round subnormals
 *    to bf16 subnormals, against the contract;
 *  - fp16 <-> fp32 is FCVT, which under Linux's and macOS's default FPCR
 *    (round to nearest, no flush to zero, NaNs propagated and quieted) gives
 *    what F16C gives;
 *  - tails go through a zeroed buffer: nothing past the end is read or written.
 */
#ifndef CN_SIMD_NEON_H
#define CN_SIMD_NEON_H

#include <arm_neon.h>

typedef struct { float32x4_t q[4]; } cn_vf;   /* lanes 4k .. 4k + 3 in q[k] */
typedef struct { float64x2_t q[4]; } cn_vd;   /* lanes 2k, 2k + 1 in q[k] */
#define CN_VF_LANES 16
#define CN_VD_LANES 8
#define CN_VEC_REGS 4    /* registers a cn_vf or cn_vd takes */
#define CN_SIMD_REGS 32  /* vector registers there are */

#define CN_NEON_ARITH(V, S, SFX)                                                                \
    CN_INLINE V V##_zero(void) { V r; for (int k = 0; k < 4; k++) r.q[k] = vdupq_n_##SFX(0); return r; } \
    CN_INLINE V V##_set1(S s) { V r; for (int k = 0; k < 4; k++) r.q[k] = vdupq_n_##SFX(s); return r; } \
    CN_INLINE V V##_add(V a, V b) { for (int k = 0; k < 4; k++) a.q[k] = vaddq_##SFX(a.q[k], b.q[k]); return a; } \
    CN_INLINE V V##_sub(V a, V b) { for (int k = 0; k < 4; k++) a.q[k] = vsubq_##SFX(a.q[k], b.q[k]); return a; } \
    CN_INLINE V V##_mul(V a, V b) { for (int k = 0; k < 4; k++) a.q[k] = vmulq_##SFX(a.q[k], b.q[k]); return a; }
CN_NEON_ARITH(cn_vf, float, f32)
CN_NEON_ARITH(cn_vd, double, f64)
#undef CN_NEON_ARITH

/* the first n lanes kept, the others +0 */
CN_INLINE cn_vf cn_vf_keepn(cn_vf v, int64_t n)
{
    static const uint32_t idx[4] = {0, 1, 2, 3};
    const uint32x4_t base = vld1q_u32(idx), nn = vdupq_n_u32((uint32_t)(n < 0 ? 0 : n > 16 ? 16 : n));
    for (int k = 0; k < 4; k++) {
        const uint32x4_t keep = vcltq_u32(vaddq_u32(base, vdupq_n_u32(4u * (uint32_t)k)), nn);
        v.q[k] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v.q[k]), keep));
    }
    return v;
}
CN_INLINE cn_vd cn_vd_keepn(cn_vd v, int64_t n)
{
    static const uint64_t idx[2] = {0, 1};
    const uint64x2_t base = vld1q_u64(idx), nn = vdupq_n_u64((uint64_t)(n < 0 ? 0 : n > 8 ? 8 : n));
    for (int k = 0; k < 4; k++) {
        const uint64x2_t keep = vcltq_u64(vaddq_u64(base, vdupq_n_u64(2u * (uint64_t)k)), nn);
        v.q[k] = vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(v.q[k]), keep));
    }
    return v;
}

/* the AVX-512 tree: (i, i+8), then (i, i+4), (i, i+2), (0, 1) */
CN_INLINE float cn_vf_hsum(cn_vf v)
{
    const float32x4_t s4 = vaddq_f32(vaddq_f32(v.q[0], v.q[2]), vaddq_f32(v.q[1], v.q[3]));
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
CN_INLINE double cn_vd_hsum(cn_vd v)
{
    const float64x2_t s2 = vaddq_f64(vaddq_f64(v.q[0], v.q[2]), vaddq_f64(v.q[1], v.q[3]));
    return vgetq_lane_f64(s2, 0) + vgetq_lane_f64(s2, 1);
}
/* out[i] = the sum of the lanes of a[i], for LANES vectors, four at a time:
 * the last two steps of the tree on transposed sums (the same additions) */
CN_INLINE void cn_vf_hsum_lanes(const cn_vf *a, float *out)
{
    for (int g = 0; g < CN_VF_LANES; g += 4) {
        float32x4_t s[4];
        for (int j = 0; j < 4; j++)   /* lane l of s[j]: (l, l+8) + (l+4, l+12) of a[g + j] */
            s[j] = vaddq_f32(vaddq_f32(a[g + j].q[0], a[g + j].q[2]), vaddq_f32(a[g + j].q[1], a[g + j].q[3]));
        /* even lanes [s0_0, s0_2, s1_0, s1_2], odd ones [s0_1, s0_3, s1_1, s1_3], ... */
        const float32x4_t e01 = vuzp1q_f32(s[0], s[1]), o01 = vuzp2q_f32(s[0], s[1]);
        const float32x4_t e23 = vuzp1q_f32(s[2], s[3]), o23 = vuzp2q_f32(s[2], s[3]);
        /* lane j: (s_j0 + s_j2) + (s_j1 + s_j3), as cn_vf_hsum adds them */
        vst1q_f32(out + g, vaddq_f32(vpaddq_f32(e01, e23), vpaddq_f32(o01, o23)));
    }
}
CN_INLINE void cn_vd_hsum_lanes(const cn_vd *a, double *out)
{
    for (int i = 0; i < CN_VD_LANES; i++) out[i] = cn_vd_hsum(a[i]);
}

/* ---- float32 and float64 ---- */
CN_INLINE cn_vf cn_vf_load_f32(const float *p)
{
    cn_vf r;
    for (int k = 0; k < 4; k++) r.q[k] = vld1q_f32(p + 4 * k);
    return r;
}
CN_INLINE void cn_vf_store_f32(float *p, cn_vf v) { for (int k = 0; k < 4; k++) vst1q_f32(p + 4 * k, v.q[k]); }
CN_INLINE cn_vd cn_vd_load_f64(const double *p)
{
    cn_vd r;
    for (int k = 0; k < 4; k++) r.q[k] = vld1q_f64(p + 2 * k);
    return r;
}
CN_INLINE void cn_vd_store_f64(double *p, cn_vd v) { for (int k = 0; k < 4; k++) vst1q_f64(p + 2 * k, v.q[k]); }

/* ---- bfloat16: widening is a shift; narrowing the integer sequence ---- */
CN_INLINE cn_vf cn_vf_from_bf16_bits(uint16x8_t lo, uint16x8_t hi)
{
    cn_vf r = {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(lo), 16)), vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(lo), 16)),
                vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(hi), 16)), vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(hi), 16))}};
    return r;
}
/* bf16 bits of four lanes: NaN quieted (sign and top payload kept), fp32
 * subnormals to signed zero, the rest rounded to nearest even */
CN_INLINE uint16x4_t cn_bf16_lanes(float32x4_t v)
{
    uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(v, v));
    const uint32x4_t sub = vceqq_u32(vandq_u32(u, vdupq_n_u32(0x7f800000u)), vdupq_n_u32(0));
    u = vbslq_u32(sub, vandq_u32(u, vdupq_n_u32(0x80000000u)), u);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fffu)));
    r = vbslq_u32(nan, vorrq_u32(u, vdupq_n_u32(0x400000u)), r);
    return vshrn_n_u32(r, 16);
}
CN_INLINE void cn_vf_to_bf16_bits(cn_vf v, uint16x8_t *lo, uint16x8_t *hi)
{
    *lo = vcombine_u16(cn_bf16_lanes(v.q[0]), cn_bf16_lanes(v.q[1]));
    *hi = vcombine_u16(cn_bf16_lanes(v.q[2]), cn_bf16_lanes(v.q[3]));
}
CN_INLINE cn_vf cn_vf_load_bf16(const cn_bf16 *p) { return cn_vf_from_bf16_bits(vld1q_u16(p), vld1q_u16(p + 8)); }
CN_INLINE void cn_vf_store_bf16(cn_bf16 *p, cn_vf v)
{
    uint16x8_t lo, hi;
    cn_vf_to_bf16_bits(v, &lo, &hi);
    vst1q_u16(p, lo);
    vst1q_u16(p + 8, hi);
}

/* ---- float16: FCVT both ways ---- */
CN_INLINE cn_vf cn_vf_from_f16_bits(uint16x8_t lo, uint16x8_t hi)
{
    const float16x8_t l = vreinterpretq_f16_u16(lo), h = vreinterpretq_f16_u16(hi);
    cn_vf r = {{vcvt_f32_f16(vget_low_f16(l)), vcvt_f32_f16(vget_high_f16(l)),
                vcvt_f32_f16(vget_low_f16(h)), vcvt_f32_f16(vget_high_f16(h))}};
    return r;
}
CN_INLINE cn_vf cn_vf_load_f16(const cn_f16 *p) { return cn_vf_from_f16_bits(vld1q_u16(p), vld1q_u16(p + 8)); }
CN_INLINE void cn_vf_store_f16(cn_f16 *p, cn_vf v)
{
    vst1q_u16(p, vreinterpretq_u16_f16(vcombine_f16(vcvt_f16_f32(v.q[0]), vcvt_f16_f32(v.q[1]))));
    vst1q_u16(p + 8, vreinterpretq_u16_f16(vcombine_f16(vcvt_f16_f32(v.q[2]), vcvt_f16_f32(v.q[3]))));
}

/* ---- tails: the first n elements only, through a zeroed buffer ---- */
#define CN_NEON_TAILS(V, SUFFIX, T, L)                                                          \
    CN_INLINE V V##_loadn_##SUFFIX(const T *p, int64_t n)                                       \
    { T buf[L] = {0}; memcpy(buf, p, (size_t)n * sizeof(T)); return V##_load_##SUFFIX(buf); }   \
    CN_INLINE void V##_storen_##SUFFIX(T *p, V a, int64_t n)                                    \
    { T buf[L]; V##_store_##SUFFIX(buf, a); memcpy(p, buf, (size_t)n * sizeof(T)); }
CN_NEON_TAILS(cn_vf, f32, float, CN_VF_LANES)
CN_NEON_TAILS(cn_vf, bf16, cn_bf16, CN_VF_LANES)
CN_NEON_TAILS(cn_vf, f16, cn_f16, CN_VF_LANES)
CN_NEON_TAILS(cn_vd, f64, double, CN_VD_LANES)
#undef CN_NEON_TAILS

/* no streaming stores (STNP is a hint of another kind): plain stores */
#define cn_vf_stream_f32 cn_vf_store_f32
#define cn_vf_stream_bf16 cn_vf_store_bf16
#define cn_vf_stream_f16 cn_vf_store_f16
#define cn_vd_stream_f64 cn_vd_store_f64
CN_INLINE void cn_stream_fence(void) {}

/* ---- fp32 lanes: multiply, then add, rounded once (cn_simd.h) ---- */
CN_INLINE cn_vf cn_vf_mul_add(cn_vf a, cn_vf b, cn_vf c)
{
    for (int k = 0; k < 4; k++) c.q[k] = vfmaq_f32(c.q[k], a.q[k], b.q[k]);
    return c;
}
CN_INLINE cn_vf cn_vf_mul_sub_from(cn_vf a, cn_vf b, cn_vf c)
{
    for (int k = 0; k < 4; k++) c.q[k] = vfmsq_f32(c.q[k], a.q[k], b.q[k]);
    return c;
}

#endif /* CN_SIMD_NEON_H */
