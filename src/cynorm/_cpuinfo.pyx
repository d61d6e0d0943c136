# cython: language_level=3
"""CPU feature probe. Built with baseline flags so it is safe to import on any CPU."""

cdef extern from "cn_cpu.h":
    int cn_cpu_features()
    int CN_CPU_AVX2, CN_CPU_FMA, CN_CPU_F16C, CN_CPU_AVX512F, CN_CPU_AVX512BW
    int CN_CPU_AVX512VL, CN_CPU_AVX512DQ, CN_CPU_AVX512BF16


def features():
    """Return the set of SIMD features that both the CPU and the OS support."""
    cdef int f = cn_cpu_features()
    names = {
        "avx2": CN_CPU_AVX2, "fma": CN_CPU_FMA, "f16c": CN_CPU_F16C,
        "avx512f": CN_CPU_AVX512F, "avx512bw": CN_CPU_AVX512BW,
        "avx512vl": CN_CPU_AVX512VL, "avx512dq": CN_CPU_AVX512DQ,
        "avx512_bf16": CN_CPU_AVX512BF16,
    }
    return frozenset(name for name, bit in names.items() if f & bit)
