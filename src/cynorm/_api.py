"""Public functions: validate the input, pick the dtype pair, call the kernels.

Every check happens before anything is written, so a refused call leaves the
caller's arrays (``out`` included) untouched. Inputs may be any array-like;
non-contiguous, Fortran-ordered or negative-stride arrays are copied to a
C-contiguous buffer first (outputs are always C-contiguous).
"""

import numpy as np

from . import _alloc, _checks, _dtypes, _isa, _outputs
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
    _checks.x_dtype(a.dtype, name)
    return a


def _params(x_dtype, norm_shape, weight, bias, what="x.shape[axis:]"):
    """Check weight/bias; returns (pair, weight, bias) as ndarrays or None (the kernel
    entry makes them C-contiguous). what: how messages name their shape."""
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
        arrays.append(p)
    weight, bias = arrays
    return _checks.params(x_dtype, norm_shape, weight, bias, what), weight, bias


def _stats(stat, name, shape, axis, dtype):
    """A mean/rstd argument of the backward, checked (the kernel entry makes it C-contiguous)."""
    stat = _as_array(stat, name)
    _checks.stats(name, stat.shape, stat.dtype, shape, axis, dtype)
    return stat


#: (x dtype, param dtype or None) -> Pair, for the fast path
_PAIR_CACHE = {**{k: v for k, v in _dtypes.PAIRS.items()},
               **{(x, None): _dtypes.PAIRS[(x, p)] for x, p in _dtypes.DEFAULT_PARAM.items()}}


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
        result = _checks.layout(shape, axis)
        if len(_LAYOUT_CACHE) >= _LAYOUT_CACHE_MAX:
            _LAYOUT_CACHE.clear()
        _LAYOUT_CACHE[(shape, axis)] = result
        return result
    return _checks.layout(shape, axis)


#: (x type number, param type number or -1) -> (pair code, stats type number),
#: for the kernels' forward_small
_FAST_PAIRS = {(x.num, -1 if p is None else p.num): (pair.code, pair.stat.num, pair.grad.num)
               for (x, p), pair in _PAIR_CACHE.items()}


#: the outputs each function returns (the single-array out= is the first)
_Y = ("y",)
_Y_MEAN_RSTD = ("y", "mean", "rstd")
_Y_RSTD = ("y", "rstd")
_DX_DW_DB = ("dx", "dweight", "dbias")
_DX_DW = ("dx", "dweight")
#: outputs that may be an input itself: y may be x; dx may be dy or x ((input, output) indices)
_Y_IN_PLACE = frozenset({(0, 0)})
_DX_IN_PLACE = frozenset({(0, 0), (1, 0)})


def _new(maker, shape, dtype):
    """A new output, and whether its pages are still to be faulted in (a recycled
    huge-page output has them in already)."""
    arr = maker(shape, dtype)
    return arr, not (maker is _huge_empty and _alloc.last_recycled())


def _given(out, names, specs):
    """The out= tuple as {name: checked array or None}; specs: name -> (shape, dtype, other shape)."""
    arrays, labels = _outputs.unpack(out, names)
    given = {}
    for name, arr, label in zip(names, arrays, labels):
        given[name] = None if arr is None else _outputs.check(arr, label, *specs[name])
    if sum(a is not None for a in arrays) > 1:
        _outputs.check_disjoint(arrays, labels)
    return given


def _forward(x, weight, bias, axis, eps, num_threads, out, center, names):
    """names: the outputs the caller returns, in order (y, then mean and/or rstd)."""
    # the common small call, checked and run in C (None: anything else)
    done = _isa.kernels.forward_small(x, weight, bias, axis, eps, num_threads, center, len(names), out,
                                      _FAST_PAIRS)
    if done is not None:
        return done
    x = _input(x, "x")
    ax, M, N, norm_shape, stat_shape = _layout(x, axis)
    pair, weight, bias = _params(x.dtype, norm_shape, weight, bias)
    eps = _checks.eps(eps)
    T = resolve_num_threads(num_threads)
    y = mean = rstd = None
    if out is not None:
        if type(out) is _ndarray:   # the single-array form: y
            y = _outputs.check(out, "out", x.shape, pair.x)
        else:
            stat = (stat_shape, pair.stat, x.shape[:ax])
            got = _given(out, names, {"y": (x.shape, pair.x, None), "mean": stat, "rstd": stat})
            y, mean, rstd = got.get("y"), got.get("mean"), got.get("rstd")
        x, weight, bias = _outputs.protect((x, weight, bias), (y, mean, rstd), _Y_IN_PLACE)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    new_y, new_stat = _makers(M * N, pair.x, M, pair.stat)
    fresh = False
    if y is None:
        y, fresh = _new(new_y, x.shape, pair.x)
    if mean is None and center and names is not _Y:
        mean = new_stat(stat_shape, pair.stat)
    if rstd is None and names is not _Y:
        rstd = new_stat(stat_shape, pair.stat)
    if M:
        _isa.kernels.forward(pair.code, center, x, y, weight, bias, mean, rstd, M, N, eps, T, fresh)
    return y, mean, rstd


