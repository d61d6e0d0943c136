"""No memory growth over many calls; huge-page outputs; 64-bit indexing past 2**31 elements."""

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm
from cynorm import _alloc, _api

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name


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


# ------------------------------------------------------ huge-page outputs --

HUGE = 2 << 20
huge_pages = pytest.mark.skipif(not _alloc.enabled, reason="huge-page outputs are Linux only (or CYNORM_HUGEPAGES=0)")


def _all_outputs(x, w, b, threads=1):
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b, num_threads=threads)
    dx, dw, db = cynorm.layer_norm_backward(x, x, mean, rstd, w, num_threads=threads)
    yr, r = cynorm.rms_norm_forward(x, w, num_threads=threads)
    dxr, dwr = cynorm.rms_norm_backward(x, x, r, w, num_threads=threads)
    return {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dweight": dw, "dbias": db,
            "rms_y": yr, "rms_rstd": r, "rms_dx": dxr, "rms_dweight": dwr}


@huge_pages
@pytest.mark.parametrize("xd, pd", [(np.float32, np.float32), (bfloat16, np.float32)])
def test_large_outputs_own_2mib_aligned_memory(xd, pd):
    """Outputs of >= 1 MiB: own their data, on a 2 MiB boundary, through cynorm's
    NumPy allocator; smaller ones come from NumPy's default allocator."""
    rng = np.random.default_rng(1)
    for shape, big in [((300_000, 4), {"y", "mean", "rstd", "dx", "rms_y", "rms_rstd", "rms_dx"}),
                       ((2, 300_000), {"y", "dx", "dweight", "dbias", "rms_y", "rms_dx", "rms_dweight"}),
                       ((64, 100), set())]:
        x = rng.standard_normal(shape).astype(xd)
        n = shape[-1]
        outs = _all_outputs(x, rng.standard_normal(n).astype(pd), rng.standard_normal(n).astype(pd))
        for name, a in outs.items():
            want_huge = name in big and a.nbytes >= _alloc.MIN_BYTES
            assert a.flags.owndata and a.flags.writeable and a.flags.c_contiguous, name
            assert (get_handler_name(a) == "cynorm_hugepages") == want_huge, (shape, name, get_handler_name(a))
            if want_huge:
                assert a.ctypes.data % HUGE == 0, (shape, name, hex(a.ctypes.data))


@huge_pages
def test_huge_page_outputs_are_bit_identical(monkeypatch):
    """Where an output lives never changes a bit (aligned or not, streamed or not)."""
    rng = np.random.default_rng(2)
    for shape, xd in [((4100, 300), np.float32), ((3, 700_001), bfloat16), ((90_001, 56), np.float16)]:
        x = rng.standard_normal(shape).astype(xd)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        b = rng.standard_normal(shape[-1]).astype(np.float32)
        monkeypatch.setattr(_api, "_HUGE_MIN", float("inf"))
        plain = _all_outputs(x, w, b, threads=2)
        monkeypatch.setattr(_api, "_HUGE_MIN", 0)            # every output on huge pages
        monkeypatch.setattr(_api, "_HUGE_GATE", 0)
        huge = _all_outputs(x, w, b, threads=2)
        for name in plain:
            assert get_handler_name(huge[name]) == "cynorm_hugepages"
            assert get_handler_name(plain[name]) != "cynorm_hugepages"
            np.testing.assert_array_equal(huge[name].view(np.uint8), plain[name].view(np.uint8), err_msg=name)


@huge_pages
def test_huge_page_arrays_resize_copy_and_free():
    """resize (the allocator's realloc) keeps the data; copies and pickles are plain
    arrays; dropping the arrays does not grow memory (recycled, or given back)."""
    import pickle

    x = np.random.default_rng(3).standard_normal((4096, 256)).astype(np.float32)
    y = cynorm.layer_norm(x)
    keep = y.copy()
    y.resize((8192, 256), refcheck=False)                    # grow: new mapping, data copied
    np.testing.assert_array_equal(y[:4096], keep)
    assert not y[4096:].any()                                 # NumPy zero-fills the growth
    y.resize((10, 256), refcheck=False)                      # shrink
    np.testing.assert_array_equal(y, keep[:10])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(keep)), keep)
    assert get_handler_name(keep) == "default_allocator"
    del y
    gc.collect()
    before = _rss_bytes()
    for _ in range(200):                                      # 200 x 4 MiB y + stats
        y, mean, rstd = cynorm.layer_norm_forward(x)
        del y, mean, rstd
    gc.collect()
    growth = _rss_bytes() - before
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 200 large calls"


