/*
 * cn_ops.h -- what the orchestration (_core.pyx, compiled once) and the row
 * kernels (kernels/, compiled once per ISA level) share: the argument structs
 * and the table of row operations each (level, dtype kernel) exports.
 *
 * The orchestration picks a level's table once (cn_level_ops, chosen after
 * the CPU check in cynorm._isa) and calls its functions through pointers, so
 * no instruction of a higher level runs before that check.
 */
#ifndef CN_OPS_H
#define CN_OPS_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>

#include "cn_order.h"
#include "cn_policy.h"
#include "cn_tables.h"

#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_OPS_INLINE static __forceinline
#else
#  define CN_OPS_INLINE static inline
#endif

typedef struct {
    const void *x;
    void *y;
    const void *w, *b;   /* NULL when absent */
    void *mean, *rstd;   /* accumulator dtype, one per row; mean may be NULL */
    int64_t M, N;
    double eps;
    int center;          /* 1: LayerNorm, 0: RMSNorm */
    const cn_policy *pol;
} cn_fwd_args;

typedef struct {
    const void *dy, *x, *mean, *rstd, *w; /* mean unused (may be NULL) for RMSNorm */
    const void *dh;      /* fused backward: dx + dh is stored (x's storage); NULL: dx */
    void *dx;
    int64_t M, N;
    int center;
    const cn_policy *pol;
} cn_bwd_args;

/* GroupNorm (kernels/cn_gfwd.h): x as (N, C, S) channels-first or (N, S, C)
 * channels-last; G groups of C/G channels; row r = n*G + g. */
typedef struct {
    const void *x;
    void *y;
    const void *w, *b;   /* C each (the kernel's param storage), or NULL */
    void *mean, *rstd;   /* N*G, accumulator dtype */
    int64_t N, C, S, G;
    double eps;
    int channels_last;
    int stream;          /* non-temporal stores for y (cn_gn_streams) */
} cn_gn_fwd_args;

typedef struct {
    const void *dy, *x, *mean, *rstd, *w;
    void *dx;
    int64_t N, C, S, G;
    int channels_last;
    int stream;          /* non-temporal stores for dx (cn_gn_streams) */
} cn_gn_bwd_args;

/* Moments of a run of elements relative to the row's pivot P (its first
 * element): delta = mean - P, m2 = sum of squared deviations. Keeping the
 * mean as P + delta keeps y accurate when |mean| >> std. */
typedef struct {
    double n, delta, m2;
} cn_moments;

/* What the normalizing pass needs for one row (pivot and rstd already rounded
 * to the accumulator dtype; delta unrounded, applied as hi + lo). ok == 0: row
 * already written by the rescue. */
typedef struct {
    double pivot, delta, rstd;
    int ok;
} cn_row_stats;

/* Chan et al. pairwise update; with delta == 0 (RMSNorm) it is a plain sum. */
CN_OPS_INLINE void cn_moments_merge(cn_moments *a, const cn_moments *b)
{
    double n = a->n + b->n;
    double d = b->delta - a->delta;
    a->delta += d * (b->n / n);
    a->m2 += b->m2 + d * d * (a->n * (b->n / n));
    a->n = n;
}

/* The row operations a kernel unit exports: X(S, K, name, (parameters),
 * (arguments)), S and K passed through (kernels/fwd.c, bwd.c, level.c). */
#define CN_FWD_OPS(X, S, K)                                                                           \
    X(S, K, fwd_rows, (const cn_fwd_args *a, int64_t r0, int64_t r1), (a, r0, r1))                    \
    /* team path: a chunk's moments, a row's stats from its merged moments, chunks of rows */         \
    X(S, K, fwd_chunk, (const cn_fwd_args *a, int64_t row, int64_t c0, int64_t c1, cn_moments *out),   \
      (a, row, c0, c1, out))                                                                          \
    X(S, K, fwd_finish, (const cn_fwd_args *a, int64_t row, const cn_moments *total, cn_row_stats *out), \
      (a, row, total, out))                                                                           \
    X(S, K, fwd_apply, (const cn_fwd_args *a, int64_t row, int64_t nrows, int64_t c0, int64_t c1,      \
                        const cn_row_stats *st), (a, row, nrows, c0, c1, st))                         \
    /* fused residual add: h = x + r over n elements, rounded once (kernels/cn_residual.h) */        \
    X(S, K, add_residual, (const void *x, const void *r, int r_wide, void *h, int h_wide, int64_t n),  \
      (x, r, r_wide, h, h_wide, n))                                                                \
    /* GroupNorm: channels-first rows; channels-last samples (scratch: CN_GN_SCRATCH) */               \
    X(S, K, gn_fwd_rows, (const cn_gn_fwd_args *a, int64_t r0, int64_t r1), (a, r0, r1))              \
    X(S, K, gn_fwd_samples, (const cn_gn_fwd_args *a, int64_t n0, int64_t n1, double *scratch),       \
      (a, n0, n1, scratch))
