"""ONNX's LayerNormalization (opset 17), RMSNormalization (opset 23) and
GroupNormalization (opset 21) with the spec's shapes, broadcasting and types,
on cynorm's kernels.

    Y, Mean, InvStdDev = cynorm.onnx.layer_normalization(X, Scale, B, axis=-1, epsilon=1e-5)
    Y = cynorm.onnx.rms_normalization(X, scale, axis=-1, epsilon=1e-5)
    Y = cynorm.onnx.group_normalization(X, scale, bias, num_groups=G, epsilon=1e-5)

What follows the spec exactly: Scale and B may be anything unidirectionally
broadcastable to X (``(3,1,1)``, ``(4,5)``, ``(1,)``, ``(1,1,4,5)``); Mean and
InvStdDev have shape ``X.shape[:axis] + (1,)*k`` and the stash type (float32 by
default, bfloat16 for ``stash_type=16``); RMSNormalization's Y has the scale's
type. Plain NumPy arrays in and out; no ``onnx`` package needed.

Rounding, where cynorm has no path that computes exactly the spec's function
body (all documented, all within a few ulps):

- Stage one (normalizing) runs in float32, for float64 X too: the spec's
  stash types are float32 and bfloat16, and its body casts X to the stash type
  first. (ONNX Runtime computes float64 X in float64; the onnx reference
  evaluator computes in X's type, 16-bit sums included.) cynorm accumulates in
  a fixed order with a shifted variance, so Mean, InvStdDev and the normalized
  values can differ from a naive float32 evaluation in the last bits.
- Where Scale and B vary over the normalized dimensions only (X not float64),
  LayerNormalization applies them inside the kernel and rounds Y once, as ONNX
  Runtime does; the spec's body rounds the normalized value to X's type first
  and again after each of Mul and Add. Otherwise (Scale or B varying over a
  leading dimension, float64 X with a float32 stash) stage two runs as the spec
  writes it, in X's type with NumPy.
- ``stash_type=16`` (bfloat16) computes in float32 and rounds Mean and
  InvStdDev to bfloat16 at the end.
- GroupNormalization (X as N x C x D1 ..., scale and bias of shape (C,)):
  X not float64, any stash type: cynorm's GroupNorm kernel, statistics in
  float32, scale and bias applied inside it and Y rounded once. float64 X with
  stash_type=11 (double): the float64 kernel. float64 X with a float32, float16
  or bfloat16 stash: stage one in float32 (the 16-bit stashes computed in
  float32 too), then stage two in float64 as the spec writes it.
- RMSNormalization with a scale of another type than X: X is normalized in the
  stash precision and rounded to X's type (as the spec's body casts it), then
  cast to the scale's type and multiplied by it there.
"""

import numpy as np

from . import _api, _checks, _dtypes

__all__ = ["layer_normalization", "rms_normalization", "group_normalization"]

#: ONNX TensorProto data types cynorm computes in, by stash_type
_STASH = {1: _dtypes.F32, 16: _dtypes.BF16}
_ONNX_TYPES = {_dtypes.F32: 1, _dtypes.F64: 11, _dtypes.BF16: 16, _dtypes.F16: 10}


def _tensor(a, name):
    a = _api._as_array(a, name)
    if not a.dtype.isnative:
        a = _api._native(a)
    if a.dtype not in _ONNX_TYPES:
        raise TypeError(f"cynorm.onnx: {name} has dtype {a.dtype}; the spec allows float16, float, double and "
                        f"bfloat16 (ml_dtypes.bfloat16)")
    return a


def _axis_and_stash(X, axis, stash_type, epsilon):
    """(axis in [0, rank), the stash dtype, epsilon); X's rank, axis, the normalized
    dims' size and epsilon checked as the NumPy API checks them."""
    axis = _checks.layout(X.shape, axis)[0]
    if isinstance(stash_type, bool) or stash_type not in _STASH:
        raise ValueError(f"cynorm.onnx: stash_type must be 1 (float) or 16 (bfloat16), got {stash_type!r}")
    return axis, _STASH[stash_type], _checks.eps(epsilon)


def _broadcast(p, X, axis, name):
    """p unidirectionally broadcast to X: (the normalized-shape array, if p varies over
    the normalized dims only; else None) and p broadcast to X's full shape."""
    if p.ndim > X.ndim or any(d not in (1, x) for d, x in zip(p.shape[::-1], X.shape[::-1])):
        raise ValueError(f"cynorm.onnx: {name} of shape {p.shape} is not unidirectionally broadcastable to X's "
                         f"shape {X.shape}")
    lead = p.shape[:max(0, p.ndim - (X.ndim - axis))]
    if all(d == 1 for d in lead):
        return np.ascontiguousarray(np.broadcast_to(p.reshape(p.shape[len(lead):]), X.shape[axis:])), None
    return None, np.broadcast_to(p, X.shape)


