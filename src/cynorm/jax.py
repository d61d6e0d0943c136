"""cynorm's kernels as JAX functions, through XLA's FFI.

    import jax, jax.numpy as jnp
    import cynorm.jax as cnj
    y = cnj.layer_norm(x, w, b)                               # jit, grad, vmap, checkpoint
    dx = jax.grad(lambda x: cnj.layer_norm(x, w, b).sum())(x)

``add_layer_norm`` and ``add_rms_norm`` are the fused residual add + norm
(``cynorm.add_layer_norm_forward``): they return ``(y, h)``, and their
gradient with respect to x and residual is ``dx + dh``, added before rounding.

``group_norm(x, num_groups, w, b)`` is GroupNorm, channels-last (NHWC) by
default as Flax's GroupNorm is (``channel_axis=1`` for NCHW); ``instance_norm``
is one channel per group.

``layer_norm`` and ``rms_norm`` are differentiable (``jax.custom_vjp``: the
forward saves mean/rstd, the backward runs cynorm's backward) and run jitted.
The kernels are XLA FFI custom calls (``jax.ffi.ffi_call``): XLA's buffers go
straight to cynorm's C entry point, without Python or the GIL. Under
``jax.vmap`` a batched weight normalizes each example with its own weight, and
gradients are per example (a batched or unbatched weight alike); each example
gets the bits a call on it alone gives. Results are bit-identical to the NumPy
API's. float64 needs JAX's ``jax_enable_x64`` (without it JAX itself turns
float64 arrays into float32). Needs the ``jax`` extra: ``pip install "cynorm[jax]"``.

Threads: each call runs cynorm's OpenMP team inside one XLA operation, on the
XLA thread that runs it. ``num_threads`` caps it; the default is OpenMP's for
that thread (``OMP_NUM_THREADS``, else every core): threadpoolctl limits set in
Python do not reach XLA's threads. XLA runs other operations at the same time
only when they do not depend on each other; to leave cores to them, pass
``num_threads``.
"""

import functools

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("cynorm.jax needs jax: pip install 'cynorm[jax]'") from exc

from . import _checks, _core, _dtypes

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "group_norm", "instance_norm"]

for _name, _capsule in _core.xla_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _threads(num_threads):
    n = _checks.num_threads(num_threads)
    return 0 if n is None else n


def _check(x, weight, bias, axis, eps):
    """Validate as the NumPy API does (cynorm._checks); returns (axis in [0, ndim), stats dtype)."""
    xd = _checks.x_dtype(x.dtype)
    axis, _, _, norm_shape, _ = _checks.layout(x.shape, axis)
    pair = _checks.params(xd, norm_shape, weight, bias)
    if eps is not None:
        _checks.eps(eps)
    return axis, pair.stat


def _attrs(x, axis, center, has_weight, has_bias, num_threads):
    return dict(center=np.int32(center), x_ndim=np.int32(x.ndim), norm_ndim=np.int32(x.ndim - axis),
                has_weight=np.int32(has_weight), has_bias=np.int32(has_bias), num_threads=np.int32(num_threads))


def _forward(x, weight, bias, axis, eps, center, num_threads):
    axis, stat = _check(x, weight, bias, axis, eps)
    stat_shape = tuple(x.shape[:axis]) + (1,) * (x.ndim - axis)
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype)]
    results += [jax.ShapeDtypeStruct(stat_shape, stat)] * (2 if center else 1)
    args = [x] + [p for p in (weight, bias) if p is not None]
    out = jax.ffi.ffi_call("cynorm_forward", results, vmap_method="expand_dims")(
        *args, eps=np.float64(eps), **_attrs(x, axis, center, weight is not None, bias is not None, num_threads))
    return (out[0], out[1], out[2]) if center else (out[0], None, out[1])


