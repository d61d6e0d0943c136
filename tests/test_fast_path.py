"""The C fast path for small forward calls (the kernels' forward_small).

cynorm._api tries it first for every call without ``out=``; it must give
exactly what the validating path gives, and decline (return None) everything
that path would convert, copy or refuse, so that the errors come from one place.
"""

import numpy as np
import pytest

import cynorm
from cynorm import _api, _isa
from conftest import PAIRS


def fast(x, w=None, b=None, axis=-1, eps=1e-5, num_threads=None, center=True, want_stats=True):
    return _isa.kernels.forward_small(x, w, b, axis, eps, num_threads, center, want_stats, _api._FAST_PAIRS)


def inputs(pair, shape, axis, rng):
    xd, pd = pair
    x = rng.standard_normal(shape).astype(xd)
    ns = shape[axis:]
    w = (1 + 0.1 * rng.standard_normal(ns)).astype(pd)
    b = (0.1 * rng.standard_normal(ns)).astype(pd)
    return x, w, b


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("shape,axis", [((1, 8, 16), -1), ((1, 8, 16), 1), ((32, 8, 16), 2), ((5, 7), -2), ((3,), 0)])
@pytest.mark.parametrize("affine", ["wb", "w", "b", "none"])
def test_same_bits_as_validating_path(isa_level, pair, shape, axis, affine, rng):
    """Small calls: the fast path's (y, mean, rstd) are the validating path's
    (reached through out=, which the fast path never takes), bit for bit, with
    the same dtypes and shapes."""
    x, w, b = inputs(pair, shape, axis, rng)
    w = w if "w" in affine else None
    b = b if "b" in affine else None
    got = fast(x, w, b, axis=axis)
    assert got is not None
    want = cynorm.layer_norm_forward(x, w, b, axis=axis, out=np.empty_like(x))
    for g, r, name in zip(got, want, ("y", "mean", "rstd")):
        assert g.dtype == r.dtype and g.shape == r.shape, name
        assert np.array_equal(g, r, equal_nan=True), name
    y = cynorm.layer_norm(x, w, b, axis=axis)          # the public calls take the fast path
    assert np.array_equal(y, want[0])
    if b is None:
        ry, rr = cynorm.rms_norm_forward(x, w, axis=axis)
        wy, wr = cynorm.rms_norm_forward(x, w, axis=axis, out=np.empty_like(x))
        assert np.array_equal(ry, wy) and np.array_equal(rr, wr)


def test_stats_wanted_or_not(rng):
    x, w, b = inputs(PAIRS[0].values[0], (4, 16), -1, rng)
    assert fast(x, w, b, want_stats=False)[1] is None           # layer_norm: no mean array
    y, mean, rstd = fast(x, w, None, eps=1e-6, center=False)   # RMSNorm: no mean at all
    assert mean is None and rstd.shape == (4, 1)
    assert np.array_equal(y, cynorm.rms_norm(x, w, out=np.empty_like(x)))


def test_declines_everything_unusual(rng):
    """Each of these needs a conversion, a copy, a large-array route or an
    error: the fast path returns None and leaves it to the validating path."""
    x, w, b = inputs(PAIRS[0].values[0], (4, 16), -1, rng)
    big = np.zeros((1 << 16, 1), np.float32)
    cases = {
        "list x": dict(x=x.tolist()),
        "subclass x": dict(x=np.ma.masked_array(x)),
        "Fortran-ordered x": dict(x=np.ones((16, 4), np.float32).T),
        "strided x": dict(x=np.ones((4, 32), np.float32)[:, ::2]),
        "byte-swapped x": dict(x=x.astype(">f4")),
        "int x": dict(x=x.astype(np.int32), w=None, b=None),
        "0-d x": dict(x=np.float32(1.0).reshape(()), w=None, b=None),
        "empty rows": dict(x=np.ones((0, 16), np.float32)),
        "large x": dict(x=big, w=None, b=None),
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
    }
    for name, case in cases.items():
        args = dict(x=x, w=w, b=b, axis=-1, eps=1e-5, num_threads=None)
        args.update(case)
        assert fast(**args) is None, name
    assert fast(x, w, b, num_threads=2) is not None              # (a valid thread count is taken)
