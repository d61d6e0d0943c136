/*
 * The forward row kernels of one (ISA level, dtype kernel). The build compiles
 * this file once per level and kernel of meson.build's tables, with that
 * level's flags and -DCN_LEVEL=<level> -DCN_KERNEL=<kernel>, and exports its
 * operations as cn_<level>__<kernel>_<op> (CN_FWD_OPS; kernels/level.c gathers
 * them). bwd.c is the backward's twin.
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
#include "cn_fwd.h"
#include "cn_residual.h"
#include "cn_group.h"
#include "cn_gfwd.h"

#define CN_EXPORT_OP(S, K, name, params, args) void CN_UNIT_FN(CN_LEVEL, CN_KERNEL, name) params { name args; }
CN_FWD_OPS(CN_EXPORT_OP, , )
