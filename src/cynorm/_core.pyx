# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernel orchestration, compiled once at baseline flags.

The row math lives in kernels/ (compiled once per ISA level and dtype kernel
of meson.build's tables, each level exporting one table of row operations:
include/cn_ops.h). The policy of a
call (threads, path, stores, group sizes) comes from one C function,
cn_policy_for (core/policy.c). The drivers (_drivers.pxi) follow it and call
the level that cynorm._isa selected, after the CPU check, through that
level's table. The C entry point (include/cynorm.h) is _c_forward and
_c_backward (_drivers.pxi) and the fused _c_add_forward/_c_add_backward
(_fused.pxi); the Python functions here fill its descriptor from ndarrays.
_fast.pxi holds the fast paths of tiny calls, _introspect.pxi the policy's
introspection.

Arrays arrive as C-contiguous ndarrays already checked by cynorm._api; their
data pointers are read with the NumPy C API. (Typed memoryviews would cost
about 100 ns each to acquire, a large share of a tiny call.)
"""

from libc.stdint cimport int64_t, uint16_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset
from cpython.pycapsule cimport PyCapsule_New
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from cynorm._openmp_helpers cimport (CN_OPENMP, omp_get_max_threads, omp_get_num_threads, omp_get_num_procs,
                                     omp_in_parallel)

cnp.import_array()

#: the level in use: set by use_level() (cynorm._isa, after the CPU check)
cdef const cn_level_ops *LEVEL = NULL
#: the machine the policy plans for: caches set by set_caches() (cynorm._isa)
cdef cn_machine MACHINE
memset(&MACHINE, 0, sizeof(MACHINE))
cn_machine_update(&MACHINE)


cdef inline const cn_ops *cn_get_ops(int pair) noexcept nogil:
    if pair < 0 or pair >= CN_NUM_PAIRS or LEVEL == NULL:
        return NULL
    return LEVEL.kernels[cn_pair_rows[pair].kernel]


cdef inline int _kernel_of(int dtype) noexcept nogil:
    """The kernel id of a dtype code (cynorm.h), or -1."""
    cdef int k
    for k in range(CN_NUM_KERNELS):
        if cn_kernel_rows[k].code == dtype:
            return k
    return -1


cdef inline int _half_of(int dtype) noexcept nogil:
    """How _widen/_narrow convert a dtype code: 1 bfloat16, 2 float16, 0 not 16-bit."""
    return 1 if dtype == CYNORM_BF16 else (2 if dtype == CYNORM_F16 else 0)


cdef inline int _widened(int pair) noexcept nogil:
    """The pair's params as _widen takes them (_half_of), where they are narrower than
    the accumulator its kernel takes them in; 0 where they are taken as they are."""
    cdef int acc = cn_kernel_rows[cn_kernel_rows[cn_pair_rows[pair].kernel].acc].code
    return 0 if cn_pair_rows[pair].param == acc else _half_of(cn_pair_rows[pair].param)


cdef inline void cn_stream_fence() noexcept nogil:
    LEVEL.stream_fence()


cdef void _widen(int half, const void *src, float *dst, int64_t n) noexcept nogil:
    """16-bit params -> float32 (exact), so one kernel serves bf16/bf16 and bf16/f32."""
    if half == 1:
        LEVEL.bf16_to_f32(<const uint16_t *>src, dst, n)
    else:
        LEVEL.f16_to_f32(<const uint16_t *>src, dst, n)


cdef void _narrow(int half, const float *src, void *dst, int64_t n) noexcept nogil:
    """float32 sums -> 16-bit params dtype, rounded once (RNE)."""
    if half == 1:
        LEVEL.f32_to_bf16(src, <uint16_t *>dst, n)
    else:
        LEVEL.f32_to_f16(src, <uint16_t *>dst, n)


include "_drivers.pxi"
include "_fused.pxi"
include "_group.pxi"


# ------------------------------------------------------------------ levels --

def tables():
    """meson.build's tables as this build compiled them: {"levels": [{name, features,
    caps, built}] in the table's order, "kernels": [{name, dtype, code, acc}] by id,
    "pairs": [(x dtype, param dtype)] by code}, dtypes by their NumPy names,
    "max_threads": the most threads a call may ask for, "cpu_features": the names of the
    features include/cn_cpu.h detects}."""
    built = set(compiled_levels())
    levels = [{"name": cn_level_rows[i].name.decode(), "features": cn_level_rows[i].features.decode().split(),
               "caps": cn_level_rows[i].caps.decode().split(), "built": cn_level_rows[i].name.decode() in built}
              for i in range(CN_NUM_LEVELS)]
    kernels = [{"name": cn_kernel_rows[k].name.decode(), "dtype": cn_kernel_rows[k].dtype.decode(),
                "code": cn_kernel_rows[k].code, "acc": cn_kernel_rows[cn_kernel_rows[k].acc].dtype.decode()}
               for k in range(CN_NUM_KERNELS)]
    dtype_of = {k["code"]: k["dtype"] for k in kernels}
    pairs = [(dtype_of[cn_pair_rows[p].x], dtype_of[cn_pair_rows[p].param]) for p in range(CN_NUM_PAIRS)]
    cdef int i = 0
    features = []
    while cn_cpu_feature_names[i] != NULL:
        features.append(cn_cpu_feature_names[i].decode())
        i += 1
    return {"levels": levels, "kernels": kernels, "pairs": pairs, "max_threads": CN_MAX_THREADS,
            "cpu_features": features}


def cpu_features():
    """The SIMD features this CPU and OS support (names of include/cn_cpu.h), a frozenset."""
    cdef uint64_t f = cn_cpu_features()
    cdef int i = 0
    names = set()
    while cn_cpu_feature_names[i] != NULL:
        if f >> i & 1:
            names.add(cn_cpu_feature_names[i].decode())
        i += 1
    return frozenset(names)


def compiled_levels():
    """Names of the ISA levels this build holds, lowest first."""
    names = []
    cdef int i = 0
    while cn_built_levels[i] != NULL:
        names.append(cn_built_levels[i].name.decode())
        i += 1
    return names


def use_level(str name):
    """Run every later call with this level's kernels. The caller (cynorm._isa)
    has checked that this CPU and OS support the level."""
    global LEVEL
    cdef int i = 0
    while cn_built_levels[i] != NULL:
        if cn_built_levels[i].name.decode() == name:
            LEVEL = cn_built_levels[i]
            return
        i += 1
    raise ValueError(f"ISA level {name!r} is not in this build (built: {', '.join(compiled_levels())})")


def isa():
    """Name of the ISA level in use (None before use_level)."""
    return None if LEVEL == NULL else LEVEL.name.decode()


# ------------------------------------------------------------ Python entry --

cdef inline void *_data(object arr):
    return NULL if arr is None else cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline object _contig(object arr):
    """C-contiguous version of a parameter array (a copy only when needed)."""
    if arr is None or cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>arr):
        return arr
    return cnp.PyArray_GETCONTIGUOUS(<cnp.ndarray>arr)


cdef void _desc(cynorm_desc *d, int pair, bint center, int64_t M, int64_t N, double eps, int num_threads,
                bint has_params, bint fresh) noexcept:
    d.norm = CYNORM_LAYER_NORM if center else CYNORM_RMS_NORM
    d.x_dtype = cn_pair_rows[pair].x
    d.param_dtype = cn_pair_rows[pair].param if has_params else CYNORM_NO_PARAMS
    d.rows = M
    d.cols = N
    d.eps = eps
    d.num_threads = num_threads
    d.flags = CYNORM_FRESH_OUTPUT if fresh else 0
    d.block_rows = 0


cdef inline int _check(int rc) except -1:
    if rc == CYNORM_ENOMEM:
        raise MemoryError(_c_error_string(rc).decode())
    if rc != CYNORM_OK:
        raise ValueError(_c_error_string(rc).decode())
    return 0


cdef int _run_forward(int pair, bint center, object x, object y, object weight, object bias, object mean,
                      object rstd, int64_t M, int64_t N, double eps, int num_threads, bint fresh) except -1:
    """The C entry point on ndarrays (C-contiguous, the dtypes of `pair`; weight, bias,
    mean, rstd may be None). num_threads 0: the default."""
    cdef cynorm_desc d
    cdef cynorm_fwd_bufs b
    _desc(&d, pair, center, M, N, eps, num_threads, weight is not None or bias is not None, fresh)
    b.x = _data(x)
    b.y = _data(y)
    b.weight = _data(weight)
    b.bias = _data(bias)
    b.mean = _data(mean)
    b.rstd = _data(rstd)
    cdef int rc
    with nogil:
        rc = _c_forward(&d, &b)
    return _check(rc)


def forward(int pair, bint center, cnp.ndarray x, cnp.ndarray y, object weight, object bias,
            object mean, object rstd, int64_t M, int64_t N, double eps, int num_threads,
            bint fresh=False):
    """Normalize the M rows of N elements of x into y; write mean and rstd (each if given).

    All arrays are C-contiguous with the dtypes of `pair` (checked by the caller).
    fresh: y was just allocated (its pages are not yet faulted in)."""
    if pair < 0 or pair >= CN_NUM_PAIRS:
        raise ValueError(f"unknown kernel pair {pair}")
    _run_forward(pair, center, x, y, _contig(weight), _contig(bias), mean, rstd, M, N, eps, num_threads, fresh)


def backward(int pair, bint center, cnp.ndarray dy, cnp.ndarray x, object mean, object rstd,
             object weight, cnp.ndarray dx, object dweight, object dbias,
             int64_t M, int64_t N, int num_threads, bint fresh=False, int64_t block_rows=0,
             object dweight_blocks=None, object dbias_blocks=None):
    """dx for M rows of N elements; dweight/dbias (param dtype) when given, or
    with dweight_blocks/dbias_blocks each block's partials (accumulator dtype),
    blocks of block_rows rows (0: the canonical size for M and N).
    fresh: dx was just allocated."""
    if pair < 0 or pair >= CN_NUM_PAIRS:
        raise ValueError(f"unknown kernel pair {pair}")
    _run_backward(pair, center, dy, x, _contig(mean), _contig(rstd), _contig(weight), dx, dweight, dbias, M, N,
                  num_threads, fresh, block_rows, dweight_blocks, dbias_blocks)


cdef int _run_backward(int pair, bint center, object dy, object x, object mean, object rstd, object weight,
                       object dx, object dweight, object dbias, int64_t M, int64_t N, int num_threads, bint fresh,
                       int64_t block_rows, object dweight_blocks, object dbias_blocks) except -1:
    """The C entry point's backward on ndarrays (C-contiguous, the dtypes of `pair`)."""
    cdef cynorm_desc d
    cdef cynorm_bwd_bufs b
    _desc(&d, pair, center, M, N, 0.0, num_threads, weight is not None, fresh)
    b.dy = _data(dy)
    b.x = _data(x)
    b.mean = _data(mean)
    b.rstd = _data(rstd)
    b.weight = _data(weight)
    b.dx = _data(dx)
    b.dweight = _data(dweight)
    b.dbias = _data(dbias)
    b.dweight_blocks = _data(dweight_blocks)
    b.dbias_blocks = _data(dbias_blocks)
    d.block_rows = block_rows
    cdef int rc
    with nogil:
        rc = _c_backward(&d, &b)
    return _check(rc)


