"""GroupNorm and InstanceNorm: the float64 reference for every dtype pair, both
layouts and 0- to 3-d spatial shapes; the same bits at every thread count and
level; LayerNorm's bits for one group; special values; out= and in place; errors."""

import numpy as np
import pytest

import cynorm
import reference as ref
import accuracy
from conftest import F64, LEVELS, PAIRS, assert_same_bits, bits_of
from cynorm import _isa

#: (channels-first shape, num_groups): no spatial dims, 1-, 2- and 3-d, InstanceNorm, one group
CASES = [((3, 12), 3), ((2, 6, 40), 3), ((2, 32, 5, 7), 8), ((2, 6, 4, 3, 5), 6), ((2, 40, 9, 9), 1),
         ((1, 64, 17), 32), ((2, 17, 3, 11), 17)]
LAYOUTS = [pytest.param(1, id="channels_first"), pytest.param(-1, id="channels_last")]


def _shape(cf_shape, channel_axis):
    """The case's shape in the layout channel_axis asks for."""
    if channel_axis == 1 or len(cf_shape) == 2:
        return cf_shape
    return (cf_shape[0],) + cf_shape[2:] + (cf_shape[1],)


def _inputs(rng, cf_shape, channel_axis, pair, offset=1.0):
    xd, pd = pair
    shape = _shape(cf_shape, channel_axis)
    C = cf_shape[1]
    x = (rng.standard_normal(shape) * 3 + offset).astype(xd)
    dy = rng.standard_normal(shape).astype(xd)
    w = (1 + 0.5 * rng.standard_normal(C)).astype(pd)
    b = (0.5 * rng.standard_normal(C)).astype(pd)
    return x, dy, w, b


@pytest.mark.parametrize("channel_axis", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[f"{s}-G{g}" for s, g in CASES])
@pytest.mark.parametrize("pair", PAIRS)
def test_forward_and_backward_match_the_reference(pair, case, channel_axis, rng):
    cf_shape, G = case
    x, dy, w, b = _inputs(rng, cf_shape, channel_axis, pair)
    y, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=channel_axis)
    y_ref, mean_ref, rstd_ref = ref.group_norm(x, G, w, b, channel_axis=channel_axis)
    assert mean.shape == rstd.shape == (x.shape[0], G)
    accuracy.check(y, y_ref, pair[0], "y")
    accuracy.check_stat(mean, mean_ref, "mean")
    accuracy.check_stat(rstd, rstd_ref, "rstd")
    dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=channel_axis)
    dx_ref, dw_ref, db_ref = ref.group_norm_backward(dy, x, mean, rstd, G, w, channel_axis=channel_axis)
    terms = float(np.max(rstd)) * float(np.max(np.abs(dy.astype(np.float64)))) * float(np.max(np.abs(w.astype(np.float64))))
    accuracy.check(dx, dx_ref, pair[0], "dx", scale=max(terms, float(np.max(np.abs(dx_ref)))))
    accuracy.check_param_grad(dw, dw_ref, pair[1], "dweight")
    accuracy.check_param_grad(db, db_ref, pair[1], "dbias")


