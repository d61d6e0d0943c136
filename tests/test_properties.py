"""Property-based tests (hypothesis) against the float64 reference.

Example counts are bounded for CI (profile "ci", the default); run the larger
profile by hand with HYPOTHESIS_PROFILE=thorough pytest tests/test_properties.py
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cynorm
import reference as ref
from accuracy import check, dx_scale
from conftest import BF16, F16, F32, F64, PAIRS

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PAIR_VALUES = [p.values[0] for p in PAIRS]
SPECIALS = ["none", "nan", "inf", "huge", "tiny", "subnormal", "constant"]


def _layout(a, kind):
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "sliced":
        return np.repeat(a, 2, axis=-1)[..., ::2]
    if kind == "negative":
        return np.ascontiguousarray(a[::-1])[::-1] if a.shape[0] > 1 else a[:, ::-1][:, ::-1] if a.ndim > 1 else a
    return a


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 4))
    dims = [draw(st.integers(1, 7)) for _ in range(ndim)]
    if draw(st.booleans()):  # sometimes one long, odd dimension
        dims[-1] = draw(st.sampled_from([17, 55, 63, 65, 129, 301, 2049, 4099]))
    axis = draw(st.integers(-ndim, ndim - 1))
    pair = draw(st.sampled_from(PAIR_VALUES))
    layout = draw(st.sampled_from(["C", "F", "sliced", "negative"]))
    eps = draw(st.sampled_from([1e-5, 1e-6, 1e-3, 1.0, 1e-12]))
    threads = draw(st.sampled_from([1, 2, 3]))
    special = draw(st.sampled_from(SPECIALS))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    offset = draw(st.sampled_from([0.0, 1.0, 100.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    affine = draw(st.booleans())
    return dict(shape=tuple(dims), axis=axis, pair=pair, layout=layout, eps=eps, threads=threads,
                special=special, scale=scale, offset=offset, seed=seed, affine=affine)


def _build(c):
    rng = np.random.default_rng(c["seed"])
    xd, pd = c["pair"]
    shape, axis = c["shape"], c["axis"]
    x64 = rng.standard_normal(shape) * c["scale"] + c["offset"]
    lead = int(np.prod(shape[: axis % len(shape)], dtype=np.int64))
    rows = x64.reshape(lead, -1)
    r = int(rng.integers(0, lead))
    finfo_max = float(np.finfo(np.float32 if xd != F64 else np.float64).max)
    if xd == F16:
        finfo_max = 65504.0
    sp = c["special"]
    if sp == "nan":
        rows[r, int(rng.integers(0, rows.shape[1]))] = np.nan
    elif sp == "inf":
        rows[r, int(rng.integers(0, rows.shape[1]))] = np.inf * rng.choice([-1, 1])
    elif sp == "huge":
        rows[r] = rng.uniform(-1, 1, rows.shape[1]) * finfo_max * 0.25
    elif sp == "tiny":
        rows[r] = rng.standard_normal(rows.shape[1]) * (1e-30 if xd in (F32, F64, BF16) else 1e-4)
    elif sp == "subnormal":
        rows[r] = rng.standard_normal(rows.shape[1]) * (1e-40 if xd in (F32, BF16) else 1e-310 if xd == F64 else 1e-6)
    elif sp == "constant":
        rows[r] = rows[r, 0]
    x = x64.astype(xd)
    dy = rng.standard_normal(shape).astype(xd)
    ns = shape[axis % len(shape):]
    w = (1 + 0.3 * rng.standard_normal(ns)).astype(pd) if c["affine"] else None
    b = (0.3 * rng.standard_normal(ns)).astype(pd) if c["affine"] else None
    return _layout(x, c["layout"]), _layout(dy, c["layout"]), w, b, r, lead


def _bad_rows(x, axis):
    """Rows holding NaN/inf (those come out NaN)."""
    lead = int(np.prod(x.shape[: axis % x.ndim], dtype=np.int64))
    return ~np.isfinite(x.astype(np.float64).reshape(lead, -1)).all(axis=1)


@given(cases())
def test_forward_backward_match_reference(c):
    x, dy, w, b, r, lead = _build(c)
    axis, eps, T = c["axis"], c["eps"], c["threads"]
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis, eps=eps, num_threads=T)
    bad = _bad_rows(x, axis)
    yrows = y.astype(np.float64).reshape(lead, -1)
    assert np.isnan(yrows[bad]).all(), "a row with NaN/inf must come out NaN"
    assert np.isfinite(yrows[~bad]).all(), "finite rows must stay finite"
    yr, mr, rr = ref.layer_norm(x, w, b, axis=axis, eps=eps)
    huge_f64 = c["special"] == "huge" and x.dtype == F64  # the float64 reference itself overflows there
    if not huge_f64:
        check(y, yr, x.dtype, "y")
    dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis, num_threads=T)
    dxrows = dx.astype(np.float64).reshape(lead, -1)
    dxr, _, _ = ref.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
    assert np.isnan(dxrows[bad]).all()
    # finite wherever the exact value is representable (float16 dx can overflow when rstd is huge)
    representable = np.abs(dxr.reshape(lead, -1)) < 0.5 * float(np.finfo(np.float32 if x.dtype != F16 else F16).max)
    assert np.isfinite(dxrows[~bad & representable.all(axis=1)]).all() or c["special"] == "huge"
    if c["special"] in ("none", "constant", "tiny") and not bad.any() and representable.all():
        check(dx, dxr, x.dtype, "dx", scale=dx_scale(dxr, dy, rstd, w))
    # RMSNorm on the same input
    yq, rq = cynorm.rms_norm_forward(x, w, axis=axis, eps=eps, num_threads=T)
    if not huge_f64:  # (an inf makes rstd 0: only the inf itself turns NaN, as in the reference)
        check(yq, ref.rms_norm(x, w, axis=axis, eps=eps)[0], x.dtype, "rms y")


@given(cases(), st.integers(-6, 6))
def test_power_of_two_scaling_is_exact(c, k):
    """LN(x * 2^k, eps * 4^k) == LN(x, eps) bit for bit (scaling by 2^k is exact everywhere)."""
    c = dict(c, special="none", offset=0.0, layout="C")
    x, _, w, b, _, _ = _build(c)
    if x.dtype in (F16,):
        k = max(min(k, 2), -2)  # stay inside float16's range
    xs = (x.astype(np.float64) * 2.0 ** k).astype(x.dtype)
    assume(np.array_equal(xs.astype(np.float64), x.astype(np.float64) * 2.0 ** k))  # no range loss
    assume(np.abs(x.astype(np.float64)).min(initial=1.0) * 2.0 ** min(k, 0) > 1e-30)
    y1 = cynorm.layer_norm(x, w, b, axis=c["axis"], eps=c["eps"], num_threads=c["threads"])
    y2 = cynorm.layer_norm(xs, w, b, axis=c["axis"], eps=c["eps"] * 4.0 ** k, num_threads=c["threads"])
    assert np.array_equal(y1.view(np.uint8), y2.view(np.uint8))


@given(cases(), st.floats(0.01, 100), st.floats(-50, 50))
def test_affine_invariance(c, scale, shift):
    """y(x * c + d; eps * c^2) ~= y(x; eps) for c > 0 (float64 inputs: no rounding of x*c+d to speak of)."""
    c = dict(c, special="none", layout="C", pair=(F64, F64))
    x, _, w, b, _, _ = _build(c)
    y1 = cynorm.layer_norm(x, w, b, axis=c["axis"], eps=c["eps"])
    y2 = cynorm.layer_norm(x * scale + shift, w, b, axis=c["axis"], eps=c["eps"] * scale**2)
    np.testing.assert_allclose(y2, y1, rtol=1e-8, atol=1e-8 * max(1.0, np.abs(y1).max()))


@given(cases())
def test_normalized_moments(c):
    """mean((y - b)/w) ~ 0 and var((y - b)/w) ~ var / (var + eps), per row."""
    c = dict(c, special="none")
    x, _, w, b, _, lead = _build(c)
    axis, eps = c["axis"], c["eps"]
    y = cynorm.layer_norm(x, w, b, axis=axis, eps=eps)
    z = y.astype(np.float64)
    if w is not None:
        z = (z - b.astype(np.float64)) / w.astype(np.float64)
    z = z.reshape(lead, -1)
    n = z.shape[1]
    x64 = x.astype(np.float64).reshape(lead, -1)
    var = x64.var(axis=1)
    tol = {F64: 1e-9, F32: 2e-5, BF16: 3e-2, F16: 4e-3}[x.dtype]
    amp = 1 if w is None else float(np.max(1 / np.abs(w.astype(np.float64))))
    assert np.all(np.abs(z.mean(axis=1)) <= tol * amp * 4)
    if n > 1:
        want = var / (var + eps)
        assert np.all(np.abs(z.var(axis=1) - want) <= tol * amp**2 * 8 + 1e-12)


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 5, 33]), st.booleans())
def test_backward_matches_finite_differences(seed, n, rms):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, n)) * 2 + 0.5
    dy = rng.standard_normal((3, n))
    w = 1 + 0.3 * rng.standard_normal(n)
    b = 0.3 * rng.standard_normal(n)
    if rms:
        y, rstd = cynorm.rms_norm_forward(x, w)
        dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w)
        f = lambda xv, wv: float(np.sum(ref.rms_norm(xv, wv)[0] * dy))  # noqa: E731
    else:
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
        dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w)
        f = lambda xv, wv: float(np.sum(ref.layer_norm(xv, wv, b)[0] * dy))  # noqa: E731
    h = 1e-6
    i, j = int(rng.integers(0, 3)), int(rng.integers(0, n))
    xp, xm = x.copy(), x.copy()
    xp[i, j] += h
    xm[i, j] -= h
    num = (f(xp, w) - f(xm, w)) / (2 * h)
    assert abs(dx[i, j] - num) <= 1e-5 * max(1.0, abs(num))
    wp, wm = w.copy(), w.copy()
    wp[j] += h
    wm[j] -= h
    num = (f(x, wp) - f(x, wm)) / (2 * h)
    assert abs(dw[j] - num) <= 1e-5 * max(1.0, abs(num))
