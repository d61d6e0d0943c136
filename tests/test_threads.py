"""Threads: the default follows OpenMP controls, per-call caps, safety, GIL release."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import cynorm
from cynorm import _isa


def _python(code, **env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=120)


needs_openmp = pytest.mark.skipif(not _isa.kernels.openmp(), reason="serial build (no OpenMP)")


@needs_openmp
def test_threadpoolctl_sees_the_openmp_runtime():
    info = [i for i in threadpool_info() if i["user_api"] == "openmp"]
    assert info, "threadpoolctl lists no OpenMP runtime"
    assert any("gomp" in i["filepath"] or "omp" in i["internal_api"] for i in info)


@needs_openmp
@pytest.mark.parametrize("limit", [1, 2, 3])
def test_threadpool_limits_reach_cynorm(limit):
    before = cynorm.get_num_threads()
    with threadpool_limits(limits=limit, user_api="openmp"):
        assert cynorm.get_num_threads() == limit
        assert _isa.kernels.omp_probe(1000) == limit     # a real prange sees the limit
    assert cynorm.get_num_threads() == before


@needs_openmp
@pytest.mark.parametrize("n", ["1", "3"])
def test_omp_num_threads_is_honoured(n):
    r = _python("import cynorm; print(cynorm.get_num_threads(), cynorm._isa.kernels.omp_probe(1000))",
                OMP_NUM_THREADS=n)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [n, n]


def test_per_call_cap_changes_no_global_state(rng):
    before = cynorm.get_num_threads()
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    cynorm.layer_norm(x, num_threads=1)
    cynorm.layer_norm(x, num_threads=3)
    assert cynorm.get_num_threads() == before


@needs_openmp
def test_thread_policy():
    k = _isa.kernels
    assert k.threads_for(8 * 8 * 16, 2) == 1           # tiny input: the calling thread only
    assert k.threads_for(1 << 24, 2) == 2
    assert k.threads_for(1 << 24, 1) == 1
    procs = os.cpu_count()
    assert k.threads_for(1 << 24, 2, 8) == max(1, min(2, procs // 8))   # 8 calls in flight share the cores
    assert k.threads_for(1 << 24, 4 * procs) == procs                   # no more threads than cores
    old = k.set_oversubscribe(True)
    try:
        assert k.threads_for(1 << 24, 4 * procs) == 4 * procs            # unless allowed
    finally:
        k.set_oversubscribe(old)


def test_concurrent_calls_are_correct(rng):
    """Many Python threads at once, each checked against a serial run."""
    inputs = [rng.standard_normal((int(rng.integers(50, 400)), 1000)).astype(np.float32) for _ in range(16)]
    w = rng.standard_normal(1000).astype(np.float32)
    expected = []
    for x in inputs:
        y, m, r = cynorm.layer_norm_forward(x, w, None, num_threads=1)
        expected.append((y, cynorm.layer_norm_backward(x, x, m, r, w, num_threads=1)))
    results = [None] * len(inputs)

    def work(i):
        for _ in range(3):
            y, m, r = cynorm.layer_norm_forward(inputs[i], w, None, num_threads=2)
            results[i] = (y, cynorm.layer_norm_backward(inputs[i], inputs[i], m, r, w, num_threads=2))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (y, g), (ye, ge) in zip(results, expected):
        assert np.array_equal(y, ye)
        for a, b in zip(g, ge):
            assert np.array_equal(a, b)


def test_gil_is_released_during_a_call():
    x = np.random.default_rng(0).standard_normal((2048, 8192)).astype(np.float32)
    y, mean, rstd = cynorm.layer_norm_forward(x)
    done = threading.Event()
    ticks = 0

    def long_calls():
        for _ in range(5):
            cynorm.layer_norm_backward(x, x, mean, rstd, num_threads=1)
        done.set()

    worker = threading.Thread(target=long_calls)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        t0 = time.perf_counter()
        worker.start()
        while not done.is_set():
            ticks += 1
        elapsed = time.perf_counter() - t0
    finally:
        sys.setswitchinterval(old)
        worker.join()
    # if the kernels held the GIL, this loop would barely run while they work
    assert ticks > 10_000, (ticks, elapsed)


@pytest.mark.parametrize("T", [1, 2, 3, 8])
@pytest.mark.parametrize("lo, hi", [(0, 3 << 20), (1 << 20, (1 << 20) + 3_211_264), (5 << 20, 6 << 20),
                                    (123_456, 123_456 + (41 << 20) + 777), (4 << 20, 4 << 20)])
def test_page_population_shares(T, lo, hi):
    """Threads fault in a fresh output's pages in disjoint shares that cover it
    and meet only on 2 MiB boundaries (no huge page is zeroed twice), with the
    new pages dealt out evenly."""
    page = 2 << 20
    edges = _isa.kernels._share_edges(lo, hi, T)
    assert edges[0] == lo and edges[-1] == hi
    assert all(a <= b for a, b in zip(edges, edges[1:]))
    assert all(e % page == 0 for e in edges[1:-1] if lo < e < hi)
    first = -(-lo // page) * page
    starts = list(range(first, hi, page))           # huge pages that start in the range
    per_thread = [sum(edges[t] <= s < edges[t + 1] for s in starts) for t in range(T)]
    assert sum(per_thread) == len(starts)
    assert max(per_thread) - min(per_thread) <= 1
