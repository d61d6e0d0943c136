/* The portable level's fp32 multiply-add (cn_simd_generic.h) against libm's
 * fmaf, bit for bit: crafted double-rounding cases (an exact sum just off a
 * float midpoint that the double sum lands on), float subnormal results, and
 * random operands over the whole float range. NaN results must be NaN on both
 * sides. Built by tests/test_fma_emulation.py; prints "ok N" or the first
 * mismatch. */
#include <stdio.h>
#include <stdlib.h>
#include "cn_simd.h"

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void)
{
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return (uint32_t)(state >> 32);
}
/* a float with a random sign and significand, exponent field within [lo, hi] */
static float random_float(int lo, int hi)
{
    const uint32_t e = (uint32_t)(lo + (int)(next_u32() % (uint32_t)(hi - lo + 1)));
    return cn_bits_f32((next_u32() & 0x807fffffu) | (e << 23));
}

static long checked, bad;
static void check16(const float *a, const float *b, const float *c)
{
    cn_vf va, vb, vc;
    memcpy(va.v, a, sizeof va.v), memcpy(vb.v, b, sizeof vb.v), memcpy(vc.v, c, sizeof vc.v);
    const cn_vf add = cn_vf_mul_add(va, vb, vc), sub = cn_vf_mul_sub_from(va, vb, vc);
    for (int i = 0; i < 16; i++) {
        const float want[2] = {fmaf(a[i], b[i], c[i]), fmaf(-a[i], b[i], c[i])};
        const float got[2] = {add.v[i], sub.v[i]};
        const float scalar[2] = {cn_fmaf(a[i], b[i], c[i]), cn_fmaf(-a[i], b[i], c[i])};
        for (int k = 0; k < 2; k++) {
            const int nan = want[k] != want[k];
            const int ok = nan ? (got[k] != got[k] && scalar[k] != scalar[k])
                               : cn_f32_bits(got[k]) == cn_f32_bits(want[k]) && cn_f32_bits(scalar[k]) == cn_f32_bits(want[k]);
            checked++;
            if (!ok && bad++ == 0)
                printf("mismatch %s: a=%a b=%a c=%a want %a vector %a scalar %a\n", k ? "c-a*b" : "a*b+c",
                       a[i], b[i], c[i], want[k], got[k], scalar[k]);
        }
    }
}

int main(void)
{
    float a[16], b[16], c[16];
    /* a*b = 2^6 - 2^-40 beside c = 2^30 + 2^k: the double sum lands on a float midpoint */
    for (int i = 0; i < 16; i++) {
        const float s = (i & 1) ? -1.0f : 1.0f, scale = ldexpf(1.0f, (i % 8) * 9 - 36);
        a[i] = (8.0f + ldexpf(1.0f, -20)) * scale;
        b[i] = s * (8.0f - ldexpf(1.0f, -20));
        c[i] = s * (ldexpf(1.0f, 30) + ldexpf(1.0f, 7 * (i & 2 ? 1 : 0))) * scale;
    }
    check16(a, b, c);
    for (int i = 0; i < 16; i++) c[i] = -c[i];
    check16(a, b, c);
    /* the same on the float subnormal grid: a*b = 2^-150 - 2^-196 beside c = k 2^-149, k odd */
    for (int i = 0; i < 16; i++) {
        const float s = (i & 2) ? -1.0f : 1.0f;
        a[i] = ldexpf(1.0f + ldexpf(1.0f, -23), -75);
        b[i] = s * ldexpf(1.0f - ldexpf(1.0f, -23), -75);
        c[i] = s * ldexpf((float)((1 << (19 + i % 4)) + 1 + 2 * i), -149);
    }
    check16(a, b, c);
    for (long r = 0; r < 400000; r++) {
        for (int i = 0; i < 16; i++) {
            switch (r % 4) {
            case 0:   /* anywhere, specials included */
                a[i] = cn_bits_f32(next_u32()), b[i] = cn_bits_f32(next_u32()), c[i] = cn_bits_f32(next_u32());
                break;
            case 1:   /* a*b and c of similar size: cancellation */
                a[i] = random_float(120, 134), b[i] = random_float(120, 134), c[i] = random_float(127 + 6, 127 + 14);
                break;
            case 2:   /* c far above a*b: the double sum rounds, often near midpoints */
                a[i] = random_float(110, 127), b[i] = random_float(110, 127), c[i] = random_float(127 + 20, 127 + 40);
                break;
            default:  /* results in the float subnormal range */
                a[i] = random_float(50, 70), b[i] = random_float(50, 70), c[i] = random_float(0, 3);
                break;
            }
        }
        check16(a, b, c);
    }
    /* a*b exactly on a midpoint of c's grid, plus or minus the smallest step */
    for (long r = 0; r < 200000; r++) {
        for (int i = 0; i < 16; i++) {
            const float cc = random_float(140, 150), ulp = ldexpf(1.0f, ((int)(cn_f32_bits(cc) >> 23 & 0xff)) - 127 - 23);
            const float half = ulp * 0.5f, t = ldexpf(1.0f, -10 - (int)(next_u32() % 20));
            a[i] = half * (1.0f + t), b[i] = 1.0f - t * (next_u32() & 1 ? 1.0f : 0.5f), c[i] = cc;
        }
        check16(a, b, c);
    }
    if (bad) { printf("%ld of %ld differ\n", bad, checked); return 1; }
    printf("ok %ld\n", checked);
    return 0;
}
