"""Fused residual add + norm: bit-identity with the unfused sequence computed
the same way, float64 references, aliasing, threads, errors."""

import numpy as np
import pytest

import cynorm
import reference as ref
from accuracy import check, check_stat
from conftest import BF16, F16, F32, F64, PAIRS, assert_same_bits

#: row lengths through every path: in registers, medium, rows, long rows
SHAPES = [(37, 8), (33, 56), (9, 300), (5, 3000), (3, 70001)]
NORMS = ["layer", "rms"]


def _inputs(rng, shape, x_dtype, p_dtype, r_dtype, scale=1.0):
    x = (rng.standard_normal(shape) * scale + 0.3).astype(x_dtype)
    r = (rng.standard_normal(shape) * 2.0 - 0.5).astype(r_dtype)
    n = shape[-1]
    w = (1.0 + 0.5 * rng.standard_normal(n)).astype(p_dtype)
    b = (0.1 * rng.standard_normal(n)).astype(p_dtype)
    return x, r, w, b


def _wide(dt):
    return F64 if dt == F64 else F32


def _h_ref(x, r, h_dtype):
    """NumPy's x + r, in float32 (float64) and rounded once."""
    acc = _wide(np.dtype(h_dtype))
    return (x.astype(acc) + r.astype(acc)).astype(h_dtype)


def _forward(norm, x, r, w, b, **kw):
    if norm == "layer":
        return cynorm.add_layer_norm_forward(x, r, w, b, **kw)
    y, h, rstd = cynorm.add_rms_norm_forward(x, r, w, **kw)
    return y, h, None, rstd


def _plain_forward(norm, h, w, b, **kw):
    if norm == "layer":
        return cynorm.layer_norm_forward(h, w, b, **kw)
    y, rstd = cynorm.rms_norm_forward(h, w, **kw)
    return y, None, rstd


def _backward(norm, dy, h, mean, rstd, w, **kw):
    if norm == "layer":
        return cynorm.add_layer_norm_backward(dy, h, mean, rstd, w, **kw)
    dsum, dw = cynorm.add_rms_norm_backward(dy, h, rstd, w, **kw)
    return dsum, dw, None


def _plain_backward(norm, dy, h, mean, rstd, w, **kw):
    if norm == "layer":
        return cynorm.layer_norm_backward(dy, h, mean, rstd, w, **kw)
    dx, dw = cynorm.rms_norm_backward(dy, h, rstd, w, **kw)
    return dx, dw, None


def _unfused(norm, x, r, w, b, h_dtype, dy, dh, eps):
    """The unfused sequence, computed the same way: NumPy's add rounded once, the
    plain forward on h; the plain backward on h in h's kernel with dx kept in
    float32 (the plain float32 kernel on widened inputs), + dh, rounded once."""
    h = _h_ref(x, r, h_dtype)
    wide_params = h.dtype == F32 and x.dtype != F32
    wp = w.astype(F32) if wide_params else w
    bp = b.astype(F32) if wide_params else b
    y, mean, rstd = _plain_forward(norm, h, wp, bp, eps=eps)
    y = y.astype(x.dtype)
    acc = _wide(h.dtype)
    wacc = w.astype(acc)
    dx, _, _ = _plain_backward(norm, dy.astype(acc), h.astype(acc), mean, rstd, wacc)
    _, dw, db = _plain_backward(norm, dy.astype(h.dtype), h, mean, rstd, wp)
    if wide_params and w.dtype != F32:   # params of x's 16-bit dtype: their gradients rounded to it
        dw = dw.astype(w.dtype)
        db = None if db is None else db.astype(w.dtype)
    dsum32 = dx if dh is None else dx + dh.astype(acc)
    return y, h, mean, rstd, dsum32, dw, db


