# Fused residual add + norm (included by _core.pyx after _drivers.pxi): the C
# entry points add_forward/add_backward (include/cynorm.h) and their drivers.
# Forward: each thread adds a few rows of h (policy.fused_rows: they stay in
# cache), then normalizes them with the plain row kernels -- so y, mean and
# rstd are the plain forward's on h, bit for bit. Backward: the plain
# backward with dh added to dx in the kernels' store (cn_bwd_args.dh).

cdef struct cn_fused_fwd:
    const cn_ops *ops_x     # x's kernel: the residual add
    const void *x
    const void *residual
    void *h
    int r_wide, h_wide      # residual / h are float32 while x is 16-bit
    int narrow              # y is x's 16-bit dtype while h is float32: 1 bf16, 2 f16 (0: y is h's dtype)
    bint fresh_h            # h was just allocated (its pages are not in yet)
    bint stream_h           # h streamed to memory (from a buffer), where the policy would stream y


cdef bint _add_desc_ok(const cynorm_add_desc *d, bint backward) noexcept nogil:
    """The dtypes of a fused call: h is x's dtype or, for 16-bit x, float32 (x's
    accumulator); the residual (forward) and dsum (backward) are x's or h's dtype;
    params as for the plain norms on x."""
    cdef int x = d.base.x_dtype, h = d.h_dtype
    if not _desc_ok(&d.base) or _pair_of(d.base.x_dtype, d.base.param_dtype) < 0:
        return False
    # h: x's dtype or x's accumulator dtype (the float32 residual stream of 16-bit x)
    if not (h == x or h == cn_kernel_rows[cn_kernel_rows[_kernel_of(x)].acc].code):
        return False
    if backward:
        return d.dsum_dtype == x or d.dsum_dtype == h
    return ((d.residual_dtype == x or d.residual_dtype == h)
            and d.base.eps >= 0.0 and d.base.eps <= 1.7976931348623157e308)


cdef int _call_threads(const cynorm_desc *d, const cn_ops *ops) noexcept nogil:
    """Threads for the whole-array conversions around a fused call: the policy's
    thread count for a call of this shape (cn_threads_for)."""
    cdef cn_call call
    _fill_call(&call, ops, d, 1, 1)
    return cn_threads_for(&MACHINE.tuned, &call)


cdef void _convert_share(int kind, const void *src, void *dst, int64_t n, int64_t t, int64_t T) noexcept nogil:
    """Share t of T of an n-element conversion. kind > 0: float32 -> 16-bit (1 bf16,
    2 f16, rounded once); kind < 0: 16-bit -> float32 (-1 bf16, -2 f16, exact)."""
    cdef int64_t s0 = n * t // T, s1 = n * (t + 1) // T
    if kind > 0:
        _narrow(kind, <const float *>src + s0, <uint16_t *>dst + s0, s1 - s0)
    else:
        _widen(-kind, <const uint16_t *>src + s0, <float *>dst + s0, s1 - s0)


cdef void _convert_all(int kind, const void *src, void *dst, int64_t n, int T) noexcept nogil:
    cdef int64_t t
    if T <= 1:
        _convert_share(kind, src, dst, n, 0, 1)
        return
    for t in prange(T, schedule='static', num_threads=T):
        _convert_share(kind, src, dst, n, t, T)


# ---------------------------------------------------------------- forward --

cdef void _fused_rows(const cn_ops *ops, const cn_fwd_args *a, const cn_fused_fwd *f, const cn_policy *pol,
                      int64_t r0, int64_t r1, float *ybuf, char *hbuf) noexcept nogil:
    """Rows [r0, r1): a few rows of h at a time, then those rows normalized
    from cache (into ybuf and rounded to y's dtype when f.narrow). With
    f.stream_h the rows of h are added into hbuf and streamed to h from there:
    stored plainly, each line of h would first be read from memory."""
    cdef cn_fwd_args rows = a[0]
    cdef int64_t N = a.N, step = pol.fused_rows, r = r0, n
    cdef int64_t xs = f.ops_x.x_size, hs = ops.x_size, rs = 4 if f.r_wide else xs, acc = ops.acc_size
    rows.pol = pol
    while r < r1:
        n = _min(step, r1 - r)
        rows.x = <const char *>hbuf if f.stream_h else <const char *>f.h + r * N * hs
        f.ops_x.add_residual(<const char *>f.x + r * N * xs, <const char *>f.residual + r * N * rs, f.r_wide,
                             <void *>rows.x, f.h_wide, n * N)
        rows.y = <void *>ybuf if f.narrow else <void *>(<char *>a.y + r * N * hs)
        rows.mean = NULL if a.mean == NULL else <void *>(<char *>a.mean + r * acc)
        rows.rstd = <char *>a.rstd + r * acc
        rows.M = n
        ops.fwd_rows(&rows, 0, n)
        if f.narrow:
            _narrow(f.narrow, ybuf, <char *>a.y + r * N * 2, n * N)
        if f.stream_h:
            cn_copy_stream(<char *>f.h + r * N * hs, hbuf, n * N * hs)
        r += n
    if f.stream_h:
        cn_stream_fence()


cdef void _add_share(const cn_fused_fwd *f, int64_t hs, int64_t n, int64_t t, int64_t T) noexcept nogil:
    cdef int64_t s0 = n * t // T, s1 = n * (t + 1) // T
    cdef int64_t xs = f.ops_x.x_size, rs = 4 if f.r_wide else xs
    f.ops_x.add_residual(<const char *>f.x + s0 * xs, <const char *>f.residual + s0 * rs, f.r_wide,
                         <char *>f.h + s0 * hs, f.h_wide, s1 - s0)