def _grad_results(grad_in, x_dtype, weight, center):
    """The backward's results: the input gradient (grad_in's shape and dtype), then
    dweight (and dbias for LayerNorm) in the pair's gradient dtype."""
    results = [jax.ShapeDtypeStruct(grad_in.shape, grad_in.dtype)]
    if weight is not None:
        results += [jax.ShapeDtypeStruct(weight.shape, _checks.pair(np.dtype(x_dtype), np.dtype(weight.dtype)).grad)]
        if center:
            results.append(results[-1])
    return results


def _backward(dy, x, mean, rstd, weight, axis, center, num_threads):
    axis, _ = _check(x, weight, None, axis, None)
    results = _grad_results(x, x.dtype, weight, center)
    args = [dy, x] + ([mean] if center else []) + [rstd] + ([weight] if weight is not None else [])
    out = jax.ffi.ffi_call("cynorm_backward", results, vmap_method="expand_dims")(
        *args, **_attrs(x, axis, center, weight is not None, False, num_threads))
    out = list(out) + [None] * (3 - len(out))
    return out[0], out[1], out[2]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _norm(x, weight, bias, axis, eps, center, num_threads):
    return _forward(x, weight, bias, axis, eps, center, num_threads)[0]


def _norm_fwd(x, weight, bias, axis, eps, center, num_threads):
    y, mean, rstd = _forward(x, weight, bias, axis, eps, center, num_threads)
    return y, (x, weight, bias, mean, rstd)


def _norm_bwd(axis, eps, center, num_threads, res, dy):
    x, weight, bias, mean, rstd = res
    w = weight
    if w is None and bias is not None:   # dbias needs the weight path: a weight of ones changes no bit
        w = jnp.ones_like(bias)
    dx, dw, db = _backward(dy.astype(x.dtype), x, mean, rstd, w, axis, center, num_threads)
    return dx, (dw if weight is not None else None), (db if bias is not None else None)


_norm.defvjp(_norm_fwd, _norm_bwd)


@functools.partial(jax.jit, static_argnames=("axis", "eps", "center", "num_threads"))
def _jitted(x, weight, bias, axis, eps, center, num_threads):
    return _norm(x, weight, bias, axis, eps, center, num_threads)


def _static_axis(axis):
    """axis as a plain int (a static argument of the jitted function): an int is checked
    against x's rank inside, by _check, with the NumPy API's message."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        _checks.axis(axis, 1)   # raises the NumPy API's TypeError
    return int(axis)


def _as_array(a):
    return a if a is None or isinstance(a, jax.Array) or hasattr(a, "aval") else jnp.asarray(a)


def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None):
    """LayerNorm over ``x.shape[axis:]`` as a differentiable JAX function (see the module docstring);
    arguments as ``cynorm.layer_norm``. Returns y with x's dtype."""
    return _jitted(_as_array(x), _as_array(weight), _as_array(bias), axis=_static_axis(axis), eps=_checks.eps(eps),
                   center=True, num_threads=_threads(num_threads))


def rms_norm(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None):
    """RMSNorm over ``x.shape[axis:]`` as a differentiable JAX function; arguments as
    ``cynorm.rms_norm``. Returns y with x's dtype."""
    return _jitted(_as_array(x), _as_array(weight), None, axis=_static_axis(axis), eps=_checks.eps(eps), center=False,
                   num_threads=_threads(num_threads))


# ------------------------------------------------- fused residual add + norm --

def _stream(x, residual, residual_dtype):
    """h's dtype, with residual's shape and dtype checked as the NumPy API checks them."""
    return _checks.residual(x.shape, _checks.x_dtype(x.dtype), residual.shape, residual.dtype, residual_dtype)


def _add_forward(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads):
    axis, _ = _check(x, weight, bias, axis, eps)
    hd = np.dtype(h_dtype)
    stat = _dtypes.ACCUMULATOR[hd]
    stat_shape = tuple(x.shape[:axis]) + (1,) * (x.ndim - axis)
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, hd)]
    results += [jax.ShapeDtypeStruct(stat_shape, stat)] * (2 if center else 1)
    args = [x, residual] + [p for p in (weight, bias) if p is not None]
    out = jax.ffi.ffi_call("cynorm_add_forward", results, vmap_method="expand_dims")(
        *args, eps=np.float64(eps), **_attrs(x, axis, center, weight is not None, bias is not None, num_threads))
    return (out[0], out[1], out[2], out[3]) if center else (out[0], out[1], None, out[2])


