# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernel orchestration, compiled once at baseline flags.

The row math lives in kernels/ (compiled once per ISA level, each level
exporting one table of row operations: include/cn_ops.h). The policy of a
call (threads, path, stores, group sizes) comes from one C function,
cn_policy_for (core/policy.c). The drivers (_drivers.pxi) follow it and call
the level that cynorm._isa selected, after the CPU check, through that
level's table. The C entry point (include/cynorm.h) is _c_forward and
_c_backward; the Python functions here fill its descriptor from ndarrays.

Arrays arrive as C-contiguous ndarrays already checked by cynorm._api; their
data pointers are read with the NumPy C API. (Typed memoryviews would cost
about 100 ns each to acquire, a large share of a tiny call.)
"""

from libc.stdint cimport int64_t, uint16_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset
from cpython.pycapsule cimport PyCapsule_New
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from cynorm._openmp_helpers cimport (CN_OPENMP, omp_get_max_threads, omp_get_num_threads, omp_get_num_procs,
                                     omp_in_parallel)

cnp.import_array()

#: the level in use: set by use_level() (cynorm._isa, after the CPU check)
cdef const cn_level_ops *LEVEL = NULL
#: the machine the policy plans for: caches set by set_caches() (cynorm._isa), the level's traits
cdef cn_machine MACHINE
memset(&MACHINE, 0, sizeof(MACHINE))
cn_machine_update(&MACHINE)


cdef inline const cn_ops *cn_get_ops(int pair) noexcept nogil:
    if pair < 0 or pair >= CN_NUM_PAIRS or LEVEL == NULL:
        return NULL
    return LEVEL.kernels[cn_kernel_of_pair[pair]]


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


# ------------------------------------------------------------------ levels --

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
            MACHINE.multirow_stream = LEVEL.multirow_stream
            cn_machine_update(&MACHINE)
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
    d.x_dtype = cn_pair_x[pair]
    d.param_dtype = cn_pair_p[pair] if has_params else CYNORM_NO_PARAMS
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


# forward_small/backward_small allocate y/dx only for calls with fewer elements
# than this (below cynorm._api's huge-page gate, so its outputs are plain
# np.empty ones either way); with y/dx given, any size.
cdef int64_t SMALL_CALL_ELEMS = 1 << 16


cdef inline bint _plain_array(object a):
    """An exact ndarray, C-contiguous, in native byte order."""
    return (type(a) is cnp.ndarray and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a))


cdef inline bint _shape_is(cnp.ndarray p, cnp.npy_intp *dims, int n):
    """p.shape == dims[:n]"""
    if cnp.PyArray_NDIM(p) != n:
        return False
    cdef cnp.npy_intp *pd = cnp.PyArray_DIMS(p)
    cdef int k
    for k in range(n):
        if pd[k] != dims[k]:
            return False
    return True


cdef inline bint _out_ok(object a, int typenum):
    """A given output the fast paths take: plain, writeable, of this dtype."""
    return (_plain_array(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == typenum
            and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a))


cdef inline bint _stat_shape_ok(object s, cnp.npy_intp *sdims, int nd, cnp.npy_intp *dims, int ax):
    """A mean/rstd array's shape: dims kept (sdims) or squeezed (dims[:ax])."""
    return _shape_is(<cnp.ndarray>s, sdims, nd) or _shape_is(<cnp.ndarray>s, dims, ax)


cdef inline bint _overlap(object a, object b):
    """Whether two C-contiguous arrays (or None) share a byte."""
    if a is None or b is None:
        return False
    cdef char *pa = <char *>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef char *pb = <char *>cnp.PyArray_DATA(<cnp.ndarray>b)
    return pa < pb + cnp.PyArray_NBYTES(<cnp.ndarray>b) and pb < pa + cnp.PyArray_NBYTES(<cnp.ndarray>a)