def add_forward(int x_dtype, int param_dtype, int residual_dtype, int h_dtype, bint center, cnp.ndarray x,
                cnp.ndarray residual, cnp.ndarray y, cnp.ndarray h, object weight, object bias, object mean,
                object rstd, int64_t M, int64_t N, double eps, int num_threads, bint fresh=False,
                bint fresh_h=False):
    """The fused residual add + norm forward (cynorm.h's add_forward) on checked
    C-contiguous ndarrays; dtypes as cynorm.h numbers them. fresh, fresh_h: y, h
    were just allocated."""
    cdef cynorm_add_desc d
    cdef cynorm_add_fwd_bufs b
    weight = _contig(weight)
    bias = _contig(bias)
    _desc(&d.base, 0, center, M, N, eps, num_threads, False, fresh)
    d.base.x_dtype = x_dtype
    d.base.param_dtype = param_dtype
    d.residual_dtype = residual_dtype
    d.h_dtype = h_dtype
    d.dsum_dtype = h_dtype
    if fresh_h:
        d.base.flags |= CYNORM_FRESH_H
    b.x = cnp.PyArray_DATA(x)
    b.residual = cnp.PyArray_DATA(residual)
    b.weight = _data(weight)
    b.bias = _data(bias)
    b.y = cnp.PyArray_DATA(y)
    b.h = cnp.PyArray_DATA(h)
    b.mean = _data(mean)
    b.rstd = _data(rstd)
    cdef int rc
    with nogil:
        rc = _c_add_forward(&d, &b)
    _check(rc)


