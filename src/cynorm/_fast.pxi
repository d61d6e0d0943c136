# The fast paths for the common small call (included by _core.pyx): the call
# checked and run in C, without the validating Python path (cynorm._api), for
# exactly the arguments that path would accept as they are; None for anything
# else, which the caller then validates and runs the general way.

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
    None or an int in 1..CN_MAX_THREADS; out None, y, or a tuple of n_outs entries (y,
    then mean and/or rstd), each None or a writeable exact array of the
    output's dtype and shape, the outputs apart from each other and from the
    inputs (y may be x); y given, or fewer than SMALL_CALL_ELEMS elements (the
    general path allocates large outputs on huge pages). Returns
    (y, mean, rstd) (mean None unless center and n_outs == 3), or None for
    anything else; the caller then validates and runs the call the general
    way (and raises there). Same kernels and policy as the general path."""
    if not (_plain_array(x) and type(eps) is float):
        return None
    if num_threads is not None and not (type(num_threads) is int and 1 <= num_threads <= CN_MAX_THREADS):
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
    if num_threads is not None and not (type(num_threads) is int and 1 <= num_threads <= CN_MAX_THREADS):
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


def given_outputs(object out, tuple shapes, tuple dtypes, tuple ins, tuple in_place):
    """The out= tuple's arrays (or None) when every given one is plain, writeable, of its
    dtype (dtypes[k]) and shape (shapes[k], a tuple), and they are apart as _apart says;
    None otherwise (the caller then checks it the general way, with its messages)."""
    if type(out) is not tuple or len(<tuple>out) != len(shapes):
        return None
    cdef Py_ssize_t k, j
    cdef cnp.ndarray a
    for k in range(len(shapes)):
        o = (<tuple>out)[k]
        if o is None:
            continue
        if not _out_ok(o, (<cnp.dtype>dtypes[k]).type_num):
            return None
        a = <cnp.ndarray>o
        shape = <tuple>shapes[k]
        if cnp.PyArray_NDIM(a) != len(shape):
            return None
        for j in range(len(shape)):
            if cnp.PyArray_DIMS(a)[j] != <cnp.npy_intp>shape[j]:
                return None
    for a_in in ins:
        if a_in is not None and type(a_in) is not cnp.ndarray:
            return None
    if not _apart(<tuple>out, ins, in_place):
        return None
    return out