cdef inline bint _same_memory(object a, object b):
    return (cnp.PyArray_DATA(<cnp.ndarray>a) == cnp.PyArray_DATA(<cnp.ndarray>b)
            and cnp.PyArray_NBYTES(<cnp.ndarray>a) == cnp.PyArray_NBYTES(<cnp.ndarray>b))


cdef bint _apart(tuple outs, tuple ins, tuple in_place):
    """Outputs (or None) pairwise disjoint and apart from every input, except that
    the first output may be exactly one of `in_place` (same data and size; both
    have x's dtype and shape, checked by the caller)."""
    cdef Py_ssize_t i, j, n = len(outs)
    for i in range(n):
        for j in range(i + 1, n):
            if _overlap(outs[i], outs[j]):
                return False
        for a in ins:
            if _overlap(outs[i], a):
                if i == 0 and (a is in_place[0] or (len(in_place) > 1 and a is in_place[1])) \
                        and _same_memory(a, outs[0]):
                    continue
                return False
    return True


cdef inline int _layout_small(cnp.ndarray xa, object axis, cnp.npy_intp *sdims, int64_t *M, int64_t *N):
    """axis in [0, ndim) and M, N, sdims (the stats' shape) for a small call; -1: not one."""
    if type(axis) is not int:
        return -1
    cdef int nd = cnp.PyArray_NDIM(xa)
    if nd == 0 or nd > 32 or not (-nd <= axis < nd):
        return -1
    cdef int ax = axis
    if ax < 0:
        ax += nd
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(xa)
    cdef int k
    M[0] = 1
    N[0] = 1
    for k in range(nd):
        if k < ax:
            M[0] *= dims[k]
            sdims[k] = dims[k]
        else:
            N[0] *= dims[k]
            sdims[k] = 1
    if M[0] == 0 or N[0] == 0:
        return -1
    return ax


cdef inline bint _param_ok(object p, cnp.npy_intp *dims, int ax, int nd):
    return p is None or (_plain_array(p) and _shape_is(<cnp.ndarray>p, dims + ax, nd - ax))


def forward_small(object x, object weight, object bias, object axis, object eps, object num_threads,
                  bint center, int n_outs, object out, dict pairs):
    """cynorm._api's fast path for the common small forward call, all in C.

    Takes only what needs no conversion and that the validating path would
    accept as it is: exact C-contiguous native ndarrays, weight/bias (or None)
    of shape x.shape[axis:] and a supported dtype pair (`pairs`: (x type
    number, param type number or -1) -> (pair code, stats type number, grad
    type number)), an int axis in range, a finite float eps >= 0, num_threads
    None or an int in 1..1024; out None, y, or a tuple of n_outs entries (y,
    then mean and/or rstd), each None or a writeable exact array of the
    output's dtype and shape, the outputs apart from each other and from the
    inputs (y may be x); y given, or fewer than SMALL_CALL_ELEMS elements (the
    general path allocates large outputs on huge pages). Returns
    (y, mean, rstd) (mean None unless center and n_outs == 3), or None for
    anything else; the caller then validates and runs the call the general
    way (and raises there). Same kernels and policy as the general path."""
    if not (_plain_array(x) and type(eps) is float):
        return None
    if num_threads is not None and not (type(num_threads) is int and 1 <= num_threads <= 1024):
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef cnp.npy_intp sdims[32]
    cdef int64_t M, N
    cdef int ax = _layout_small(xa, axis, sdims, &M, &N)
    if ax < 0 or (out is None and M * N >= SMALL_CALL_ELEMS):   # (a fresh large y: the general path)
        return None
    cdef int nd = cnp.PyArray_NDIM(xa)
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(xa)
    cdef int pnum = -1
    if not (_param_ok(weight, dims, ax, nd) and _param_ok(bias, dims, ax, nd)):
        return None
    if weight is not None:
        pnum = cnp.PyArray_TYPE(<cnp.ndarray>weight)
    if bias is not None:
        if pnum != -1 and cnp.PyArray_TYPE(<cnp.ndarray>bias) != pnum:
            return None
        pnum = cnp.PyArray_TYPE(<cnp.ndarray>bias)
    entry = pairs.get((cnp.PyArray_TYPE(xa), pnum))
    cdef double e = eps
    if entry is None or not (e >= 0.0 and e <= 1.7976931348623157e308):   # (NaN fails both)
        return None
    cdef int code = entry[0], stat_num = entry[1], xnum = cnp.PyArray_TYPE(xa)
    cdef bint want_mean = center and n_outs == 3, want_rstd = n_outs > 1
    y = mean = rstd = None
    if out is not None:
        if type(out) is cnp.ndarray:
            y = out
        elif type(out) is tuple and len(<tuple>out) == n_outs:
            y = (<tuple>out)[0]
            if n_outs == 3:
                mean = (<tuple>out)[1]
            if n_outs > 1:
                rstd = (<tuple>out)[n_outs - 1]
        else:
            return None
        if y is not None and not (_out_ok(y, xnum) and _shape_is(<cnp.ndarray>y, dims, nd)):
            return None
        for s in (mean, rstd):
            if s is not None and not (_out_ok(s, stat_num) and _stat_shape_ok(s, sdims, nd, dims, ax)):
                return None
        if not _apart((y, mean, rstd), (x, weight, bias), (x,)):
            return None
    fresh = y is None
    if y is None:
        if M * N >= SMALL_CALL_ELEMS:   # (large outputs: the general path's allocator)
            return None
        y = cnp.PyArray_EMPTY(nd, dims, xnum, 0)
    if mean is None and want_mean:
        mean = cnp.PyArray_EMPTY(nd, sdims, stat_num, 0)
    if rstd is None and want_rstd:
        rstd = cnp.PyArray_EMPTY(nd, sdims, stat_num, 0)
    _run_forward(code, center, xa, y, weight, bias, mean, rstd, M, N, e,
                 0 if num_threads is None else <int>num_threads, fresh)
    return y, mean, rstd