def _add_backward(dy, h, mean, rstd, weight, dh, axis, center, num_threads):
    axis, _ = _check(dy, weight, None, axis, None)
    results = _grad_results(h, dy.dtype, weight, center)
    args = [dy, h] + ([mean] if center else []) + [rstd] + ([weight] if weight is not None else []) + [dh]
    out = jax.ffi.ffi_call("cynorm_add_backward", results, vmap_method="expand_dims")(
        *args, has_dh=np.int32(1), **_attrs(dy, axis, center, weight is not None, False, num_threads))
    out = list(out) + [None] * (3 - len(out))
    return out[0], out[1], out[2]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _add_norm(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads):
    y, h, _, _ = _add_forward(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads)
    return y, h


def _add_norm_fwd(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads):
    y, h, mean, rstd = _add_forward(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads)
    # dtypes of x and residual, for their cotangents (a residual must be a JAX value)
    return (y, h), (h, weight, bias, mean, rstd, jnp.zeros((), x.dtype), jnp.zeros((), residual.dtype))


def _add_norm_bwd(axis, eps, center, h_dtype, num_threads, res, cts):
    h, weight, bias, mean, rstd, x_proto, r_proto = res
    dy, dh = cts
    w = weight
    if w is None and bias is not None:   # dbias needs the weight path: a weight of ones changes no bit
        w = jnp.ones_like(bias)
    dsum, dw, db = _add_backward(dy.astype(x_proto.dtype), h, mean, rstd, w, dh.astype(h.dtype), axis, center,
                                 num_threads)
    return (dsum.astype(x_proto.dtype), dsum.astype(r_proto.dtype), (dw if weight is not None else None),
            (db if bias is not None else None))


_add_norm.defvjp(_add_norm_fwd, _add_norm_bwd)


@functools.partial(jax.jit, static_argnames=("axis", "eps", "center", "h_dtype", "num_threads"))
def _add_jitted(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads):
    return _add_norm(x, residual, weight, bias, axis, eps, center, h_dtype, num_threads)


def add_layer_norm(x, residual, weight=None, bias=None, *, axis=-1, eps=1e-5, residual_dtype=None, num_threads=None):
    """``h = x + residual`` (rounded once to residual_dtype), then LayerNorm of h, as a
    differentiable JAX function: returns ``(y, h)``; arguments as
    ``cynorm.add_layer_norm_forward``. The cotangent of x and of residual is
    ``dx + dh`` (h's cotangent added to the norm's dx in float32 before rounding),
    cast to their dtypes."""
    x, residual = _as_array(x), _as_array(residual)
    hd = _stream(x, residual, residual_dtype)
    return _add_jitted(x, residual, _as_array(weight), _as_array(bias), axis=_static_axis(axis), eps=_checks.eps(eps),
                       center=True, h_dtype=hd.name, num_threads=_threads(num_threads))


def add_rms_norm(x, residual, weight=None, *, axis=-1, eps=1e-6, residual_dtype=None, num_threads=None):
    """``h = x + residual``, then RMSNorm of h: ``(y, h)``, as add_layer_norm."""
    x, residual = _as_array(x), _as_array(residual)
    hd = _stream(x, residual, residual_dtype)
    return _add_jitted(x, residual, _as_array(weight), None, axis=_static_axis(axis), eps=_checks.eps(eps), center=False,
                       h_dtype=hd.name, num_threads=_threads(num_threads))



# ------------------------------------------------------------- GroupNorm --

