"""The input checks of every entry point: the NumPy API, the fused functions,
cynorm.jax, cynorm.dask and cynorm.onnx. One function per kind of mistake,
so each mistake gets one message wherever it is made.

They take shapes and dtypes (and, for weight/bias, anything with .shape and
.dtype), so abstract arrays -- JAX tracers, dask arrays -- are checked as
they are. Each raises TypeError (wrong kinds and dtypes) or ValueError (wrong
values and shapes) with a message that says what was expected, and returns
the checked value.
"""

import math
import numbers
import operator

import numpy as np

from . import _core, _dtypes

#: the most threads a call may ask for (include/cn_policy.h)
MAX_THREADS = _core.tables()["max_threads"]


def _is_bool(v):
    return isinstance(v, (bool, np.bool_))


def x_dtype(dt, name="x"):
    """dt as a NumPy dtype, if cynorm takes it for x."""
    dt = np.dtype(dt)
    if dt not in _dtypes.DEFAULT_PARAM:
        raise TypeError(
            f"cynorm: {name} has dtype {dt}; supported input dtypes are {_dtypes.supported_x_text()} "
            f"(bfloat16 is ml_dtypes.bfloat16). Convert it first, e.g. {name}.astype(np.float32).")
    return dt


def axis(axis, ndim):
    """The first normalized axis, in [0, ndim)."""
    if type(axis) is not int:
        if _is_bool(axis) or not isinstance(axis, (numbers.Integral, np.integer)):
            raise TypeError(f"cynorm: axis must be an int, got {type(axis).__name__}")
        axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"cynorm: axis {axis} is out of range for an array with {ndim} dimension(s); "
                         f"expected {-ndim} <= axis < {ndim}")
    return axis % ndim


def eps(eps):
    """eps as a float: finite, >= 0."""
    if type(eps) is not float:
        if _is_bool(eps) or not isinstance(eps, numbers.Real):
            raise TypeError(f"cynorm: eps must be a real number, got {type(eps).__name__}")
        eps = float(eps)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"cynorm: eps must be finite and >= 0, got {eps!r}")
    return eps


def num_threads(n):
    """A num_threads argument: None, or an int in 1..MAX_THREADS."""
    if n is None:
        return None
    if _is_bool(n):
        raise TypeError("cynorm: num_threads must be an int >= 1 or None, got a bool")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"cynorm: num_threads must be an int >= 1 or None, got {type(n).__name__}") from None
    if n < 1:
        raise ValueError(f"cynorm: num_threads must be >= 1 (or None for the default), got {n}")
    if n > MAX_THREADS:
        raise ValueError(f"cynorm: num_threads={n} is above cynorm's limit of {MAX_THREADS}")
    return n


def layout(shape, ax):
    """(axis in [0, ndim), M rows, N elements per row, normalized shape, stats shape)
    for normalizing an array of this shape over shape[ax:]."""
    shape = tuple(shape)
    ndim = len(shape)
    if ndim == 0:
        raise ValueError("cynorm: x must have at least one dimension, got a 0-d array")
    ax = axis(ax, ndim)
    norm_shape = shape[ax:]
    n = norm_shape[0] if len(norm_shape) == 1 else math.prod(norm_shape)
    if n == 0:
        raise ValueError(f"cynorm: the normalized dimensions x.shape[axis:] = {norm_shape} have zero size")
    return ax, math.prod(shape[:ax]), n, norm_shape, shape[:ax] + (1,) * (ndim - ax)


