"""cynorm on Dask arrays: a lazy forward, and a backward whose dweight/dbias are
bit-identical to one cynorm call on the whole array, for any row chunking.

    import dask.array as da
    import cynorm.dask as cnd
    y, mean, rstd = cnd.layer_norm_forward(x, w, b)          # x: a dask array
    dx, dw, db = cnd.layer_norm_backward(dy, x, mean, rstd, w)
    dw, db = dask.compute(dw, db)                            # every output is a dask array

Each row chunk runs cynorm's kernels as one task. The normalized axes
(``x.shape[axis:]``) must each be one chunk; split ones are rechunked, with a
PerformanceWarning. Forward results get x's chunks (mean/rstd: x's row chunks,
and 1 along the normalized axes).

Exact gradients. cynorm adds the rows of dweight/dbias in fixed blocks of
``block_rows(x.shape, axis, x.dtype)`` rows (the size depends on the whole
array's shape, never on threads or chunks). The backward runs row chunks that
start on block boundaries (rechunking dy/x/mean/rstd to the nearest ones where
needed, and dx back to x's chunks), has each task return its blocks' partial
sums, and adds them in block order, as one call does, then rounds once: the
same bits. Row chunks in multiples of block_rows avoid the rechunk.

Fused residual add + norm: ``add_layer_norm_forward(x, residual, ...)`` gives
``(y, h, mean, rstd)`` chunk by chunk, and ``add_layer_norm_backward(dy, h, mean,
rstd, w, dh=...)`` gives ``(dsum, dweight, dbias)`` with the same exact block
order (as ``cynorm.add_layer_norm_forward`` / ``_backward``; RMSNorm likewise).

GroupNorm: ``group_norm_forward(x, num_groups, w, b, channel_axis=1)`` and
``group_norm_backward(dy, x, mean, rstd, w, num_groups=..., channel_axis=...)``
take x chunked along the batch axis only (the others are rechunked to one
chunk, with a PerformanceWarning). Each task returns its samples' dweight/dbias
terms; they are added sample after sample, as one call adds them: the same bits
for any chunking of the batch.

Threads. Inside a ``distributed`` worker a task uses the worker's threads
(threads_per_worker) divided by the tasks it is running, so a node is never
oversubscribed; ``num_threads`` caps it. Elsewhere (threaded or synchronous
scheduler) cynorm's default applies: concurrent calls share the cores.
Needs the ``dask`` extra: ``pip install "cynorm[dask]"``.
"""

import math
import warnings

import numpy as np

try:
    import dask.array as da
    from dask.array.core import PerformanceWarning
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("cynorm.dask needs dask: pip install 'cynorm[dask]'") from exc

from . import _api, _checks, _core, _dtypes, _fused, _group, _isa
from ._threads import resolve_num_threads

__all__ = ["layer_norm", "layer_norm_forward", "layer_norm_backward",
           "rms_norm", "rms_norm_forward", "rms_norm_backward",
           "add_layer_norm_forward", "add_layer_norm_backward", "add_rms_norm_forward", "add_rms_norm_backward",
           "group_norm", "group_norm_forward", "group_norm_backward", "block_rows"]


# ------------------------------------------------------------- threads --

