"""Public functions: validate the input, pick the dtype pair, call the kernels.

Every check happens before anything is written, so a refused call leaves the
caller's arrays (``out`` included) untouched. Inputs may be any array-like;
non-contiguous, Fortran-ordered or negative-stride arrays are copied to a
C-contiguous buffer first (outputs are always C-contiguous).
"""

import math
import numbers

import numpy as np

from . import _alloc, _dtypes, _isa
from ._threads import resolve_num_threads

__all__ = [
    "layer_norm", "layer_norm_forward", "layer_norm_backward",
    "rms_norm", "rms_norm_forward", "rms_norm_backward",
]

_ndarray = np.ndarray
_empty = np.empty
_huge_empty = _alloc.empty
#: outputs this large go on huge pages (cynorm._alloc; CYNORM_HUGEPAGES=0: never)
_HUGE_MIN = _alloc.MIN_BYTES if _alloc.enabled else float("inf")
#: below this many elements in x no output can reach _HUGE_MIN (8-byte items at most):
#: one int compare keeps tiny calls on the plain path
_HUGE_GATE = _alloc.MIN_BYTES // 8 if _alloc.enabled else 1 << 62


def _makers(elems, x_dtype, count, dtype):
    """How to make the x-shaped output (`elems` elements of x_dtype) and the other
    outputs (`count` elements of dtype): large ones on huge pages (cheaper to fault in)."""
    if elems < _HUGE_GATE:
        return _empty, _empty
    return (_huge_empty if elems * x_dtype.itemsize >= _HUGE_MIN else _empty,
            _huge_empty if count * dtype.itemsize >= _HUGE_MIN else _empty)


# ------------------------------------------------------------- validation --

def _as_array(a, name):
    if type(a) is _ndarray:
        return a
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"cynorm: {name} is a masked array; fill it first (e.g. {name}.filled())")
    if isinstance(a, _ndarray):
        return a.view(_ndarray)
    try:
        return np.asarray(a)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"cynorm: {name} must be an array-like of numbers ({exc})") from None


def _native(a):
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _input(a, name):
    if type(a) is _ndarray and a.dtype in _dtypes.DEFAULT_PARAM:   # fast path
        return a
    a = _as_array(a, name)
    if not a.dtype.isnative:
        a = _native(a)
    _dtypes.check_x_dtype(a.dtype, name)
    return a


def _axis(axis, ndim):
    if type(axis) is not int:
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (numbers.Integral, np.integer)):
            raise TypeError(f"cynorm: axis must be an int, got {type(axis).__name__}")
        axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"cynorm: axis {axis} is out of range for an array with {ndim} dimension(s); "
                         f"expected {-ndim} <= axis < {ndim}")
    return axis % ndim


def _eps(eps):
    if type(eps) is not float:
        if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
            raise TypeError(f"cynorm: eps must be a real number, got {type(eps).__name__}")
        eps = float(eps)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"cynorm: eps must be finite and >= 0, got {eps!r}")
    return eps


def _params(x_dtype, norm_shape, weight, bias):
    """Check weight/bias; returns (pair, weight, bias) as ndarrays or None (the kernel
    entry makes them C-contiguous)."""
    # fast path: ndarrays (or None) of the right shape and a supported dtype pair;
    # the kernel entry copies non-contiguous ones
    if (weight is None or type(weight) is _ndarray) and (bias is None or type(bias) is _ndarray):
        pdt = weight.dtype if weight is not None else bias.dtype if bias is not None else None
        pair = _PAIR_CACHE.get((x_dtype, pdt))
        if (pair is not None and (weight is None or weight.shape == norm_shape)
                and (bias is None or (bias.shape == norm_shape and bias.dtype == pdt))):
            return pair, weight, bias
    default = _dtypes.DEFAULT_PARAM[x_dtype]
    arrays = []
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            if not hasattr(p, "dtype"):  # a plain sequence carries no dtype: use the natural one
                p = np.asarray(p, dtype=default)
            p = _as_array(p, name)
            if not p.dtype.isnative:
                p = _native(p)
            if p.shape != norm_shape:
                raise ValueError(f"cynorm: {name} must have shape x.shape[axis:] = {norm_shape}, got {p.shape}")
        arrays.append(p)
    weight, bias = arrays
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise TypeError(f"cynorm: weight and bias must have the same dtype, got "
                        f"{_dtypes.dtype_name(weight.dtype)} and {_dtypes.dtype_name(bias.dtype)}; "
                        f"supported (x, weight/bias) pairs: {_dtypes.supported_pairs_text()}")
    given = weight if weight is not None else bias
    return _dtypes.resolve(x_dtype, None if given is None else given.dtype), weight, bias


