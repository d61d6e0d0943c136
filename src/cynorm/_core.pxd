# Declarations of _core: the C headers it uses (include/) and the small C
# helpers it needs. Cython reads this file together with _core.pyx.

from libc.stdint cimport int64_t, uint16_t, uint64_t, uintptr_t

# Calls in flight in this process (all Python threads): concurrent callers share the cores.
cdef extern from *:
    """
    #if defined(_MSC_VER) && !defined(__clang__)
    #include <intrin.h>
    static volatile long cn_in_flight = 0;
    static int cn_enter_call(void) { return (int)_InterlockedIncrement(&cn_in_flight); }
    static void cn_leave_call(void) { _InterlockedDecrement(&cn_in_flight); }
    #else
    static int cn_in_flight = 0;
    static int cn_enter_call(void) { return __atomic_add_fetch(&cn_in_flight, 1, __ATOMIC_RELAXED); }
    static void cn_leave_call(void) { __atomic_sub_fetch(&cn_in_flight, 1, __ATOMIC_RELAXED); }
    #endif
    """
    int cn_enter_call() noexcept nogil
    void cn_leave_call() noexcept nogil


cdef extern from "cn_scratch.h" nogil:
    # per-thread buffers kept between calls (slot 0: widened params, 2: block
    # partials, 3: an rstd the caller does not want)
    void *cn_scratch_get(int slot, size_t nbytes)
    void cn_scratch_put(int slot, void *p)
    void cn_populate_share(void *dst, size_t nbytes, int64_t t, int64_t T)
    void cn_copy_stream(void *dst, const void *src, size_t nbytes)
    size_t cn_share_edge(size_t lo, size_t hi, int64_t t, int64_t T)


cdef extern from "cn_policy.h" nogil:
    ctypedef struct cn_tunables:   # (fields as in cn_policy.h's CN_FOR_EACH_TUNABLE; by name: cn_tunable_slot)
        int64_t long_row_bytes
    ctypedef struct cn_machine:
        int64_t l2_bytes
        int64_t l3_bytes
        int oversubscribe
        cn_tunables tuned
    enum:
        CN_NUM_CLASSES
        CN_NUM_TUNABLES
        CN_NUM_ROW_CLASSES
    ctypedef struct cn_call:
        int backward
        int64_t M
        int64_t N
        int x_size
        int acc_size
        int64_t small_max
        int multirow_stream
        int grads
        int64_t block_rows
        int requested_threads
        int (*num_procs)() noexcept nogil
        int in_flight
        int in_parallel
        int oversubscribe
        int openmp
        int fresh
        uintptr_t out_addr
        uintptr_t in_addr
    ctypedef struct cn_policy:
        int threads
        int path
        int stream
        int populate
        int64_t slab_rows
        int prefetch_l2
        int64_t prefetch_elems
        int64_t group_rows
        int64_t apply_chunk
        int64_t pass1_rows
        int64_t prefetch_rows
        int late_parts
        int team_parts
        int prefetch_pieces
        int64_t block_rows
        int64_t fused_rows
    enum:
        CN_MAX_THREADS
        CN_PATH_SMALL
        CN_PATH_MEDIUM
        CN_PATH_ROWS
        CN_PATH_LONG
        CN_PATH_TEAM
        CN_POPULATE_NONE
        CN_POPULATE_AHEAD
        CN_POPULATE_SLABS
        CN_PARTS_IN_PHASE_C
        CN_PARTS_BY_PAIRS
        CN_PARTS_BY_CHUNK
    cn_tunables cn_tune
    void cn_tunables_defaults(cn_tunables *t)
    cn_policy cn_policy_for(const cn_machine *m, const cn_call *c)
    cn_tunables cn_tunables_for(const cn_tunables *base, const cn_machine *m)
    void cn_machine_update(cn_machine *m)
    int cn_threads_for(const cn_tunables *t, const cn_call *c)
    int cn_gn_streams(const cn_policy *p, const cn_call *c, int64_t run)
    const char *cn_tunable_name(int i)
    const char *cn_tunable_what(int i)
    int cn_class_of(const cn_call *c, int threads)
    void cn_machine_set_class_value(cn_machine *m, int cls, int i, int64_t value)
    void cn_machine_clear_classes(cn_machine *m)
    int cn_machine_class_value(const cn_machine *m, int cls, int i, int64_t *value)
    const cn_tunables *cn_machine_tunables(const cn_machine *m, int cls)
    int64_t *cn_tunable_slot(cn_tunables *t, int i)


cdef extern from "cn_order.h" nogil:
    const int CN_CHUNK
    int64_t CN_GN_SCRATCH(int64_t C, int streamed)
    int64_t cn_block_rows(int64_t M, int64_t N, int acc_size)


