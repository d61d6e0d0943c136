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

/* While a row is finished from cache, up to this many elements of the next row
 * are prefetched (so DRAM keeps streaming during the in-cache passes). */
#ifndef CN_PREFETCH_MAX
#define CN_PREFETCH_MAX 8192
#endif
/* Whole rows are taken in groups of up to 4 whose data fits in these many
 * bytes (forward: x; backward: x and dy). */
#ifndef CN_FWD_GROUP_BYTES
#define CN_FWD_GROUP_BYTES (16 << 10)
#endif
/* Forward rows of SMALL_MAX..CN_MED_ROW_BYTES and at most CN_CHUNK elements
 * (longer ones must take chunk moments, as the team path does): blocks of up
 * to 16 rows within CN_MED_BLOCK_BYTES (fwd_med). */
#ifndef CN_MED_ROW_BYTES
#define CN_MED_ROW_BYTES 8192
#endif
#ifndef CN_MED_BLOCK_BYTES
#define CN_MED_BLOCK_BYTES (32 << 10)
#endif
/* Rows longer than this are normalized column chunk by column chunk across a
 * group of rows (chunks of CN_APPLY_CHUNK elements); see fwd_rows. */
#ifndef CN_LONG_ROW_BYTES
#define CN_LONG_ROW_BYTES (64 << 10)
#endif
#ifndef CN_LONG_GROUP
#define CN_LONG_GROUP 4
#endif
#define CN_LONG_GROUP_BIG 16
#ifndef CN_APPLY_CHUNK
#define CN_APPLY_CHUNK 2048
#endif
/* Fresh outputs of short rows are faulted in slabs of this many bytes ... */
#ifndef CN_POPULATE_BYTES
#define CN_POPULATE_BYTES (1 << 20)
#endif
/* ... and a fresh dx of 32-bit or wider rows of at least this many bytes is
 * written with plain stores, not non-temporal ones (see bwd_rows). */
#ifndef CN_FRESH_PLAIN_ROW_BYTES
#define CN_FRESH_PLAIN_ROW_BYTES (4 << 10)
#endif
/* Backward, short rows: x and dy of the rows that take pass 1 before any takes pass 2. */
#ifndef CN_BWD_SHORT_BYTES
#define CN_BWD_SHORT_BYTES (16 << 10)
#endif
#ifndef CN_BWD_FAR_BYTES
#define CN_BWD_FAR_BYTES (32 << 10)
#endif
#ifndef CN_BWD_GROUP_BYTES
#define CN_BWD_GROUP_BYTES (256 << 10)
#endif

typedef struct {
    const void *x;
    void *y;
    const void *w, *b;   /* NULL when absent */
    void *mean, *rstd;   /* accumulator dtype, one per row; mean may be NULL */
    int64_t M, N;
    double eps;
    int center;          /* 1: LayerNorm, 0: RMSNorm */
    int stream;          /* write y with non-temporal stores (large outputs) */
    int populate;        /* y is fresh: fault in each long-row group's pages first (cn_populate_write) */
    int long_group;      /* rows per group of rows over CN_LONG_ROW_BYTES (1..CN_LONG_GROUP_BIG) */
    int prefetch_l2;     /* the row paths prefetch the next rows into L2, not L1 (PREFETCH_INTO_L2) */
} cn_fwd_args;

typedef struct {
    const void *dy, *x, *mean, *rstd, *w; /* mean unused (may be NULL) for RMSNorm */
    void *dx;
    int64_t M, N;
    int center;
    int stream;          /* write dx with non-temporal stores (large outputs) */
    int populate;        /* dx is fresh: fault in each row group's pages first (cn_populate_write) */
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

/* Rows per slab when a fresh output is faulted in just before it is written:
 * whole groups of `group` rows, about CN_POPULATE_BYTES, at least one group. */
CN_OPS_INLINE int64_t cn_populate_slab_rows(int64_t row_bytes, int64_t group)
{
    const int64_t group_bytes = group * row_bytes;
    return group_bytes >= CN_POPULATE_BYTES ? group : group * (CN_POPULATE_BYTES / group_bytes);
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
    /* partial sums (accumulator dtype) */
    void (*acc_add)(void *dst, const void *src, int64_t c0, int64_t c1);
    void (*acc_to_param)(void *out, const void *src, int64_t c0, int64_t c1);
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
} cn_level_ops;

/* The levels this build holds (CN_HAVE_LEVEL_<name> set by the build). Data,
 * not code: reading a table runs nothing of its level. */
extern const cn_level_ops cn_level_baseline;
extern const cn_level_ops cn_level_avx2;
extern const cn_level_ops cn_level_avx512;
extern const cn_level_ops cn_level_avx512_bf16;

#endif /* CN_OPS_H */