#: (x dtype, param dtype or None) -> Pair, for the fast path
_PAIR_CACHE = {**{k: v for k, v in _dtypes.PAIRS.items()},
               **{(x, None): _dtypes.PAIRS[(x, p)] for x, p in _dtypes.DEFAULT_PARAM.items()}}


def _split(shape, axis):
    """(M rows, N elements per row) for normalizing over shape[axis:]."""
    norm_shape = shape[axis:]
    n = norm_shape[0] if len(norm_shape) == 1 else math.prod(norm_shape)
    if n == 0:
        raise ValueError(f"cynorm: the normalized dimensions x.shape[axis:] = {norm_shape} have zero size")
    return math.prod(shape[:axis]), n, norm_shape


def _check_out(out, shape, dtype, name="out"):
    if type(out) is _ndarray and out.dtype is dtype and out.shape == shape:   # fast path
        flags = out.flags
        if flags.c_contiguous and flags.writeable:
            return out
    if type(out) is not _ndarray and not isinstance(out, _ndarray):
        raise TypeError(f"cynorm: {name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"cynorm: {name} must have dtype {_dtypes.dtype_name(dtype)}, "
                        f"got {_dtypes.dtype_name(out.dtype)}")
    if out.shape != shape:
        raise ValueError(f"cynorm: {name} must have shape {shape}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"cynorm: {name} must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"cynorm: {name} is read-only")
    return out


def _same_buffer(a, b):
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.strides == b.strides


def _contiguous_input(a, out):
    """C-contiguous version of a; a copy if it overlaps `out` other than exactly."""
    if out is not None and a is not out and np.may_share_memory(a, out):
        if not (a.flags.c_contiguous and _same_buffer(a, out)):
            return np.array(a, order="C", copy=True)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _stats(stat, name, shape, stat_shape, axis, dtype):
    """Check a mean/rstd argument of the backward."""
    stat = _as_array(stat, name)
    if stat.shape != stat_shape and stat.shape != shape[:axis]:
        raise ValueError(f"cynorm: {name} must have shape {stat_shape} (or {shape[:axis]}), got {stat.shape}")
    if stat.dtype != dtype:
        raise TypeError(f"cynorm: {name} must have dtype {_dtypes.dtype_name(dtype)} for this input "
                        f"(what the forward returns), got {_dtypes.dtype_name(stat.dtype)}")
    return stat  # (the kernel entry makes it C-contiguous)


# ----------------------------------------------------------------- shared --

#: (shape, axis) -> _layout's result: most callers repeat a few shapes, and
#: rebuilding the tuples costs about 0.3 us of a ~2 us tiny call. Bounded.
_LAYOUT_CACHE = {}
_LAYOUT_CACHE_MAX = 512


def _layout(x, axis):
    """(axis in [0, ndim), M rows, N per row, normalized shape, stats shape)."""
    shape = x.shape
    if type(axis) is int:
        hit = _LAYOUT_CACHE.get((shape, axis))
        if hit is not None:
            return hit
        result = _layout_uncached(shape, axis)
        if len(_LAYOUT_CACHE) >= _LAYOUT_CACHE_MAX:
            _LAYOUT_CACHE.clear()
        _LAYOUT_CACHE[(shape, axis)] = result
        return result
    return _layout_uncached(shape, axis)


def _layout_uncached(shape, axis):
    ndim = len(shape)
    if ndim == 0:
        raise ValueError("cynorm: x must have at least one dimension, got a 0-d array")
    ax = _axis(axis, ndim)
    M, N, norm_shape = _split(shape, ax)
    return ax, M, N, norm_shape, shape[:ax] + (1,) * (ndim - ax)


def _destination(out, shape, new, dtype, params):
    """The output array (new from `new`, or the checked `out`), whether its pages
    are still to be faulted in (fresh), and params copied if they overlap it."""
    if out is None:
        dst = new(shape, dtype)   # a recycled huge-page output has its pages in already
        return dst, not (new is _huge_empty and _alloc.last_recycled()), params
    dst = _check_out(out, shape, dtype)
    for p in params:   # a list of copies only when one overlaps dst (rare)
        if p is not None and np.may_share_memory(p, dst):
            return dst, False, [q.copy() if q is not None and np.may_share_memory(q, dst) else q for q in params]
    return dst, False, params


#: (x type number, param type number or -1) -> (pair code, stats type number),
#: for the kernels' forward_small
_FAST_PAIRS = {(x.num, -1 if p is None else p.num): (pair.code, pair.stat.num)
               for (x, p), pair in _PAIR_CACHE.items()}


