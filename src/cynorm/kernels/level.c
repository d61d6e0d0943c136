/*
 * One ISA level's table: its four kernels (kernels/ops.c) and its array
 * conversions. Compiled once per level with that level's flags and
 * -DCN_LEVEL=<level> -DCN_LEVEL_ID=<0..3>; exports cn_level_<level>.
 */
#include <stdint.h>

#include "cn_simd.h"
#include "cn_ops.h"

#if CN_LEVEL_ID != CN_ISA_ID
#error "this unit's compiler flags do not select the ISA level it is named for"
#endif

#define CN_CAT_(a, b, c) a##b##c
#define CN_CAT(a, b, c) CN_CAT_(a, b, c)
#define CN_KERNEL_TABLE(k) CN_CAT(cn_ops_, CN_LEVEL, k)
extern const cn_ops CN_KERNEL_TABLE(_0), CN_KERNEL_TABLE(_1), CN_KERNEL_TABLE(_2), CN_KERNEL_TABLE(_3);

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

const cn_level_ops CN_CAT(cn_level_, CN_LEVEL, ) = {
    CN_ISA_NAME,
    {&CN_KERNEL_TABLE(_0), &CN_KERNEL_TABLE(_1), &CN_KERNEL_TABLE(_2), &CN_KERNEL_TABLE(_3)},
    f32_to_bf16, f32_to_f16, bf16_to_f32, f16_to_f32, stream_fence,
#if defined(CN_AVX512)
    1,
#else
    0,
#endif
};