CASES = [pytest.param((x, p, h), id=f"{pid}-h{'32' if h == F32 and x != F32 else ''}")
         for (x, p), pid in [((F32, F32), "f32"), ((F64, F64), "f64"), ((BF16, BF16), "bf16"),
                             ((BF16, F32), "bf16-f32"), ((F16, F16), "f16"), ((F16, F32), "f16-f32")]
         for h in ([x, F32] if x in (BF16, F16) else [x])]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_bit_identical_to_the_unfused_sequence(case, shape, norm, rng):
    x_dtype, p_dtype, h_dtype = case
    x, r, w, b = _inputs(rng, shape, x_dtype, p_dtype, h_dtype)
    dy = rng.standard_normal(shape).astype(x_dtype)
    dh = rng.standard_normal(shape).astype(h_dtype)
    eps = 1e-5
    y_u, h_u, mean_u, rstd_u, dsum32_u, dw_u, db_u = _unfused(norm, x, r, w, b, h_dtype, dy, dh, eps)
    y, h, mean, rstd = _forward(norm, x, r, w, b, eps=eps, residual_dtype=h_dtype)
    for got, want, what in [(h, h_u, "h"), (y, y_u, "y"), (mean, mean_u, "mean"), (rstd, rstd_u, "rstd")]:
        assert_same_bits(got, want, what)
    dsum, dw, db = _backward(norm, dy, h, mean, rstd, w, dh=dh)
    assert_same_bits(dsum, dsum32_u.astype(h_dtype), "dsum")
    assert_same_bits(dw, dw_u, "dweight")
    assert_same_bits(db, db_u, "dbias")
    if h_dtype != x_dtype:   # dsum in x's dtype on request: the float32 sum rounded once
        dsum_x = np.empty(shape, x_dtype)
        got = _backward(norm, dy, h, mean, rstd, w, dh=dh, out=(dsum_x, None, None) if norm == "layer"
                        else (dsum_x, None))
        assert got[0] is dsum_x
        assert_same_bits(dsum_x, dsum32_u.astype(x_dtype), "dsum in x's dtype")
    # no dh: dsum is the plain dx (rounded once from the same float32 value)
    dsum0, _, _ = _backward(norm, dy, h, mean, rstd, w)
    dx_plain = _plain_backward(norm, dy.astype(h_dtype), h, mean, rstd,
                               w.astype(F32) if h.dtype == F32 and x_dtype != F32 else w)[0]
    assert_same_bits(dsum0, dx_plain, "dsum without dh")


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("pair", PAIRS)
def test_against_float64(pair, norm, rng):
    x_dtype, p_dtype = pair
    shape = (6, 515)
    x, r, w, b = _inputs(rng, shape, x_dtype, p_dtype, x_dtype)
    dy = rng.standard_normal(shape).astype(x_dtype)
    dh = rng.standard_normal(shape).astype(x_dtype)
    y, h, mean, rstd = _forward(norm, x, r, w, b)
    h64 = x.astype(F64) + r.astype(F64)
    check(h, h64, x_dtype, "h")
    if norm == "layer":
        yr, mr, rr = ref.layer_norm(h, w, b)
        check_stat(mean, mr, "mean")
    else:
        yr, rr = ref.rms_norm(h, w)
    check(y, yr, x_dtype, "y")
    check_stat(rstd, rr, "rstd")
    dsum, dw, db = _backward(norm, dy, h, mean, rstd, w, dh=dh)
    if norm == "layer":
        dxr, dwr, dbr = ref.layer_norm_backward(dy, h, mean, rstd, w)
    else:
        dxr, dwr = ref.rms_norm_backward(dy, h, rstd, w)
    want = dxr + dh.astype(F64)
    check(dsum, want, x_dtype, "dsum", scale=float(np.max(np.abs(want))) + float(np.max(np.abs(dxr))))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("case", CASES)
