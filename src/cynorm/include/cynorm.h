/*
 * cynorm.h -- cynorm's C entry point: LayerNorm, RMSNorm and GroupNorm,
 * forward and backward, on raw pointers and a descriptor. No Python object is touched and
 * the GIL is not needed: call it from any thread. Results are bit-identical
 * to the Python API's for the same inputs, at any thread count.
 *
 * From another extension module (include this header; find it with
 * cynorm.get_include()):
 *
 *     const cynorm_api *api = cynorm_import();      // with the GIL, once; NULL + exception on failure
 *     cynorm_desc d = {CYNORM_LAYER_NORM, CYNORM_BF16, CYNORM_F32, rows, cols, 1e-5};
 *     cynorm_fwd_bufs b = {x, weight, bias, y, mean, rstd};
 *     int rc = api->forward(&d, &b);                 // CYNORM_OK, or see api->error_string(rc)
 *
 * Arrays are C-contiguous: x, y, dy, dx hold rows * cols elements; weight,
 * bias, dweight, dbias cols; mean and rstd rows (float32, or float64 for
 * float64 x). dweight/dbias have the param dtype. y may be x itself and dx may
 * be dy or x; no other output may overlap an input.
 */
#ifndef CYNORM_H
#define CYNORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the function table below (cynorm_api). Compatibility: the
 * table only grows -- a new version appends functions and never changes or
 * removes one -- so a module built against version k runs with any cynorm
 * whose table has a version >= k (cynorm_import checks just that), and uses
 * the functions of version k only.
 *   1: forward, backward, error_string, block_rows
 *   2: add_forward, add_backward
 *   3: group_forward, group_backward */
#define CYNORM_ABI_VERSION 3

enum cynorm_dtype { CYNORM_F32 = 0, CYNORM_F64 = 1, CYNORM_BF16 = 2, CYNORM_F16 = 3, CYNORM_NO_PARAMS = -1 };
enum cynorm_norm { CYNORM_LAYER_NORM = 0, CYNORM_RMS_NORM = 1 };
enum cynorm_flags { CYNORM_FRESH_OUTPUT = 1,    /* y / dx (dsum) was just allocated: its pages are not in yet */
                   CYNORM_FRESH_H = 2 };        /* add_forward: h was just allocated */
enum cynorm_status { CYNORM_OK = 0, CYNORM_ENOMEM = 1, CYNORM_EINVAL = 2 };

typedef struct {
    int norm;             /* cynorm_norm */
    int x_dtype;          /* x, y, dy, dx: cynorm_dtype */
    int param_dtype;      /* weight, bias, dweight, dbias: x_dtype, CYNORM_F32 (mixed), or
                             CYNORM_NO_PARAMS when neither weight nor bias is given */
    int64_t rows, cols;   /* rows >= 0 rows of cols >= 1 elements */
    double eps;           /* forward: finite, >= 0 */
    int num_threads;      /* 0: the default (omp_get_max_threads()) */
    unsigned flags;       /* cynorm_flags */
    int64_t block_rows;   /* backward: rows per dweight/dbias block; 0: cynorm_block_rows(rows, cols) */
} cynorm_desc;

typedef struct {
    const void *x, *weight, *bias;   /* weight and bias may be NULL */
    void *y, *mean, *rstd;           /* mean may be NULL (RMSNorm: always); rstd may be NULL */
} cynorm_fwd_bufs;

typedef struct {
    const void *dy, *x, *mean, *rstd, *weight;   /* mean unused by RMSNorm; weight may be NULL */
    void *dx, *dweight, *dbias;                  /* dweight needs weight; dbias (LayerNorm) needs dweight */
    /* Instead of dweight/dbias: each block's partial sums, unreduced (float32, or float64 for float64
     * x), ceil(rows / block_rows) rows of cols each. Added in block order (float additions, left
     * to right) and rounded once to the param dtype, the blocks of all row ranges of a larger array
     * give its dweight/dbias bit for bit, when each range starts on a block boundary. */
    void *dweight_blocks, *dbias_blocks;
} cynorm_bwd_bufs;

/* Fused residual add + norm. Forward: h = x + residual, added in float32
 * (float64 for float64 x) and rounded once to h_dtype; mean/rstd are h's, so
 * y is bit-identical to forward() on h (rounded to x's dtype when h is wider).
 * Backward: dsum = dx + dh, added before dx is rounded, rounded once to
 * dsum_dtype; dweight/dbias are backward()'s on h. */
