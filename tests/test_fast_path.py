"""The C fast paths (the kernels' forward_small and backward_small).

cynorm._api tries them first for every call; they must give exactly what the
validating path gives, and decline (return None) everything that path would
convert, copy or refuse, so that the errors come from one place. The validating
path is reached here by switching the fast paths off.
"""

import contextlib

import numpy as np
import pytest

import cynorm
from cynorm import _api, _isa
from conftest import PAIRS


def fast(x, w=None, b=None, axis=-1, eps=1e-5, num_threads=None, center=True, n_outs=3, out=None):
    return _isa.kernels.forward_small(x, w, b, axis, eps, num_threads, center, n_outs, out, _api._FAST_PAIRS)


def fast_bwd(dy, x, mean, rstd, w=None, axis=-1, num_threads=None, center=True, out=None):
    return _isa.kernels.backward_small(dy, x, mean, rstd, w, axis, num_threads, center, out, _api._FAST_PAIRS)


@contextlib.contextmanager
def general_path():
    """Every call through the validating path (the fast paths decline all)."""
    k = _isa.kernels
    saved = k.forward_small, k.backward_small
    k.forward_small = k.backward_small = lambda *a: None
    try:
        yield
    finally:
        k.forward_small, k.backward_small = saved


def inputs(pair, shape, axis, rng):
    xd, pd = pair
    x = rng.standard_normal(shape).astype(xd)
    ns = shape[axis:]
    w = (1 + 0.1 * rng.standard_normal(ns)).astype(pd)
    b = (0.1 * rng.standard_normal(ns)).astype(pd)
    return x, w, b


def same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


SHAPES = [((1, 8, 16), -1), ((1, 8, 16), 1), ((32, 8, 16), 2), ((5, 7), -2), ((3,), 0), ((300, 300), 1)]


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("shape,axis", SHAPES)
@pytest.mark.parametrize("affine", ["wb", "w", "b", "none"])
def test_same_bits_as_validating_path(isa_level, pair, shape, axis, affine, rng):
    """The fast paths' outputs, fresh and into out=, are the validating path's bit
    for bit, with the same dtypes and shapes; given outputs are returned as given."""
    x, w, b = inputs(pair, shape, axis, rng)
    dy = rng.standard_normal(shape).astype(x.dtype)
    w = w if "w" in affine else None
    b = b if "b" in affine else None
    with general_path():
        want = cynorm.layer_norm_forward(x, w, b, axis=axis)
        want_b = cynorm.layer_norm_backward(dy, x, want[1], want[2], w, axis=axis)
        want_rms = cynorm.rms_norm_forward(x, w, axis=axis)
        want_rms_b = cynorm.rms_norm_backward(dy, x, want_rms[1], w, axis=axis)
    small = x.size < (1 << 16)
    got = fast(x, w, b, axis=axis)
    assert (got is not None) == small           # (large fresh outputs: the general path's allocator)
    if small:
        assert all(same(g, r) for g, r in zip(got, want))
    outs = tuple(np.empty_like(a) for a in want)
    got = fast(x, w, b, axis=axis, out=outs)
    assert got is not None and all(g is o for g, o in zip(got, outs))
    assert all(same(g, r) for g, r in zip(got, want))
    for g, r in zip(cynorm.layer_norm_forward(x, w, b, axis=axis), want):   # the public calls
        assert same(g, r)
    for g, r in zip(cynorm.rms_norm_forward(x, w, axis=axis, out=tuple(map(np.empty_like, want_rms))), want_rms):
        assert same(g, r)
    if w is None:
        assert fast_bwd(dy, x, want[1], want[2], None, axis=axis, out=(None, np.empty_like(x), None)) is None
    bouts = tuple(None if a is None else np.empty_like(a) for a in want_b)
    got = fast_bwd(dy, x, want[1], want[2], w, axis=axis, out=bouts)
    assert got is not None and got[0] is bouts[0]
    assert all(same(g, r) for g, r in zip(got, want_b))
    for g, r in zip(cynorm.layer_norm_backward(dy, x, want[1], want[2], w, axis=axis), want_b):
        assert same(g, r)
    for g, r in zip(cynorm.rms_norm_backward(dy, x, want_rms[1], w, axis=axis), want_rms_b):
        assert same(g, r)