def backward_small(object dy, object x, object mean, object rstd, object weight, object axis,
                   object num_threads, bint center, object out, dict pairs):
    """The backward's fast path, as forward_small: plain arrays (dy and x of one
    dtype and shape; mean (LayerNorm) and rstd of the stats dtype, dims kept or
    squeezed; weight None or of shape x.shape[axis:]), out None, dx, or (dx,
    dweight[, dbias]) with the outputs apart from each other and from the
    inputs (dx may be dy or x); dx given, or fewer than SMALL_CALL_ELEMS elements.
    Returns (dx, dweight, dbias), or None: the general path then runs it."""
    if not (_plain_array(x) and _plain_array(dy)):
        return None
    if num_threads is not None and not (type(num_threads) is int and 1 <= num_threads <= 1024):
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(xa), xnum = cnp.PyArray_TYPE(xa)
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(xa)
    if cnp.PyArray_TYPE(<cnp.ndarray>dy) != xnum or not _shape_is(<cnp.ndarray>dy, dims, nd):
        return None
    cdef cnp.npy_intp sdims[32]
    cdef int64_t M, N
    cdef int ax = _layout_small(xa, axis, sdims, &M, &N)
    if ax < 0 or (out is None and M * N >= SMALL_CALL_ELEMS) or not _param_ok(weight, dims, ax, nd):
        return None
    entry = pairs.get((xnum, -1 if weight is None else cnp.PyArray_TYPE(<cnp.ndarray>weight)))
    if entry is None:
        return None
    cdef int code = entry[0], stat_num = entry[1], grad_num = entry[2]
    for s in ((mean, rstd) if center else (rstd,)):
        if not (_plain_array(s) and cnp.PyArray_TYPE(<cnp.ndarray>s) == stat_num
                and _stat_shape_ok(s, sdims, nd, dims, ax)):
            return None
    dx = dweight = dbias = None
    if out is not None:
        if type(out) is cnp.ndarray:
            dx = out
        elif type(out) is tuple and len(<tuple>out) == (3 if center else 2):
            dx = (<tuple>out)[0]
            dweight = (<tuple>out)[1]
            if center:
                dbias = (<tuple>out)[2]
            if weight is None and (dweight is not None or dbias is not None):
                return None
        else:
            return None
        if dx is not None and not (_out_ok(dx, xnum) and _shape_is(<cnp.ndarray>dx, dims, nd)):
            return None
        for g in (dweight, dbias):
            if g is not None and not (_out_ok(g, grad_num) and _shape_is(<cnp.ndarray>g, dims + ax, nd - ax)):
                return None
        if not _apart((dx, dweight, dbias), (dy, x, mean, rstd, weight), (dy, x)):
            return None
    fresh = dx is None
    if dx is None:
        if M * N >= SMALL_CALL_ELEMS:
            return None
        dx = cnp.PyArray_EMPTY(nd, dims, xnum, 0)
    if weight is not None:
        if dweight is None:
            dweight = cnp.PyArray_EMPTY(nd - ax, dims + ax, grad_num, 0)
        if center and dbias is None:
            dbias = cnp.PyArray_EMPTY(nd - ax, dims + ax, grad_num, 0)
    _run_backward(code, center, dy, xa, mean, rstd, weight, dx, dweight, dbias, M, N,
                  0 if num_threads is None else <int>num_threads, fresh, 0, None, None)
    return dx, dweight, dbias