def test_thread_counts_give_the_same_bits(case, norm, rng, force_parallel):
    x_dtype, p_dtype, h_dtype = case
    results = []
    for shape in [(40, 56), (7, 3000), (2, 70001)]:
        x, r, w, b = _inputs(rng, shape, x_dtype, p_dtype, h_dtype)
        dy = rng.standard_normal(shape).astype(x_dtype)
        dh = rng.standard_normal(shape).astype(h_dtype)
        per_t = []
        for T in (1, 2, 3):
            f = _forward(norm, x, r, w, b, residual_dtype=h_dtype, num_threads=T)
            g = _backward(norm, dy, f[1], f[2], f[3], w, dh=dh, num_threads=T)
            per_t.append([a for a in f + g if a is not None])
        for other in per_t[1:]:
            for a, b_ in zip(per_t[0], other):
                assert_same_bits(a, b_, f"{shape} threads")
        results.append(per_t[0])
    assert results


@pytest.mark.parametrize("norm", NORMS)
def test_every_level_gives_the_same_bits(isa_level, norm):
    rng = np.random.default_rng(7)
    shape = (19, 300)
    x, r, w, b = _inputs(rng, shape, BF16, F32, F32)
    dy = rng.standard_normal(shape).astype(BF16)
    dh = rng.standard_normal(shape).astype(F32)
    f = _forward(norm, x, r, w, b, residual_dtype=np.float32)
    g = _backward(norm, dy, f[1], f[2], f[3], w, dh=dh)
    with cynorm._isa.using(cynorm._isa.available_levels()[0]):
        f0 = _forward(norm, x, r, w, b, residual_dtype=np.float32)
        g0 = _backward(norm, dy, f0[1], f0[2], f0[3], w, dh=dh)
    for a, b_ in zip(f + g, f0 + g0):
        assert_same_bits(a, b_, f"{isa_level} vs lowest")


# ----------------------------------------------------------------- aliasing --

@pytest.mark.parametrize("shape", [(33, 56), (5, 3000)], ids=str)
def test_h_in_place_over_residual(shape, rng):
    x, r, w, b = _inputs(rng, shape, F32, F32, F32)
    y0, h0, m0, s0 = cynorm.add_layer_norm_forward(x, r, w, b)
    res = r.copy()
    y, h, m, s = cynorm.add_layer_norm_forward(x, res, w, b, out=(None, res))
    assert h is res
    assert_same_bits(res, h0, "h in place")
    assert_same_bits(y, y0, "y")
    # y over x, h over the residual: the vLLM-style update of both buffers
    xx, res = x.copy(), r.copy()
    y, h, _, _ = cynorm.add_layer_norm_forward(xx, res, w, b, out=(xx, res))
    assert y is xx and h is res
    assert_same_bits(xx, y0, "y in place over x")
    assert_same_bits(res, h0, "h in place over residual")


def test_fp32_stream_in_place(rng):
    x, r, w, b = _inputs(rng, (9, 300), BF16, F32, F32)
    y0, h0, _, _ = cynorm.add_rms_norm_forward(x, r, w, residual_dtype=np.float32) + (None,)
    res = r.copy()
    y, h, _ = cynorm.add_rms_norm_forward(x, res, w, residual_dtype=np.float32, out=(None, res))
    assert h is res and h.dtype == F32 and y.dtype == BF16
    assert_same_bits(res, h0, "fp32 h in place")
    assert_same_bits(y, y0, "y")


@pytest.mark.parametrize("target", ["dy", "h", "dh"])
def test_dsum_in_place(target, rng):
    shape = (17, 300)
    x, r, w, b = _inputs(rng, shape, F32, F32, F32)
    y, h, mean, rstd = cynorm.add_layer_norm_forward(x, r, w, b)
    dy = rng.standard_normal(shape).astype(F32)
    dh = rng.standard_normal(shape).astype(F32)
    want = cynorm.add_layer_norm_backward(dy, h, mean, rstd, w, dh=dh)
    arrays = {"dy": dy.copy(), "h": h.copy(), "dh": dh.copy()}
    got = cynorm.add_layer_norm_backward(arrays["dy"], arrays["h"], mean, rstd, w, dh=arrays["dh"],
                                         out=(arrays[target], None, None))
    assert got[0] is arrays[target]
    for a, b_ in zip(got, want):
        assert_same_bits(a, b_, f"dsum over {target}")


