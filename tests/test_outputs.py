"""out= as a tuple naming any of the outputs (y/mean/rstd, dx/dweight/dbias):
same bits as fresh outputs, the given arrays returned, bad tuples refused
before anything is written, and outputs that overlap inputs handled."""

import numpy as np
import pytest

import cynorm
from conftest import PAIRS, assert_same_bits, make_inputs

SHAPES = [((37, 16), 1), ((5, 8, 300), 1), ((3, 9000), 1)]


def _forward(norm, x, w, b, out=None):
    if norm == "layer":
        return cynorm.layer_norm_forward(x, w, b, axis=1, out=out)
    return cynorm.rms_norm_forward(x, w, axis=1, out=out)


def _backward(norm, dy, x, stats, w, out=None):
    if norm == "layer":
        return cynorm.layer_norm_backward(dy, x, stats[0], stats[1], w, axis=1, out=out)
    return cynorm.rms_norm_backward(dy, x, stats[-1], w, axis=1, out=out)


def _masks(n):
    """Every choice of which of n outputs to give (at least one)."""
    return [[bool(m >> i & 1) for i in range(n)] for m in range(1, 1 << n)]


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_tuple_out_same_bits_and_returned(pair, norm, shape, axis, rng):
    x, dy, w, b = make_inputs(rng, shape, axis, pair)
    want_fwd = _forward(norm, x, w, b)
    want_bwd = _backward(norm, dy, x, want_fwd[1:], w)
    for mask in _masks(len(want_fwd)):
        outs = tuple(np.full_like(a, 7) if m else None for a, m in zip(want_fwd, mask))
        got = _forward(norm, x, w, b, out=outs)
        for g, o, e in zip(got, outs, want_fwd):
            if o is not None:
                assert g is o
            assert_same_bits(g, e)
    for mask in _masks(len(want_bwd)):
        outs = tuple(np.full_like(a, 7) if m else None for a, m in zip(want_bwd, mask))
        got = _backward(norm, dy, x, want_fwd[1:], w, out=outs)
        for g, o, e in zip(got, outs, want_bwd):
            if o is not None:
                assert g is o
            assert_same_bits(g, e)


def test_stats_out_may_be_squeezed(rng):
    x = rng.standard_normal((4, 6, 10)).astype(np.float32)
    y, mean, rstd = cynorm.layer_norm_forward(x, axis=1)
    m, r = np.empty(4, np.float32), np.empty(4, np.float32)
    got = cynorm.layer_norm_forward(x, axis=1, out=(None, m, r))
    assert got[1] is m and got[2] is r
    assert np.array_equal(m, mean.ravel()) and np.array_equal(r, rstd.ravel())
    assert np.array_equal(got[0], y)


def test_single_array_form_still_means_the_first_output(rng):
    x = rng.standard_normal((8, 32)).astype(np.float32)
    out = np.empty_like(x)
    y, mean, rstd = cynorm.layer_norm_forward(x, out=out)
    assert y is out and mean is not None and rstd is not None
    y1 = cynorm.layer_norm(x, out=(out,))
    assert y1 is out


def _untouched(arrays, call, exc, match):
    before = [a.copy() for a in arrays]
    with pytest.raises(exc, match=match):
        call()
    for a, b_ in zip(arrays, before):
        assert a.tobytes() == b_.tobytes()


