/*
 * One (ISA level, kernel dtypes) of the row kernels. The build compiles this
 * file once per level and kernel, with that level's flags and
 *   -DCN_LEVEL=<level> -DCN_LEVEL_ID=<0..3> -DCN_KERNEL=<CN_KERNEL_* value>
 * and it exports the table cn_ops_<level>_<kernel> (kernels/level.c gathers them).
 */
#include <math.h>
#include <stdint.h>
#include <stddef.h>

#include "cn_simd.h"
#include "cn_pages.h"
#include "cn_ops.h"

#if !defined(CN_LEVEL) || !defined(CN_LEVEL_ID) || !defined(CN_KERNEL)
#error "build this file with -DCN_LEVEL=<level> -DCN_LEVEL_ID=<n> -DCN_KERNEL=<n>"
#endif
#if CN_LEVEL_ID != CN_ISA_ID
#error "this unit's compiler flags do not select the ISA level it is named for"
#endif

/* Whether one-pass sums about a pivot, s = sum (x - pc) and q = sum (x - pc)^2
 * over n elements, give m2 = q - s^2/n accurately: both finite and the pivot
 * within sqrt(1/2) std of the mean (3 s^2 <= n q), so the subtraction costs at
 * most a factor 1.5. (&, not &&: loops over a block vectorize.) */
CN_INLINE int cn_onepass_accepts(double s, double q, double n)
{
    return isfinite(s) & isfinite(q) & (3.0 * s * s <= n * q);
}

CN_INLINE double cn_rstd(double m2, double n, double eps)
{
    double var = m2 / n;
    if (var < 0.0) var = 0.0; /* rounding can leave -tiny; NaN passes through */
    return 1.0 / sqrt(var + eps);
}

/* scalar conversions used by pivots and the rare double-precision rescue */
CN_INLINE float cn_scalar_f32(float v) { return v; }
CN_INLINE double cn_scalar_f64(double v) { return v; }
CN_INLINE float cn_scalar_bf16(cn_bf16 v) { return cn_bf16_to_f32(v); }
CN_INLINE float cn_scalar_f16(cn_f16 v) { return cn_f16_to_f32(v); }
CN_INLINE float cn_unscalar_f32(double v) { return (float)v; }
CN_INLINE double cn_unscalar_f64(double v) { return v; }
CN_INLINE cn_bf16 cn_unscalar_bf16(double v) { return cn_f32_to_bf16((float)v); }
CN_INLINE cn_f16 cn_unscalar_f16(double v) { return cn_f32_to_f16((float)v); }

#if CN_KERNEL == 0
#  define CN_SFX f32_f32
#  define CN_XT float
#  define CN_XS f32
#elif CN_KERNEL == 1
#  define CN_SFX f64_f64
#  define CN_XT double
#  define CN_XS f64
#elif CN_KERNEL == 2
#  define CN_SFX bf16_f32
#  define CN_XT cn_bf16
#  define CN_XS bf16
#elif CN_KERNEL == 3
#  define CN_SFX f16_f32
#  define CN_XT cn_f16
#  define CN_XS f16
#else
#error "unknown CN_KERNEL"
#endif
#if CN_KERNEL == 1
#  define CN_PT double
#  define CN_PS f64
#  define CN_LANE vd
#  define CN_LANE_IS_VD 1
#  define CN_AT double
#else
#  define CN_PT float
#  define CN_PS f32
#  define CN_LANE vf
#  define CN_LANE_IS_VD 0
#  define CN_AT float
#endif

/* The backward's sweeps over several rows at once (bwd_dx_rows_acc) write
 * their dx with non-temporal stores only with AVX-512, where they were
 * measured to pay (Zen 4/5); and only there do aligned 32-bit rows take the
 * route built on those sweeps (bwd_rows). With AVX2 (measured on Zen 3) the
 * half-filled write-combining buffers of four rows at once collapsed: fp32
 * (64,4096) from L2, 52 -> 15 cycles per 8 elements with plain stores;
 * (4096,4096) from DRAM, aligned route 33, the other one 20; the team path's
 * phase C at two threads, (64,401408) bf16, 65 ms against 17 at one thread. */
#if defined(CN_AVX512)
#  define CN_MULTIROW_STREAM 1
#else
#  define CN_MULTIROW_STREAM 0
#endif

#include "cn_rows.h"

#define CN_OPS_NAME_(level, sfx) cn_ops_##level##_##sfx
#define CN_OPS_NAME(level, sfx) CN_OPS_NAME_(level, sfx)
const cn_ops CN_OPS_NAME(CN_LEVEL, CN_SFX) = {
    (int)sizeof(CN_XT), (int)sizeof(CN_PT), (int)sizeof(CN_AT), SMALL_MAX,
    FN(fwd_rows), FN(fwd_chunk), FN(fwd_finish), FN(fwd_apply),
    FN(bwd_rows), FN(bwd_chunk), FN(bwd_apply),
    FN(acc_add), FN(acc_to_param),
};