@pytest.mark.parametrize("channel_axis", LAYOUTS)
def test_backward_matches_finite_differences(channel_axis):
    """The reference's gradients are the forward's (so the backward test above means something)."""
    rng = np.random.default_rng(5)
    x, dy, w, b = _inputs(rng, (2, 6, 3, 4), channel_axis, (F64, F64))
    y, mean, rstd = cynorm.group_norm_forward(x, 3, w, b, channel_axis=channel_axis)
    dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=3, channel_axis=channel_axis)

    def loss(xv, wv, bv):
        return float(np.sum(ref.group_norm(xv, 3, wv, bv, channel_axis=channel_axis)[0] * dy))

    h = 1e-6
    for idx in [(0, 0, 0, 0), (1, 2, 1, 3), (0, 1, 2, 5 if channel_axis == -1 else 1)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num = (loss(xp, w, b) - loss(xm, w, b)) / (2 * h)
        assert abs(dx[idx] - num) <= 1e-6 * max(1.0, abs(num)), (idx, dx[idx], num)
    for j in range(6):
        for arr, grad in ((w, dw), (b, db)):
            p, m = arr.copy(), arr.copy()
            p[j] += h
            m[j] -= h
            num = (loss(x, p, b) - loss(x, m, b)) if arr is w else (loss(x, w, p) - loss(x, w, m))
            assert abs(grad[j] - num / (2 * h)) <= 1e-6 * max(1.0, abs(num / (2 * h))), (j, grad[j], num)


@pytest.mark.parametrize("pair", PAIRS)
def test_one_group_is_layer_norm_with_a_channel_affine(pair, rng):
    """Channels-first, one group: LayerNorm over C,H,W's rows with the weight spread over each
    channel's positions. Rows of 8192 take the same chunk moments: the very same bits."""
    x, dy, w, b = _inputs(rng, (3, 8, 32, 32), 1, pair)
    y, mean, rstd = cynorm.group_norm_forward(x, 1, w, b)
    w_full = np.broadcast_to(w[:, None, None], x.shape[1:]).copy()
    b_full = np.broadcast_to(b[:, None, None], x.shape[1:]).copy()
    y_ln, mean_ln, rstd_ln = cynorm.layer_norm_forward(x, w_full, b_full, axis=1)
    assert_same_bits(y, y_ln, "y")
    assert_same_bits(mean, mean_ln.reshape(3, 1), "mean")
    assert_same_bits(rstd, rstd_ln.reshape(3, 1), "rstd")
    dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=1)
    dx_ln, dw_ln, db_ln = cynorm.layer_norm_backward(dy, x, mean_ln, rstd_ln, w_full, axis=1)
    accuracy.check(dx, dx_ln.astype(np.float64), pair[0], "dx against LayerNorm's",
                   scale=float(np.max(np.abs(dx_ln.astype(np.float64)))) * 4)
    dw_sum = dw_ln.astype(np.float64).reshape(8, -1).sum(axis=1)
    # (LayerNorm's 16-bit dweight is rounded per element before this sum: judged on the array's scale)
    tol = (0.02 if pair[1].itemsize == 2 else 1e-5) * float(np.max(np.abs(dw_sum)))
    np.testing.assert_allclose(dw.astype(np.float64), dw_sum, rtol=0, atol=tol)


@pytest.mark.parametrize("channel_axis", LAYOUTS)
def test_instance_norm_is_one_channel_per_group(channel_axis, rng):
    x, dy, w, b = _inputs(rng, (2, 5, 6, 7), channel_axis, (np.dtype(np.float32),) * 2)
    y, mean, rstd = cynorm.instance_norm_forward(x, w, b, channel_axis=channel_axis)
    assert mean.shape == (2, 5)
    assert_same_bits(y, cynorm.group_norm(x, 5, w, b, channel_axis=channel_axis), "y")
    got = cynorm.instance_norm_backward(dy, x, mean, rstd, w, channel_axis=channel_axis)
    want = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=5, channel_axis=channel_axis)
    for g, e in zip(got, want):
        assert_same_bits(g, e)
    assert_same_bits(cynorm.instance_norm(x, w, b, channel_axis=channel_axis), y)


def _run(x, dy, w, b, G, channel_axis, T):
    y, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=channel_axis, num_threads=T)
    return (y, mean, rstd) + cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G,
                                                       channel_axis=channel_axis, num_threads=T)


@pytest.mark.parametrize("channel_axis", LAYOUTS)
@pytest.mark.parametrize("pair", PAIRS)
def test_same_bits_at_every_thread_count(pair, channel_axis, rng, force_parallel):
    x, dy, w, b = _inputs(rng, (7, 24, 5, 9), channel_axis, pair)
    first = _run(x, dy, w, b, 6, channel_axis, 1)
    for T in (2, 3, 8):
        for name, got, want in zip(("y", "mean", "rstd", "dx", "dweight", "dbias"), _run(x, dy, w, b, 6, channel_axis, T), first):
            assert_same_bits(got, want, f"{name} at {T} threads")


