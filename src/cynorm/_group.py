"""GroupNorm and InstanceNorm on NumPy arrays (kernels/cn_gfwd.h, cn_gbwd.h).

x is (N, C, *spatial) with ``channel_axis=1`` (NCHW-style, any number of
spatial dims, none included) or (N, *spatial, C) with ``channel_axis=-1``
(NHWC-style, JAX's and Flax's default). The C channels fall into num_groups
groups of C/num_groups consecutive channels; each (sample, group) is
normalized over its channels and positions. weight and bias are per channel.
InstanceNorm is num_groups == C; num_groups == 1 is LayerNorm over
(C, *spatial) followed by a per-channel affine.

Same conventions as the LayerNorm functions: dtype pairs, statistics in
float32 (float64 for float64), 16-bit outputs rounded once, ``num_threads``,
``out=``, errors before anything is written. dweight/dbias are added sample
after sample in float64 from each sample's terms, so they are bit-identical
for any thread count, ISA level or batch chunking.
"""

import numpy as np

from . import _api, _checks, _isa, _outputs
from ._threads import resolve_num_threads

__all__ = ["group_norm", "group_norm_forward", "group_norm_backward",
           "instance_norm", "instance_norm_forward", "instance_norm_backward"]

_Y_MEAN_RSTD = ("y", "mean", "rstd")
_DX_DW_DB = ("dx", "dweight", "dbias")


#: (shape, num_groups, channel_axis) -> _checks.group_layout's result (bounded): most
#: callers repeat a few shapes, and the checks cost a tiny call's time again
_LAYOUT_CACHE = {}


def _layout(shape, num_groups, channel_axis):
    if type(num_groups) is int and type(channel_axis) is int:
        key = (shape, num_groups, channel_axis)
        hit = _LAYOUT_CACHE.get(key)
        if hit is None:
            hit = _checks.group_layout(shape, num_groups, channel_axis)
            if len(_LAYOUT_CACHE) >= 512:
                _LAYOUT_CACHE.clear()
            _LAYOUT_CACHE[key] = hit
        return hit
    return _checks.group_layout(shape, num_groups, channel_axis)