def test_outputs_in_every_form(rng):
    """out= as y alone, a tuple with None entries, squeezed stats, and in place."""
    x, w, b = inputs(PAIRS[0].values[0], (6, 16), -1, rng)
    dy = rng.standard_normal(x.shape).astype(x.dtype)
    with general_path():
        assert fast(x, w, b) is None and fast_bwd(dy, x, x, x, w) is None   # (the switch works)
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
        dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w)
    yo = np.empty_like(x)
    got = fast(x, w, b, out=yo)
    assert got[0] is yo and same(yo, y) and same(got[2], rstd)
    mo = np.empty(6, np.float32)                 # squeezed mean, fresh rstd
    got = fast(x, w, b, out=(None, mo, None))
    assert got[1] is mo and same(mo, mean.reshape(6)) and same(got[0], y) and same(got[2], rstd)
    assert fast(x, w, None, center=False, n_outs=2, out=(None, np.empty((6,), np.float32))) is not None
    assert fast(x, w, b, n_outs=1, out=(yo,))[0] is yo
    xi = x.copy()                                 # y over x
    assert fast(xi, w, b, out=(xi, None, None))[0] is xi and same(xi, y)
    dyi = dy.copy()                               # dx over dy, then over x
    got = fast_bwd(dyi, x, mean, rstd, w, out=(dyi, None, None))
    assert got[0] is dyi and same(dyi, dx) and same(got[1], dw) and same(got[2], db)
    xi = x.copy()
    got = fast_bwd(dy, xi, mean, rstd, w, out=xi)
    assert got[0] is xi and same(xi, dx)
    got = fast_bwd(dy, x, mean.reshape(6), rstd.reshape(6), w, out=(None, np.empty_like(dw), None))
    assert same(got[0], dx) and same(got[1], dw) and same(got[2], db)


def test_declines_everything_unusual(rng):
    """Each of these needs a conversion, a copy, a large-array route or an
    error: the fast path returns None and leaves it to the validating path."""
    x, w, b = inputs(PAIRS[0].values[0], (4, 16), -1, rng)
    big = np.zeros((1 << 16, 1), np.float32)
    y = np.empty_like(x)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    buf = np.empty(3 * 4, np.float32)
    cases = {
        "list x": dict(x=x.tolist()),
        "subclass x": dict(x=np.ma.masked_array(x)),
        "Fortran-ordered x": dict(x=np.ones((16, 4), np.float32).T),
        "strided x": dict(x=np.ones((4, 32), np.float32)[:, ::2]),
        "byte-swapped x": dict(x=x.astype(">f4")),
        "int x": dict(x=x.astype(np.int32), w=None, b=None),
        "0-d x": dict(x=np.float32(1.0).reshape(()), w=None, b=None),
        "empty rows": dict(x=np.ones((0, 16), np.float32)),
        "large x, fresh y": dict(x=big, w=None, b=None),
        "axis out of range": dict(axis=2),
        "bool axis": dict(axis=True),
        "float axis": dict(axis=1.0),
        "int eps": dict(eps=0),
        "negative eps": dict(eps=-1e-5),
        "nan eps": dict(eps=float("nan")),
        "inf eps": dict(eps=float("inf")),
        "num_threads 0": dict(num_threads=0),
        "num_threads bool": dict(num_threads=True),
        "num_threads huge": dict(num_threads=4096),
        "weight wrong shape": dict(w=np.ones(15, np.float32)),
        "weight list": dict(w=[1.0] * 16),
        "weight strided": dict(w=np.ones(32, np.float32)[::2]),
        "weight byte-swapped": dict(w=w.astype(">f4")),
        "weight unsupported dtype": dict(w=w.astype(np.float16), b=None),
        "weight and bias dtypes differ": dict(w=w.astype(np.float64), b=b),
        "bias wrong shape": dict(b=np.ones((1, 16), np.float32)),
        "out a list": dict(out=[y, None, None]),
        "out tuple too short": dict(out=(y, None)),
        "y wrong dtype": dict(out=np.empty(x.shape, np.float64)),
        "y wrong shape": dict(out=np.empty((16, 4), np.float32)),
        "y read-only": dict(out=ro),
        "y strided": dict(out=np.empty((4, 32), np.float32)[:, ::2]),
        "mean wrong dtype": dict(out=(y, np.empty((4, 1), np.float64), None)),
        "mean and rstd one array": dict(out=(y, buf[:4].reshape(4, 1), buf[:4].reshape(4, 1))),
        "mean and rstd overlapping": dict(out=(y, buf[:4], buf[2:6])),
    }
    for name, case in cases.items():
        args = dict(x=x, w=w, b=b, axis=-1, eps=1e-5, num_threads=None)
        args.update(case)
        assert fast(**args) is None, name
    # outputs over inputs (other than y exactly x): the general path copies the input first
    buf = np.ones(16, np.float32)
    assert fast(np.ones((1, 16), np.float32), buf, None, out=buf.reshape(1, 16)) is None, "y over the weight"
    share = np.ones((3, 16), np.float32)
    assert fast(share[:2], None, None, out=share[1:]) is None, "y over part of x"
    assert fast(x, w, b, num_threads=2) is not None              # (a valid thread count is taken)
    assert fast(big, out=np.empty_like(big)) is not None         # (large x with y given is taken)