def _backward(dy, x, mean, rstd, weight, axis, num_threads, out, center, names):
    """names: the outputs the caller returns (dx, dweight and, for LayerNorm, dbias)."""
    # the common small call, checked and run in C (None: anything else)
    done = _isa.kernels.backward_small(dy, x, mean, rstd, weight, axis, num_threads, center, out, _FAST_PAIRS)
    if done is not None:
        return done
    x = _input(x, "x")
    dy = _input(dy, "dy")
    _checks.like("dy", dy.shape, dy.dtype, "x", x.shape, x.dtype)
    ax, M, N, norm_shape, stat_shape = _layout(x, axis)
    pair, weight, _ = _params(x.dtype, norm_shape, weight, None)
    if center:
        mean = _stats(mean, "mean", x.shape, ax, pair.stat)
    rstd = _stats(rstd, "rstd", x.shape, ax, pair.stat)
    T = resolve_num_threads(num_threads)
    dx = dweight = dbias = None
    if out is not None:
        if type(out) is _ndarray:   # the single-array form: dx
            dx = _outputs.check(out, "out", x.shape, pair.x)
        else:
            grad = (norm_shape, pair.grad, None)
            got = _given(out, names, {"dx": (x.shape, pair.x, None), "dweight": grad, "dbias": grad})
            dx, dweight, dbias = got.get("dx"), got.get("dweight"), got.get("dbias")
            if weight is None and (dweight is not None or dbias is not None):
                raise ValueError(f"cynorm: out[{1 if dweight is not None else 2}] "
                                 f"({'dweight' if dweight is not None else 'dbias'}) is given but there is no "
                                 f"weight, so no {'dweight' if dweight is not None else 'dbias'} to write")
        dy, x, mean, rstd, weight = _outputs.protect((dy, x, mean, rstd, weight), (dx, dweight, dbias),
                                                     _DX_IN_PLACE)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    if not dy.flags.c_contiguous:
        dy = np.ascontiguousarray(dy)
    new_dx, new_grad = _makers(M * N, pair.x, N, pair.grad)
    fresh = False
    if dx is None:
        dx, fresh = _new(new_dx, x.shape, pair.x)
    if weight is not None:
        if dweight is None:
            dweight = new_grad(norm_shape, pair.grad)
        if center and dbias is None:
            dbias = new_grad(norm_shape, pair.grad)
    _isa.kernels.backward(pair.code, center, dy, x, mean, rstd, weight, dx, dweight, dbias, M, N, T, fresh)
    return dx, dweight, dbias


# ------------------------------------------------------------- LayerNorm --

_OUT_DOC = """``out`` may be one array (the first output, {first}) or a tuple with an entry
    per output ({all}), each an array or None (allocated). Given arrays must be
    C-contiguous, writeable and of exactly the output's dtype and shape; the call
    returns them."""


def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None, out=None):
    """LayerNorm over ``x.shape[axis:]``: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``axis`` is the first normalized axis (ONNX convention); torch's
    ``normalized_shape=s`` is ``axis=-len(s)``. ``weight``/``bias`` (optional,
    independently) have shape ``x.shape[axis:]``. The variance is biased.
    Returns y with x's dtype (written into ``out`` when given; ``out`` may be x).
    """
    return _forward(x, weight, bias, axis, eps, num_threads, out, True, _Y)[0]


def layer_norm_forward(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None, out=None):
    """LayerNorm that also returns the statistics the backward needs.

    Returns ``(y, mean, rstd)``; ``mean`` and ``rstd = 1/sqrt(var + eps)`` have
    shape ``x.shape[:axis] + (1,) * k`` (dims kept, so they broadcast against x)
    and dtype float32 (float64 for float64 input). ``out=(y, mean, rstd)``
    (any may be None) writes them into given arrays; mean and rstd may also
    have the squeezed shape ``x.shape[:axis]``.
    """
    return _forward(x, weight, bias, axis, eps, num_threads, out, True, _Y_MEAN_RSTD)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1, num_threads=None, out=None):
    """Gradients of LayerNorm: returns ``(dx, dweight, dbias)``.

    ``mean``/``rstd`` are what layer_norm_forward returned. With ``weight=None``
    the result is ``(dx, None, None)``. ``out`` receives dx (it may be dy or x),
    or ``out=(dx, dweight, dbias)`` (any may be None).
    dweight/dbias are bit-identical for any ``num_threads``.
    """
    return _backward(dy, x, mean, rstd, weight, axis, num_threads, out, True, _DX_DW_DB)