typedef struct {
    cynorm_desc base;      /* x_dtype: x, y, dy; param_dtype as for the plain norms */
    int residual_dtype;    /* residual: x_dtype or h_dtype */
    int h_dtype;           /* h and dh: x_dtype, or CYNORM_F32 for 16-bit x (an fp32 residual stream) */
    int dsum_dtype;        /* backward: h_dtype or x_dtype */
} cynorm_add_desc;

typedef struct {
    const void *x, *residual, *weight, *bias;
    void *y, *h, *mean, *rstd;   /* h may be residual or x, y may be x (same dtype); mean/rstd may be NULL */
} cynorm_add_fwd_bufs;

typedef struct {
    const void *dy, *h, *mean, *rstd, *weight, *dh;   /* dh may be NULL (dsum = dx) */
    void *dsum, *dweight, *dbias;                     /* dsum may be dy, h or dh (same dtype) */
    void *dweight_blocks, *dbias_blocks;              /* as in cynorm_bwd_bufs */
} cynorm_add_bwd_bufs;

/* GroupNorm (InstanceNorm: groups == channels). x is (batch, channels, spatial)
 * channels-first or (batch, spatial, channels) channels-last, spatial the
 * product of the spatial dims (1 for none); each sample's group of
 * channels/groups channels is normalized over its channels and positions;
 * weight, bias, dweight, dbias hold one value per channel; mean and rstd
 * batch * groups values (float32, or float64 for float64 x). */
typedef struct {
    int x_dtype, param_dtype;         /* as in cynorm_desc */
    int64_t batch, channels, spatial, groups;   /* batch >= 0; the others >= 1, groups divides channels */
    int channels_last;                /* 0: channels-first (NCHW), 1: channels-last (NHWC) */
    double eps;                       /* forward: finite, >= 0 */
    int num_threads;                  /* 0: the default */
} cynorm_group_desc;

typedef struct {
    const void *x, *weight, *bias;   /* weight and bias may be NULL */
    void *y, *mean, *rstd;           /* all three required; y may be x */
} cynorm_group_fwd_bufs;

typedef struct {
    const void *dy, *x, *mean, *rstd, *weight;   /* weight may be NULL */
    void *dx, *dweight, *dbias;                  /* dweight and dbias: both or neither, and only with weight */
    /* Optional: each sample's dweight/dbias terms, float64, batch x 2 x channels (sum dy * xhat, then
     * sum dy, per channel). Added sample after sample in float64 and rounded (via float32 for 32- and
     * 16-bit params), the terms of all the batch ranges of a larger batch give its dweight/dbias bit
     * for bit. */
    double *terms;
} cynorm_group_bwd_bufs;

typedef struct {
    int abi_version;                                                  /* CYNORM_ABI_VERSION */
    int (*forward)(const cynorm_desc *d, const cynorm_fwd_bufs *b);   /* returns a cynorm_status */
    int (*backward)(const cynorm_desc *d, const cynorm_bwd_bufs *b);
    const char *(*error_string)(int status);
    int64_t (*block_rows)(int64_t rows, int64_t cols, int x_dtype);   /* the canonical dweight block
                                                                          (-1: x_dtype unknown) */
    int (*add_forward)(const cynorm_add_desc *d, const cynorm_add_fwd_bufs *b);     /* ABI 2 */
    int (*add_backward)(const cynorm_add_desc *d, const cynorm_add_bwd_bufs *b);   /* ABI 2 */
    int (*group_forward)(const cynorm_group_desc *d, const cynorm_group_fwd_bufs *b);    /* ABI 3 */
    int (*group_backward)(const cynorm_group_desc *d, const cynorm_group_bwd_bufs *b);   /* ABI 3 */
} cynorm_api;

#define CYNORM_CAPSULE "cynorm._core._C_API"

#if defined(Py_PYTHON_H)
/* The function table, from the capsule cynorm._core._C_API (imports cynorm):
 * NULL and an ImportError when that cynorm's table is older than this header's. */
static inline const cynorm_api *cynorm_import(void)
{
    const cynorm_api *api = (const cynorm_api *)PyCapsule_Import(CYNORM_CAPSULE, 0);
    if (api != NULL && api->abi_version < CYNORM_ABI_VERSION) {
        PyErr_Format(PyExc_ImportError,
                     "cynorm's C API has version %d; this module was built for version %d or later "
                     "(upgrade cynorm)", api->abi_version, CYNORM_ABI_VERSION);
        return NULL;
    }
    return api;
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* CYNORM_H */