cdef extern from "cn_ops.h" nogil:
    ctypedef struct cn_fwd_args:
        const void *x
        void *y
        const void *w
        const void *b
        void *mean
        void *rstd
        int64_t M
        int64_t N
        double eps
        int center
        const cn_policy *pol

    ctypedef struct cn_bwd_args:
        const void *dy
        const void *x
        const void *mean
        const void *rstd
        const void *w
        const void *dh
        void *dx
        int64_t M
        int64_t N
        int center
        const cn_policy *pol

    ctypedef struct cn_gn_fwd_args:
        const void *x
        void *y
        const void *w
        const void *b
        void *mean
        void *rstd
        int64_t N, C, S, G
        double eps
        int channels_last
        int stream

    ctypedef struct cn_gn_bwd_args:
        const void *dy
        const void *x
        const void *mean
        const void *rstd
        const void *w
        void *dx
        int64_t N, C, S, G
        int channels_last
        int stream

    ctypedef struct cn_moments:
        double n
        double delta
        double m2

    ctypedef struct cn_row_stats:
        double pivot
        double delta
        double rstd
        int ok

    ctypedef struct cn_ops:
        int x_size
        int p_size
        int acc_size
        int64_t small_max
        int multirow_stream
        void (*fwd_rows)(const cn_fwd_args *, int64_t, int64_t) noexcept nogil
        void (*fwd_chunk)(const cn_fwd_args *, int64_t, int64_t, int64_t, cn_moments *) noexcept nogil
        void (*fwd_finish)(const cn_fwd_args *, int64_t, const cn_moments *, cn_row_stats *) noexcept nogil
        void (*fwd_apply)(const cn_fwd_args *, int64_t, int64_t, int64_t, int64_t, const cn_row_stats *) noexcept nogil
        void (*bwd_rows)(const cn_bwd_args *, int64_t, int64_t, void *, void *) noexcept nogil
        void (*bwd_chunk)(const cn_bwd_args *, int64_t, int, int64_t, int64_t, double *, double *,
                          int64_t, void *, void *, int, int64_t, int64_t) noexcept nogil
        void (*bwd_apply)(const cn_bwd_args *, int64_t, int64_t, int64_t, int64_t, const double *, void *, void *,
                          int64_t) noexcept nogil
        void (*acc_add)(void *, const void *, int64_t, int64_t) noexcept nogil
        void (*add_residual)(const void *, const void *, int, void *, int, int64_t) noexcept nogil
        void (*gn_fwd_rows)(const cn_gn_fwd_args *, int64_t, int64_t) noexcept nogil
        void (*gn_fwd_samples)(const cn_gn_fwd_args *, int64_t, int64_t, double *) noexcept nogil
        void (*gn_bwd_rows)(const cn_gn_bwd_args *, int64_t, int64_t, double *) noexcept nogil
        void (*gn_bwd_samples)(const cn_gn_bwd_args *, int64_t, int64_t, double *, double *) noexcept nogil

    ctypedef struct cn_level_ops:
        const char *name
        const cn_ops **kernels
        void (*f32_to_bf16)(const float *, uint16_t *, int64_t) noexcept nogil
        void (*f32_to_f16)(const float *, uint16_t *, int64_t) noexcept nogil
        void (*bf16_to_f32)(const uint16_t *, float *, int64_t) noexcept nogil
        void (*f16_to_f32)(const uint16_t *, float *, int64_t) noexcept nogil
        void (*stream_fence)() noexcept nogil

    void cn_moments_merge(cn_moments *a, const cn_moments *b)