def test_overlapping_outputs_refused_and_untouched(rng):
    x, r, w, b = _inputs(rng, (8, 64), F32, F32, F32)
    buf = np.zeros(8 * 64 + 32, F32)
    y_dst = buf[:8 * 64].reshape(8, 64)
    h_dst = buf[32:].reshape(8, 64)   # partly the same memory as y_dst
    before = buf.copy(), x.copy(), r.copy()
    with pytest.raises(ValueError, match="overlap"):
        cynorm.add_layer_norm_forward(x, r, w, b, out=(y_dst, h_dst))
    for a, b_ in zip((buf, x, r), before):
        assert_same_bits(a, b_, "untouched")


def test_input_partly_overlapping_an_output_is_copied_first(rng):
    x, r, w, b = _inputs(rng, (8, 64), F32, F32, F32)
    y0, h0, _, _ = cynorm.add_layer_norm_forward(x, r, w, b)
    buf = np.zeros(9 * 64, F32)
    buf[64:] = r.ravel()
    res = buf[64:].reshape(8, 64)
    h_dst = buf[:8 * 64].reshape(8, 64)   # one row behind the residual it reads
    _, h, _, _ = cynorm.add_layer_norm_forward(x, res, w, b, out=(None, h_dst))
    assert_same_bits(h, h0, "h over a shifted residual")


# ------------------------------------------------------------------- errors --

def _untouched(arrays, fn):
    before = [a.copy() for a in arrays]
    fn()
    for a, b_ in zip(arrays, before):
        assert_same_bits(a, b_, "caller's array")


@pytest.mark.parametrize("call, exc, msg", [
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r[:, :-1], w, b), ValueError, "residual must have the shape"),
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r.astype(np.float64), w, b), TypeError, "residual must have"),
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r, w, b, residual_dtype=np.float16), TypeError, "residual_dtype must be"),
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r, w, b, residual_dtype="nonsense"), TypeError, "residual_dtype must be a dtype"),
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r, w, b, out=(s, None)), TypeError, "dtype"),
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r, w, b, out=s), TypeError, "tuple"),
    (lambda x, r, w, b, s: cynorm.add_layer_norm_forward(x, r, w, b, eps=-1.0), ValueError, "eps"),
    (lambda x, r, w, b, s: cynorm.add_rms_norm_forward(x, r, w[:-1]), ValueError, "weight must have shape"),
])
def test_bad_forward_input(call, exc, msg, rng):
    x, r, w, b = _inputs(rng, (4, 32), F32, F32, F32)
    s = np.zeros((4, 32), np.float64)
    with pytest.raises(exc, match=msg):
        _untouched([x, r, w, b, s], lambda: call(x, r, w, b, s))


def test_bad_backward_input(rng):
    x, r, w, b = _inputs(rng, (4, 32), BF16, F32, F32)
    y, h, mean, rstd = cynorm.add_layer_norm_forward(x, r, w, b, residual_dtype=np.float32)
    dy = rng.standard_normal((4, 32)).astype(BF16)
    cases = [
        (dict(dh=np.zeros((4, 32), BF16)), TypeError, "dh must have the dtype of h"),
        (dict(dh=np.zeros((4, 31), np.float32)), ValueError, "dh must have the shape"),
        (dict(out=(np.zeros((4, 32), np.float16), None, None)), TypeError, "dtype"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            _untouched([dy, h, mean, rstd, w], lambda: cynorm.add_layer_norm_backward(dy, h, mean, rstd, w, **kw))
    with pytest.raises(TypeError, match="h must have dy's dtype"):
        cynorm.add_layer_norm_backward(dy, h.astype(np.float64), mean, rstd, w)
    with pytest.raises(TypeError, match="rstd must have dtype"):
        cynorm.add_layer_norm_backward(dy, h, mean, rstd.astype(np.float64), w)
