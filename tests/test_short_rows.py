"""Short rows (the in-register path) with streamed outputs: each block of rows is
staged in L1 and leaves with non-temporal stores. The bits must be those of
plain stores, in place too, and for rows that need the double-precision
rescue (written by a separate routine) as well."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa
from conftest import same_bits

DTYPES = [(np.float32, np.float32), (np.float64, np.float64), (bfloat16, bfloat16), (bfloat16, np.float32),
          (np.float16, np.float32)]


@pytest.fixture
def streaming():
    """stream_min_bytes = 0: every out= output streams (set back afterwards)."""
    def use(on):
        _isa.kernels._policy("stream_min_bytes", 0 if on else 1 << 60)
    yield use
    _isa.kernels.reset_policy()


def _data(M, N, dt, pdt, specials):
    rng = np.random.default_rng(N)
    x = (rng.standard_normal((M, N)) * 3 + 1).astype(dt)
    dy = rng.standard_normal((M, N)).astype(dt)
    if specials:   # rows the rescue recomputes (huge, tiny variance), and inf/NaN/constant rows
        big = np.finfo(np.dtype(dt)).max if np.dtype(dt).itemsize > 2 else np.float32(1e4 if dt is np.float16 else 1e38)
        x[3] = np.asarray(big, np.float64) * np.linspace(-0.9, 0.9, N)
        x[5] = (1 + 1e-30 * np.arange(N)) if np.dtype(dt).itemsize > 2 else 1
        x[7, 0], x[9, N // 2], x[11] = np.inf, np.nan, 2.5
    w = (1 + 0.1 * rng.standard_normal(N)).astype(pdt)
    b = (0.1 * rng.standard_normal(N)).astype(pdt)
    return x, dy, w, b


def _fwd(norm, x, w, b, out):
    if norm == "layer":
        return cynorm.layer_norm_forward(x, w, b, num_threads=1, out=out)
    return cynorm.rms_norm_forward(x, w, num_threads=1, out=out)


def _bwd(norm, dy, x, stats, w, out):
    if norm == "layer":
        return cynorm.layer_norm_backward(dy, x, stats[0], stats[1], w, num_threads=1, out=out)
    return cynorm.rms_norm_backward(dy, x, stats[0], w, num_threads=1, out=out)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("N", [5, 8, 16, 24, 56, 64])
@pytest.mark.parametrize("dt,pdt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("specials", [False, True], ids=["normal", "specials"])
def test_streamed_short_rows_give_the_plain_bits(streaming, norm, N, dt, pdt, specials):
    M = 83   # five blocks of 16 rows and a partial one
    x, dy, w, b = _data(M, N, dt, pdt, specials)
    keep = [a.copy() for a in (x, dy, w, b)]
    streaming(False)
    plain = _fwd(norm, x, w, b, None)
    plain_b = _bwd(norm, dy, x, plain[1:], w, None)
    streaming(True)
    y = np.empty_like(x)
    assert cynorm.explain(x, w, norm=f"{norm}_norm", num_threads=1, out=y)["stream"]
    assert cynorm.explain(x, w, norm=f"{norm}_norm", num_threads=1, backward=True, out=y)["stream"]
    got = _fwd(norm, x, w, b, (y,) + tuple(np.empty_like(a) for a in plain[1:]))
    for p, g in zip(plain, got):
        assert same_bits(p, g)
    got_b = _bwd(norm, dy, x, plain[1:], w, (np.empty_like(dy),) + tuple(np.empty_like(a) for a in plain_b[1:]))
    for p, g in zip(plain_b, got_b):
        assert same_bits(p, g)
    for a, k in zip((x, dy, w, b), keep):
        assert same_bits(a, k)
    # in place, streamed: y over x, then dx over dy
    xi, dyi = x.copy(), dy.copy()
    got = _fwd(norm, xi, w, b, (xi,) + tuple(np.empty_like(a) for a in plain[1:]))
    assert got[0] is xi and same_bits(xi, plain[0])
    got_b = _bwd(norm, dyi, x, plain[1:], w, (dyi,) + tuple(np.empty_like(a) for a in plain_b[1:]))
    assert got_b[0] is dyi and same_bits(dyi, plain_b[0])
