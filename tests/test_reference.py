"""kernels/reference.c, the row math in plain scalar C, against the float64
oracle (tests/reference.py); and the kernels against it at every level."""

import numpy as np
import pytest

import cynorm
from cynorm import _core
import reference

SHAPES = [(7, 33), (5, 300), (3, 2100), (2, 5000)]   # in registers, medium, chunked (2 and 3 chunks)


def _data(rng, shape):
    x = (1e3 + rng.standard_normal(shape)).astype(np.float32)     # mean far from zero: the pivot matters
    dy = rng.standard_normal(shape).astype(np.float32)
    w = (1 + 0.5 * rng.standard_normal(shape[1])).astype(np.float32)
    b = (0.5 * rng.standard_normal(shape[1])).astype(np.float32)
    return x, dy, w, b


@pytest.mark.parametrize("center", [True, False], ids=["layer", "rms"])
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_the_float64_oracle(shape, center, rng):
    x, dy, w, b = _data(rng, shape)
    eps = 1e-5
    y, mean, rstd = _core.reference_forward(x, w, b if center else None, eps, center)
    if center:
        ry, rmean, rrstd = reference.layer_norm(x, w, b, eps=eps)
        np.testing.assert_allclose(mean, rmean.ravel(), rtol=1e-7)
    else:
        ry, rrstd = reference.rms_norm(x, w, eps=eps)
    np.testing.assert_allclose(rstd, rrstd.ravel(), rtol=2e-6)
    np.testing.assert_allclose(y, ry, rtol=0, atol=1e-4)
    dx, dw, db = _core.reference_backward(dy, x, mean if center else None, rstd, w, center)
    if center:
        rdx, rdw, rdb = reference.layer_norm_backward(dy, x, rmean, rrstd, w)
        np.testing.assert_allclose(db, rdb, rtol=1e-6, atol=1e-6)
    else:
        rdx, rdw = reference.rms_norm_backward(dy, x, rrstd, w)
    np.testing.assert_allclose(dx, rdx, rtol=0, atol=2e-4 * np.abs(rdx).max())
    np.testing.assert_allclose(dw, rdw, rtol=0, atol=1e-4 * np.abs(rdw).max())


@pytest.mark.parametrize("center", [True, False], ids=["layer", "rms"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernels_match_the_reference(isa_level, shape, center, rng):
    """The kernels sum in other orders (vector lanes, blocks), so they agree with
    the scalar reference to float32 rounding, not bit for bit."""
    x, dy, w, b = _data(rng, shape)
    y0, mean0, rstd0 = _core.reference_forward(x, w, b if center else None, 1e-5, center)
    dx0, dw0, db0 = _core.reference_backward(dy, x, mean0 if center else None, rstd0, w, center)
    if center:
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
        dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w)
        np.testing.assert_allclose(mean.ravel(), mean0, rtol=1e-6)
        np.testing.assert_allclose(db, db0, rtol=1e-5, atol=1e-5)
    else:
        y, rstd = cynorm.rms_norm_forward(x, w, eps=1e-5)
        dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w)
    np.testing.assert_allclose(rstd.ravel(), rstd0, rtol=2e-6)
    np.testing.assert_allclose(y, y0, rtol=0, atol=1e-4)
    np.testing.assert_allclose(dx, dx0, rtol=0, atol=2e-4 * np.abs(dx0).max())
    np.testing.assert_allclose(dw, dw0, rtol=0, atol=1e-4 * np.abs(dw0).max())
