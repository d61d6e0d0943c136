/*
 * cn_cpu.h -- which SIMD features this CPU *and* this OS support, by the
 * names meson.build's table of ISA levels uses. Compiled into _core at
 * baseline flags (it runs before any level is chosen).
 */
#ifndef CN_CPU_H
#define CN_CPU_H
#include <stdint.h>

/* The x86 features: X(name, CPUID leaf, subleaf, register (0 eax, 1 ebx, 2 ecx,
 * 3 edx), bit, the XCR0 state bits the OS must save for it). */
#define CN_FOR_EACH_X86_FEATURE(X)              \
    X(avx2, 7, 0, 1, 5, 0x6)                    \
    X(fma, 1, 0, 2, 12, 0x6)                    \
    X(f16c, 1, 0, 2, 29, 0x6)                   \
    X(avx512f, 7, 0, 1, 16, 0xe6)               \
    X(avx512dq, 7, 0, 1, 17, 0xe6)              \
    X(avx512bw, 7, 0, 1, 30, 0xe6)              \
    X(avx512vl, 7, 0, 1, 31, 0xe6)              \
    X(avx512_bf16, 7, 1, 0, 5, 0xe6)

/* The features' names, in bit order: cn_cpu_features() sets bit i for name i. */
#define CN_FEATURE_NAME(name, ...) #name,
static const char *const cn_cpu_feature_names[] = {CN_FOR_EACH_X86_FEATURE(CN_FEATURE_NAME) NULL};
#undef CN_FEATURE_NAME

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

/* Bit i set: the CPU has feature i (cn_cpu_feature_names) and the OS saves its state. */
static uint64_t cn_cpu_features(void)
{
    uint32_t r[4], max_leaf;
    uint64_t f = 0, xcr0;
    int i = 0;
    cn_cpuid(0, 0, r);
    max_leaf = r[0];
    if (max_leaf < 7) return 0;
    cn_cpuid(1, 0, r);
    if (!(r[2] & (1u << 27)) || !(r[2] & (1u << 28))) return 0; /* OSXSAVE and AVX */
    xcr0 = cn_xgetbv();
#define CN_FEATURE_TEST(name, leaf, sub, reg, bit, state)                          \
    cn_cpuid(leaf, sub, r);                                                        \
    if ((r[reg] & (1u << bit)) && (xcr0 & (state)) == (state)) f |= (uint64_t)1 << i; \
    i++;
    CN_FOR_EACH_X86_FEATURE(CN_FEATURE_TEST)
#undef CN_FEATURE_TEST
    return f;
}
#else
static uint64_t cn_cpu_features(void) { return 0; }   /* no x86 features elsewhere */
#endif

#endif /* CN_CPU_H */
