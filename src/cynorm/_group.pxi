# GroupNorm's drivers (included by _core.pyx; kernels/cn_gfwd.h, cn_gbwd.h).
# Channels-first calls split the rows (sample, group) among the threads,
# channels-last calls the samples; a row's or a sample's arithmetic never
# depends on which thread takes it. The thread count comes from the policy
# (cn_policy_for), as a LayerNorm call over the same rows would get it.


cdef int _gn_threads(const cn_ops *ops, int64_t rows, int64_t L, int64_t units, int num_threads,
                     bint backward, int in_flight) noexcept nogil:
    cdef cn_call c
    memset(&c, 0, sizeof(c))
    c.backward = backward
    c.M = rows
    c.N = L
    c.x_size = ops.x_size
    c.acc_size = ops.acc_size
    c.small_max = ops.small_max
    c.multirow_stream = ops.multirow_stream
    c.requested_threads = num_threads if num_threads > 0 else omp_get_max_threads()
    c.num_procs = omp_get_num_procs
    c.in_flight = in_flight
    c.in_parallel = omp_in_parallel()
    c.oversubscribe = MACHINE.oversubscribe
    c.openmp = CN_OPENMP
    cdef int T = cn_policy_for(&MACHINE, &c).threads
    return <int>_min(T, units) if units > 0 else 1


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


def group_forward(int pair, cnp.ndarray x, cnp.ndarray y, object weight, object bias, cnp.ndarray mean,
                  cnp.ndarray rstd, int64_t N, int64_t C, int64_t S, int64_t G, double eps, bint channels_last,
                  int num_threads):
    """GroupNorm forward on checked C-contiguous arrays: x and y (N, C, S) or (N, S, C)
    (channels_last), weight/bias (C,) or None, mean/rstd (N, G)."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    weight = _contig(weight)
    bias = _contig(bias)
    cdef cn_gn_fwd_args a
    a.x = _data(x)
    a.y = _data(y)
    a.w = _data(weight)
    a.b = _data(bias)
    a.mean = _data(mean)
    a.rstd = _data(rstd)
    a.N, a.C, a.S, a.G = N, C, S, G
    a.eps = eps
    a.channels_last = channels_last
    cdef int half = _widened(pair)
    cdef float *wide = _gn_params(half, &a.w, &a.b, C)
    if half and (weight is not None or bias is not None) and wide == NULL:
        raise MemoryError("cynorm: out of memory for the widened params")
    cdef int64_t units = N if channels_last else N * G
    cdef int T, t
    cdef double *scratch = NULL
    cdef int64_t per = CN_GN_SCRATCH(C)
    with nogil:
        T = _gn_threads(ops, N * G, C // G * S, units, num_threads, False, cn_enter_call())
        if channels_last:
            scratch = <double *>malloc(T * per * sizeof(double))
        if not channels_last or scratch != NULL:
            if T <= 1:
                if channels_last:
                    ops.gn_fwd_samples(&a, 0, N, scratch)
                else:
                    ops.gn_fwd_rows(&a, 0, units)
            else:
                for t in prange(T, schedule='static', num_threads=T):
                    if channels_last:
                        ops.gn_fwd_samples(&a, (units * t) // T, (units * (t + 1)) // T, scratch + t * per)
                    else:
                        ops.gn_fwd_rows(&a, (units * t) // T, (units * (t + 1)) // T)
        cn_leave_call()
    free(wide)
    if channels_last and scratch == NULL:
        raise MemoryError("cynorm: out of memory for GroupNorm's scratch")
    free(scratch)


def group_backward(int pair, cnp.ndarray dy, cnp.ndarray x, cnp.ndarray mean, cnp.ndarray rstd, object weight,
                   cnp.ndarray dx, cnp.ndarray part, int64_t N, int64_t C, int64_t S, int64_t G,
                   bint channels_last, int num_threads):
    """GroupNorm backward: dx, and each sample's dweight/dbias terms in part
    (float64, (N, 2, C): sum dy * xhat, then sum dy, per channel)."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    weight = _contig(weight)
    cdef cn_gn_bwd_args a
    a.dy = _data(dy)
    a.x = _data(x)
    a.mean = _data(mean)
    a.rstd = _data(rstd)
    a.w = _data(weight)
    a.dx = _data(dx)
    a.N, a.C, a.S, a.G = N, C, S, G
    a.channels_last = channels_last
    cdef const void *no_bias = NULL
    cdef int half = _widened(pair)
    cdef float *wide = _gn_params(half, &a.w, &no_bias, C)
    if half and weight is not None and wide == NULL:
        raise MemoryError("cynorm: out of memory for the widened params")
    cdef double *p = <double *>_data(part)
    cdef int64_t units = N if channels_last else N * G
    cdef int T, t
    cdef double *scratch = NULL
    cdef int64_t per = CN_GN_SCRATCH(C)
    with nogil:
        T = _gn_threads(ops, N * G, C // G * S, units, num_threads, True, cn_enter_call())
        if channels_last:
            scratch = <double *>malloc(T * per * sizeof(double))
        if not channels_last or scratch != NULL:
            if T <= 1:
                if channels_last:
                    ops.gn_bwd_samples(&a, 0, N, p, scratch)
                else:
                    ops.gn_bwd_rows(&a, 0, units, p)
            else:
                for t in prange(T, schedule='static', num_threads=T):
                    if channels_last:
                        ops.gn_bwd_samples(&a, (units * t) // T, (units * (t + 1)) // T, p, scratch + t * per)
                    else:
                        ops.gn_bwd_rows(&a, (units * t) // T, (units * (t + 1)) // T, p)
        cn_leave_call()
    free(wide)
    if channels_last and scratch == NULL:
        raise MemoryError("cynorm: out of memory for GroupNorm's scratch")
    free(scratch)


def group_part_sums(cnp.ndarray part):
    """dweight and dbias in float64 from the samples' terms (part: C-contiguous float64
    (N, 2, C)), added sample after sample: (2, C). The order depends on nothing but N."""
    cdef int64_t N = part.shape[0], K = part.shape[1] * part.shape[2], n, j
    out = np.zeros((part.shape[1], part.shape[2]), np.float64)
    cdef double *o = <double *>_data(out)
    cdef const double *p = <const double *>_data(part)
    with nogil:
        for n in range(N):
            for j in range(K):
                o[j] += p[n * K + j]
    return out