@huge_pages
def test_freed_outputs_are_recycled_and_fully_overwritten():
    """A freed huge-page output is reused by the next one of its size (same
    address, pages already in), every byte of it is rewritten (garbage left in
    it never shows), and a limit of 0 or release_recycled gives it back."""
    rng = np.random.default_rng(4)
    limit = _alloc.recycle_limit()
    try:
        _alloc.set_recycle_limit(64 << 20)
        for xd, pd in [(np.float32, np.float32), (bfloat16, bfloat16), (np.float16, np.float32)]:
            x = rng.standard_normal((300, 4100)).astype(xd)
            w = rng.standard_normal(4100).astype(pd)
            want = {k: v.copy() for k, v in _all_outputs(x, w, w, threads=2).items()}
            y = cynorm.layer_norm(x, w, w)
            addr = y.ctypes.data
            y.view(np.uint8)[:] = 0xFF                      # NaN garbage for the next user
            del y
            assert _alloc.recycled_bytes() >= x.nbytes
            got = _all_outputs(x, w, w, threads=2)          # its y takes the kept mapping
            assert got["y"].ctypes.data == addr
            for name in want:
                np.testing.assert_array_equal(got[name].view(np.uint8), want[name].view(np.uint8), err_msg=name)
            del got
        assert cynorm.release_recycled() > 0 and _alloc.recycled_bytes() == 0
        assert _alloc.recycle_limit() == 64 << 20          # releasing keeps the limit
        _alloc.set_recycle_limit(0)
        y = cynorm.layer_norm(x)
        del y
        assert _alloc.recycled_bytes() == 0 and not _alloc.last_recycled()
        y = cynorm.layer_norm(x)
        assert not _alloc.last_recycled()
        with pytest.raises(ValueError, match=">= 0"):
            _alloc.set_recycle_limit(-1)
    finally:
        _alloc.set_recycle_limit(limit)


def _mapping_of(addr):
    """(start, end) of the /proc/self/maps line holding addr."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= addr < hi:
                return lo, hi
    return None


@huge_pages
@pytest.mark.parametrize("page", [16384, 65536])
def test_outputs_on_larger_pages(page):
    """On 16 KiB and 64 KiB kernels (faked here on top of the OS's pages) the
    header before an output is one such page: it stays mapped (the part the
    alignment skipped is given back in whole pages), the output is written and
    read whole, recycled, and given back; mappings made before keep their own
    header. On a real 64 KiB kernel the aarch64 CI job runs the same calls."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2048, 300)).astype(np.float32)        # 2.3 MiB outputs
    limit = _alloc.recycle_limit()
    before = cynorm.layer_norm(x)                                   # made with the OS's page
    os_page = os.sysconf("SC_PAGE_SIZE")
    assert _alloc._header_bytes(before) == os_page
    page = max(page, os_page)               # (on a 64 KiB kernel: 64 KiB, the real thing)
    try:
        _alloc.set_recycle_limit(64 << 20)
        _alloc._fake_page_size(page)
        y = cynorm.layer_norm(x)
        addr = y.ctypes.data
        assert get_handler_name(y) == "cynorm_hugepages" and addr % HUGE == 0
        assert _alloc._header_bytes(y) == page
        lo, hi = _mapping_of(addr - page)                           # the header is mapped ...
        assert lo <= addr - page and (addr - page) % page == 0       # ... from a page boundary
        np.testing.assert_array_equal(y, before)
        y[...] = 7                                                  # every byte writable
        assert float(y.sum(dtype=np.float64)) == 7 * y.size
        del y
        z = cynorm.layer_norm(x)                                    # recycled: same mapping
        assert z.ctypes.data == addr and _alloc.last_recycled()
        np.testing.assert_array_equal(z, before)
        _alloc._fake_page_size(0)
        w = cynorm.layer_norm(x)                                    # a new one: the OS's page
        assert _alloc._header_bytes(w) == os_page and _alloc._header_bytes(z) == page
        del z, w, before
        assert _alloc.release_recycled() > 0 and _alloc.recycled_bytes() == 0
        assert _mapping_of(addr) is None or _mapping_of(addr)[1] <= addr   # given back
    finally:
        _alloc._fake_page_size(0)
        _alloc.set_recycle_limit(limit)
    for bad in (os_page // 2, 3 * os_page, 4 << 20):
        with pytest.raises(ValueError, match="power of two from the OS's page"):
            _alloc._fake_page_size(bad)


@linux_only
def test_recycle_env():
    """CYNORM_RECYCLE_MB sets the limit; a bad value is refused at import with a clear message."""
    code = "import cynorm._alloc as a; print(a.recycle_limit())"
    for flag, want in (("0", "0"), ("1.5", str(3 << 19))):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, CYNORM_RECYCLE_MB=flag), timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == (want if _alloc.enabled else "0"), (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, CYNORM_RECYCLE_MB="lots"), timeout=120)
    assert r.returncode != 0 and "CYNORM_RECYCLE_MB must be a number of MiB" in r.stderr


@linux_only
def test_hugepages_env_off():
    """CYNORM_HUGEPAGES=0: every output from NumPy's default allocator, and show_config says so."""
    code = textwrap.dedent("""
        import numpy as np, cynorm
        try:
            from numpy._core.multiarray import get_handler_name
        except ImportError:
            from numpy.core.multiarray import get_handler_name
        y, mean, rstd = cynorm.layer_norm_forward(np.ones((300_000, 8), np.float32))
        print(get_handler_name(y), get_handler_name(rstd), cynorm.show_config()["hugepage_outputs"])
    """)
    for flag, want in (("0", "default_allocator default_allocator False"),
                       ("1", "cynorm_hugepages cynorm_hugepages True")):
        env = dict(os.environ, CYNORM_HUGEPAGES=flag)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[-2].strip() == want, r.stdout


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