def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, num_threads=None):
    """ONNX LayerNormalization: ``(Y, Mean, InvStdDev)``. Y has X's type and shape;
    Mean and InvStdDev have shape ``X.shape[:axis] + (1,)*k`` and the stash type."""
    X = _tensor(X, "X")
    Scale = _tensor(Scale, "Scale")
    B = None if B is None else _tensor(B, "B")
    axis, stash, eps = _axis_and_stash(X, axis, stash_type, epsilon)
    for name, p in (("Scale", Scale), ("B", B)):
        if p is not None and p.dtype != X.dtype:
            raise TypeError(f"cynorm.onnx: {name} must have X's type {_dtypes.dtype_name(X.dtype)} (T), got "
                            f"{_dtypes.dtype_name(p.dtype)}")
    w, w_full = _broadcast(Scale, X, axis, "Scale")
    b, b_full = (None, None) if B is None else _broadcast(B, X, axis, "B")
    f32_stage_one = X.dtype == _dtypes.F64   # the stash types are float32 and bfloat16
    if w is not None and (B is None or b is not None) and not f32_stage_one:
        Y, mean, rstd = _api.layer_norm_forward(X, w, b, axis=axis, eps=eps, num_threads=num_threads)
    else:   # stage one in the stash precision, then stage two in X's type, as the spec writes it
        Xs = X.astype(_dtypes.F32) if f32_stage_one else X
        N, mean, rstd = _api.layer_norm_forward(Xs, axis=axis, eps=eps, num_threads=num_threads)
        N = N.astype(X.dtype) if f32_stage_one else N
        Y = N * (w if w is not None else w_full)
        if B is not None:
            Y = Y + (b if b is not None else b_full)
        Y = np.ascontiguousarray(Y, dtype=X.dtype)
    return (Y, _dtypes.round_float32(mean.astype(_dtypes.F32), stash),
            _dtypes.round_float32(rstd.astype(_dtypes.F32), stash))


def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, num_threads=None):
    """ONNX RMSNormalization: Y, with X's shape and the scale's type."""
    X = _tensor(X, "X")
    scale = _tensor(scale, "scale")
    axis, stash, eps = _axis_and_stash(X, axis, stash_type, epsilon)
    w, w_full = _broadcast(scale, X, axis, "scale")
    f32_stage_one = X.dtype == _dtypes.F64   # the stash types are float32 and bfloat16
    if w is not None and scale.dtype == X.dtype and not f32_stage_one:
        return _api.rms_norm(X, w, axis=axis, eps=eps, num_threads=num_threads)
    Xs = X.astype(_dtypes.F32) if f32_stage_one else X
    N = _api.rms_norm(Xs, axis=axis, eps=eps, num_threads=num_threads)
    N = N.astype(X.dtype).astype(scale.dtype)          # the spec: back to X's type, then to the scale's
    Y = N * (w if w is not None else w_full)
    return np.ascontiguousarray(Y, dtype=scale.dtype)


#: GroupNormalization-21's stash types: float, float16, double, bfloat16
_GROUP_STASH = (1, 10, 11, 16)


def group_normalization(X, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1, num_threads=None):
    """ONNX GroupNormalization (opset 21): Y with X's shape and type. X is (N, C, D1, ...);
    scale and bias have shape (C,) and X's type."""
    from . import _group
    X = _tensor(X, "X")
    scale = _tensor(scale, "scale")
    bias = _tensor(bias, "bias")
    if isinstance(stash_type, bool) or stash_type not in _GROUP_STASH:
        raise ValueError(f"cynorm.onnx: stash_type must be 1 (float), 10 (float16), 11 (double) or 16 "
                         f"(bfloat16), got {stash_type!r}")
    _, _, C, _, _ = _checks.group_layout(X.shape, num_groups, 1)
    for name, p in (("scale", scale), ("bias", bias)):
        if p.dtype != X.dtype:
            raise TypeError(f"cynorm.onnx: {name} must have X's type {_dtypes.dtype_name(X.dtype)} (T), got "
                            f"{_dtypes.dtype_name(p.dtype)}")
        if p.shape != (C,):
            raise ValueError(f"cynorm.onnx: {name} must have shape (C,) = ({C},), got {p.shape}")
    eps = _checks.eps(epsilon)
    if X.dtype != _dtypes.F64 or stash_type == 11:
        return _group.group_norm(X, num_groups, scale, bias, eps=eps, num_threads=num_threads)
    N = _group.group_norm(X.astype(_dtypes.F32), num_groups, eps=eps, num_threads=num_threads).astype(X.dtype)
    per_channel = (1, C) + (1,) * (X.ndim - 2)
    return np.ascontiguousarray(N * scale.reshape(per_channel) + bias.reshape(per_channel))
