# Introspection (included by _core.pyx): the policy's tunables and a call's
# policy (cynorm.explain, benchmarks/tunables.py), the scalar reference of the
# row math, OpenMP facts, and probes of the level's vector conversions (tests).

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


def tunable_names():
    """{name: what it decides}, in cn_policy.h's order."""
    return {cn_tunable_name(i).decode(): cn_tunable_what(i).decode() for i in range(CN_NUM_TUNABLES)}


def tunables(int cls=-1):
    """{name: value in use}, the cache-derived ones resolved for this machine; with a
    class index, the values a call of that class runs with (its measured ones included)."""
    cdef const cn_tunables *t = cn_machine_tunables(&MACHINE, cls)
    cdef cn_tunables copy = t[0]
    return {cn_tunable_name(i).decode(): cn_tunable_slot(&copy, i)[0] for i in range(CN_NUM_TUNABLES)}


def _policy(str name, int64_t value=-1):
    """Read (value < 0) or set one tunable for every call; returns the value in use before.

    For tests and tuning only (benchmarks/tunables.py). None changes a bit."""
    cdef int i = _tunable_index(name)
    cdef cn_tunables t = MACHINE.tuned
    old = cn_tunable_slot(&t, i)[0]
    if value >= 0:
        cn_tunable_slot(&cn_tune, i)[0] = value
        cn_machine_update(&MACHINE)
    return old


def reset_policy():
    """Every tunable back to its default, and no measured values."""
    cn_tunables_defaults(&cn_tune)
    cn_machine_clear_classes(&MACHINE)
    cn_machine_update(&MACHINE)


def set_oversubscribe(bint allow):
    """Allow calls more threads than cores (CYNORM_OVERSUBSCRIBE=1; tests); returns the setting before."""
    old = bool(MACHINE.oversubscribe)
    MACHINE.oversubscribe = allow
    return old


def class_names():
    """The classes a measured policy holds tunables for, by index (cn_class_of)."""
    rows = ("rows of <= 64", "rows of <= 8 KB", "rows of <= 64 KB", "longer rows")
    return [f"{d} {w}, {r}, {t}" for d in ("fwd", "bwd") for w in ("16-bit", "32/64-bit") for r in rows
            for t in ("1 thread", "threads")]


def class_of(bint backward, int pair, int64_t M, int64_t N, int threads):
    """The class index of such a call running on `threads` threads."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    cdef cynorm_desc d
    cdef cn_call c
    _desc(&d, pair, True, M, N, 0.0, threads, True, False)
    _fill_call(&c, ops, &d, backward, 1)
    return cn_class_of(&c, threads)


def set_class_tunables(dict values):
    """A measured policy: {class index: {tunable: value}}, replacing any before ({}: none)."""
    cn_machine_clear_classes(&MACHINE)
    for cls, named in values.items():
        if not 0 <= cls < CN_NUM_CLASSES:
            raise ValueError(f"class {cls} is not in 0..{CN_NUM_CLASSES - 1}")
        for name, value in named.items():
            cn_machine_set_class_value(&MACHINE, cls, _tunable_index(name), value)
    cn_machine_update(&MACHINE)


def class_tunables():
    """The measured policy in use: {class index: {tunable: value}} (the classes with any)."""
    cdef int64_t v
    out = {}
    for c in range(CN_NUM_CLASSES):
        for i in range(CN_NUM_TUNABLES):
            if cn_machine_class_value(&MACHINE, c, i, &v):
                out.setdefault(c, {})[cn_tunable_name(i).decode()] = v
    return out


def cache_tunables(int64_t l2_bytes, int64_t l3_bytes, int64_t long_row_bytes):
    """The cache-derived tunables as they come out for these caches (tests, show_config)."""
    cdef cn_machine m = MACHINE
    cdef cn_tunables base
    m.l2_bytes = l2_bytes
    m.l3_bytes = l3_bytes
    cn_tunables_defaults(&base)
    base.long_row_bytes = long_row_bytes
    cdef cn_tunables t = cn_tunables_for(&base, &m)
    return {name: cn_tunable_slot(&t, _tunable_index(name))[0]
            for name in ("long_group_bytes", "parts_in_a_bytes", "bwd_a_by_chunk", "fresh_plain_row_bytes",
                         "short_prefetch_bytes")}


def explain_call(bint backward, int pair, bint center, int64_t M, int64_t N, int num_threads, bint fresh,
                 uintptr_t out_addr, uintptr_t in_addr, int grads, bint every_field=False):
    """The policy cn_policy_for gives this call (cynorm.explain builds the arguments):
    the fields explain() shows, or every_field: all of cn_policy, as a dict."""
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
    if every_field:
        return p
    out = {"threads": p.threads, "class": cn_class_of(&c, p.threads), "path": _PATHS[p.path],
           "group_rows": p.group_rows,
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
        if p.path == CN_PATH_ROWS or p.path == CN_PATH_SMALL:
            out["prefetch_rows_ahead"] = p.prefetch_rows
    else:
        out["prefetch_into"] = "L2" if p.prefetch_l2 else "L1"
        if p.path == CN_PATH_SMALL or p.path == CN_PATH_MEDIUM:
            out["prefetch_rows_ahead"] = p.prefetch_rows
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
    c.oversubscribe = MACHINE.oversubscribe
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
