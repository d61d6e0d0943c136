"""RMSNorm forward/backward against the float64 reference."""

import numpy as np
import pytest

import cynorm
import reference as ref
from accuracy import check, check_param_grad, check_stat, dx_scale
from conftest import F32, F64, PAIRS, make_inputs


def run_and_check(x, dy, w, axis, eps=1e-6, num_threads=None):
    y, rstd = cynorm.rms_norm_forward(x, w, axis=axis, eps=eps, num_threads=num_threads)
    yr, rr = ref.rms_norm(x, w, axis=axis, eps=eps)
    check(y, yr, x.dtype, "y")
    check_stat(rstd, rr, "rstd")
    assert rstd.shape == x.shape[: axis % x.ndim] + (1,) * (x.ndim - axis % x.ndim)
    dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w, axis=axis, num_threads=num_threads)
    dxr, dwr = ref.rms_norm_backward(dy, x, rstd, w, axis=axis)
    check(dx, dxr, x.dtype, "dx", scale=dx_scale(dxr, dy, rstd.reshape(rstd.shape[: axis % x.ndim] + (1,) * (x.ndim - axis % x.ndim)), w))
    if w is None:
        assert dw is None
    else:
        check_param_grad(dw, dwr, w.dtype, "dweight")
    return y, rstd, dx, dw


@pytest.mark.parametrize("n", [1, 3, 16, 17, 56, 1000, 4097, 100003])
@pytest.mark.parametrize("pair", PAIRS)
def test_accuracy_every_level(isa_level, pair, n, rng):
    rows = 7 if n <= 1000 else 3 if n <= 5000 else 2
    x, dy, w, _ = make_inputs(rng, (rows, n), 1, pair)
    run_and_check(x, dy, w, axis=1)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("pair", PAIRS)
def test_axes_and_no_weight(pair, axis, rng):
    x, dy, w, _ = make_inputs(rng, (3, 4, 9), axis, pair)
    run_and_check(x, dy, w, axis=axis)
    run_and_check(x, dy, None, axis=axis)


@pytest.mark.parametrize("pair", PAIRS)
def test_team_and_block_paths(pair, rng, force_parallel):
    for shape in [(3, 9000), (200, 100), (130, 2100), (70, 33000)]:
        x, dy, w, _ = make_inputs(rng, shape, 1, pair)
        run_and_check(x, dy, w, axis=1, num_threads=3)


def test_backward_matches_finite_differences():
    rng = np.random.default_rng(4)
    x, dy, w, _ = make_inputs(rng, (3, 29), 1, (F64, F64))
    y, rstd = cynorm.rms_norm_forward(x, w)
    dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w)

    def loss(xv, wv):
        return float(np.sum(ref.rms_norm(xv, wv)[0] * dy))

    h = 1e-6
    for idx in [(0, 0), (1, 10), (2, 28)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num = (loss(xp, w) - loss(xm, w)) / (2 * h)
        assert abs(dx[idx] - num) <= 1e-6 * max(1, abs(num))
    for j in [0, 7, 28]:
        wp, wm = w.copy(), w.copy()
        wp[j] += h
        wm[j] -= h
        num = (loss(x, wp) - loss(x, wm)) / (2 * h)
        assert abs(dw[j] - num) <= 1e-6 * max(1, abs(num))


def test_zero_row(rng):
    x = rng.standard_normal((3, 40)).astype(np.float32)
    x[1] = 0
    y, rstd = cynorm.rms_norm_forward(x)
    assert np.all(y[1] == 0)
    assert rstd[1, 0] == np.float32(1 / np.sqrt(1e-6))


def test_default_eps_differs_from_layer_norm(rng):
    x = rng.standard_normal((2, 5)).astype(np.float64) * 1e-3
    _, rstd = cynorm.rms_norm_forward(x)
    np.testing.assert_allclose(rstd, ref.rms_norm(x, eps=1e-6)[1], rtol=1e-12)