#: The C entry point for other extension modules (include/cynorm.h: cynorm_import()).
_C_API = PyCapsule_New(<void *>&_C_API_TABLE, b"cynorm._core._C_API", NULL)
cn_xla_set_api(&_C_API_TABLE)


def xla_targets():
    """{target name: PyCapsule of its XLA FFI handler} (ffi/xla.c), for jax.ffi.register_ffi_target."""
    return {"cynorm_forward": PyCapsule_New(cn_xla_handler_address(0), NULL, NULL),
            "cynorm_backward": PyCapsule_New(cn_xla_handler_address(1), NULL, NULL),
            "cynorm_add_forward": PyCapsule_New(cn_xla_handler_address(2), NULL, NULL),
            "cynorm_add_backward": PyCapsule_New(cn_xla_handler_address(3), NULL, NULL)}


# ------------------------------------------------------------------ policy --

_PATHS = {CN_PATH_SMALL: "small rows in registers", CN_PATH_MEDIUM: "medium rows in blocks",
          CN_PATH_ROWS: "rows by chunks", CN_PATH_LONG: "long rows in groups",
          CN_PATH_TEAM: "team: columns split across threads"}
_POPULATE = {CN_POPULATE_NONE: "none", CN_POPULATE_AHEAD: "ahead", CN_POPULATE_SLABS: "slabs"}
_PARTS = {CN_PARTS_IN_PHASE_C: "phase C", CN_PARTS_BY_PAIRS: "phase A, pairs of rows",
          CN_PARTS_BY_CHUNK: "phase A, column chunks"}


def set_caches(int64_t l2_bytes, int64_t l3_bytes):
    """The machine's L2 (per core) and L3 sizes in bytes (0: unknown), read once by cynorm._isa."""
    MACHINE.l2_bytes = l2_bytes
    MACHINE.l3_bytes = l3_bytes
    cn_machine_update(&MACHINE)


def _tunable_index(str name):
    cdef int i = 0
    while cn_tunable_name(i) != NULL:
        if cn_tunable_name(i).decode() == name:
            return i
        i += 1
    raise KeyError(name)


def tunables():
    """{name: value in use}, the cache-derived ones resolved for this machine."""
    cdef cn_tunables t = MACHINE.tuned
    cdef int i = 0
    out = {}
    while cn_tunable_name(i) != NULL:
        out[cn_tunable_name(i).decode()] = cn_tunable_slot(&t, i)[0]
        i += 1
    return out