def test_backward_declines_everything_unusual(rng):
    x, w, b = inputs(PAIRS[0].values[0], (4, 16), -1, rng)
    dy = rng.standard_normal(x.shape).astype(x.dtype)
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
    dx = np.empty_like(x)
    g = np.empty(2 * 16, np.float32)
    cases = {
        "dy another dtype": dict(dy=dy.astype(np.float64)),
        "dy another shape": dict(dy=dy.reshape(8, 8)),
        "dy strided": dict(dy=np.ones((4, 32), np.float32)[:, ::2]),
        "x a list": dict(x=x.tolist()),
        "mean float64": dict(mean=mean.astype(np.float64)),
        "rstd wrong shape": dict(rstd=np.ones((2, 2), np.float32)),
        "mean None for LayerNorm": dict(mean=None),
        "weight wrong shape": dict(w=np.ones(8, np.float32)),
        "axis float": dict(axis=1.0),
        "large x, fresh dx": dict(dy=np.zeros((1 << 16, 1), np.float32), x=np.zeros((1 << 16, 1), np.float32),
                                  mean=np.zeros((1 << 16, 1), np.float32), rstd=np.ones((1 << 16, 1), np.float32),
                                  w=None),
        "out tuple too long": dict(out=(dx, None, None, None)),
        "dweight without weight": dict(w=None, out=(dx, np.empty(16, np.float32), None)),
        "dweight wrong dtype": dict(out=(dx, np.empty(16, np.float64), None)),
        "dweight and dbias one array": dict(out=(dx, g[:16], g[:16])),
    }
    stat = np.zeros((4, 1), np.float32)
    cases["dx over mean"] = dict(x=np.ones((4, 1), np.float32), dy=np.ones((4, 1), np.float32), w=None,
                                 mean=stat, rstd=np.ones((4, 1), np.float32), out=stat)
    share = np.ones((5, 16), np.float32)
    cases["dx over part of dy"] = dict(dy=share[:4], out=share[1:])
    cases["dx over dweight"] = dict(out=(share[:4], share[0], None))
    for name, case in cases.items():
        args = dict(dy=dy, x=x, mean=mean, rstd=rstd, w=w, axis=-1, out=None)
        args.update(case)
        assert fast_bwd(**args) is None, name
