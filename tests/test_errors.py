"""Bad input raises TypeError/ValueError with a useful message and touches nothing."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm

F32 = np.float32


def _args():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(F32)
    return x, np.ones(6, F32), np.zeros(6, F32)


def _check_untouched(arrays, call, exc, match):
    before = [a.copy() for a in arrays]
    with pytest.raises(exc, match=match):
        call()
    for a, b in zip(arrays, before):
        if a.dtype == object:
            assert a.tolist() == b.tolist()
        else:
            assert a.tobytes() == b.tobytes()


# (description, kwargs-producing function, exception, message regex)
FORWARD_CASES = [
    ("f32 x with f64 weight", lambda x, w, b: dict(x=x, weight=w.astype(np.float64)), TypeError,
     r"unsupported dtypes: x is float32 but weight/bias are float64.*\(float32, float32\)"),
    ("weight/bias dtypes differ", lambda x, w, b: dict(x=x, weight=w, bias=b.astype(np.float64)), TypeError,
     "weight and bias must have the same dtype"),
    ("int x", lambda x, w, b: dict(x=x.astype(np.int32)), TypeError, "x has dtype int32"),
    ("bool x", lambda x, w, b: dict(x=x > 0), TypeError, "x has dtype bool"),
    ("complex x", lambda x, w, b: dict(x=x.astype(np.complex64)), TypeError, "x has dtype complex64"),
    ("object x", lambda x, w, b: dict(x=np.array([[1.0, "a"]], dtype=object)), TypeError, "dtype object"),
    ("string x", lambda x, w, b: dict(x="abc"), TypeError, "dtype <U3"),
    ("ragged list", lambda x, w, b: dict(x=[[1.0, 2.0], [3.0]]), TypeError, "array-like"),
    ("int weight", lambda x, w, b: dict(x=x, weight=w.astype(np.int64)), TypeError, "weight/bias are int64"),
    ("bf16 x, f16 weight", lambda x, w, b: dict(x=x.astype(bfloat16), weight=w.astype(np.float16)), TypeError,
     "bfloat16.*float16"),
    ("weight shape", lambda x, w, b: dict(x=x, weight=w[:5]), ValueError, r"weight must have shape .*\(6,\)"),
    ("bias shape", lambda x, w, b: dict(x=x, bias=np.zeros((1, 6), F32)), ValueError, "bias must have shape"),
    ("axis out of range", lambda x, w, b: dict(x=x, axis=2), ValueError, "axis 2 is out of range"),
    ("axis too negative", lambda x, w, b: dict(x=x, axis=-3), ValueError, "out of range"),
    ("axis float", lambda x, w, b: dict(x=x, axis=1.0), TypeError, "axis must be an int"),
    ("axis bool", lambda x, w, b: dict(x=x, axis=True), TypeError, "axis must be an int"),
    ("axis tuple", lambda x, w, b: dict(x=x, axis=(0, 1)), TypeError, "axis must be an int"),
    ("eps negative", lambda x, w, b: dict(x=x, eps=-1e-5), ValueError, "eps must be finite and >= 0"),
    ("eps nan", lambda x, w, b: dict(x=x, eps=float("nan")), ValueError, "eps must be finite"),
    ("eps inf", lambda x, w, b: dict(x=x, eps=float("inf")), ValueError, "eps must be finite"),
    ("eps string", lambda x, w, b: dict(x=x, eps="0.1"), TypeError, "eps must be a real number"),
    ("eps None", lambda x, w, b: dict(x=x, eps=None), TypeError, "eps must be a real number"),
    ("eps complex", lambda x, w, b: dict(x=x, eps=1j), TypeError, "eps must be a real number"),
    ("num_threads 0", lambda x, w, b: dict(x=x, num_threads=0), ValueError, "num_threads must be >= 1"),
    ("num_threads -2", lambda x, w, b: dict(x=x, num_threads=-2), ValueError, "num_threads must be >= 1"),
    ("num_threads float", lambda x, w, b: dict(x=x, num_threads=2.0), TypeError, "num_threads must be an int"),
    ("num_threads bool", lambda x, w, b: dict(x=x, num_threads=True), TypeError, "num_threads must be an int"),
    ("num_threads huge", lambda x, w, b: dict(x=x, num_threads=10**9), ValueError, "limit"),
    ("0-d x", lambda x, w, b: dict(x=np.float32(3.0)), ValueError, "at least one dimension"),
    ("zero-size normalized dims", lambda x, w, b: dict(x=np.zeros((3, 0), F32)), ValueError, "zero size"),
    ("masked x", lambda x, w, b: dict(x=np.ma.masked_array(x, mask=x > 0)), TypeError, "masked array"),
]


def _forward_params():
    for fn in ("layer_norm", "layer_norm_forward", "rms_norm"):
        for case in FORWARD_CASES:
            if fn == "rms_norm" and "bias" in case[0]:
                continue  # rms_norm has no bias argument
            yield pytest.param(fn, case, id=f"{fn}-{case[0]}")


@pytest.mark.parametrize("fn,case", list(_forward_params()))
def test_forward_rejects(fn, case):
    _, make, exc, match = case
    x, w, b = _args()
    kwargs = make(x, w, b)
    arrays = [a for a in kwargs.values() if isinstance(a, np.ndarray)] + [x, w, b]
    _check_untouched(arrays, lambda: getattr(cynorm, fn)(**kwargs), exc, match)


OUT_CASES = [
    ("wrong shape", lambda x: np.empty((4, 5), F32), ValueError, "out must have shape"),
    ("wrong dtype", lambda x: np.empty((4, 6), np.float64), TypeError, "out must have dtype float32"),
    ("read-only", lambda x: np.frombuffer(bytes(4 * 24), dtype=F32).reshape(4, 6), ValueError, "read-only"),
    ("non-contiguous", lambda x: np.empty((6, 4), F32).T, ValueError, "C-contiguous"),
    ("not an array", lambda x: [[0.0] * 6] * 4, TypeError, "out must be a numpy.ndarray"),
]


@pytest.mark.parametrize("case", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_bad_out(case):
    _, make, exc, match = case
    x, w, b = _args()
    out = make(x)
    arrays = [x, w, b] + ([out] if isinstance(out, np.ndarray) and out.flags.writeable else [])
    _check_untouched(arrays, lambda: cynorm.layer_norm(x, w, b, out=out), exc, match)
    _check_untouched(arrays, lambda: cynorm.rms_norm(x, w, out=out), exc, match)


def _bwd_args():
    x, w, b = _args()
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
    return np.ones_like(x), x, mean, rstd, w


BACKWARD_CASES = [
    ("dy shape", lambda dy, x, m, r, w: dict(dy=dy[:, :5]), ValueError, "dy must have the shape of x"),
    ("dy dtype", lambda dy, x, m, r, w: dict(dy=dy.astype(np.float64)), TypeError, "dy must have the dtype of x"),
    ("mean shape", lambda dy, x, m, r, w: dict(mean=m[:3]), ValueError, "mean must have shape"),
    ("rstd shape", lambda dy, x, m, r, w: dict(rstd=np.ones((4, 2), F32)), ValueError, "rstd must have shape"),
    ("rstd dtype", lambda dy, x, m, r, w: dict(rstd=r.astype(np.float64)), TypeError, "rstd must have dtype float32"),
    ("weight shape", lambda dy, x, m, r, w: dict(weight=w[:4]), ValueError, "weight must have shape"),
    ("weight dtype", lambda dy, x, m, r, w: dict(weight=w.astype(np.float64)), TypeError, "unsupported dtypes"),
    ("axis", lambda dy, x, m, r, w: dict(axis=5), ValueError, "out of range"),
    ("num_threads", lambda dy, x, m, r, w: dict(num_threads=0), ValueError, "num_threads"),
    ("out dtype", lambda dy, x, m, r, w: dict(out=np.empty((4, 6), np.float64)), TypeError, "out must have dtype"),
    ("0-d", lambda dy, x, m, r, w: dict(x=np.float32(1), dy=np.float32(1)), ValueError, "at least one dimension"),
]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[c[0] for c in BACKWARD_CASES])
def test_backward_rejects(case):
    _, make, exc, match = case
    dy, x, mean, rstd, w = _bwd_args()
    kw = dict(dy=dy, x=x, mean=mean, rstd=rstd, weight=w)
    kw.update(make(dy, x, mean, rstd, w))
    arrays = [a for a in kw.values() if isinstance(a, np.ndarray)]
    _check_untouched(arrays, lambda: cynorm.layer_norm_backward(**kw), exc, match)
    kw.pop("mean")
    if "mean" not in case[0]:
        _check_untouched(arrays, lambda: cynorm.rms_norm_backward(**kw), exc, match)


def test_messages_name_the_fix():
    x, w, _ = _args()
    with pytest.raises(TypeError) as info:
        cynorm.layer_norm(x, w.astype(np.float64))
    msg = str(info.value)
    assert "astype(np.float32)" in msg and "(bfloat16, float32)" in msg


def test_backward_accepts_squeezed_stats():
    dy, x, mean, rstd, w = _bwd_args()
    a = cynorm.layer_norm_backward(dy, x, mean, rstd, w)
    b = cynorm.layer_norm_backward(dy, x, mean.reshape(-1), rstd.reshape(-1), w)
    for u, v in zip(a, b):
        assert np.array_equal(u, v)


def test_non_native_byte_order_is_converted():
    x, w, b = _args()
    xb = x.astype(">f4")
    np.testing.assert_array_equal(cynorm.layer_norm(xb, w, b), cynorm.layer_norm(x, w, b))