def _policy(str name, int64_t value=-1):
    """Read (value < 0) or set one tunable; returns the value in use before.

    For tests and tuning only (benchmarks/tunables.py). None changes a bit."""
    cdef int i = _tunable_index(name)
    cdef cn_tunables t = MACHINE.tuned
    old = cn_tunable_slot(&t, i)[0]
    if value >= 0:
        cn_tunable_slot(&cn_tune, i)[0] = value
        cn_machine_update(&MACHINE)
    return old


def reset_policy():
    """Every tunable back to its default."""
    cn_tunables_defaults(&cn_tune)
    cn_machine_update(&MACHINE)


def cache_tunables(int64_t l2_bytes, int64_t l3_bytes, int64_t long_row_bytes):
    """The cache-derived tunables as they come out for these caches (tests, show_config)."""
    cdef cn_machine m = MACHINE
    cdef cn_tunables base
    m.l2_bytes = l2_bytes
    m.l3_bytes = l3_bytes
    cn_tunables_defaults(&base)
    base.long_row_bytes = long_row_bytes
    cdef cn_tunables t = cn_tunables_for(&base, &m)
    return {"long_group_bytes": t.long_group_bytes, "parts_in_a_bytes": t.parts_in_a_bytes,
            "bwd_a_by_chunk": t.bwd_a_by_chunk, "fresh_plain_row_bytes": t.fresh_plain_row_bytes,
            "prefetch_into_l2": t.prefetch_into_l2}


def explain_call(bint backward, int pair, bint center, int64_t M, int64_t N, int num_threads, bint fresh,
                 uintptr_t out_addr, uintptr_t in_addr, int grads):
    """The policy cn_policy_for gives this call (cynorm.explain builds the arguments)."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    cdef cynorm_desc d
    cdef cn_call c
    _desc(&d, pair, center, M, N, 0.0, num_threads, True, fresh)
    _fill_call(&c, ops, &d, backward, 1)
    c.grads = grads
    c.out_addr = out_addr
    c.in_addr = in_addr
    cdef cn_policy p = cn_policy_for(&MACHINE, &c)
    out = {"threads": p.threads, "path": _PATHS[p.path], "group_rows": p.group_rows,
           "stream": bool(p.stream), "populate": _POPULATE[p.populate]}
    if p.populate == CN_POPULATE_SLABS:
        out["slab_rows"] = p.slab_rows
    if backward:
        out["block_rows"] = p.block_rows
        if p.path == CN_PATH_TEAM:
            out["partials_added_in"] = _PARTS[p.team_parts]
            out["prefetch_pieces"] = bool(p.prefetch_pieces)
        elif p.path == CN_PATH_ROWS:
            out["pass1_rows"] = p.pass1_rows
            out["partials_added_in"] = "pass 2" if p.late_parts else "pass 1"
            out["prefetch_rows_ahead"] = p.prefetch_rows
    else:
        out["prefetch_into"] = "L2" if p.prefetch_l2 else "L1"
        if p.path == CN_PATH_LONG:
            out["apply_chunk"] = p.apply_chunk
    return out


def threads_for(int64_t elems, int requested, int in_flight=1):
    """The thread count a call with this much work would use (introspection, tests)."""
    cdef cn_call c
    memset(&c, 0, sizeof(c))
    c.M = elems
    c.N = 1
    c.requested_threads = requested
    c.num_procs = omp_get_num_procs
    c.in_flight = in_flight
    c.in_parallel = omp_in_parallel()
    c.openmp = CN_OPENMP
    cdef cn_tunables t = MACHINE.tuned
    return cn_threads_for(&t, &c)


def block_rows(int64_t M, int64_t N, int acc_size):
    """Rows per dweight/dbias block of an array of M rows of N elements (acc_size:
    4, or 8 for float64): the order the backward adds rows in depends on it alone."""
    return cn_block_rows(M, N, acc_size)


def long_row_bytes():
    """Rows longer than this many bytes take the long-row paths."""
    return cn_tune.long_row_bytes


def small_row_limit(int pair):
    """Rows up to this length take the in-register kernels at the level in use."""
    return cn_get_ops(pair).small_max


# --------------------------------------------------------------- reference --

cdef inline const float *_f32(object a):
    return NULL if a is None else <const float *>cnp.PyArray_DATA(<cnp.ndarray>a)


def reference_forward(cnp.ndarray x, object weight, object bias, double eps, bint center):
    """kernels/reference.c, the row math in plain scalar C, over the rows of a
    2-D C-contiguous float32 x (for the tests): (y, mean, rstd)."""
    import numpy as np
    cdef int64_t M = x.shape[0], N = x.shape[1], i
    y = np.empty_like(x)
    mean = np.empty(M, np.float32)
    rstd = np.empty(M, np.float32)
    for i in range(M):
        cn_reference_forward(_f32(x) + i * N, N, _f32(weight), _f32(bias), eps, center,
                             <float *>cnp.PyArray_DATA(<cnp.ndarray>y) + i * N,
                             <float *>cnp.PyArray_DATA(<cnp.ndarray>mean) + i,
                             <float *>cnp.PyArray_DATA(<cnp.ndarray>rstd) + i)
    return y, mean, rstd


def reference_backward(cnp.ndarray dy, cnp.ndarray x, object mean, cnp.ndarray rstd, object weight, bint center):
    """kernels/reference.c's backward over the rows (for the tests): (dx, dweight, dbias) in float64 sums."""
    import numpy as np
    cdef int64_t M = x.shape[0], N = x.shape[1], i
    dx = np.empty_like(x)
    dw = np.zeros(N, np.float64)
    db = np.zeros(N, np.float64)
    cdef const float *m = _f32(mean)
    for i in range(M):
        cn_reference_backward(_f32(dy) + i * N, _f32(x) + i * N, N, _f32(weight), m[i] if center else 0.0,
                              _f32(rstd)[i], center, <float *>cnp.PyArray_DATA(<cnp.ndarray>dx) + i * N,
                              <double *>cnp.PyArray_DATA(<cnp.ndarray>dw), <double *>cnp.PyArray_DATA(<cnp.ndarray>db))
    return dx, dw, db