def _group_attrs(x, G, channel_axis, has_weight, has_bias, num_threads):
    channels_last = _checks.group_layout(x.shape, G, channel_axis)[0]
    return dict(num_groups=np.int32(G), channels_last=np.int32(channels_last), x_ndim=np.int32(x.ndim),
                has_weight=np.int32(has_weight), has_bias=np.int32(has_bias), num_threads=np.int32(num_threads))


def _group_forward(x, weight, bias, G, channel_axis, eps, num_threads):
    _, N, C, _, _ = _checks.group_layout(x.shape, G, channel_axis)
    pair = _checks.params(_checks.x_dtype(x.dtype), (C,), weight, bias, "(C,)")
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype)] + [jax.ShapeDtypeStruct((N, G), pair.stat)] * 2
    args = [x] + [p for p in (weight, bias) if p is not None]
    y, mean, rstd = jax.ffi.ffi_call("cynorm_group_forward", results, vmap_method="expand_dims")(
        *args, eps=np.float64(eps), **_group_attrs(x, G, channel_axis, weight is not None, bias is not None,
                                                   num_threads))
    return y, mean, rstd


def _group_backward(dy, x, mean, rstd, weight, G, channel_axis, num_threads):
    results = _grad_results(x, x.dtype, weight, True)
    args = [dy, x, mean, rstd] + ([weight] if weight is not None else [])
    out = jax.ffi.ffi_call("cynorm_group_backward", results, vmap_method="expand_dims")(
        *args, **_group_attrs(x, G, channel_axis, weight is not None, False, num_threads))
    out = list(out) + [None] * (3 - len(out))
    return out[0], out[1], out[2]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _group(x, weight, bias, G, channel_axis, eps, num_threads):
    return _group_forward(x, weight, bias, G, channel_axis, eps, num_threads)[0]


def _group_fwd(x, weight, bias, G, channel_axis, eps, num_threads):
    y, mean, rstd = _group_forward(x, weight, bias, G, channel_axis, eps, num_threads)
    return y, (x, weight, bias, mean, rstd)


def _group_bwd(G, channel_axis, eps, num_threads, res, dy):
    x, weight, bias, mean, rstd = res
    w = weight
    if w is None and bias is not None:   # dbias needs the weight path: a weight of ones changes no bit
        w = jnp.ones_like(bias)
    dx, dw, db = _group_backward(dy.astype(x.dtype), x, mean, rstd, w, G, channel_axis, num_threads)
    return dx, (dw if weight is not None else None), (db if bias is not None else None)


_group.defvjp(_group_fwd, _group_bwd)


@functools.partial(jax.jit, static_argnames=("G", "channel_axis", "eps", "num_threads"))
def _group_jitted(x, weight, bias, G, channel_axis, eps, num_threads):
    return _group(x, weight, bias, G, channel_axis, eps, num_threads)


def _static_int(v, name):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"cynorm: {name} must be an int, got {type(v).__name__}")
    return int(v)


def group_norm(x, num_groups, weight=None, bias=None, *, channel_axis=-1, eps=1e-5, num_threads=None):
    """GroupNorm as a differentiable JAX function (jit, grad, vmap): arguments as
    ``cynorm.group_norm``, but channels-last by default (NHWC, as Flax's GroupNorm;
    ``channel_axis=1`` for NCHW). Returns y with x's dtype."""
    return _group_jitted(_as_array(x), _as_array(weight), _as_array(bias), G=_static_int(num_groups, "num_groups"),
                         channel_axis=_static_int(channel_axis, "channel_axis"), eps=_checks.eps(eps),
                         num_threads=_threads(num_threads))


def instance_norm(x, weight=None, bias=None, *, channel_axis=-1, eps=1e-5, num_threads=None):
    """InstanceNorm (one channel per group) as a differentiable JAX function."""
    x = _as_array(x)
    ca = _static_int(channel_axis, "channel_axis")
    _checks.group_layout(x.shape, 1, ca)
    return group_norm(x, x.shape[ca], weight, bias, channel_axis=ca, eps=eps, num_threads=num_threads)
