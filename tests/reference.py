"""Plain-NumPy float64 reference implementations: the oracle for every kernel.

In the style of bottleneck's ``slow`` module: obviously correct, slow, and
computed in float64 from exactly the values the kernel sees (inputs are
upcast from their stored dtype, never re-rounded).
"""

import numpy as np


def _quiet(fn):
    """Evaluate like the kernels: NaN/inf propagate without warnings."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return fn(*args, **kwargs)
    return wrapper


#: float64 inputs are checked against long double (x86: 64-bit significand) so the
#: oracle is more precise than what it judges; everything else in float64.
_WIDE = np.longdouble if np.finfo(np.longdouble).nmant > 52 else np.float64


def _f64(a):
    if a is None:
        return None
    a = np.asarray(a)
    return a.astype(_WIDE if a.dtype == np.float64 else np.float64)


def _out(*arrays):
    return tuple(None if a is None else np.asarray(a, dtype=np.float64) for a in arrays)


def _axes(x, axis):
    axis = axis % x.ndim
    return tuple(range(axis, x.ndim))


@_quiet
def layer_norm(x, weight=None, bias=None, axis=-1, eps=1e-5):
    """(y, mean, rstd) in float64; mean/rstd keep dims."""
    x = _f64(x)
    axes = _axes(x, axis)
    mean = x.mean(axis=axes, keepdims=True)
    # one corrected-two-pass step: makes a constant row's mean exact (a plain
    # sum of 3087 equal float64 values is not), so y == bias is the reference too
    finite = np.isfinite(mean)
    mean = np.where(finite, mean + (x - np.where(finite, mean, 0.0)).mean(axis=axes, keepdims=True), mean)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return _out(y, mean, rstd)


@_quiet
def layer_norm_backward(dy, x, mean, rstd, weight=None, axis=-1):
    """(dx, dweight, dbias) in float64 from the given mean/rstd."""
    dy, x, mean, rstd = _f64(dy), _f64(x), _f64(mean), _f64(rstd)
    axes = _axes(x, axis)
    lead = tuple(range(0, axis % x.ndim))
    mean = mean.reshape(x.shape[: axis % x.ndim] + (1,) * len(axes))
    rstd = rstd.reshape(mean.shape)
    xhat = (x - mean) * rstd
    g = dy * _f64(weight) if weight is not None else dy
    c1 = g.mean(axis=axes, keepdims=True)
    c2 = (g * xhat).mean(axis=axes, keepdims=True)
    dx = rstd * (g - c1 - xhat * c2)
    if weight is None:
        return _out(dx, None, None)
    return _out(dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead))


@_quiet
def rms_norm(x, weight=None, axis=-1, eps=1e-6):
    """(y, rstd) in float64; rstd keeps dims."""
    x = _f64(x)
    axes = _axes(x, axis)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * _f64(weight)
    return _out(y, rstd)


@_quiet
def rms_norm_backward(dy, x, rstd, weight=None, axis=-1):
    """(dx, dweight) in float64 from the given rstd."""
    dy, x, rstd = _f64(dy), _f64(x), _f64(rstd)
    axes = _axes(x, axis)
    lead = tuple(range(0, axis % x.ndim))
    rstd = rstd.reshape(x.shape[: axis % x.ndim] + (1,) * len(axes))
    xhat = x * rstd
    g = dy * _f64(weight) if weight is not None else dy
    dx = rstd * (g - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    if weight is None:
        return _out(dx, None)
    return _out(dx, (dy * xhat).sum(axis=lead))


def _channels_first(a, channel_axis):
    """a as (N, C, ...) and the function that puts an array of that layout back."""
    if a.ndim > 2 and channel_axis % a.ndim == a.ndim - 1:
        return np.moveaxis(a, -1, 1), lambda b: np.moveaxis(b, 1, -1)
    return a, lambda b: b


@_quiet
def group_norm(x, num_groups, weight=None, bias=None, channel_axis=1, eps=1e-5):
    """(y, mean, rstd) in float64; mean/rstd of shape (N, num_groups). Each
    sample's group is LayerNorm's row; the affine is per channel."""
    xc, back = _channels_first(_f64(x), channel_axis)
    N, C = xc.shape[:2]
    y, mean, rstd = layer_norm(xc.reshape(N, num_groups, -1), eps=eps)
    y = y.reshape(xc.shape)
    per_channel = (1, C) + (1,) * (xc.ndim - 2)
    if weight is not None:
        y = y * _f64(weight).reshape(per_channel)
    if bias is not None:
        y = y + _f64(bias).reshape(per_channel)
    return _out(back(y), mean.reshape(N, num_groups), rstd.reshape(N, num_groups))


@_quiet
def group_norm_backward(dy, x, mean, rstd, num_groups, weight=None, channel_axis=1):
    """(dx, dweight, dbias) in float64 from the given mean/rstd."""
    xc, back = _channels_first(_f64(x), channel_axis)
    dyc, _ = _channels_first(_f64(dy), channel_axis)
    N, C = xc.shape[:2]
    G = num_groups
    xg, dyg = xc.reshape(N, G, C // G, -1), dyc.reshape(N, G, C // G, -1)
    m, r = _f64(mean).reshape(N, G, 1, 1), _f64(rstd).reshape(N, G, 1, 1)
    xhat = (xg - m) * r
    g = dyg * _f64(weight).reshape(1, G, C // G, 1) if weight is not None else dyg
    c1 = g.mean(axis=(2, 3), keepdims=True)
    c2 = (g * xhat).mean(axis=(2, 3), keepdims=True)
    dx = back((r * (g - c1 - xhat * c2)).reshape(xc.shape))
    if weight is None:
        return _out(dx, None, None)
    return _out(dx, (dyg * xhat).sum(axis=(0, 3)).reshape(C), dyg.sum(axis=(0, 3)).reshape(C))


# ----------------------------------------------------------- rounding oracle --

#: (explicit significand bits, min normal exponent) of the narrow formats
FORMATS = {"bfloat16": (7, -126), "float16": (10, -14), "float32": (23, -126)}
MAX = {"bfloat16": 3.3895313892515355e38, "float16": 65504.0, "float32": 3.4028234663852886e38}


def ulp(v, fmt):
    """Spacing of `fmt` numbers at |v| (float64 array)."""
    mant, emin = FORMATS[fmt]
    a = np.abs(np.asarray(v, dtype=np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, emin)
    return np.ldexp(1.0, (e - mant).astype(int))


def round_to(v, fmt):
    """float64 -> nearest `fmt` value (round half to even), kept as float64.

    Computed directly from float64 (no double rounding through float32)."""
    v = np.asarray(v, dtype=np.float64)
    u = ulp(v, fmt)
    with np.errstate(invalid="ignore"):
        r = np.rint(v / u) * u        # exact scaling by a power of two; rint is half-to-even
    r = np.where(np.abs(r) > MAX[fmt], np.copysign(np.inf, v), r)   # past the largest finite: inf
    return np.where(np.isfinite(v), r, v)