def _forward(x, weight, bias, axis, eps, num_threads, out, center, want_stats):
    if out is None:   # the common small call, checked and run in C (None: anything else)
        done = _isa.kernels.forward_small(x, weight, bias, axis, eps, num_threads, center, want_stats, _FAST_PAIRS)
        if done is not None:
            return done
    x = _input(x, "x")
    ax, M, N, norm_shape, stat_shape = _layout(x, axis)
    pair, weight, bias = _params(x.dtype, norm_shape, weight, bias)
    eps = _eps(eps)
    T = resolve_num_threads(num_threads)
    new_y, new_stat = _makers(M * N, pair.x, M, pair.stat)
    y, fresh, (weight, bias) = _destination(out, x.shape, new_y, pair.x, (weight, bias))
    x = _contiguous_input(x, out)
    mean = new_stat(stat_shape, pair.stat) if (center and want_stats) else None
    rstd = new_stat(stat_shape, pair.stat)
    if M:
        _isa.kernels.forward(pair.code, center, x, y, weight, bias, mean, rstd, M, N, eps, T, fresh)
    return y, mean, rstd


def _backward(dy, x, mean, rstd, weight, axis, num_threads, out, center):
    x = _input(x, "x")
    dy = _input(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"cynorm: dy must have the shape of x, {x.shape}, got {dy.shape}")
    if dy.dtype != x.dtype:
        raise TypeError(f"cynorm: dy must have the dtype of x, {_dtypes.dtype_name(x.dtype)}, "
                        f"got {_dtypes.dtype_name(dy.dtype)}")
    ax, M, N, norm_shape, stat_shape = _layout(x, axis)
    pair, weight, _ = _params(x.dtype, norm_shape, weight, None)
    if center:
        mean = _stats(mean, "mean", x.shape, stat_shape, ax, pair.stat)
    rstd = _stats(rstd, "rstd", x.shape, stat_shape, ax, pair.stat)
    T = resolve_num_threads(num_threads)
    new_dx, new_grad = _makers(M * N, pair.x, N, pair.grad)
    dx, fresh, (weight, mean, rstd) = _destination(out, x.shape, new_dx, pair.x,
                                                   (weight, mean if center else None, rstd))
    x = _contiguous_input(x, out)
    dy = _contiguous_input(dy, out)
    if weight is not None:
        dweight = new_grad(norm_shape, pair.grad)
        dbias = new_grad(norm_shape, pair.grad) if center else None
        if M == 0:
            dweight.fill(0)
            if dbias is not None:
                dbias.fill(0)
    else:
        dweight = dbias = None
    if M:
        _isa.kernels.backward(pair.code, center, dy, x, mean, rstd, weight, dx, dweight, dbias, M, N, T, fresh)
    return dx, dweight, dbias


# ------------------------------------------------------------- LayerNorm --

def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None, out=None):
    """LayerNorm over ``x.shape[axis:]``: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``axis`` is the first normalized axis (ONNX convention); torch's
    ``normalized_shape=s`` is ``axis=-len(s)``. ``weight``/``bias`` (optional,
    independently) have shape ``x.shape[axis:]``. The variance is biased.
    Returns y with x's dtype (written into ``out`` when given; ``out`` may be x).
    """
    return _forward(x, weight, bias, axis, eps, num_threads, out, True, False)[0]


def layer_norm_forward(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None, out=None):
    """LayerNorm that also returns the statistics the backward needs.

    Returns ``(y, mean, rstd)``; ``mean`` and ``rstd = 1/sqrt(var + eps)`` have
    shape ``x.shape[:axis] + (1,) * k`` (dims kept, so they broadcast against x)
    and dtype float32 (float64 for float64 input).
    """
    return _forward(x, weight, bias, axis, eps, num_threads, out, True, True)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1, num_threads=None, out=None):
    """Gradients of LayerNorm: returns ``(dx, dweight, dbias)``.

    ``mean``/``rstd`` are what layer_norm_forward returned. With ``weight=None``
    the result is ``(dx, None, None)``. ``out`` receives dx (it may be dy or x).
    dweight/dbias are bit-identical for any ``num_threads``.
    """
    return _backward(dy, x, mean, rstd, weight, axis, num_threads, out, True)


# --------------------------------------------------------------- RMSNorm --

def rms_norm(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None, out=None):
    """RMSNorm over ``x.shape[axis:]``: ``x / sqrt(mean(x**2) + eps) * weight``."""
    return _forward(x, weight, None, axis, eps, num_threads, out, False, False)[0]


def rms_norm_forward(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None, out=None):
    """RMSNorm that also returns ``rstd = 1/sqrt(mean(x**2) + eps)``: ``(y, rstd)``."""
    y, _, rstd = _forward(x, weight, None, axis, eps, num_threads, out, False, True)
    return y, rstd


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1, num_threads=None, out=None):
    """Gradients of RMSNorm: ``(dx, dweight)``; dweight is None when weight is None."""
    dx, dweight, _ = _backward(dy, x, None, rstd, weight, axis, num_threads, out, False)
    return dx, dweight