#define CN_BWD_OPS(X, S, K)                                                                           \
    /* the rows of one block (dw_part, db_part: its partials) */                                      \
    X(S, K, bwd_rows, (const cn_bwd_args *a, int64_t r0, int64_t r1, void *dw_part, void *db_part),    \
      (a, r0, r1, dw_part, db_part))                                                                  \
    /* team path: pass 1 over a chunk of R rows, then pass 2 over a chunk of rows */                  \
    X(S, K, bwd_chunk, (const cn_bwd_args *a, int64_t row, int nrows, int64_t c0, int64_t c1, double *s1, \
                        double *s2, int64_t stride, void *dw_part, void *db_part, int init, int64_t pf_offset, \
                        int64_t pf_count),                                                            \
      (a, row, nrows, c0, c1, s1, s2, stride, dw_part, db_part, init, pf_offset, pf_count))           \
    X(S, K, bwd_apply, (const cn_bwd_args *a, int64_t row, int64_t nrows, int64_t c0, int64_t c1,      \
                        const double *rowsums, void *dw_part, void *db_part, int64_t first_row_of_block), \
      (a, row, nrows, c0, c1, rowsums, dw_part, db_part, first_row_of_block))                         \
    /* partial sums (accumulator dtype): dst[c0:c1] += src[c0:c1] */                                  \
    X(S, K, acc_add, (void *dst, const void *src, int64_t c0, int64_t c1), (dst, src, c0, c1))        \
    /* GroupNorm: dx, and each sample's dweight/dbias terms in part (2*C doubles a sample) */         \
    X(S, K, gn_bwd_rows, (const cn_gn_bwd_args *a, int64_t r0, int64_t r1, double *part), (a, r0, r1, part)) \
    X(S, K, gn_bwd_samples, (const cn_gn_bwd_args *a, int64_t n0, int64_t n1, double *part,           \
                             double *scratch), (a, n0, n1, part, scratch))

/* cn_<level>__<kernel>_<op>: the exported name of a kernel unit's operation */
#define CN_UNIT_FN_(level, kernel, op) cn_##level##__##kernel##_##op
#define CN_UNIT_FN(level, kernel, op) CN_UNIT_FN_(level, kernel, op)

/* The row operations of one (ISA level, dtype kernel), gathered by kernels/level.c. */
#define CN_OP_FIELD(S, K, name, params, args) void (*name) params;
typedef struct {
    int x_size, p_size, acc_size; /* bytes per element of x, of the params (as the kernel takes them)
                                     and of the accumulators */
    int64_t small_max;            /* rows up to this length use the in-register kernels */
    int multirow_stream;          /* the unit's level streams several rows at once (its caps) */
    CN_FWD_OPS(CN_OP_FIELD, , )
    CN_BWD_OPS(CN_OP_FIELD, , )
} cn_ops;
#undef CN_OP_FIELD

/* Everything one ISA level exports: kernels/level.c. */
typedef struct {
    const char *name;                         /* the level's name in meson.build's table */
    const cn_ops *kernels[CN_NUM_KERNELS];    /* by kernel id */
    /* array conversions (16-bit params, and the tests' probes of this level's vector paths) */
    void (*f32_to_bf16)(const float *src, uint16_t *dst, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    void (*bf16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*stream_fence)(void);               /* after non-temporal stores */
} cn_level_ops;

/* The levels this build holds: cn_level_<name>. Data, not code: reading a
 * table runs nothing of its level. */
#define CN_DECLARE_LEVEL(name) extern const cn_level_ops cn_level_##name;
CN_FOR_EACH_BUILT_LEVEL(CN_DECLARE_LEVEL)
#undef CN_DECLARE_LEVEL

#endif /* CN_OPS_H */