# --------------------------------------------------------------- RMSNorm --

def rms_norm(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None, out=None):
    """RMSNorm over ``x.shape[axis:]``: ``x / sqrt(mean(x**2) + eps) * weight``."""
    return _forward(x, weight, None, axis, eps, num_threads, out, False, _Y)[0]


def rms_norm_forward(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None, out=None):
    """RMSNorm that also returns ``rstd = 1/sqrt(mean(x**2) + eps)``: ``(y, rstd)``;
    ``out=(y, rstd)`` (either may be None)."""
    y, _, rstd = _forward(x, weight, None, axis, eps, num_threads, out, False, _Y_RSTD)
    return y, rstd


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1, num_threads=None, out=None):
    """Gradients of RMSNorm: ``(dx, dweight)``; dweight is None when weight is None.
    ``out`` receives dx, or ``out=(dx, dweight)``."""
    dx, dweight, _ = _backward(dy, x, None, rstd, weight, axis, num_threads, out, False, _DX_DW)
    return dx, dweight


# ----------------------------------------------------------------- explain --

def _policy_of(x, weight, axis, num_threads, norm, backward, out, every_field=False):
    """The policy a LayerNorm or RMSNorm call gets (cn_policy_for), with the call's
    pair, rows, columns and threads: explain()'s fields, or every_field: the whole
    cn_policy (cynorm.tune() compares two settings' policies by it)."""
    x = _input(x, "x")
    ax, M, N, norm_shape, stat_shape = _layout(x, axis)
    pair, weight, _ = _params(x.dtype, norm_shape, weight, None)
    T = resolve_num_threads(num_threads)
    center = norm == "layer_norm"
    dst = None
    if out is not None:
        arrays, labels = _outputs.unpack(out, ("dx",) if backward else ("y",))
        if arrays[0] is not None:
            dst = _outputs.check(arrays[0], labels[0], x.shape, pair.x)
    addr = x.__array_interface__["data"][0]
    out_addr = dst.__array_interface__["data"][0] if dst is not None else 64   # new outputs: 64-byte aligned or better
    grads = 0 if weight is None else (2 if center else 1)
    policy = _isa.kernels.explain_call(bool(backward), pair.code, center, M, N, T, dst is None, out_addr,
                                       addr | out_addr, grads, every_field)
    return policy, pair, M, N, T


def explain(x, weight=None, *, axis=-1, num_threads=None, norm="layer_norm", backward=False, out=None,
            num_groups=None, channel_axis=1):
    """How a call would run, as a dict: the ISA level, the kernel dtypes, the
    threads, the path through the rows, whether the output is streamed and how
    a fresh one is faulted in, group sizes, and the tunables in use.

    Takes the arguments of the call to explain (x, weight, axis, num_threads,
    out) plus ``norm`` ("layer_norm", "rms_norm" or "group_norm": then with
    ``num_groups`` and ``channel_axis`` instead of axis) and ``backward``; x may be
    any array (only its shape, dtype and address count). Nothing is computed.
    The policy comes from the same function the call uses (cn_policy_for), with
    this call alone in flight; an output it allocates is taken as fresh (a
    recycled one is not, see the README's Memory section). ``"policy"`` says
    whether a measured policy (cynorm.tune()) is loaded, the call's class, and
    which tunables came from measurement and which from the defaults.
    """
    if norm == "group_norm":
        from . import _group
        return _group.explain(x, num_groups, weight, channel_axis=channel_axis, num_threads=num_threads,
                              backward=backward, out=out)
    if norm not in ("layer_norm", "rms_norm"):
        raise ValueError(f"cynorm: norm must be 'layer_norm', 'rms_norm' or 'group_norm', got {norm!r}")
    policy, pair, M, N, T = _policy_of(x, weight, axis, num_threads, norm, backward, out)
    from . import _tune
    cls = policy.pop("class")
    cls_name = _isa.kernels.class_names()[cls]
    measured = _tune.loaded["measured"].get(cls_name, {}) if _tune.loaded else {}
    tunables = _isa.kernels.tunables(cls)
    return {"norm": norm, "direction": "backward" if backward else "forward", "isa": _isa.level,
            "rows": M, "cols": N, "x_dtype": _dtypes.dtype_name(pair.x), "param_dtype": _dtypes.dtype_name(pair.param),
            "requested_threads": T, **policy, "tunables": tunables,
            "policy": {**_tune.status(), "class": cls_name,
                       "measured": {k: tunables[k] for k in measured},
                       "defaults": sorted(k for k in tunables if k not in measured)}}