def add_backward(int x_dtype, int param_dtype, int h_dtype, int dsum_dtype, bint center, cnp.ndarray dy,
                 cnp.ndarray h, object mean, object rstd, object weight, object dh, cnp.ndarray dsum,
                 object dweight, object dbias, int64_t M, int64_t N, int num_threads, bint fresh=False,
                 int64_t block_rows=0, object dweight_blocks=None, object dbias_blocks=None):
    """The fused backward (cynorm.h's add_backward): dsum = dx + dh (dh may be None);
    blocks as in backward()."""
    cdef cynorm_add_desc d
    cdef cynorm_add_bwd_bufs b
    weight = _contig(weight)
    mean = _contig(mean)
    rstd = _contig(rstd)
    _desc(&d.base, 0, center, M, N, 0.0, num_threads, False, fresh)
    d.base.x_dtype = x_dtype
    d.base.param_dtype = param_dtype
    d.residual_dtype = h_dtype
    d.h_dtype = h_dtype
    d.dsum_dtype = dsum_dtype
    b.dy = cnp.PyArray_DATA(dy)
    b.h = cnp.PyArray_DATA(h)
    b.mean = _data(mean)
    b.rstd = _data(rstd)
    b.weight = _data(weight)
    b.dh = _data(dh)
    b.dsum = cnp.PyArray_DATA(dsum)
    b.dweight = _data(dweight)
    b.dbias = _data(dbias)
    b.dweight_blocks = _data(dweight_blocks)
    b.dbias_blocks = _data(dbias_blocks)
    d.base.block_rows = block_rows
    cdef int rc
    with nogil:
        rc = _c_add_backward(&d, &b)
    _check(rc)


include "_fast.pxi"


#: The C entry point for other extension modules (include/cynorm.h: cynorm_import()).
_C_API = PyCapsule_New(<void *>&_C_API_TABLE, b"cynorm._core._C_API", NULL)
cn_xla_set_api(&_C_API_TABLE)


def xla_targets():
    """{target name: PyCapsule of its XLA FFI handler} (ffi/xla.c), for jax.ffi.register_ffi_target."""
    return {"cynorm_forward": PyCapsule_New(cn_xla_handler_address(0), NULL, NULL),
            "cynorm_backward": PyCapsule_New(cn_xla_handler_address(1), NULL, NULL),
            "cynorm_add_forward": PyCapsule_New(cn_xla_handler_address(2), NULL, NULL),
            "cynorm_add_backward": PyCapsule_New(cn_xla_handler_address(3), NULL, NULL),
            "cynorm_group_forward": PyCapsule_New(cn_xla_handler_address(4), NULL, NULL),
            "cynorm_group_backward": PyCapsule_New(cn_xla_handler_address(5), NULL, NULL)}


include "_introspect.pxi"