def test_bad_tuples_are_refused_before_writing(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = np.ones(6, np.float32)
    y, m, r = np.full((4, 6), 3, np.float32), np.full((4, 1), 3, np.float32), np.full((4, 1), 3, np.float32)
    arrays = [x, w, y, m, r]
    _untouched(arrays, lambda: cynorm.layer_norm_forward(x, w, out=(y, m)), ValueError, r"tuple of 3 entries")
    _untouched(arrays, lambda: cynorm.layer_norm_forward(x, w, out=[y, m, r]), TypeError,
               r"numpy.ndarray or a tuple")
    _untouched(arrays, lambda: cynorm.layer_norm_forward(x, w, out=(y, m.astype(np.float64), r)), TypeError,
               r"out\[1\] \(mean\) must have dtype float32")
    _untouched(arrays, lambda: cynorm.layer_norm_forward(x, w, out=(y, m, np.empty((3, 1), np.float32))),
               ValueError, r"out\[2\] \(rstd\) must have shape \(4, 1\) \(or \(4,\)\)")
    ro = np.frombuffer(bytes(16), np.float32).reshape(4, 1)
    _untouched(arrays, lambda: cynorm.layer_norm_forward(x, w, out=(y, m, ro)), ValueError, r"read-only")
    _untouched(arrays, lambda: cynorm.rms_norm_forward(x, w, out=(y, m, r)), ValueError, r"tuple of 2 entries")
    # outputs that share memory: which one wins would depend on the write order
    _untouched(arrays, lambda: cynorm.layer_norm_forward(x, w, out=(None, m, m)), ValueError,
               r"out\[1\] \(mean\) and out\[2\] \(rstd\) share memory")
    dy = np.ones_like(x)
    _, mean, rstd = cynorm.layer_norm_forward(x, w)
    dw = np.full(6, 3, np.float32)
    _untouched(arrays + [dw], lambda: cynorm.layer_norm_backward(dy, x, mean, rstd, out=(None, dw, None)),
               ValueError, r"no weight")
    _untouched(arrays + [dw], lambda: cynorm.layer_norm_backward(dy, x, mean, rstd, w, out=(y, dw, dw)),
               ValueError, r"share memory")
    _untouched(arrays + [dw], lambda: cynorm.rms_norm_backward(dy, x, rstd, w, out=(y, dw[:5])),
               ValueError, r"out\[1\] \(dweight\) must have shape \(6,\)")


def test_outputs_overlapping_inputs_are_safe(rng):
    """Stats written over x, dweight over the weight or dy: the inputs are copied
    first, so every result equals the one with separate outputs."""
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    dy = rng.standard_normal((4, 32)).astype(np.float32)
    y0, m0, r0 = cynorm.layer_norm_forward(x, w)
    xs = x.copy()
    mean_in_x = xs[0, :4].reshape(4, 1)                                   # mean over x's first four values
    got = cynorm.layer_norm_forward(xs, w, out=(None, mean_in_x, None))
    assert got[1] is mean_in_x
    assert np.array_equal(got[0], y0) and np.array_equal(got[2], r0) and np.array_equal(mean_in_x, m0)
    dx0, dw0, db0 = cynorm.layer_norm_backward(dy, x, m0, r0, w)
    ws, dys = w.copy(), dy.copy()
    dx, dw, db = cynorm.layer_norm_backward(dys, x, m0, r0, ws, out=(dys, ws, None))   # dx over dy, dweight over w
    assert dx is dys and dw is ws
    assert np.array_equal(dx, dx0) and np.array_equal(dw, dw0) and np.array_equal(db, db0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unaligned_out_is_written_plainly(dtype, rng):
    """An out= array whose data is not aligned to its element size (a view into
    a byte buffer) cannot take non-temporal stores: the policy writes it with
    plain stores, and the results are those of an aligned output."""
    from cynorm import _isa
    x = rng.standard_normal((33, 1031)).astype(dtype)
    dy = rng.standard_normal((33, 1031)).astype(dtype)
    want_y, mean, rstd = cynorm.layer_norm_forward(x)
    want_dx = cynorm.layer_norm_backward(dy, x, mean, rstd)[0]
    old = _isa.kernels._policy("stream_min_bytes", 0)
    try:
        for T in (1, 2):
            buf = np.zeros(x.nbytes + 1, np.uint8)
            y = buf[1:].view(dtype).reshape(x.shape)
            assert not y.flags.aligned
            assert cynorm.explain(x, out=y)["stream"] is False
            assert cynorm.explain(x, out=np.empty_like(x))["stream"] is True
            cynorm.layer_norm(x, out=y, num_threads=T)
            assert np.array_equal(y, want_y)
            cynorm.layer_norm_backward(dy, x, mean, rstd, out=y, num_threads=T)
            assert np.array_equal(y, want_dx)
    finally:
        _isa.kernels._policy("stream_min_bytes", old)