def _contiguous(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def group_norm_forward(x, num_groups, weight=None, bias=None, *, channel_axis=1, eps=1e-5, num_threads=None,
                       out=None):
    """GroupNorm that also returns the statistics the backward needs: ``(y, mean, rstd)``.

    ``y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c]``, mean and the
    (biased) variance over each sample's group of channels and all positions.
    mean and rstd have shape (N, num_groups). ``out=(y, mean, rstd)`` (any may
    be None) writes into given arrays; ``out`` may also be y alone, and y may be x.
    """
    x = _api._input(x, "x")
    channels_last, N, C, S, G = _layout(x.shape, num_groups, channel_axis)
    pair, weight, bias = _api._params(x.dtype, (C,), weight, bias, "(C,)")
    eps = _checks.eps(eps)
    T = resolve_num_threads(num_threads)
    y = mean = rstd = None
    fast = out is not None and x.flags.c_contiguous and _isa.kernels.given_outputs(
        out, (x.shape, (N, G), (N, G)), (pair.x, pair.stat, pair.stat), (x, weight, bias), (x,))
    if fast:   # plain, right, apart from the inputs (y may be x): nothing to check or copy
        y, mean, rstd = fast
    elif out is not None:
        if type(out) is np.ndarray:
            y = _outputs.check(out, "out", x.shape, pair.x)
        else:
            stat = ((N, G), pair.stat, None)
            got = _api._given(out, _Y_MEAN_RSTD, {"y": (x.shape, pair.x, None), "mean": stat, "rstd": stat})
            y, mean, rstd = got["y"], got["mean"], got["rstd"]
        x, weight, bias = _outputs.protect((x, weight, bias), (y, mean, rstd), _api._Y_IN_PLACE)
    x = _contiguous(x)
    if y is None:   # large ones on huge pages, recycled where one is kept (as LayerNorm's)
        y = _api._new(_api._makers(x.size, pair.x, 0, pair.stat)[0], x.shape, pair.x)[0]
    if mean is None:
        mean = np.empty((N, G), pair.stat)
    if rstd is None:
        rstd = np.empty((N, G), pair.stat)
    if N:
        _isa.kernels.group_forward(pair.code, x, y, weight, bias, mean, rstd, N, C, S, G, eps, channels_last,
                                   T or 0)
    return y, mean, rstd


def group_norm(x, num_groups, weight=None, bias=None, *, channel_axis=1, eps=1e-5, num_threads=None, out=None):
    """GroupNorm: returns y (see group_norm_forward)."""
    return group_norm_forward(x, num_groups, weight, bias, channel_axis=channel_axis, eps=eps,
                              num_threads=num_threads, out=out)[0]


def group_norm_backward(dy, x, mean, rstd, weight=None, *, num_groups, channel_axis=1, num_threads=None,
                        out=None):
    """Gradients of GroupNorm: ``(dx, dweight, dbias)``, dweight/dbias of shape (C,)
    (``(dx, None, None)`` without weight). mean/rstd are what the forward returned.
    ``out`` receives dx (it may be dy or x), or ``out=(dx, dweight, dbias)``."""
    x = _api._input(x, "x")
    dy = _api._input(dy, "dy")
    _checks.like("dy", dy.shape, dy.dtype, "x", x.shape, x.dtype)
    channels_last, N, C, S, G = _layout(x.shape, num_groups, channel_axis)
    pair, weight, _ = _api._params(x.dtype, (C,), weight, None, "(C,)")
    mean = _api._as_array(mean, "mean")
    rstd = _api._as_array(rstd, "rstd")
    _checks.group_stats("mean", mean.shape, mean.dtype, N, G, pair.stat)
    _checks.group_stats("rstd", rstd.shape, rstd.dtype, N, G, pair.stat)
    T = resolve_num_threads(num_threads)
    dx = dweight = dbias = None
    fast = out is not None and weight is not None and x.flags.c_contiguous and dy.flags.c_contiguous and \
        _isa.kernels.given_outputs(out, (x.shape, (C,), (C,)), (pair.x, pair.grad, pair.grad),
                                   (dy, x, mean, rstd, weight), (dy, x))
    if fast:   # plain, right, apart from the inputs (dx may be dy or x)
        dx, dweight, dbias = fast
    elif out is not None:
        if type(out) is np.ndarray:
            dx = _outputs.check(out, "out", x.shape, pair.x)
        else:
            grad = ((C,), pair.grad, None)
            got = _api._given(out, _DX_DW_DB, {"dx": (x.shape, pair.x, None), "dweight": grad, "dbias": grad})
            dx, dweight, dbias = got["dx"], got["dweight"], got["dbias"]
            if weight is None and (dweight is not None or dbias is not None):
                raise ValueError("cynorm: out gives dweight or dbias but there is no weight, so no "
                                 "parameter gradients to write")
        dy, x, mean, rstd, weight = _outputs.protect((dy, x, mean, rstd, weight), (dx, dweight, dbias),
                                                     _api._DX_IN_PLACE)
    x, dy, mean, rstd = _contiguous(x), _contiguous(dy), _contiguous(mean), _contiguous(rstd)
    if dx is None:
        dx = _api._new(_api._makers(x.size, pair.x, 0, pair.x)[0], x.shape, pair.x)[0]
    if weight is not None:
        if dweight is None:
            dweight = np.empty((C,), pair.grad)
        if dbias is None:
            dbias = np.empty((C,), pair.grad)
    _isa.kernels.group_backward(pair.code, dy, x, mean, rstd, weight, dx, dweight, dbias, None, N, C, S, G,
                                channels_last, T or 0)
    return dx, dweight, dbias


def explain(x, num_groups, weight=None, *, channel_axis=1, num_threads=None, backward=False, out=None):
    """cynorm.explain(..., norm="group_norm"): how a GroupNorm call would run. Its thread
    count comes from the policy as for LayerNorm over the same (sample, group) rows;
    channels-first calls give each thread whole rows, channels-last ones whole samples.
    ``out`` as the call's: whether y (dx) streams depends on where it lies."""
    if num_groups is None:
        raise ValueError("cynorm: explain(norm='group_norm') needs num_groups")
    x = _api._input(x, "x")
    channels_last, N, C, S, G = _layout(x.shape, num_groups, channel_axis)
    pair, weight, _ = _api._params(x.dtype, (C,), weight, None, "(C,)")
    T = resolve_num_threads(num_threads)
    from . import _dtypes, _tune
    out_addr = 0   # a new output: aligned
    if out is not None:
        arrays, labels = _outputs.unpack(out, _DX_DW_DB if backward else _Y_MEAN_RSTD)
        if arrays[0] is not None:
            out_addr = _outputs.check(arrays[0], labels[0], x.shape, pair.x).__array_interface__["data"][0]
    plan = _isa.kernels.group_explain_call(pair.code, N, C, S, G, channels_last, T or 0, bool(backward), out_addr)
    cls_name = _isa.kernels.class_names()[plan.pop("class")]
    return {"norm": "group_norm", "direction": "backward" if backward else "forward", "isa": _isa.level,
            "layout": "channels_last" if channels_last else "channels_first", "batch": N, "channels": C,
            "groups": G, "positions": S, "group_elems": C // G * S,
            "x_dtype": _dtypes.dtype_name(pair.x), "param_dtype": _dtypes.dtype_name(pair.param),
            "requested_threads": T, **plan,
            "policy": {**_tune.status(), "class": cls_name}}


def param_grads(part, pair):
    """(dweight, dbias) from the samples' terms (float64 (N, 2, C), in batch order), added
    and rounded by the C entry point's own code (_group_grads). cynorm.dask concatenates
    its chunks' terms and calls this: the same bits for any chunking."""
    return _isa.kernels.group_param_grads(pair.code, np.ascontiguousarray(part, dtype=np.float64), pair.grad)


def instance_norm_forward(x, weight=None, bias=None, *, channel_axis=1, eps=1e-5, num_threads=None, out=None):
    """InstanceNorm (GroupNorm with one channel per group): ``(y, mean, rstd)``, mean/rstd (N, C)."""
    C = _instance_channels(x, channel_axis)
    return group_norm_forward(x, C, weight, bias, channel_axis=channel_axis, eps=eps, num_threads=num_threads,
                              out=out)


def instance_norm(x, weight=None, bias=None, *, channel_axis=1, eps=1e-5, num_threads=None, out=None):
    """InstanceNorm: y."""
    return instance_norm_forward(x, weight, bias, channel_axis=channel_axis, eps=eps, num_threads=num_threads,
                                 out=out)[0]


def instance_norm_backward(dy, x, mean, rstd, weight=None, *, channel_axis=1, num_threads=None, out=None):
    """Gradients of InstanceNorm: ``(dx, dweight, dbias)``."""
    C = _instance_channels(x, channel_axis)
    return group_norm_backward(dy, x, mean, rstd, weight, num_groups=C, channel_axis=channel_axis,
                               num_threads=num_threads, out=out)


def _instance_channels(x, channel_axis):
    shape = np.shape(x)
    _checks.group_layout(shape, 1, channel_axis)
    return shape[channel_axis]
