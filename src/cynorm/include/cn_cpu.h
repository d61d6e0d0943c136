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

/* The aarch64 features: X(name, its bit in Linux's AT_HWCAP, macOS's sysctl).
 * ASIMD (NEON) is part of every aarch64 CPU that Linux, macOS and Windows run
 * on, but a kernel says so, and we ask. */
#define CN_FOR_EACH_ARM_FEATURE(X)              \
    X(asimd, 1, "hw.optional.neon")

/* The features' names, in bit order (x86's, then aarch64's): cn_cpu_features()
 * sets bit i for name i, of its own architecture's. */
#define CN_FEATURE_NAME(name, ...) #name,
static const char *const cn_cpu_feature_names[] = {
    CN_FOR_EACH_X86_FEATURE(CN_FEATURE_NAME) CN_FOR_EACH_ARM_FEATURE(CN_FEATURE_NAME) NULL};
#undef CN_FEATURE_NAME
#define CN_FEATURE_ONE(...) +1
enum { CN_NUM_X86_FEATURES = 0 CN_FOR_EACH_X86_FEATURE(CN_FEATURE_ONE) };
#undef CN_FEATURE_ONE

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
#elif defined(__aarch64__) || defined(_M_ARM64)
#  if defined(__linux__)
#    include <sys/auxv.h>
#    define CN_ARM_HAS(hwcap_bit, sysctl_name) ((getauxval(AT_HWCAP) >> (hwcap_bit)) & 1)
#  elif defined(__APPLE__)
#    include <sys/sysctl.h>
static int cn_sysctl_flag(const char *name)
{
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}
#    define CN_ARM_HAS(hwcap_bit, sysctl_name) cn_sysctl_flag(sysctl_name)
#  else
#    define CN_ARM_HAS(hwcap_bit, sysctl_name) 1   /* Windows on Arm: ASIMD is required */
#  endif
static uint64_t cn_cpu_features(void)
{
    uint64_t f = 0;
    int i = CN_NUM_X86_FEATURES;
#define CN_FEATURE_TEST(name, hwcap_bit, sysctl_name)        \
    if (CN_ARM_HAS(hwcap_bit, sysctl_name)) f |= (uint64_t)1 << i; \
    i++;
    CN_FOR_EACH_ARM_FEATURE(CN_FEATURE_TEST)
#undef CN_FEATURE_TEST
    return f;
}
#else
static uint64_t cn_cpu_features(void) { return 0; }   /* none known elsewhere */
#endif

#endif /* CN_CPU_H */