@pytest.mark.parametrize("channel_axis", LAYOUTS)
@pytest.mark.parametrize("pair", PAIRS)
def test_same_bits_at_every_level(pair, channel_axis, rng):
    x, dy, w, b = _inputs(rng, (3, 40, 7, 5), channel_axis, pair)   # 40 channels: a partial vector of them
    results = {}
    for level in LEVELS:
        with _isa.using(level):
            results[level] = _run(x, dy, w, b, 8, channel_axis, 2)
    for level in LEVELS[1:]:
        for got, want in zip(results[level], results[LEVELS[0]]):
            assert_same_bits(got, want, f"{level} against {LEVELS[0]}")


def test_dweight_is_the_samples_terms_added_in_order(rng):
    """Each sample's terms depend on that sample alone: a batch's dweight is the sum of
    what its samples give one by one, the sample order kept (within float32 rounding of
    those terms' sum)."""
    x, dy, w, b = _inputs(rng, (5, 8, 6, 6), 1, (np.dtype(np.float32),) * 2)
    y, mean, rstd = cynorm.group_norm_forward(x, 2, w, b)
    _, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=2)
    parts = [cynorm.group_norm_backward(dy[i:i + 1], x[i:i + 1], mean[i:i + 1], rstd[i:i + 1], w, num_groups=2)
             for i in range(5)]
    np.testing.assert_allclose(dw, np.sum([p[1] for p in parts], axis=0, dtype=np.float64), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(db, np.sum([p[2] for p in parts], axis=0, dtype=np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channel_axis", LAYOUTS)
@pytest.mark.parametrize("pair", PAIRS)
def test_special_groups(pair, channel_axis):
    """A constant group gives exactly the bias; huge and tiny groups are rescued
    (finite, normalized); a NaN stays inside its own group."""
    xd, pd = pair
    C, G = 8, 4
    x = np.random.default_rng(9).standard_normal((4, C, 3, 5))
    x[0, 0:2] = 5.0                      # sample 0, group 0: constant
    x[1, 2:4] *= 1e30 if xd.itemsize > 2 else 1e4
    x[2, 4:6] *= 1e-35 if xd.itemsize > 2 else 1e-3
    x[3, 6, 1, 1] = np.nan               # sample 3, group 3
    x = x.astype(xd)
    w = np.linspace(0.5, 2, C).astype(pd)
    b = np.linspace(-1, 1, C).astype(pd)
    if channel_axis == -1:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    with np.errstate(all="ignore"):
        y, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=channel_axis)
    yc = np.moveaxis(y, -1, 1) if channel_axis == -1 else y
    assert np.array_equal(yc[0, 0:2].astype(np.float64), np.broadcast_to(b[0:2, None, None].astype(xd).astype(np.float64), (2, 3, 5)))
    for n, c0 in ((1, 2), (2, 4)):
        group = yc[n, c0:c0 + 2].astype(np.float64)
        assert np.all(np.isfinite(group))
        want = ref.group_norm(x, G, w, b, channel_axis=channel_axis)[0]
        wc = np.moveaxis(want, -1, 1) if channel_axis == -1 else want
        np.testing.assert_allclose(group, wc[n, c0:c0 + 2], atol=0.02 if xd.itemsize == 2 else 1e-4)
    assert np.all(np.isnan(yc[3, 6:8].astype(np.float64)))
    assert not np.any(np.isnan(np.delete(yc.astype(np.float64).reshape(4, C, -1)[3], [6, 7], axis=0)))
    # in place: a rescued group is redone from its x, which the normalizing pass left alone
    xi = x.copy()
    with np.errstate(all="ignore"):
        got = cynorm.group_norm_forward(xi, G, w, b, channel_axis=channel_axis, out=(xi, None, None))
    for name, g, e in zip(("y", "mean", "rstd"), got, (y, mean, rstd)):
        assert_same_bits(g, e, f"{name} in place")


def _at_offset(shape, dtype, offset):
    """An array `offset` bytes past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    buf = np.empty(int(np.prod(shape)) * dtype.itemsize + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    return buf[start:start + int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)


@pytest.mark.parametrize("channel_axis", LAYOUTS)
@pytest.mark.parametrize("pair", PAIRS)
def test_streamed_stores_change_no_bit(isa_level, pair, channel_axis, rng, force_parallel):
    """y and dx stream, non-temporal stores, where the policy streams and every channel's
    run (channels-first) or position's channels (channels-last) starts at the same place in
    a cache line, element-aligned (16-bit: on a 16-byte boundary), the stores before the
    first aligned vector plain: the same bits as plain stores, into a fresh, an aligned, a
    16-byte-off (NumPy's usual) and a one-element-off output and in place, at 1 and 2
    threads, and with a rescued group (channels-last: its sample's y then takes plain stores)."""
    xd, pd = pair
    x, dy, w, b = _inputs(rng, (3, 64, 8, 12), channel_axis, pair)   # 64 channels, 96 positions: whole lines
    offsets = {"aligned": 0, "16 bytes off": 16, "one element off": xd.itemsize}
    for name, x in (("plain", x), ("rescued", x.copy())):
        if name == "rescued":
            big = {8: 1e200, 2: 1e3 if xd == np.float16 else 1e30}.get(xd.itemsize, 1e30)   # past the accumulators
            group = (1, Ellipsis, slice(8, 16)) if channel_axis == -1 else (1, slice(8, 16))
            x[group] = (x[group].astype(np.float64) * big).astype(xd)
        for T in (1, 2):
            def streams(backward, out=None):
                return cynorm.explain(x, w, norm="group_norm", num_groups=8, channel_axis=channel_axis,
                                      num_threads=T, backward=backward, out=out)["stream"]

            def both(y, dx, x=x, dy=dy):
                fwd = cynorm.group_norm_forward(x, 8, w, b, channel_axis=channel_axis, num_threads=T,
                                                out=(y, None, None))
                mean, rstd = want[1:3]   # (x may have been overwritten)
                return fwd + cynorm.group_norm_backward(dy, x if y is not x else xs, mean, rstd, w, num_groups=8,
                                                        channel_axis=channel_axis, num_threads=T,
                                                        out=(dx, None, None))
            xs = x.copy()
            want = cynorm.group_norm_forward(x, 8, w, b, channel_axis=channel_axis, num_threads=T)
            want = want + cynorm.group_norm_backward(dy, x, want[1], want[2], w, num_groups=8,
                                                     channel_axis=channel_axis, num_threads=T)
            assert streams(False) is False and streams(True) is False
            old = _isa.kernels._policy("stream_min_bytes", 0)
            try:
                assert streams(False) is True and streams(True) is True
                for where in ("fresh", *offsets, "in place"):
                    if where == "in place":
                        xi, dyi = x.copy(), dy.copy()
                        assert streams(False, xi) and streams(True, (dyi, None, None))
                        got = both(xi, dyi, xi, dyi)
                    else:
                        outs = [None if where == "fresh" else _at_offset(x.shape, xd, offsets[where]) for _ in range(2)]
                        expected = where != "one element off" or xd.itemsize != 2
                        assert streams(False, outs[0]) is expected and streams(True, (outs[1], None, None)) is expected
                        got = both(*outs)
                    for i, (g, e) in enumerate(zip(got, want)):
                        assert_same_bits(g, e, f"{name}, {where} outputs, {T} threads: output {i}")
            finally:
                _isa.kernels._policy("stream_min_bytes", old)


@pytest.mark.parametrize("channel_axis", LAYOUTS)
def test_out_and_in_place(channel_axis, rng):
    pair = (np.dtype(np.float32),) * 2
    x, dy, w, b = _inputs(rng, (2, 6, 4, 5), channel_axis, pair)
    y, mean, rstd = cynorm.group_norm_forward(x, 3, w, b, channel_axis=channel_axis)
    outs = (np.empty_like(x), np.empty((2, 3), np.float32), np.empty((2, 3), np.float32))
    got = cynorm.group_norm_forward(x, 3, w, b, channel_axis=channel_axis, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    for g, e in zip(got, (y, mean, rstd)):
        assert_same_bits(g, e)
    xi = x.copy()
    assert cynorm.group_norm(xi, 3, w, b, channel_axis=channel_axis, out=xi) is xi
    assert_same_bits(xi, y)
    dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=3, channel_axis=channel_axis)
    dyi = dy.copy()
    got = cynorm.group_norm_backward(dyi, x, mean, rstd, w, num_groups=3, channel_axis=channel_axis, out=dyi)
    assert got[0] is dyi
    for g, e in zip(got, (dx, dw, db)):
        assert_same_bits(g, e)
    assert cynorm.group_norm_backward(dy, x, mean, rstd, None, num_groups=3, channel_axis=channel_axis)[1:] == (None, None)


BAD = [
    (lambda x, w: cynorm.group_norm(x, 5, w), ValueError, "must divide the number of channels, 6"),
    (lambda x, w: cynorm.group_norm(x, 0, w), ValueError, "num_groups must be >= 1"),
    (lambda x, w: cynorm.group_norm(x, 2.0, w), TypeError, "num_groups must be an int"),
    (lambda x, w: cynorm.group_norm(x, True, w), TypeError, "got a bool"),
    (lambda x, w: cynorm.group_norm(x, 3, w, channel_axis=2), ValueError, "channel_axis must be 1"),
    (lambda x, w: cynorm.group_norm(x, 3, w, channel_axis="1"), TypeError, "channel_axis must be an int"),
    (lambda x, w: cynorm.group_norm(x[0, 0, 0], 3, w[:4]), ValueError, "ndim >= 2"),
    (lambda x, w: cynorm.group_norm(x, 3, w[:5]), ValueError, "weight must have shape (C,) = (6,)"),
    (lambda x, w: cynorm.group_norm(x, 3, w.astype(np.float64)), TypeError, "unsupported dtypes"),
    (lambda x, w: cynorm.group_norm(x.astype(np.int32), 3), TypeError, "supported input dtypes"),
    (lambda x, w: cynorm.group_norm(x[:, :, :0], 3), ValueError, "zero elements"),
    (lambda x, w: cynorm.group_norm(x, 3, w, eps=-1.0), ValueError, "eps must be finite and >= 0"),
    (lambda x, w: cynorm.group_norm(x, 3, w, out=np.empty((2, 6, 4, 4), np.float32)), ValueError, "must have shape"),
    (lambda x, w: cynorm.group_norm_backward(x, x, np.zeros((2, 2), np.float32), np.ones((2, 3), np.float32), w,
                                             num_groups=3), ValueError, "mean must have shape (N, num_groups) = (2, 3)"),
    (lambda x, w: cynorm.group_norm_backward(x, x, np.zeros((2, 3)), np.ones((2, 3), np.float32), w, num_groups=3),
     TypeError, "mean must have dtype float32"),
    (lambda x, w: cynorm.group_norm_backward(x[:1], x, np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32),
                                             w, num_groups=3), ValueError, "dy must have the shape of x"),
]


@pytest.mark.parametrize("call, exc, words", BAD, ids=[b[2][:30] for b in BAD])
def test_bad_input_is_refused_with_a_message(call, exc, words):
    x = np.random.default_rng(1).standard_normal((2, 6, 4, 5)).astype(np.float32)
    w = np.ones(6, np.float32)
    before = bits_of(x), bits_of(w)
    with pytest.raises(exc, match=None) as info:
        call(x, w)
    assert words in str(info.value), str(info.value)
    assert np.array_equal(bits_of(x), before[0]) and np.array_equal(bits_of(w), before[1])


def test_out_untouched_when_refused():
    x = np.ones((2, 6, 4), np.float32)
    y = np.full_like(x, 7.0)
    with pytest.raises(ValueError):
        cynorm.group_norm_forward(x, 4, out=(y, None, None))
    assert np.all(y == 7.0)


def test_empty_batch():
    y, mean, rstd = cynorm.group_norm_forward(np.zeros((0, 4, 3), np.float32), 2)
    assert y.shape == (0, 4, 3) and mean.shape == (0, 2)
    dx, dw, db = cynorm.group_norm_backward(y, y, mean, rstd, np.ones(4, np.float32), num_groups=2)
    assert dx.shape == (0, 4, 3) and np.array_equal(dw, np.zeros(4, np.float32)) and np.array_equal(db, dw)


def test_out_overlaps_are_refused_or_copied(rng):
    """The out= fast path takes only disjoint outputs: the same array twice is refused, and
    a y that overlaps x without being x has x copied first (the result is x's, unchanged)."""
    x, dy, w, b = _inputs(rng, (2, 6, 4, 5), 1, (np.dtype(np.float32),) * 2)
    y0, mean, rstd = cynorm.group_norm_forward(x, 3, w, b)
    m = np.empty((2, 3), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        cynorm.group_norm_forward(x, 3, w, b, out=(None, m, m))
    buf = np.zeros(2 * x.size, np.float32)
    buf[5:5 + x.size] = x.ravel()
    xs, ys = buf[5:5 + x.size].reshape(x.shape), buf[:x.size].reshape(x.shape)
    got = cynorm.group_norm_forward(xs, 3, w, b, out=(ys, None, None))[0]
    assert got is ys
    assert_same_bits(ys, y0)


@pytest.mark.parametrize("pair", PAIRS)
def test_each_group_as_if_alone(pair, rng):
    """Channels-last: a group's outputs do not depend on the other groups (the
    forward merges every group's channel moments side by side): each group, its
    channels cut out and normalized as one group, gives the same bits. One
    channel of group 3 sits 1000 above its own later positions for its first
    64, so its one-pass sums are refused and redone in double."""
    xd, pd = pair
    N, S, C, G = 2, 100, 96, 8
    Cg = C // G
    x = rng.standard_normal((N, 10, 10, C))
    x[:, :6, :, 3 * Cg + 5] += 1000.0      # positions 0-59 of channel 41 (and 60-63 in the next row)
    x[:, 6, :4, 3 * Cg + 5] += 1000.0
    x = x.astype(xd)
    w = (1 + 0.5 * rng.standard_normal(C)).astype(pd)
    b = (0.5 * rng.standard_normal(C)).astype(pd)
    dy = rng.standard_normal(x.shape).astype(xd)
    y, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=-1)
    y_ref, mean_ref, _ = ref.group_norm(x, G, w, b, channel_axis=-1)
    accuracy.check(y, y_ref, xd, "y")
    accuracy.check_stat(mean, mean_ref, "mean")
    dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=-1)
    for g in range(G):
        cut = slice(g * Cg, (g + 1) * Cg)
        xg, dyg = np.ascontiguousarray(x[..., cut]), np.ascontiguousarray(dy[..., cut])
        yg, mg, rg = cynorm.group_norm_forward(xg, 1, w[cut], b[cut], channel_axis=-1)
        assert_same_bits(yg, np.ascontiguousarray(y[..., cut]), f"y of group {g}")
        assert_same_bits(mg[:, 0], mean[:, g], f"mean of group {g}")
        assert_same_bits(rg[:, 0], rstd[:, g], f"rstd of group {g}")
        dxg, _, _ = cynorm.group_norm_backward(dyg, xg, mg, rg, w[cut], num_groups=1, channel_axis=-1)
        assert_same_bits(dxg, np.ascontiguousarray(dx[..., cut]), f"dx of group {g}")
