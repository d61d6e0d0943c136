"""The backward's block partials (the C entry point's dweight_blocks/dbias_blocks):
row ranges that start on block boundaries, each run on its own, give partials
whose sum in block order is the whole array's dweight/dbias, bit for bit. This
is what makes the Dask backward exact for any row chunking."""

import numpy as np
import pytest

import cynorm
from cynorm import _checks, _core, _isa
from conftest import PAIRS, make_inputs


def _round_like_cynorm(total, param_dtype):
    """float32 sums -> the param dtype, rounded as cynorm rounds (RNE; bf16 flushes subnormals)."""
    if param_dtype.itemsize != 2:
        return total.astype(param_dtype)
    out = np.empty(total.shape, np.uint16)
    (_isa.kernels.f32_to_bf16 if param_dtype.name == "bfloat16" else _isa.kernels.f32_to_f16)(total, out)
    return out.view(param_dtype)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("shape", [(1000, 300), (777, 2100), (130, 33000), (3000, 24)])
def test_block_partials_reduce_to_the_whole_arrays_grads(pair, norm, shape, rng):
    x, dy, w, b = make_inputs(rng, shape, 1, pair)
    M, N = shape
    center = norm == "layer"
    if center:
        _, mean, rstd = cynorm.layer_norm_forward(x, w, b)
        dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w, num_threads=2)
    else:
        _, rstd = cynorm.rms_norm_forward(x, w)
        mean, db = None, None
        dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w, num_threads=2)
    p = _checks.pair(x.dtype, w.dtype)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    B = _core.block_rows(M, N, np.dtype(acc).itemsize)
    bounds = [0]
    while bounds[-1] < M:
        bounds.append(min(M, bounds[-1] + B * int(rng.integers(1, 4))))
    parts_w, parts_b, dxs = [], [], []
    for r0, r1 in zip(bounds, bounds[1:]):
        nb = -(-(r1 - r0) // B)
        pw = np.empty((nb, N), acc)
        pb = np.empty((nb, N), acc) if center else None
        dxc = np.empty((r1 - r0, N), x.dtype)
        _core.backward(p.code, center, dy[r0:r1], x[r0:r1], None if mean is None else mean[r0:r1], rstd[r0:r1], w,
                       dxc, None, None, r1 - r0, N, int(rng.integers(1, 4)), False, B, pw, pb)
        parts_w.append(pw)
        parts_b.append(pb)
        dxs.append(dxc)
    assert np.array_equal(np.concatenate(dxs).view(np.uint8), dx.view(np.uint8))
    for parts, want in ((parts_w, dw), (parts_b, db)):
        if want is None:
            continue
        blocks = np.concatenate(parts)
        assert len(blocks) == -(-M // B)
        total = blocks[0].copy()
        for row in blocks[1:]:
            total += row
        assert np.array_equal(_round_like_cynorm(total, p.grad).view(np.uint8), want.view(np.uint8))
