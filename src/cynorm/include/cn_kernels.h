/*
 * cn_kernels.h -- one table of row operations per (x dtype, param dtype) pair.
 *
 * The row math lives in cn_rows.h and is instantiated here six times. The
 * Cython layer (_kernels.pxi) looks a table up once per call and decides how
 * rows and column chunks are spread over threads.
 */
#ifndef CN_KERNELS_H
#define CN_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include "cn_simd.h"
#include "cn_scratch.h"

/* Pair codes; the Python dtype layer (_dtypes.py) uses the same numbers. */
enum {
    CN_PAIR_F32 = 0,      /* float32  x, float32  params */
    CN_PAIR_F64 = 1,      /* float64  x, float64  params */
    CN_PAIR_BF16 = 2,     /* bfloat16 x, bfloat16 params */
    CN_PAIR_BF16_F32 = 3, /* bfloat16 x, float32  params (mixed) */
    CN_PAIR_F16 = 4,      /* float16  x, float16  params */
    CN_PAIR_F16_F32 = 5,  /* float16  x, float32  params (mixed) */
    CN_NUM_PAIRS = 6
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
/* ... taking a group of long rows at a time (their stats, then their chunks),
 * so that the normalizing pass rereads the group from cache and each
 * weight/bias chunk is read once per group instead of once per row. The
 * driver sets the group size (cn_fwd_args.long_group, _fwd_long_group in
 * _kernels.pxi): as many rows as fit in its cache budget, up to
 * CN_LONG_GROUP_BIG; rows too long for CN_LONG_GROUP of them to fit come from
 * DRAM again anyway and go CN_LONG_GROUP_BIG at a time with one thread (rows
 * of 8.4M elements, bf16, 1 thread: 156-163 -> 135 ms against 4), but
 * CN_LONG_GROUP at a time with more (fp32, 2 threads: 154 -> 192 ms with 16;
 * 2 x 16 concurrent row streams). Grouping never changes a bit. */
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
/* ... and from this many bytes of x and dy per group (32-bit and wider rows),
 * pass 2 prefetches two groups ahead, not one. Measured, 1 thread, out=,
 * alternating builds, 8 rounds: (16384,1024) fp32 7.17 -> 6.38 ms, (4096,4096)
 * fp32 6.21 -> 6.05; but rows of 256 (16 KB groups) 25.0 -> 27.2, and 16-bit
 * rows of 1024 and 4096 gained nothing (3.16 -> 3.13, 2.88 -> 3.04). */
#ifndef CN_BWD_FAR_BYTES
#define CN_BWD_FAR_BYTES (32 << 10)
#endif
/* The backward's sweeps over several rows at once (bwd_dx_rows_acc) write
 * their dx with non-temporal stores only with AVX-512, where they were
 * measured to pay (Zen 4/5); and only there do aligned 32-bit rows take the
 * route built on those sweeps (bwd_rows). With AVX2 (measured on Zen 3) the
 * half-filled write-combining buffers of four rows at once collapsed: fp32
 * (64,4096) from L2, 52 -> 15 cycles per 8 elements with plain stores;
 * (4096,4096) from DRAM, aligned route 33, the other one 20; the team path's
 * phase C at two threads, (64,401408) bf16, 65 ms against 17 at one thread. */
#ifndef CN_MULTIROW_STREAM
#  if defined(CN_AVX512)
#    define CN_MULTIROW_STREAM 1
#  else
#    define CN_MULTIROW_STREAM 0
#  endif
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
CN_INLINE void cn_moments_merge(cn_moments *a, const cn_moments *b)
{
    double n = a->n + b->n;
    double d = b->delta - a->delta;
    a->delta += d * (b->n / n);
    a->m2 += b->m2 + d * d * (a->n * (b->n / n));
    a->n = n;
}

/* Rows per slab when a fresh output is faulted in just before it is written:
 * whole groups of `group` rows, about CN_POPULATE_BYTES, at least one group. */
CN_INLINE int64_t cn_populate_slab_rows(int64_t row_bytes, int64_t group)
{
    const int64_t group_bytes = group * row_bytes;
    return group_bytes >= CN_POPULATE_BYTES ? group : group * (CN_POPULATE_BYTES / group_bytes);
}

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

#define CN_SFX f32_f32
#define CN_XT float
#define CN_XS f32
#define CN_PT float
#define CN_PS f32
#define CN_LANE vf
#define CN_LANE_IS_VD 0
#define CN_AT float
#include "cn_rows.h"
#undef CN_SFX
#undef CN_XT
#undef CN_XS
#undef CN_PT
#undef CN_PS

#define CN_SFX bf16_f32
#define CN_XT cn_bf16
#define CN_XS bf16
#define CN_PT float
#define CN_PS f32
#include "cn_rows.h"
#undef CN_SFX
#undef CN_XT
#undef CN_XS
#undef CN_PT
#undef CN_PS

#define CN_SFX f16_f32
#define CN_XT cn_f16
#define CN_XS f16
#define CN_PT float
#define CN_PS f32
#include "cn_rows.h"
#undef CN_SFX
#undef CN_XT
#undef CN_XS
#undef CN_PT
#undef CN_PS
#undef CN_LANE
#undef CN_LANE_IS_VD
#undef CN_AT

#define CN_SFX f64_f64
#define CN_XT double
#define CN_XS f64
#define CN_PT double
#define CN_PS f64
#define CN_LANE vd
#define CN_LANE_IS_VD 1
#define CN_AT double
#include "cn_rows.h"
#undef CN_SFX
#undef CN_XT
#undef CN_XS
#undef CN_PT
#undef CN_PS
#undef CN_LANE
#undef CN_LANE_IS_VD
#undef CN_AT

/* bf16/bf16 and f16/f16 run the mixed kernels: the caller widens the 16-bit
 * params to float32 once per call (exact) and rounds dweight/dbias back once. */
static const cn_ops *const cn_ops_table[CN_NUM_PAIRS] = {
    &cn_ops_f32_f32, &cn_ops_f64_f64, &cn_ops_bf16_f32, &cn_ops_bf16_f32, &cn_ops_f16_f32, &cn_ops_f16_f32,
};
/* storage of the params the caller passes for each pair: 0 as the kernel, 1 bf16, 2 f16 */
static const int cn_half_params[CN_NUM_PAIRS] = {0, 0, 1, 0, 2, 0};

static const cn_ops *cn_get_ops(int pair)
{
    return (pair >= 0 && pair < CN_NUM_PAIRS) ? cn_ops_table[pair] : NULL;
}

/* ---- array conversions (half params, and the tests' probes of this level's vector paths:
 * pairs of vectors, then one, then the tail -- every store path the kernels use) ---- */
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
CN_CONVERT_ARRAY(cn_f32_to_bf16_array, float, cn_bf16, f32, bf16)
CN_CONVERT_ARRAY(cn_f32_to_f16_array, float, cn_f16, f32, f16)
CN_CONVERT_ARRAY(cn_bf16_to_f32_array, cn_bf16, float, bf16, f32)
CN_CONVERT_ARRAY(cn_f16_to_f32_array, cn_f16, float, f16, f32)
#undef CN_CONVERT_ARRAY

#endif /* CN_KERNELS_H */