# ------------------------------------------------------------- introspection --

def _share_edges(size_t lo, size_t hi, int64_t T):
    """The T + 1 edges at which threads split a fresh output's page population (for the tests)."""
    return [cn_share_edge(lo, hi, t, T) for t in range(T + 1)]


def openmp():
    """True when this module was built with OpenMP."""
    return bool(CN_OPENMP)


def max_threads():
    """omp_get_max_threads() for the calling thread (1 without OpenMP)."""
    return omp_get_max_threads()


def omp_probe(int64_t n):
    """Threads a default-sized parallel region gets (as threadpoolctl's own test
    helper measures it): omp_get_num_threads() from inside a prange."""
    cdef int64_t i, total = 0
    cdef int nthreads = 1
    for i in prange(n, nogil=True, schedule='static'):
        nthreads = omp_get_num_threads()
        total += i
    if total != n * (n - 1) // 2:
        raise AssertionError("omp_probe: wrong sum")
    return nthreads


def f32_to_bf16(cnp.ndarray src, cnp.ndarray dst):
    """Vector-path conversion, for tests: float32 -> bfloat16 bits (uint16)."""
    LEVEL.f32_to_bf16(<const float *>cnp.PyArray_DATA(src), <uint16_t *>cnp.PyArray_DATA(dst), src.size)


def f32_to_f16(cnp.ndarray src, cnp.ndarray dst):
    """Vector-path conversion, for tests: float32 -> float16 bits (uint16)."""
    LEVEL.f32_to_f16(<const float *>cnp.PyArray_DATA(src), <uint16_t *>cnp.PyArray_DATA(dst), src.size)


def f16_to_f32(cnp.ndarray src, cnp.ndarray dst):
    """Vector-path conversion, for tests: float16 bits (uint16) -> float32."""
    LEVEL.f16_to_f32(<const uint16_t *>cnp.PyArray_DATA(src), <float *>cnp.PyArray_DATA(dst), src.size)
