/*
 * cn_cpu.h -- which SIMD extensions this CPU *and* this OS support.
 * Compiled with baseline flags only (it runs before any variant is imported).
 */
#ifndef CN_CPU_H
#define CN_CPU_H
#include <stdint.h>

enum {
    CN_CPU_AVX2 = 1 << 0, CN_CPU_FMA = 1 << 1, CN_CPU_F16C = 1 << 2,
    CN_CPU_AVX512F = 1 << 3, CN_CPU_AVX512BW = 1 << 4, CN_CPU_AVX512VL = 1 << 5,
    CN_CPU_AVX512DQ = 1 << 6, CN_CPU_AVX512BF16 = 1 << 7,
};

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#  if defined(_MSC_VER) && !defined(__clang__)
#    include <intrin.h>
static void cn_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    r[0] = (uint32_t)v[0]; r[1] = (uint32_t)v[1]; r[2] = (uint32_t)v[2]; r[3] = (uint32_t)v[3];
}
static uint64_t cn_xgetbv(void) { return _xgetbv(0); }
#  else
#    include <cpuid.h>
static void cn_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    r[0] = r[1] = r[2] = r[3] = 0;
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static uint64_t cn_xgetbv(void)
{
    uint32_t lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0)); /* xgetbv */
    return ((uint64_t)hi << 32) | lo;
}
#  endif

static int cn_cpu_features(void)
{
    uint32_t r[4], max_leaf;
    int f = 0;
    uint64_t xcr0;
    cn_cpuid(0, 0, r);
    max_leaf = r[0];
    if (max_leaf < 7) return 0;
    cn_cpuid(1, 0, r);
    if (!(r[2] & (1u << 27)) || !(r[2] & (1u << 28))) return 0; /* OSXSAVE and AVX */
    xcr0 = cn_xgetbv();
    if ((xcr0 & 0x6) != 0x6) return 0;                          /* OS saves XMM/YMM */
    if (r[2] & (1u << 12)) f |= CN_CPU_FMA;
    if (r[2] & (1u << 29)) f |= CN_CPU_F16C;
    cn_cpuid(7, 0, r);
    if (r[1] & (1u << 5)) f |= CN_CPU_AVX2;
    if ((xcr0 & 0xe0) == 0xe0) {                                /* OS saves opmask/ZMM */
        if (r[1] & (1u << 16)) f |= CN_CPU_AVX512F;
        if (r[1] & (1u << 17)) f |= CN_CPU_AVX512DQ;
        if (r[1] & (1u << 30)) f |= CN_CPU_AVX512BW;
        if (r[1] & (1u << 31)) f |= CN_CPU_AVX512VL;
        cn_cpuid(7, 1, r);
        if (r[0] & (1u << 5)) f |= CN_CPU_AVX512BF16;
    }
    return f;
}
#else
static int cn_cpu_features(void) { return 0; } /* non-x86: only the generic level */
#endif

#endif /* CN_CPU_H */
