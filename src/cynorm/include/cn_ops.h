/*
 * cn_ops.h -- what the orchestration (_core.pyx, compiled once) and the row
 * kernels (kernels/, compiled once per ISA level) share: the argument structs,
 * the table of row operations each (level, dtype pair) exports, and the
 * constants that fix the arithmetic order.
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

#include "cn_policy.h"

#if defined(_MSC_VER) && !defined(__clang__)
#  define CN_OPS_INLINE static __forceinline
#else
#  define CN_OPS_INLINE static inline
#endif

/* Kernel tables: one per (x storage, param storage). bf16/bf16 and f16/f16
 * calls run the mixed kernels: the caller widens 16-bit params to float32
 * once (exact) and rounds dweight/dbias back once. */
#define CN_KERNEL_F32 0      /* float32  x, float32 params */
#define CN_KERNEL_F64 1      /* float64  x, float64 params */
#define CN_KERNEL_BF16 2     /* bfloat16 x, float32 params */
#define CN_KERNEL_F16 3      /* float16  x, float32 params */
#define CN_NUM_KERNELS 4

/* Pair codes: (x dtype, param dtype) as the Python layer (_dtypes.py) numbers them. */
enum {
    CN_PAIR_F32 = 0, CN_PAIR_F64 = 1, CN_PAIR_BF16 = 2, CN_PAIR_BF16_F32 = 3,
    CN_PAIR_F16 = 4, CN_PAIR_F16_F32 = 5, CN_NUM_PAIRS = 6
};

/* Rows are cut into chunks of this many elements. Results depend on it, so it
 * is a constant, never derived from the thread count or the cache size. */
#define CN_CHUNK 2048

/* Forward rows of more than SMALL_MAX elements, up to this many bytes and at
 * most CN_CHUNK elements, take the medium-row kernel (one-pass moments over a
 * block of rows); longer rows take chunk moments. Which kernel a row takes
 * changes its arithmetic, so this is part of the reduction order too. */
#define CN_MED_ROW_BYTES 8192

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

/* The row operations of one (ISA level, kernel dtypes): kernels/ops.c. */
typedef struct {
    int x_size, p_size, acc_size; /* bytes per element */
    int64_t small_max;            /* rows up to this length use the in-register kernels */
    /* whole rows */
    void (*fwd_rows)(const cn_fwd_args *, int64_t r0, int64_t r1);
    /* team path: chunks of rows */
    void (*fwd_chunk)(const cn_fwd_args *, int64_t row, int64_t c0, int64_t c1, cn_moments *out);
    void (*fwd_finish)(const cn_fwd_args *, int64_t row, const cn_moments *total, cn_row_stats *out);
    void (*fwd_apply)(const cn_fwd_args *, int64_t row, int64_t nrows, int64_t c0, int64_t c1,
                      const cn_row_stats *st);
    /* rows of one block, and their chunk-level pieces */
    void (*bwd_rows)(const cn_bwd_args *, int64_t r0, int64_t r1, void *dw_part, void *db_part);
    void (*bwd_chunk)(const cn_bwd_args *, int64_t row, int nrows, int64_t c0, int64_t c1, double *s1, double *s2,
                      int64_t stride, void *dw_part, void *db_part, int init, int64_t pf_offset, int64_t pf_count);
    void (*bwd_apply)(const cn_bwd_args *, int64_t row, int64_t nrows, int64_t c0, int64_t c1,
                      const double *rowsums, void *dw_part, void *db_part, int64_t first_row_of_block);
    /* partial sums (accumulator dtype): dst[c0:c1] += src[c0:c1] */
    void (*acc_add)(void *dst, const void *src, int64_t c0, int64_t c1);
    /* fused residual add: h = x + r over n elements, rounded once (kernels/cn_residual.h) */
    void (*add_residual)(const void *x, const void *r, int r_wide, void *h, int h_wide, int64_t n);
} cn_ops;

/* Everything one ISA level exports: kernels/level.c. */
typedef struct {
    const char *name;                         /* "baseline", "avx2", "avx512", "avx512_bf16" */
    const cn_ops *kernels[CN_NUM_KERNELS];
    /* array conversions (16-bit params, and the tests' probes of this level's vector paths) */
    void (*f32_to_bf16)(const float *src, uint16_t *dst, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    void (*bf16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*stream_fence)(void);               /* after non-temporal stores */
    int multirow_stream;                      /* streams several rows at once (AVX-512; see ops.c) */
} cn_level_ops;

/* The levels this build holds (CN_HAVE_LEVEL_<name> set by the build). Data,
 * not code: reading a table runs nothing of its level. */
extern const cn_level_ops cn_level_baseline;
extern const cn_level_ops cn_level_avx2;
extern const cn_level_ops cn_level_avx512;
extern const cn_level_ops cn_level_avx512_bf16;

#endif /* CN_OPS_H */