cdef int _forward_fused(const cn_ops *ops, const cn_fwd_args *a, const cn_fused_fwd *f) noexcept nogil:
    """The fused forward; ops is h's kernel, a.x is h."""
    cdef cn_policy pol = a.pol[0]
    cdef int T = pol.threads
    cdef int64_t M = a.M, N = a.N, t
    cdef cn_fwd_args whole = a[0]
    cdef float *ybuf = NULL
    cdef char *hbuf = NULL
    cdef cn_fused_fwd rows_f = f[0]
    if f.narrow:   # y goes through a float32 buffer that is read right back: plain stores into it
        pol.stream = 0
    if pol.path != CN_PATH_TEAM or f.narrow:
        # fresh pages fault in as the rows are written: faulting y and h in ahead,
        # slab by slab or chunk by chunk, measured no faster (benchmarks/README.md)
        pol.populate = CN_POPULATE_NONE
    if pol.path == CN_PATH_TEAM:
        # long rows split across threads: all of h first, then the plain forward on it
        for t in prange(T, schedule='static', num_threads=T):
            _add_share(f, ops.x_size, M * N, t, T)
        whole.pol = &pol
        if f.narrow:
            ybuf = <float *>malloc(M * N * sizeof(float))
            if ybuf == NULL:
                return -1
            whole.y = ybuf
        if _forward(ops, &whole) != 0:
            free(ybuf)
            return -1
        if f.narrow:
            _convert_all(f.narrow, ybuf, a.y, M * N, T)
        free(ybuf)
        return 0
    cdef int64_t chunk = pol.fused_rows * N
    if f.narrow:
        ybuf = <float *>malloc(T * chunk * sizeof(float))
        if ybuf == NULL:
            return -1
    if rows_f.stream_h:
        hbuf = <char *>malloc(T * chunk * ops.x_size + 64)
        if hbuf == NULL:
            free(ybuf)
            return -1
    if T <= 1:
        _fused_rows(ops, a, &rows_f, &pol, 0, M, ybuf, hbuf)
    else:
        for t in prange(T, schedule='static', num_threads=T):
            _fused_rows(ops, a, &rows_f, &pol, (M * t) // T, (M * (t + 1)) // T,
                        ybuf + t * chunk if ybuf != NULL else NULL,
                        hbuf + t * chunk * ops.x_size if hbuf != NULL else NULL)
    free(ybuf)
    free(hbuf)
    return 0


cdef int _c_add_forward(const cynorm_add_desc *d, const cynorm_add_fwd_bufs *b) noexcept nogil:
    if not _add_desc_ok(d, False) or b.x == NULL or b.residual == NULL or b.y == NULL or b.h == NULL:
        return CYNORM_EINVAL
    cdef int x = d.base.x_dtype, h = d.h_dtype
    cdef cynorm_desc inner = d.base
    cdef cn_fused_fwd f
    cdef cynorm_fwd_bufs fb
    inner.x_dtype = h
    f.ops_x = LEVEL.kernels[_kernel_of(x)]
    f.x = b.x
    f.residual = b.residual
    f.h = b.h
    f.r_wide = d.residual_dtype != x
    f.h_wide = h != x
    f.narrow = 0 if h == x else _half_of(x)
    f.fresh_h = (d.base.flags & CYNORM_FRESH_H) != 0
    f.stream_h = False  # (decided by the policy: _forward_impl)
    fb.x = b.h
    fb.y = b.y
    fb.weight = b.weight
    fb.bias = b.bias
    fb.mean = b.mean
    fb.rstd = b.rstd
    return _forward_impl(&inner, &fb, LEVEL.kernels[_kernel_of(h)], _half_of(d.base.param_dtype), &f)


# --------------------------------------------------------------- backward --

cdef int _c_add_backward(const cynorm_add_desc *d, const cynorm_add_bwd_bufs *b) noexcept nogil:
    if not _add_desc_ok(d, True):
        return CYNORM_EINVAL
    cdef int x = d.base.x_dtype, h = d.h_dtype
    cdef int64_t n = d.base.rows * d.base.cols
    cdef cynorm_desc inner = d.base
    cdef cynorm_bwd_bufs bb
    cdef float *dy32 = NULL
    cdef float *dsum32 = NULL
    cdef int rc, T
    inner.x_dtype = h
    bb.dy = b.dy
    bb.x = b.h
    bb.mean = b.mean
    bb.rstd = b.rstd
    bb.weight = b.weight
    bb.dx = b.dsum
    bb.dweight = b.dweight
    bb.dbias = b.dbias
    bb.dweight_blocks = b.dweight_blocks
    bb.dbias_blocks = b.dbias_blocks
    if not _bwd_bufs_ok(&d.base, &bb):
        return CYNORM_EINVAL
    T = _call_threads(&inner, LEVEL.kernels[_kernel_of(h)])
    if h != x and n > 0:
        # float32 h under 16-bit dy: h's kernel takes dy widened (exact); a 16-bit
        # dsum is its float32 dx + dh, rounded once afterwards
        dy32 = <float *>malloc(n * sizeof(float))
        if dy32 == NULL:
            return CYNORM_ENOMEM
        _convert_all(-_half_of(x), b.dy, dy32, n, T)
        bb.dy = dy32
        if d.dsum_dtype != h:
            dsum32 = <float *>malloc(n * sizeof(float))
            if dsum32 == NULL:
                free(dy32)
                return CYNORM_ENOMEM
            bb.dx = dsum32
    rc = _backward_impl(&inner, &bb, LEVEL.kernels[_kernel_of(h)], _half_of(d.base.param_dtype), b.dh)
    if rc == CYNORM_OK and dsum32 != NULL:
        _convert_all(_half_of(x), dsum32, b.dsum, n, T)
    free(dy32)
    free(dsum32)
    return rc
