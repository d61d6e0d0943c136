"""Fused residual add + norm: ``h = x + residual; y = norm(h)`` and its backward.

The forward writes h (the residual stream's next value) and y in one pass
over memory: each thread adds a few rows of h, then normalizes them while
they are still in cache (include/cynorm.h, add_forward). The backward adds
the gradient arriving along the residual stream, ``dsum = dx + dh``, to dx
before it is rounded (add_backward). Same checks, aliasing rules and
determinism as the plain functions (cynorm._api).
"""

import numpy as np

from . import _checks, _dtypes, _isa, _outputs
from ._api import _given, _input, _layout, _makers, _new, _params, _stats
from ._threads import resolve_num_threads

__all__ = ["add_layer_norm_forward", "add_layer_norm_backward", "add_rms_norm_forward", "add_rms_norm_backward"]

#: dtype codes of include/cynorm.h
_CODE = _dtypes.CODES
_NO_PARAMS = -1
#: out= entries that may be an input itself (input index, output index)
_FWD_IN_PLACE = frozenset({(0, 0), (0, 1), (1, 0), (1, 1)})   # y or h may be x or residual
_BWD_IN_PLACE = frozenset({(0, 0), (1, 0), (5, 0)})           # dsum may be dy, h or dh


def _param_code(pair, weight, bias):
    return _NO_PARAMS if weight is None and bias is None else _CODE[pair.param]


def _add_forward(x, residual, weight, bias, axis, eps, residual_dtype, num_threads, out, center):
    x = _input(x, "x")
    residual = _input(residual, "residual")
    h_dtype = _checks.residual(x.shape, x.dtype, residual.shape, residual.dtype, residual_dtype)
    ax, M, N, norm_shape, stat_shape = _layout(x, axis)
    pair, weight, bias = _params(x.dtype, norm_shape, weight, bias)
    eps = _checks.eps(eps)
    T = resolve_num_threads(num_threads)
    y = h = None
    if out is not None:
        if not isinstance(out, tuple):
            raise TypeError(f"cynorm: out must be a tuple (y, h), each an array or None, got {type(out).__name__}")
        got = _given(out, ("y", "h"), {"y": (x.shape, pair.x, None), "h": (x.shape, h_dtype, None)})
        y, h = got["y"], got["h"]
        x, residual, weight, bias = _outputs.protect((x, residual, weight, bias), (y, h), _FWD_IN_PLACE)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    if not residual.flags.c_contiguous:
        residual = np.ascontiguousarray(residual)
    stat = _dtypes.ACCUMULATOR[h_dtype]
    new_y, new_stat = _makers(M * N, pair.x, M, stat)
    fresh = fresh_h = False
    if y is None:
        y, fresh = _new(new_y, x.shape, pair.x)
    if h is None:
        h, fresh_h = _new(_makers(M * N, h_dtype, 0, stat)[0], x.shape, h_dtype)
    mean = new_stat(stat_shape, stat) if center else None
    rstd = new_stat(stat_shape, stat)
    if M:
        _isa.kernels.add_forward(_CODE[pair.x], _param_code(pair, weight, bias), _CODE[residual.dtype],
                                 _CODE[h_dtype], center, x, residual, y, h, weight, bias, mean, rstd,
                                 M, N, eps, T, fresh, fresh_h)
    return y, h, mean, rstd


