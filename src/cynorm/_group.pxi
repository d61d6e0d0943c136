# GroupNorm's drivers (included by _core.pyx; kernels/cn_gfwd.h, cn_gbwd.h).
# Channels-first calls split the rows (sample, group) among the threads,
# channels-last calls the samples; a row's or a sample's arithmetic never
# depends on which thread takes it. The thread count comes from the policy
# (cn_policy_for), as a LayerNorm call over the same rows would get it.


cdef int _gn_plan(const cn_ops *ops, int64_t N, int64_t C, int64_t S, int64_t G, bint channels_last,
                  uintptr_t out, int num_threads, bint backward, int in_flight, int *stream) noexcept nogil:
    """A call's thread count, from the policy of LayerNorm over the same (sample, group) rows
    and at most its units (samples channels-last, rows channels-first), and in stream[0]
    whether its y or dx streams (cn_gn_streams); out: that output's address (0: a fresh one)."""
    cdef cn_call c
    _fill_call_rows(&c, ops, N * G, C // G * S, num_threads, False, backward, in_flight)
    c.out_addr = out
    cdef cn_policy p = cn_policy_for(&MACHINE, &c)
    stream[0] = cn_gn_streams(&p, &c, C if channels_last else S)
    cdef int64_t units = N if channels_last else N * G
    return <int>_min(p.threads, units) if units > 0 else 1


cdef float *_gn_params(int half, const void **w, const void **b, int64_t C) noexcept nogil:
    """16-bit params widened to float32 (the kernel takes them so); NULL if none or not needed."""
    if not half or (w[0] == NULL and b[0] == NULL):
        return NULL
    cdef float *wide = <float *>malloc(2 * C * sizeof(float))
    if wide == NULL:
        return NULL
    if w[0] != NULL:
        _widen(half, w[0], wide, C)
        w[0] = wide
    if b[0] != NULL:
        _widen(half, b[0], wide + C, C)
        b[0] = wide + C
    return wide


cdef inline bint _group_desc_ok(const cynorm_group_desc *d) noexcept nogil:
    return (d.batch >= 0 and d.channels >= 1 and d.spatial >= 1 and d.groups >= 1 and d.channels % d.groups == 0
            and (d.channels_last == 0 or d.channels_last == 1) and d.num_threads >= 0 and LEVEL != NULL)


cdef int _c_group_forward(const cynorm_group_desc *d, const cynorm_group_fwd_bufs *b) noexcept nogil:
    """The C entry point's GroupNorm forward (cynorm.h)."""
    cdef int pair = _pair_of(d.x_dtype, d.param_dtype)
    if pair < 0 or not _group_desc_ok(d) or not (d.eps >= 0.0 and d.eps <= 1.7976931348623157e308):
        return CYNORM_EINVAL
    if d.batch == 0:
        return CYNORM_OK
    if b.x == NULL or b.y == NULL or b.mean == NULL or b.rstd == NULL:
        return CYNORM_EINVAL
    if d.param_dtype == CYNORM_NO_PARAMS and (b.weight != NULL or b.bias != NULL):
        return CYNORM_EINVAL
    cdef const cn_ops *ops = cn_get_ops(pair)
    cdef cn_gn_fwd_args a
    a.x, a.y, a.w, a.b, a.mean, a.rstd = b.x, b.y, b.weight, b.bias, b.mean, b.rstd
    a.N, a.C, a.S, a.G = d.batch, d.channels, d.spatial, d.groups
    a.eps = d.eps
    a.channels_last = d.channels_last
    cdef int half = _widened(pair)
    cdef float *wide = _gn_params(half, &a.w, &a.b, a.C)
    if half and (b.weight != NULL or b.bias != NULL) and wide == NULL:
        return CYNORM_ENOMEM
    cdef int64_t units = a.N if a.channels_last else a.N * a.G
    cdef int T = _gn_plan(ops, a.N, a.C, a.S, a.G, a.channels_last, <uintptr_t>a.y, d.num_threads, False,
                          cn_enter_call(), &a.stream)
    cdef int64_t per = CN_GN_SCRATCH(a.C, a.stream)
    cdef double *scratch = NULL
    cdef int t
    cdef int rc = CYNORM_OK
    if a.channels_last:
        scratch = <double *>malloc(T * per * sizeof(double))
        if scratch == NULL:
            rc = CYNORM_ENOMEM
    if rc == CYNORM_OK:
        if T <= 1:
            if a.channels_last:
                ops.gn_fwd_samples(&a, 0, a.N, scratch)
            else:
                ops.gn_fwd_rows(&a, 0, units)
            if a.stream:
                cn_stream_fence()
        else:
            for t in prange(T, schedule='static', num_threads=T):
                if a.channels_last:
                    ops.gn_fwd_samples(&a, (units * t) // T, (units * (t + 1)) // T, scratch + t * per)
                else:
                    ops.gn_fwd_rows(&a, (units * t) // T, (units * (t + 1)) // T)
                if a.stream:
                    cn_stream_fence()   # make this thread's non-temporal stores visible
    cn_leave_call()
    free(scratch)
    free(wide)
    return rc


cdef int _c_group_backward(const cynorm_group_desc *d, const cynorm_group_bwd_bufs *b) noexcept nogil:
    """The C entry point's GroupNorm backward (cynorm.h): dx; dweight/dbias from the
    samples' terms added in order and rounded once (via float32 for 16-bit params)."""
    cdef int pair = _pair_of(d.x_dtype, d.param_dtype)
    if pair < 0 or not _group_desc_ok(d):
        return CYNORM_EINVAL
    if (b.dweight == NULL) != (b.dbias == NULL) or (b.dweight != NULL and b.weight == NULL):
        return CYNORM_EINVAL
    if d.param_dtype == CYNORM_NO_PARAMS and b.weight != NULL:
        return CYNORM_EINVAL
    cdef int64_t N = d.batch, C = d.channels
    if N > 0 and (b.dy == NULL or b.x == NULL or b.mean == NULL or b.rstd == NULL or b.dx == NULL):
        return CYNORM_EINVAL
    cdef const cn_ops *ops = cn_get_ops(pair)
    cdef cn_gn_bwd_args a
    a.dy, a.x, a.mean, a.rstd, a.w, a.dx = b.dy, b.x, b.mean, b.rstd, b.weight, b.dx
    a.N, a.C, a.S, a.G = N, C, d.spatial, d.groups
    a.channels_last = d.channels_last
    cdef const void *no_bias = NULL
    cdef int half = _widened(pair)
    cdef float *wide = _gn_params(half, &a.w, &no_bias, C)
    if half and b.weight != NULL and wide == NULL:
        return CYNORM_ENOMEM
    cdef double *part = b.terms
    cdef double *sums = <double *>calloc(2 * C, sizeof(double))
    if part == NULL:
        part = <double *>malloc((N if N > 0 else 1) * 2 * C * sizeof(double))
    cdef int64_t units = N if a.channels_last else N * a.G
    cdef int T = _gn_plan(ops, N, C, a.S, a.G, a.channels_last, <uintptr_t>a.dx, d.num_threads, True,
                          cn_enter_call(), &a.stream)
    cdef int64_t per = CN_GN_SCRATCH(C, a.stream)
    cdef double *scratch = NULL
    cdef int t
    cdef int rc = CYNORM_OK
    if a.channels_last:
        scratch = <double *>malloc(T * per * sizeof(double))
    if part == NULL or sums == NULL or (a.channels_last and scratch == NULL):
        rc = CYNORM_ENOMEM
    if rc == CYNORM_OK and N > 0:
        if T <= 1:
            if a.channels_last:
                ops.gn_bwd_samples(&a, 0, N, part, scratch)
            else:
                ops.gn_bwd_rows(&a, 0, units, part)
            if a.stream:
                cn_stream_fence()
        else:
            for t in prange(T, schedule='static', num_threads=T):
                if a.channels_last:
                    ops.gn_bwd_samples(&a, (units * t) // T, (units * (t + 1)) // T, part, scratch + t * per)
                else:
                    ops.gn_bwd_rows(&a, (units * t) // T, (units * (t + 1)) // T, part)
                if a.stream:
                    cn_stream_fence()   # make this thread's non-temporal stores visible
    cn_leave_call()
    if rc == CYNORM_OK and b.dweight != NULL:
        _group_grads(part, N, C, pair, sums, b.dweight, b.dbias)
    free(scratch)
    free(sums)
    if part != b.terms:
        free(part)
    free(wide)
    return rc


cdef void _group_grads(const double *part, int64_t N, int64_t C, int pair, double *sums, void *dweight,
                       void *dbias) noexcept nogil:
    """dweight, dbias from N samples' terms (part: N x 2 x C): added sample after sample
    into sums (2C zeros), the order depending on N alone, then rounded once."""
    cdef int64_t n, j
    for n in range(N):
        for j in range(2 * C):
            sums[j] += part[n * 2 * C + j]
    _group_round(sums, dweight, C, pair)
    _group_round(sums + C, dbias, C, pair)


cdef void _group_round(const double *src, void *dst, int64_t C, int pair) noexcept nogil:
    """float64 sums into the pair's gradient dtype: float64 as they are; float32 once;
    16-bit via float32 (the level's conversion, as every 16-bit output)."""
    cdef int64_t j
    cdef int param = cn_pair_rows[pair].param
    cdef float *tmp
    if param == CYNORM_F64:
        for j in range(C):
            (<double *>dst)[j] = src[j]
    elif param == CYNORM_F32:
        for j in range(C):
            (<float *>dst)[j] = <float>src[j]
    else:
        tmp = <float *>malloc(C * sizeof(float))
        if tmp != NULL:
            for j in range(C):
                tmp[j] = <float>src[j]
            _narrow(_half_of(param), tmp, dst, C)
        free(tmp)


_C_API_TABLE.group_forward = _c_group_forward
_C_API_TABLE.group_backward = _c_group_backward


cdef inline int _group_desc(cynorm_group_desc *d, int pair, bint has_params, int64_t N, int64_t C, int64_t S,
                            int64_t G, bint channels_last, double eps, int num_threads) noexcept:
    d.x_dtype = cn_pair_rows[pair].x
    d.param_dtype = cn_pair_rows[pair].param if has_params else CYNORM_NO_PARAMS
    d.batch, d.channels, d.spatial, d.groups = N, C, S, G
    d.channels_last = channels_last
    d.eps = eps
    d.num_threads = num_threads
    return 0


def group_forward(int pair, cnp.ndarray x, cnp.ndarray y, object weight, object bias, cnp.ndarray mean,
                  cnp.ndarray rstd, int64_t N, int64_t C, int64_t S, int64_t G, double eps, bint channels_last,
                  int num_threads):
    """GroupNorm forward through the C entry point, on checked C-contiguous arrays: x and y
    (N, C, S) or (N, S, C) (channels_last), weight/bias (C,) or None, mean/rstd (N, G)."""
    if pair < 0 or pair >= CN_NUM_PAIRS:
        raise ValueError(f"unknown kernel pair {pair}")
    weight = _contig(weight)
    bias = _contig(bias)
    cdef cynorm_group_desc d
    cdef cynorm_group_fwd_bufs b
    _group_desc(&d, pair, weight is not None or bias is not None, N, C, S, G, channels_last, eps, num_threads)
    b.x, b.y, b.weight, b.bias, b.mean, b.rstd = _data(x), _data(y), _data(weight), _data(bias), _data(mean), _data(rstd)
    cdef int rc
    with nogil:
        rc = _c_group_forward(&d, &b)
    _check(rc)


def group_backward(int pair, cnp.ndarray dy, cnp.ndarray x, cnp.ndarray mean, cnp.ndarray rstd, object weight,
                   cnp.ndarray dx, object dweight, object dbias, object terms, int64_t N, int64_t C, int64_t S,
                   int64_t G, bint channels_last, int num_threads):
    """GroupNorm backward through the C entry point: dx; dweight/dbias (param dtype) when
    given; each sample's terms into `terms` (float64 (N, 2, C)) when given."""
    if pair < 0 or pair >= CN_NUM_PAIRS:
        raise ValueError(f"unknown kernel pair {pair}")
    weight = _contig(weight)
    cdef cynorm_group_desc d
    cdef cynorm_group_bwd_bufs b
    _group_desc(&d, pair, weight is not None, N, C, S, G, channels_last, 0.0, num_threads)
    b.dy, b.x, b.mean, b.rstd, b.weight, b.dx = _data(dy), _data(x), _data(mean), _data(rstd), _data(weight), _data(dx)
    b.dweight, b.dbias = _data(dweight), _data(dbias)
    b.terms = <double *>_data(terms)
    cdef int rc
    with nogil:
        rc = _c_group_backward(&d, &b)
    _check(rc)


def group_param_grads(int pair, cnp.ndarray part, object grad_dtype):
    """(dweight, dbias) in the pair's gradient dtype from samples' terms (C-contiguous
    float64 (N, 2, C)), as _c_group_backward makes them: cynorm.dask adds its chunks'
    terms here, concatenated in batch order."""
    cdef int64_t N = part.shape[0], C = part.shape[2]
    dw, db = np.empty(C, grad_dtype), np.empty(C, grad_dtype)
    sums = np.zeros(2 * C, np.float64)
    cdef const double *p = <const double *>_data(part)
    cdef double *s = <double *>_data(sums)
    cdef void *w = _data(dw)
    cdef void *b = _data(db)
    with nogil:
        _group_grads(p, N, C, pair, s, w, b)
    return dw, db


def group_explain_call(int pair, int64_t N, int64_t C, int64_t S, int64_t G, bint channels_last, int num_threads,
                       bint backward, uintptr_t out_addr):
    """How a GroupNorm call would split its work (cynorm.explain builds the arguments): the
    threads _gn_plan gives it, what each thread takes, whether its y or dx streams (out_addr:
    that output's address, 0 for a fresh one), and the policy class of the LayerNorm call over
    the same rows that the thread count comes from."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    cdef int stream = 0
    cdef int T = _gn_plan(ops, N, C, S, G, channels_last, out_addr, num_threads, backward, 1, &stream)
    cdef cn_call c
    _fill_call_rows(&c, ops, N * G, C // G * S, num_threads, False, backward, 1)
    return {"threads": T, "class": cn_class_of(&c, T),
            "split": "samples" if channels_last else "rows (sample, group)",
            "units": N if channels_last else N * G,
            "scratch_bytes_per_thread": CN_GN_SCRATCH(C, stream) * 8 if channels_last else 0, "stream": bool(stream)}
