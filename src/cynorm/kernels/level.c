/*
 * One ISA level's table (cn_level_<level>): its kernels' operations, by
 * kernel id, and its array conversions. Compiled once per level with that
 * level's flags and -DCN_LEVEL=<level>. A kernel's operations come from the
 * units meson.build's table names for it (the level's own, or those of the
 * level it reuses): CN_LEVEL_KERNELS_<level>.
 */
#include <stdint.h>

#include "cn_simd.h"
#include "cn_ops.h"

#if !defined(CN_LEVEL)
#error "build this file with -DCN_LEVEL=<level> (meson.build's table)"
#endif

/* the units' operations: cn_<source level>__<kernel>_<op> */
#define CN_DECLARE_OP(S, K, name, params, args) void CN_UNIT_FN(S, K, name) params;
#define CN_DECLARE_KERNEL(S, K) CN_FWD_OPS(CN_DECLARE_OP, S, K) CN_BWD_OPS(CN_DECLARE_OP, S, K)
CN_LEVEL_FIELD(KERNELS, CN_LEVEL)(CN_DECLARE_KERNEL)

/* one table per kernel: cn_<level>__<kernel>_ops */
#define CN_OP_INIT(S, K, name, params, args) .name = CN_UNIT_FN(S, K, name),
#define CN_KERNEL_OPS(S, K)                                                                      \
    static const cn_ops CN_UNIT_FN(CN_LEVEL, K, ops) = {                                         \
        .x_size = (int)sizeof(CN_KERNEL_FIELD(CTYPE, K)),                                        \
        .p_size = (int)sizeof(CN_KERNEL_FIELD(CTYPE, CN_KERNEL_FIELD(ACC, K))),                  \
        .acc_size = (int)sizeof(CN_KERNEL_FIELD(CTYPE, CN_KERNEL_FIELD(ACC, K))),                \
        .small_max = CN_SMALL_ROW_MAX,                                                           \
        .multirow_stream = CN_LEVEL_FIELD(MULTIROW_STREAM, S),                                   \
        CN_FWD_OPS(CN_OP_INIT, S, K) CN_BWD_OPS(CN_OP_INIT, S, K)                                \
    };
CN_LEVEL_FIELD(KERNELS, CN_LEVEL)(CN_KERNEL_OPS)

/* pairs of vectors, then one, then the tail: every store path the kernels use */
#define CN_CONVERT_ARRAY(NAME, SRC, DST, FROM, TO)                                        \
    static void NAME(const SRC *src, DST *dst, int64_t n)                                 \
    {                                                                                     \
        int64_t j = 0;                                                                    \
        for (; j + 2 * CN_VF_LANES <= n; j += 2 * CN_VF_LANES)                            \
            cn_vf_store2_##TO(dst + j, cn_vf_load_##FROM(src + j),                        \
                              cn_vf_load_##FROM(src + j + CN_VF_LANES));                  \
        for (; j + CN_VF_LANES <= n; j += CN_VF_LANES)                                    \
            cn_vf_store_##TO(dst + j, cn_vf_load_##FROM(src + j));                        \
        if (j < n) cn_vf_storen_##TO(dst + j, cn_vf_loadn_##FROM(src + j, n - j), n - j); \
    }
CN_CONVERT_ARRAY(f32_to_bf16, float, cn_bf16, f32, bf16)
CN_CONVERT_ARRAY(f32_to_f16, float, cn_f16, f32, f16)
CN_CONVERT_ARRAY(bf16_to_f32, cn_bf16, float, bf16, f32)
CN_CONVERT_ARRAY(f16_to_f32, cn_f16, float, f16, f32)

static void stream_fence(void) { cn_stream_fence(); }

#define CN_LEVEL_TABLE_(level) cn_level_##level
#define CN_LEVEL_TABLE(level) CN_LEVEL_TABLE_(level)
#define CN_KERNEL_PTR(name, id, code, dtype, ctype, acc) &CN_UNIT_FN(CN_LEVEL, name, ops),
const cn_level_ops CN_LEVEL_TABLE(CN_LEVEL) = {
    CN_ISA_NAME,
    {CN_FOR_EACH_KERNEL(CN_KERNEL_PTR)},
    f32_to_bf16, f32_to_f16, bf16_to_f32, f16_to_f32, stream_fence,
};