def params(xdt, norm_shape, weight, bias, what="x.shape[axis:]"):
    """The Pair for x's dtype and its weight/bias (each None or with .shape and .dtype);
    what: how the message names their expected shape."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != tuple(norm_shape):
            raise ValueError(f"cynorm: {name} must have shape {what} = {tuple(norm_shape)}, "
                             f"got {tuple(p.shape)}")
    if weight is not None and bias is not None and np.dtype(weight.dtype) != np.dtype(bias.dtype):
        raise TypeError(f"cynorm: weight and bias must have the same dtype, got {weight.dtype} and {bias.dtype}; "
                        f"supported (x, weight/bias) pairs: {_dtypes.supported_pairs_text()}")
    given = weight if weight is not None else bias
    return pair(xdt, None if given is None else np.dtype(given.dtype))


def pair(xdt, param_dtype):
    """The Pair for x and its parameters (param_dtype None: no weight/bias)."""
    if param_dtype is None:
        param_dtype = _dtypes.DEFAULT_PARAM[xdt]
    found = _dtypes.PAIRS.get((xdt, param_dtype))
    if found is None:
        options = [str(p) for (x, p) in _dtypes.PAIRS if x == xdt]
        raise TypeError(
            f"cynorm: unsupported dtypes: x is {xdt} but weight/bias are {param_dtype}. "
            f"Supported (x, weight/bias) pairs: {_dtypes.supported_pairs_text()}. "
            f"Fix: cast weight and bias to {' or '.join(options)}, e.g. weight.astype(np.{options[-1]}).")
    return found


def group_layout(shape, num_groups, channel_axis):
    """GroupNorm of an array of this shape: (channels_last, N, C, S, G), S the
    product of the spatial dims (1 with none)."""
    shape = tuple(shape)
    ndim = len(shape)
    if ndim < 2:
        raise ValueError(f"cynorm: group_norm needs x with a batch and a channel axis (ndim >= 2), got shape {shape}")
    if _is_bool(num_groups):
        raise TypeError("cynorm: num_groups must be an int >= 1, got a bool")
    try:
        G = operator.index(num_groups)
    except TypeError:
        raise TypeError(f"cynorm: num_groups must be an int >= 1, got {type(num_groups).__name__}") from None
    if _is_bool(channel_axis) or not isinstance(channel_axis, (numbers.Integral, np.integer)):
        raise TypeError(f"cynorm: channel_axis must be an int (1 or -1), got {type(channel_axis).__name__}")
    ax = int(channel_axis) + ndim if channel_axis < 0 else int(channel_axis)
    if ax not in (1, ndim - 1):
        raise ValueError(f"cynorm: channel_axis must be 1 (channels-first, NCHW) or -1 (channels-last, NHWC) "
                         f"for an array of shape {shape}, got {channel_axis}")
    channels_last = ax == ndim - 1 and ndim > 2
    C = shape[ax]
    spatial = shape[2:] if ax == 1 else shape[1:-1]
    S = math.prod(spatial)
    if G < 1:
        raise ValueError(f"cynorm: num_groups must be >= 1, got {G}")
    if C % G:
        raise ValueError(f"cynorm: num_groups={G} must divide the number of channels, {C} (x.shape[{ax}])")
    if C == 0 or S == 0:
        raise ValueError(f"cynorm: each group of x (shape {shape}) would normalize over zero elements")
    return channels_last, shape[0], C, S, G


def group_stats(name, shape, dtype, N, G, stat_dtype):
    """A mean/rstd argument of the GroupNorm backward: (N, G) and the forward's dtype."""
    if tuple(shape) != (N, G):
        raise ValueError(f"cynorm: {name} must have shape (N, num_groups) = {(N, G)}, got {tuple(shape)}")
    if np.dtype(dtype) != stat_dtype:
        raise TypeError(f"cynorm: {name} must have dtype {stat_dtype} for this input (what the forward "
                        f"returns), got {dtype}")


def like(name, shape, dtype, ref, ref_shape, ref_dtype):
    """An array that must have another's shape and dtype (dy and x, dh and h)."""
    if tuple(shape) != tuple(ref_shape):
        raise ValueError(f"cynorm: {name} must have the shape of {ref}, {tuple(ref_shape)}, got {tuple(shape)}")
    if np.dtype(dtype) != np.dtype(ref_dtype):
        raise TypeError(f"cynorm: {name} must have the dtype of {ref}, {ref_dtype}, got {dtype}")


def stats(name, shape, dtype, x_shape, ax, stat_dtype):
    """A mean/rstd argument of a backward: the forward's shape (dims kept or squeezed) and dtype."""
    x_shape = tuple(x_shape)
    kept = x_shape[:ax] + (1,) * (len(x_shape) - ax)
    if tuple(shape) != kept and tuple(shape) != x_shape[:ax]:
        raise ValueError(f"cynorm: {name} must have shape {kept} (or {x_shape[:ax]}), got {tuple(shape)}")
    if np.dtype(dtype) != stat_dtype:
        raise TypeError(f"cynorm: {name} must have dtype {stat_dtype} for this input (what the forward "
                        f"returns), got {dtype}")


def stream_dtype(xdt, residual_dtype):
    """h's dtype in a fused call: x's, or x's accumulator (residual_dtype=np.float32
    for 16-bit x: the float32 residual stream)."""
    if residual_dtype is None:
        return xdt
    try:
        dt = np.dtype(residual_dtype)
    except TypeError:
        raise TypeError(f"cynorm: residual_dtype must be a dtype (or None), got {residual_dtype!r}") from None
    wide = _dtypes.ACCUMULATOR[xdt]
    if dt == xdt or dt == wide:
        return dt
    raise TypeError(f"cynorm: residual_dtype must be x's dtype ({xdt})"
                    f"{f' or {wide}' if wide != xdt else ''}, got {dt}")


def residual(x_shape, xdt, residual_shape, residual_dt, residual_dtype):
    """h's dtype for x and a residual of these shapes and dtypes (residual_dtype: the argument)."""
    if tuple(residual_shape) != tuple(x_shape):
        raise ValueError(f"cynorm: residual must have the shape of x, {tuple(x_shape)}, "
                         f"got {tuple(residual_shape)}")
    h_dtype = stream_dtype(xdt, residual_dtype)
    rd = np.dtype(residual_dt)
    if rd != xdt and rd != h_dtype:
        raise TypeError(f"cynorm: residual must have x's dtype ({xdt}) or residual_dtype ({h_dtype}), got {rd}")
    return h_dtype


def h_of(h_shape, h_dt, dy_shape, dy_dt):
    """A fused backward's h: dy's shape, and dy's dtype or its accumulator's."""
    if tuple(h_shape) != tuple(dy_shape):
        raise ValueError(f"cynorm: h must have the shape of dy, {tuple(dy_shape)}, got {tuple(h_shape)}")
    wide = _dtypes.ACCUMULATOR[np.dtype(dy_dt)]
    if np.dtype(h_dt) != np.dtype(dy_dt) and np.dtype(h_dt) != wide:
        raise TypeError(f"cynorm: h must have dy's dtype ({dy_dt})"
                        f"{f' or {wide}' if wide != np.dtype(dy_dt) else ''}, got {h_dt}")
    return np.dtype(h_dt)