def _add_backward(dy, h, mean, rstd, weight, dh, axis, num_threads, out, center, names):
    dy = _input(dy, "dy")
    h = _input(h, "h")
    ax, M, N, norm_shape, stat_shape = _layout(dy, axis)
    pair, weight, _ = _params(dy.dtype, norm_shape, weight, None)
    h_dtype = _checks.h_of(h.shape, h.dtype, dy.shape, dy.dtype)
    if dh is not None:
        dh = _input(dh, "dh")
        _checks.like("dh", dh.shape, dh.dtype, "h", h.shape, h_dtype)
    stat = _dtypes.ACCUMULATOR[h_dtype]
    if center:
        mean = _stats(mean, "mean", h.shape, ax, stat)
    rstd = _stats(rstd, "rstd", h.shape, ax, stat)
    T = resolve_num_threads(num_threads)
    dsum = dweight = dbias = None
    dsum_dtype = h_dtype
    if out is not None:
        if not isinstance(out, tuple):
            raise TypeError(f"cynorm: out must be a tuple ({', '.join(names)}), each an array or None, "
                            f"got {type(out).__name__}")
        arrays, _ = _outputs.unpack(out, names)
        first = arrays[0]
        if isinstance(first, np.ndarray) and first.dtype == pair.x:   # dsum in x's dtype, on request
            dsum_dtype = pair.x
        grad = (norm_shape, pair.grad, None)
        got = _given(out, names, {"dsum": (h.shape, dsum_dtype, None), "dweight": grad, "dbias": grad})
        dsum, dweight, dbias = got.get("dsum"), got.get("dweight"), got.get("dbias")
        if weight is None and (dweight is not None or dbias is not None):
            raise ValueError("cynorm: out gives dweight/dbias but there is no weight, so no gradient to write")
        dy, h, mean, rstd, weight, dh = _outputs.protect((dy, h, mean, rstd, weight, dh), (dsum, dweight, dbias),
                                                         _BWD_IN_PLACE)
    dy, h = (a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in (dy, h))
    if dh is not None and not dh.flags.c_contiguous:
        dh = np.ascontiguousarray(dh)
    new_dsum, new_grad = _makers(M * N, dsum_dtype, N, pair.grad)
    fresh = False
    if dsum is None:
        dsum, fresh = _new(new_dsum, h.shape, dsum_dtype)
    if weight is not None:
        if dweight is None:
            dweight = new_grad(norm_shape, pair.grad)
        if center and dbias is None:
            dbias = new_grad(norm_shape, pair.grad)
    _isa.kernels.add_backward(_CODE[pair.x], _param_code(pair, weight, None), _CODE[h_dtype], _CODE[dsum_dtype],
                              center, dy, h, mean, rstd, weight, dh, dsum, dweight, dbias, M, N, T, fresh)
    return dsum, dweight, dbias


def add_layer_norm_forward(x, residual, weight=None, bias=None, *, axis=-1, eps=1e-5, residual_dtype=None,
                           num_threads=None, out=None):
    """``h = x + residual`` (rounded once to ``residual_dtype``), then LayerNorm of h:
    returns ``(y, h, mean, rstd)``.

    ``residual_dtype`` is x's dtype by default; float32 with bfloat16/float16 x
    keeps the residual stream in float32 (``residual`` may then be float32 or
    x's dtype). mean and rstd are h's as stored, so y is bit-identical to
    ``layer_norm_forward(h, ...)`` (rounded to x's dtype when h is float32),
    and y has x's dtype. ``out=(y, h)``, either None; h may be ``residual`` (or
    x) itself: the in-place update of the residual stream.
    """
    return _add_forward(x, residual, weight, bias, axis, eps, residual_dtype, num_threads, out, True)


def add_layer_norm_backward(dy, h, mean, rstd, weight=None, *, dh=None, axis=-1, num_threads=None, out=None):
    """Gradients of add_layer_norm_forward: ``(dsum, dweight, dbias)``.

    ``dsum = dx + dh`` is the gradient of both x and residual: dh (the gradient
    arriving along the residual stream, h's dtype, or None) is added to dx in
    float32 (float64) before dx is rounded, and the sum rounded once. dsum has
    h's dtype, or x's (dy's) if ``out=(dsum, dweight, dbias)`` gives such an
    array. dweight/dbias are bit-identical to ``layer_norm_backward`` on h.
    dsum may be dy, h or dh in place.
    """
    return _add_backward(dy, h, mean, rstd, weight, dh, axis, num_threads, out, True, ("dsum", "dweight", "dbias"))


def add_rms_norm_forward(x, residual, weight=None, *, axis=-1, eps=1e-6, residual_dtype=None, num_threads=None,
                         out=None):
    """``h = x + residual``, then RMSNorm of h: ``(y, h, rstd)``; as add_layer_norm_forward."""
    y, h, _, rstd = _add_forward(x, residual, weight, None, axis, eps, residual_dtype, num_threads, out, False)
    return y, h, rstd


def add_rms_norm_backward(dy, h, rstd, weight=None, *, dh=None, axis=-1, num_threads=None, out=None):
    """Gradients of add_rms_norm_forward: ``(dsum, dweight)``; as add_layer_norm_backward."""
    dsum, dweight, _ = _add_backward(dy, h, None, rstd, weight, dh, axis, num_threads, out, False,
                                     ("dsum", "dweight"))
    return dsum, dweight
