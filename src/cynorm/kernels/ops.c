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

/* The backward's sweeps over several rows at once write their dx with
 * non-temporal stores only with AVX-512, and only there do aligned 32-bit rows
 * take the route built on those sweeps (bwd_rows); with AVX2 the half-filled
 * write-combining buffers of four rows at once collapsed (benchmarks/NOTES.md). */
#if defined(CN_AVX512)
#  define CN_MULTIROW_STREAM 1
#else
#  define CN_MULTIROW_STREAM 0
#endif

#include "cn_pair.h"
#include "cn_rowmath.h"
#include "cn_fwd.h"
#include "cn_bwd.h"
#include "cn_residual.h"

#define CN_OPS_NAME_(level, kernel) cn_ops_##level##_##kernel
#define CN_OPS_NAME(level, kernel) CN_OPS_NAME_(level, kernel)
const cn_ops CN_OPS_NAME(CN_LEVEL, CN_KERNEL) = {
    (int)sizeof(xt), (int)sizeof(pt), (int)sizeof(at), SMALL_MAX,
    fwd_rows, fwd_chunk, fwd_finish, fwd_apply,
    bwd_rows, bwd_chunk, bwd_apply,
    acc_add, add_residual,
};
