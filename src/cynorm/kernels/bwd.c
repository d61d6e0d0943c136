/*
 * The backward row kernels of one (ISA level, dtype kernel): as fwd.c, for
 * the operations of CN_BWD_OPS.
 */
#include <math.h>
#include <stdint.h>
#include <stddef.h>

#include "cn_simd.h"
#include "cn_pages.h"
#include "cn_ops.h"

#if !defined(CN_LEVEL) || !defined(CN_KERNEL)
#error "build this file with -DCN_LEVEL=<level> -DCN_KERNEL=<kernel> (meson.build's tables)"
#endif

#include "cn_pair.h"
#include "cn_rowmath.h"
#include "cn_bwd.h"
#include "cn_group.h"
#include "cn_gbwd.h"

#define CN_EXPORT_OP(S, K, name, params, args) void CN_UNIT_FN(CN_LEVEL, CN_KERNEL, name) params { name args; }
CN_BWD_OPS(CN_EXPORT_OP, , )
