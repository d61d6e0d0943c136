"""No memory growth over many calls; 64-bit indexing on arrays past 2**31 elements."""

import gc
import os

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc (Linux)")


@linux_only
def test_no_memory_growth_over_10000_calls():
    rng = np.random.default_rng(0)
    cases = []
    for shape, xd, pd in [((64, 300), np.float32, np.float32), ((8, 4100), bfloat16, bfloat16),
                          ((3, 9000), bfloat16, np.float32), ((40, 56), np.float16, np.float32)]:
        x = rng.standard_normal(shape).astype(xd)
        cases.append((x, np.ones(shape[-1], pd), np.zeros(shape[-1], pd)))

    def one_round(i):
        x, w, b = cases[i % len(cases)]
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b, num_threads=1 + i % 2)
        cynorm.layer_norm_backward(x, x, mean, rstd, w, num_threads=1 + i % 2)
        yr, r = cynorm.rms_norm_forward(x, w)
        cynorm.rms_norm_backward(x, x, r, w)
        for bad in (lambda: cynorm.layer_norm(x, w.astype(np.float64)),
                    lambda: cynorm.layer_norm(x, axis=5),
                    lambda: cynorm.layer_norm_backward(x, x, mean[:1], rstd, w)):
            try:
                bad()
            except (TypeError, ValueError):
                pass
            else:
                raise AssertionError("bad input accepted")

    for i in range(500):          # warm up allocator caches
        one_round(i)
    gc.collect()
    before = _rss_bytes()
    for i in range(10_000):
        one_round(i)
    gc.collect()
    growth = _rss_bytes() - before
    assert growth < 4 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 10,000 rounds"


@pytest.mark.slow
@linux_only
def test_more_than_2_31_elements():
    """bf16 (2, 2**30 + 2**19): rows longer than 2**30, 2**31 + 2**20 elements in all."""
    n = 2**30 + 2**19
    need = 2 * 2 * n * 2 + (1 << 30)   # x and y, plus slack
    if _available_bytes() < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free memory")
    x = np.empty((2, n), dtype=bfloat16)
    period = np.arange(7, dtype=np.float32) - 3.0        # -3..3, exact in bf16
    chunk = 7 * 2**20                                    # fill in pieces: no multi-GB temporaries
    tiles = [np.tile(period, chunk // 7).astype(bfloat16), np.tile(period * 2 + 1, chunk // 7).astype(bfloat16)]
    for r in range(2):
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            x[r, start:stop] = tiles[r][: stop - start]
    # exact stats of each row from the pattern's counts
    counts = np.bincount(np.arange(n) % 7, minlength=7).astype(np.float64)
    vals = period.astype(np.float64)
    mean0 = float((counts * vals).sum() / n)
    var0 = float((counts * (vals - mean0) ** 2).sum() / n)
    for threads in (1, 2):
        y, mean, rstd = cynorm.layer_norm_forward(x, num_threads=threads)
        np.testing.assert_allclose(mean[:, 0], [mean0, 2 * mean0 + 1], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(rstd[:, 0], [1 / np.sqrt(var0 + 1e-5), 1 / np.sqrt(4 * var0 + 1e-5)], rtol=1e-5)
        # the far end of each row, and the first elements
        for r, (a, c) in enumerate([(1.0, 0.0), (2.0, 1.0)]):
            for j in (0, 1, n - 1, n - 2, n - 7):
                want = (a * vals[j % 7] + c - (a * mean0 + c)) / np.sqrt(a * a * var0 + 1e-5)
                got = float(y[r, j])
                assert abs(got - want) <= 2 ** -7 * abs(want) + 1e-6, (r, j, got, want)
        del y
    # backward in place (dx into x) with dy = x: analytic at the far end
    y, mean, rstd = cynorm.layer_norm_forward(x, num_threads=2)
    del y
    xs = [float(x[0, j]) for j in (0, n - 1)]
    dx = cynorm.layer_norm_backward(x, x, mean, rstd, num_threads=2, out=x)[0]
    assert dx is x
    r0 = float(rstd[0, 0])
    xh = [(v - mean0) * r0 for v in xs]
    c1 = mean0                                   # mean(g) with g = x
    c2 = float((counts * vals * ((vals - mean0) * r0)).sum() / n)  # mean(g * xhat)
    for (j, v, h) in zip((0, n - 1), xs, xh):
        want = r0 * (v - c1 - h * c2)
        assert abs(float(dx[0, j]) - want) <= 2 ** -7 * abs(want) + 1e-5, (j, float(dx[0, j]), want)