def _task_threads(num_threads):
    """Threads for one task: the worker's share, capped by num_threads."""
    try:
        from distributed import get_worker
        state = get_worker().state
    except (ImportError, ValueError):   # not in a distributed worker: cynorm's default
        return num_threads
    share = max(1, state.nthreads // max(1, len(state.executing)))
    return share if num_threads is None else min(num_threads, share)


# ----------------------------------------------------------- validation --

def _as_dask(a, name):
    if isinstance(a, da.Array):
        return a
    arr = _api._input(a, name)
    return da.from_array(arr, chunks=arr.shape or ())


def _param(p, name):
    """weight or bias as a dask array in one chunk (shape and dtype: _checks.params)."""
    if p is None:
        return None
    p = _as_dask(p, name)
    return p.rechunk(-1) if p.numblocks != (1,) * p.ndim else p


def _layout(x, axis):
    """(axis in [0, ndim), rows M, columns N, normalized shape); x's chunks checked."""
    _checks.x_dtype(x.dtype)
    if any(math.isnan(s) for s in x.shape):
        raise ValueError("cynorm: x has unknown chunk sizes; call x.compute_chunk_sizes() first")
    ax, M, N, norm_shape, _ = _checks.layout(x.shape, axis)
    return ax, M, N, norm_shape


def _whole_norm_axes(a, ax, name):
    """a with each normalized axis in one chunk (rechunked with a warning if split)."""
    split = [k for k in range(ax, a.ndim) if len(a.chunks[k]) > 1]
    if not split:
        return a
    warnings.warn(f"cynorm.dask: {name} is split along normalized axes {split}; rechunking them to one chunk "
                  f"each. To avoid this, chunk only the leading axes, e.g. {name}.rechunk({ {k: -1 for k in split} })",
                  PerformanceWarning, stacklevel=4)
    return a.rechunk({k: -1 for k in split})


def block_rows(shape, axis=-1, dtype=np.float32):
    """Rows per dweight/dbias block for x of this shape and dtype: row chunks in
    multiples of it keep the exact backward from rechunking."""
    _, M, N, _, _ = _checks.layout(shape, axis)
    return _core.block_rows(M, N, _dtypes.ACCUMULATOR[_checks.x_dtype(dtype, "dtype")].itemsize)


# -------------------------------------------------------------- forward --

def _forward_task(x, residual, weight, bias, *, axis, eps, center, num_threads, h_dtype):
    T = _task_threads(num_threads)
    if residual is not None:   # the fused forward: (y, h, mean, rstd)
        return _fused._add_forward(x, residual, weight, bias, axis, eps, h_dtype, T, None, center)
    if center:
        return _api.layer_norm_forward(x, weight, bias, axis=axis, eps=eps, num_threads=T)
    y, rstd = _api.rms_norm_forward(x, weight, axis=axis, eps=eps, num_threads=T)
    return y, None, rstd


def _pick(parts, k):
    return parts[k]


def _forward(x, weight, bias, axis, eps, num_threads, center, residual=None, residual_dtype=None):
    """residual given: the fused forward, (y, h, mean, rstd)."""
    x = _as_dask(x, "x")
    ax, M, N, norm_shape = _layout(x, axis)
    weight, bias = _param(weight, "weight"), _param(bias, "bias")
    pair = _checks.params(np.dtype(x.dtype), norm_shape, weight, bias)
    eps = _checks.eps(eps)
    _checks.num_threads(num_threads)
    x = _whole_norm_axes(x, ax, "x")
    ind = tuple(range(x.ndim))
    fused = residual is not None
    if fused:
        residual = _as_dask(residual, "residual")
        h_dtype = _checks.residual(x.shape, pair.x, residual.shape, residual.dtype, residual_dtype)
        residual = residual.rechunk(x.chunks)
    args = [x, ind, residual, ind if fused else None]
    for p in (weight, bias):
        args += [p, ind[ax:]] if p is not None else [None, None]
    norm = ("add_" if fused else "") + ("layer_norm" if center else "rms_norm")
    parts = da.blockwise(_forward_task, ind, *args, axis=ax, eps=eps, center=center, num_threads=num_threads,
                         h_dtype=h_dtype if fused else None, token=f"cynorm-{norm}-forward",
                         meta=np.empty((0,) * x.ndim, object), dtype=object, concatenate=True)
    stat_chunks = x.chunks[:ax] + ((1,),) * (x.ndim - ax)
    stat = _dtypes.ACCUMULATOR[h_dtype if fused else pair.x]
    y = parts.map_blocks(_pick, 0, chunks=x.chunks, dtype=pair.x, meta=np.empty((0,) * x.ndim, pair.x),
                         token=f"cynorm-{norm}-y")
    k = 1 + fused
    stat_meta = np.empty((0,) * x.ndim, stat)
    mean = (parts.map_blocks(_pick, k, chunks=stat_chunks, dtype=stat, meta=stat_meta, token=f"cynorm-{norm}-mean")
            if center else None)
    rstd = parts.map_blocks(_pick, k + 1, chunks=stat_chunks, dtype=stat, meta=stat_meta, token=f"cynorm-{norm}-rstd")
    if not fused:
        return y, mean, rstd
    h = parts.map_blocks(_pick, 1, chunks=x.chunks, dtype=h_dtype, meta=np.empty((0,) * x.ndim, h_dtype),
                         token=f"cynorm-{norm}-h")
    return y, h, mean, rstd


# ------------------------------------------------------------- backward --

def _aligned_chunks(chunks, B, M):
    """Row chunks whose starts are multiples of B, near the given ones."""
    bounds = np.cumsum((0,) + tuple(chunks))
    starts = sorted({min(M, int(round(s / B)) * B) for s in bounds[:-1]} | {0})
    starts = [s for s in starts if s < M] + [M]
    return tuple(int(b - a) for a, b in zip(starts, starts[1:])) or (0,)


def _backward_task(dy, x, mean, rstd, weight, dh=None, *, code, center, N, B, acc, num_threads):
    """code: the pair code; or for the fused backward (x is h), the dtype codes
    (x, params, h) of cynorm.h."""
    M = x.shape[0]
    dx = np.empty(x.shape, x.dtype)
    nb = -(-M // B)
    pw = np.empty((nb, N), acc) if weight is not None else None
    pb = np.empty((nb, N), acc) if weight is not None and center else None
    T = resolve_num_threads(_task_threads(num_threads))
    c = np.ascontiguousarray
    if M and isinstance(code, tuple):
        xc, pc, hc = code
        _isa.kernels.add_backward(xc, pc, hc, hc, center, c(dy), c(x), None if mean is None else c(mean), c(rstd),
                                  weight, None if dh is None else c(dh), dx, None, None, M, N, T, False, B, pw, pb)
    elif M:
        _isa.kernels.backward(code, center, c(dy), c(x), None if mean is None else c(mean), c(rstd),
                              weight, dx, None, None, M, N, T, False, B,
                              pw, pb)
    return dx, pw, pb


def _sum_blocks(partials, grad_dtype):
    """The blocks' partial sums added in block order, as one call adds them, then rounded
    to the gradient dtype as cynorm rounds (round to nearest even; bfloat16 flushes subnormals)."""
    if len(partials) == 0:   # no rows
        return np.zeros(partials.shape[1:], grad_dtype)
    total = partials[0].copy()
    for row in partials[1:]:     # sequential, in block order: the kernel's order
        total += row
    return _dtypes.round_float32(total, grad_dtype)


def _stats_2d(s, name, x, ax, M, stat_dtype):
    s = _as_dask(s, name)
    _checks.stats(name, s.shape, s.dtype, x.shape, ax, stat_dtype)
    return s.reshape(M, 1)


def _backward(dy, x, mean, rstd, weight, axis, num_threads, center, fused=False, dh=None):
    """fused: x is h of the fused forward, dh (or None) is added to dx."""
    x, dy = _as_dask(x, "x"), _as_dask(dy, "dy")
    ax, M, N, norm_shape = _layout(x, axis)
    if fused:   # x is h: dy's dtype or its accumulator's
        _checks.h_of(x.shape, x.dtype, dy.shape, dy.dtype)
    else:
        _checks.like("dy", dy.shape, dy.dtype, "x", x.shape, x.dtype)
    weight = _param(weight, "weight")
    pair = _checks.params(_checks.x_dtype(dy.dtype, "dy"), norm_shape, weight, None)
    _checks.num_threads(num_threads)
    stat = _dtypes.ACCUMULATOR[np.dtype(x.dtype)]
    mean2 = _stats_2d(mean, "mean", x, ax, M, stat) if center else None
    rstd2 = _stats_2d(rstd, "rstd", x, ax, M, stat)
    if dh is not None:
        dh = _as_dask(dh, "dh")
        _checks.like("dh", dh.shape, dh.dtype, "h", x.shape, x.dtype)
    x_chunks = x.chunks
    x2 = _whole_norm_axes(x, ax, "x").reshape(M, N)
    dy2 = _whole_norm_axes(dy, ax, "dy").reshape(M, N)
    acc = stat
    B = _core.block_rows(M, N, acc.itemsize)
    rows = _aligned_chunks(x2.chunks[0], B, M)
    x2, dy2, rstd2 = x2.rechunk((rows, N)), dy2.rechunk((rows, N)), rstd2.rechunk((rows, 1))
    mean2 = mean2.rechunk((rows, 1)) if center else None
    dh2 = _whole_norm_axes(dh, ax, "dh").reshape(M, N).rechunk((rows, N)) if dh is not None else None
    w1 = weight.reshape(N) if weight is not None else None
    norm = ("add_" if fused else "") + ("layer_norm" if center else "rms_norm")
    code = pair.code
    if fused:
        code = (_fused._CODE[pair.x], _fused._param_code(pair, weight, None), _fused._CODE[np.dtype(x.dtype)])
    parts = da.blockwise(_backward_task, "ij", dy2, "ij", x2, "ij", mean2, "ij" if center else None, rstd2, "ij",
                         w1, "j" if weight is not None else None, dh2, "ij" if dh is not None else None,
                         code=code, center=center, N=N, B=B, acc=acc,
                         num_threads=num_threads, token=f"cynorm-{norm}-backward", meta=np.empty((0, 0), object),
                         dtype=object, concatenate=True)
    dx = parts.map_blocks(_pick, 0, chunks=(rows, (N,)), dtype=x.dtype, meta=np.empty((0, 0), x.dtype),
                          token=f"cynorm-{norm}-dx")
    dx = dx.reshape(x.shape)
    if dx.chunks != x_chunks:
        dx = dx.rechunk(x_chunks)
    grads = []
    if weight is not None:
        blocks = tuple(-(-r // B) for r in rows)
        for k, grad in ((1, "dweight"), (2, "dbias"))[:1 + center]:
            partial = parts.map_blocks(_pick, k, chunks=(blocks, (N,)), dtype=acc, meta=np.empty((0, 0), acc),
                                       token=f"cynorm-{norm}-{grad}-blocks")
            total = da.blockwise(_sum_blocks, "j", partial, "ij", pair.grad, None, concatenate=True,   # all blocks
                                 token=f"cynorm-{norm}-{grad}", dtype=pair.grad, meta=np.empty((0,), pair.grad))
            grads.append(total.reshape(norm_shape))
    grads += [None] * (2 - len(grads))
    return dx, grads[0], grads[1]


# ------------------------------------------------------------- public API --

def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None):
    """LayerNorm of a dask array over ``x.shape[axis:]`` (as ``cynorm.layer_norm``); returns y, lazily."""
    return _forward(x, weight, bias, axis, eps, num_threads, True)[0]


def layer_norm_forward(x, weight=None, bias=None, *, axis=-1, eps=1e-5, num_threads=None):
    """``(y, mean, rstd)`` as dask arrays (as ``cynorm.layer_norm_forward``)."""
    return _forward(x, weight, bias, axis, eps, num_threads, True)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1, num_threads=None):
    """``(dx, dweight, dbias)`` as dask arrays; dweight/dbias bit-identical to
    ``cynorm.layer_norm_backward`` on the whole array, for any chunking (None without a weight)."""
    return _backward(dy, x, mean, rstd, weight, axis, num_threads, True)


def rms_norm(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None):
    """RMSNorm of a dask array over ``x.shape[axis:]`` (as ``cynorm.rms_norm``); returns y, lazily."""
    return _forward(x, weight, None, axis, eps, num_threads, False)[0]


def rms_norm_forward(x, weight=None, *, axis=-1, eps=1e-6, num_threads=None):
    """``(y, rstd)`` as dask arrays (as ``cynorm.rms_norm_forward``)."""
    y, _, rstd = _forward(x, weight, None, axis, eps, num_threads, False)
    return y, rstd


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1, num_threads=None):
    """``(dx, dweight)`` as dask arrays; dweight bit-identical to ``cynorm.rms_norm_backward``
    on the whole array, for any chunking (None without a weight)."""
    dx, dw, _ = _backward(dy, x, None, rstd, weight, axis, num_threads, False)
    return dx, dw


# ------------------------------------------------- fused residual add + norm --

def add_layer_norm_forward(x, residual, weight=None, bias=None, *, axis=-1, eps=1e-5, residual_dtype=None,
                           num_threads=None):
    """``(y, h, mean, rstd)`` as dask arrays (as ``cynorm.add_layer_norm_forward``);
    residual is rechunked to x's chunks."""
    return _forward(x, weight, bias, axis, eps, num_threads, True, residual, residual_dtype)


def add_layer_norm_backward(dy, h, mean, rstd, weight=None, *, dh=None, axis=-1, num_threads=None):
    """``(dsum, dweight, dbias)`` as dask arrays (as ``cynorm.add_layer_norm_backward``):
    dsum = dx + dh in h's dtype; dweight/dbias bit-identical to one call on the whole array."""
    return _backward(dy, h, mean, rstd, weight, axis, num_threads, True, fused=True, dh=dh)


def add_rms_norm_forward(x, residual, weight=None, *, axis=-1, eps=1e-6, residual_dtype=None, num_threads=None):
    """``(y, h, rstd)`` as dask arrays (as ``cynorm.add_rms_norm_forward``)."""
    y, h, _, rstd = _forward(x, weight, None, axis, eps, num_threads, False, residual, residual_dtype)
    return y, h, rstd


def add_rms_norm_backward(dy, h, rstd, weight=None, *, dh=None, axis=-1, num_threads=None):
    """``(dsum, dweight)`` as dask arrays (as ``cynorm.add_rms_norm_backward``)."""
    dsum, dw, _ = _backward(dy, h, None, rstd, weight, axis, num_threads, False, fused=True, dh=dh)
    return dsum, dw


# ------------------------------------------------------------- GroupNorm --
# One task per batch chunk (the other axes in one chunk each): dask.delayed
# calls of the NumPy API, their pieces put back together as dask arrays.

def _group_layout(x, num_groups, channel_axis):
    _checks.x_dtype(x.dtype)
    if any(math.isnan(s) for s in x.shape):
        raise ValueError("cynorm: x has unknown chunk sizes; call x.compute_chunk_sizes() first")
    return _checks.group_layout(x.shape, num_groups, channel_axis)


def _batch_blocks(a):
    """a's blocks along the batch axis, as delayed objects (its other axes in one chunk)."""
    return list(a.to_delayed().reshape(-1))


def _group_forward_task(x, weight, bias, *, G, ca, eps, num_threads):
    return _group.group_norm_forward(x, G, weight, bias, channel_axis=ca, eps=eps,
                                     num_threads=_task_threads(num_threads))


def group_norm_forward(x, num_groups, weight=None, bias=None, *, channel_axis=1, eps=1e-5, num_threads=None):
    """``(y, mean, rstd)`` as dask arrays (as ``cynorm.group_norm_forward``); mean and
    rstd (N, num_groups) get x's batch chunks."""
    from dask import delayed
    x = _as_dask(x, "x")
    _, N, C, S, G = _group_layout(x, num_groups, channel_axis)
    weight, bias = _param(weight, "weight"), _param(bias, "bias")
    pair = _checks.params(np.dtype(x.dtype), (C,), weight, bias, "(C,)")
    eps = _checks.eps(eps)
    _checks.num_threads(num_threads)
    x = _whole_norm_axes(x, 1, "x")
    task = delayed(_group_forward_task, pure=True, nout=3)
    ys, means, rstds = [], [], []
    for block, n in zip(_batch_blocks(x), x.chunks[0]):
        y, mean, rstd = task(block, weight, bias, G=G, ca=channel_axis, eps=eps, num_threads=num_threads)
        ys.append(da.from_delayed(y, (n,) + x.shape[1:], dtype=pair.x, meta=np.empty((0,) * x.ndim, pair.x)))
        for out, d in ((means, mean), (rstds, rstd)):
            out.append(da.from_delayed(d, (n, G), dtype=pair.stat, meta=np.empty((0, 0), pair.stat)))
    return da.concatenate(ys), da.concatenate(means), da.concatenate(rstds)


def group_norm(x, num_groups, weight=None, bias=None, *, channel_axis=1, eps=1e-5, num_threads=None):
    """GroupNorm of a dask array (as ``cynorm.group_norm``): y, lazily."""
    return group_norm_forward(x, num_groups, weight, bias, channel_axis=channel_axis, eps=eps,
                              num_threads=num_threads)[0]


def _group_backward_task(dy, x, mean, rstd, weight, *, code, G, ca, num_threads):
    """dx, and the chunk's samples' dweight/dbias terms (float64 (n, 2, C))."""
    channels_last, n, C, S, _ = _checks.group_layout(x.shape, G, ca)
    dx = np.empty(x.shape, x.dtype)
    part = np.empty((n, 2, C), np.float64)
    c = np.ascontiguousarray
    _isa.kernels.group_backward(code, c(dy), c(x), c(mean), c(rstd), weight, dx, None, None, part, n, C, S, G,
                                channels_last, resolve_num_threads(_task_threads(num_threads)))
    return dx, part


def _group_grads(parts, pair):
    """dweight, dbias from every chunk's terms, in batch order: one call's sums."""
    return _group.param_grads(np.concatenate(parts), pair)


def group_norm_backward(dy, x, mean, rstd, weight=None, *, num_groups, channel_axis=1, num_threads=None):
    """``(dx, dweight, dbias)`` as dask arrays; dweight/dbias bit-identical to
    ``cynorm.group_norm_backward`` on the whole array, for any chunking of the batch."""
    from dask import delayed
    x, dy = _as_dask(x, "x"), _as_dask(dy, "dy")
    _, N, C, S, G = _group_layout(x, num_groups, channel_axis)
    _checks.like("dy", dy.shape, dy.dtype, "x", x.shape, x.dtype)
    weight = _param(weight, "weight")
    pair = _checks.params(np.dtype(x.dtype), (C,), weight, None, "(C,)")
    _checks.num_threads(num_threads)
    x = _whole_norm_axes(x, 1, "x")
    dy = _whole_norm_axes(dy, 1, "dy").rechunk(x.chunks)
    batch = x.chunks[0]
    stats = []
    for name, s in (("mean", mean), ("rstd", rstd)):
        s = _as_dask(s, name)
        _checks.group_stats(name, s.shape, s.dtype, N, G, pair.stat)
        stats.append(_batch_blocks(s.rechunk((batch, (G,)))))
    task = delayed(_group_backward_task, pure=True, nout=2)
    dxs, parts = [], []
    for dyb, xb, mb, rb, n in zip(_batch_blocks(dy), _batch_blocks(x), stats[0], stats[1], batch):
        dx, part = task(dyb, xb, mb, rb, weight, code=pair.code, G=G, ca=channel_axis, num_threads=num_threads)
        dxs.append(da.from_delayed(dx, (n,) + x.shape[1:], dtype=pair.x, meta=np.empty((0,) * x.ndim, pair.x)))
        parts.append(part)
    dx = da.concatenate(dxs)
    if weight is None:
        return dx, None, None
    grads = delayed(_group_grads, pure=True, nout=2)(parts, pair)
    return (dx,) + tuple(da.from_delayed(g, (C,), dtype=pair.grad, meta=np.empty((0,), pair.grad)) for g in grads)