cdef extern from "cynorm.h" nogil:
    ctypedef struct cynorm_desc:
        int norm
        int x_dtype
        int param_dtype
        int64_t rows
        int64_t cols
        double eps
        int num_threads
        unsigned flags
        int64_t block_rows
    ctypedef struct cynorm_fwd_bufs:
        const void *x
        const void *weight
        const void *bias
        void *y
        void *mean
        void *rstd
    ctypedef struct cynorm_bwd_bufs:
        const void *dy
        const void *x
        const void *mean
        const void *rstd
        const void *weight
        void *dx
        void *dweight
        void *dbias
        void *dweight_blocks
        void *dbias_blocks
    ctypedef struct cynorm_add_desc:
        cynorm_desc base
        int residual_dtype
        int h_dtype
        int dsum_dtype
    ctypedef struct cynorm_add_fwd_bufs:
        const void *x
        const void *residual
        const void *weight
        const void *bias
        void *y
        void *h
        void *mean
        void *rstd
    ctypedef struct cynorm_add_bwd_bufs:
        const void *dy
        const void *h
        const void *mean
        const void *rstd
        const void *weight
        const void *dh
        void *dsum
        void *dweight
        void *dbias
        void *dweight_blocks
        void *dbias_blocks
    ctypedef struct cynorm_group_desc:
        int x_dtype, param_dtype
        int64_t batch, channels, spatial, groups
        int channels_last
        double eps
        int num_threads
    ctypedef struct cynorm_group_fwd_bufs:
        const void *x
        const void *weight
        const void *bias
        void *y
        void *mean
        void *rstd
    ctypedef struct cynorm_group_bwd_bufs:
        const void *dy
        const void *x
        const void *mean
        const void *rstd
        const void *weight
        void *dx
        void *dweight
        void *dbias
        double *terms
    ctypedef struct cynorm_api:
        int abi_version
        int (*forward)(const cynorm_desc *, const cynorm_fwd_bufs *) noexcept nogil
        int (*backward)(const cynorm_desc *, const cynorm_bwd_bufs *) noexcept nogil
        const char *(*error_string)(int) noexcept nogil
        int64_t (*block_rows)(int64_t, int64_t, int) noexcept nogil
        int (*add_forward)(const cynorm_add_desc *, const cynorm_add_fwd_bufs *) noexcept nogil
        int (*add_backward)(const cynorm_add_desc *, const cynorm_add_bwd_bufs *) noexcept nogil
        int (*group_forward)(const cynorm_group_desc *, const cynorm_group_fwd_bufs *) noexcept nogil
        int (*group_backward)(const cynorm_group_desc *, const cynorm_group_bwd_bufs *) noexcept nogil
    enum:
        CYNORM_ABI_VERSION
        CYNORM_F32
        CYNORM_F64
        CYNORM_BF16
        CYNORM_F16
        CYNORM_NO_PARAMS
        CYNORM_LAYER_NORM
        CYNORM_RMS_NORM
        CYNORM_FRESH_OUTPUT
        CYNORM_FRESH_H
        CYNORM_OK
        CYNORM_ENOMEM
        CYNORM_EINVAL


# meson.build's tables (cn_tables.h) as C arrays, and this CPU's features (cn_cpu.h).
cdef extern from *:
    """
    #include "cn_ops.h"
    #include "cn_cpu.h"
    /* every level of the table */
    #define CN_LEVEL_ROW(name, id, simd, features, caps) {#name, features, caps},
    static const struct cn_level_row { const char *name, *features, *caps; } cn_level_rows[] = {
        CN_FOR_EACH_LEVEL(CN_LEVEL_ROW)
    };
    /* the levels this build holds */
    #define CN_BUILT_LEVEL(name) &cn_level_##name,
    static const cn_level_ops *const cn_built_levels[] = {CN_FOR_EACH_BUILT_LEVEL(CN_BUILT_LEVEL) NULL};
    /* the dtype kernels, by id */
    #define CN_KERNEL_ROW(name, id, code, dtype, ctype, acc) {#name, code, dtype, CN_KERNEL_ID_##acc},
    static const struct cn_kernel_row { const char *name; int code; const char *dtype; int acc; } cn_kernel_rows[] = {
        CN_FOR_EACH_KERNEL(CN_KERNEL_ROW)
    };
    /* the dtype pairs, by code: x's kernel, and the dtype codes (cynorm.h) of x and of the params */
    #define CN_PAIR_ROW(code, xk, pk) {CN_KERNEL_ID_##xk, CN_KERNEL_CODE_##xk, CN_KERNEL_CODE_##pk},
    static const struct cn_pair_row { int kernel, x, param; } cn_pair_rows[] = {CN_FOR_EACH_PAIR(CN_PAIR_ROW)};
    """
    struct cn_level_row:
        const char *name
        const char *features
        const char *caps
    struct cn_kernel_row:
        const char *name
        int code
        const char *dtype
        int acc
    struct cn_pair_row:
        int kernel
        int x
        int param
    const cn_level_row *cn_level_rows
    const cn_level_ops *const *cn_built_levels
    const cn_kernel_row *cn_kernel_rows
    const cn_pair_row *cn_pair_rows
    const int CN_NUM_LEVELS
    const int CN_NUM_KERNELS
    const int CN_NUM_PAIRS
    const char *const *cn_cpu_feature_names
    uint64_t cn_cpu_features()


cdef extern from *:
    """
    void cn_reference_forward(const float *x, int64_t n, const float *w, const float *b, double eps, int center,
                              float *y, float *mean, float *rstd);
    void cn_reference_backward(const float *dy, const float *x, int64_t n, const float *w, float mean, float rstd,
                               int center, float *dx, double *dw, double *db);
    """
    void cn_reference_forward(const float *x, int64_t n, const float *w, const float *b, double eps, int center,
                              float *y, float *mean, float *rstd) nogil
    void cn_reference_backward(const float *dy, const float *x, int64_t n, const float *w, float mean, float rstd,
                               int center, float *dx, double *dw, double *db) nogil


# XLA FFI handlers (ffi/xla.c), which call the C entry point through the table set here
cdef extern from *:
    """
    void cn_xla_set_api(const cynorm_api *api);
    void *cn_xla_handler_address(int backward);
    """
    void cn_xla_set_api(const cynorm_api *api)
    void *cn_xla_handler_address(int backward)
