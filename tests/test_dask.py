"""cynorm.dask: the lazy forward and the exact backward, against one cynorm call on
the whole array (bit for bit, any chunking), on the threaded scheduler and on a
distributed LocalCluster of worker processes, one of them killed mid-backward."""

import os
import signal
import time
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="the dask extra is not installed (pip install 'cynorm[dask]')")
distributed = pytest.importorskip("distributed", reason="the dask extra is not installed (pip install 'cynorm[dask]')")
import dask  # noqa: E402
from dask.array.core import PerformanceWarning  # noqa: E402

import cynorm  # noqa: E402
import cynorm.dask as cnd  # noqa: E402
from conftest import F64, PAIRS, make_inputs  # noqa: E402


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def whole_array(norm, dy, x, w, b, axis):
    """One NumPy cynorm call: the forward's and the backward's outputs."""
    if norm == "layer":
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis)
        return (y, mean, rstd), cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
    y, rstd = cynorm.rms_norm_forward(x, w, axis=axis)
    return (y, rstd), cynorm.rms_norm_backward(dy, x, rstd, w, axis=axis)


def lazy(norm, DY, X, w, b, axis):
    if norm == "layer":
        fwd = cnd.layer_norm_forward(X, w, b, axis=axis)
        return fwd, cnd.layer_norm_backward(DY, X, fwd[1], fwd[2], w, axis=axis)
    fwd = cnd.rms_norm_forward(X, w, axis=axis)
    return fwd, cnd.rms_norm_backward(DY, X, fwd[1], w, axis=axis)


def random_chunks(rng, n):
    bounds = sorted({0, n, *rng.integers(1, n, size=int(rng.integers(0, 6))).tolist()})
    return tuple(int(b - a) for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_any_row_chunking_gives_the_whole_arrays_bits(pair, norm, rng):
    x, dy, w, b = make_inputs(rng, (2500, 300), -1, pair)
    want_fwd, want_bwd = whole_array(norm, dy, x, w, b, -1)
    for _ in range(4):
        rows = random_chunks(rng, 2500)
        X, DY = da.from_array(x, chunks=(rows, 300)), da.from_array(dy, chunks=(rows, 300))
        fwd, bwd = lazy(norm, DY, X, w, b, -1)
        assert all(isinstance(a, da.Array) for a in fwd + bwd)
        assert fwd[0].dtype == x.dtype and fwd[0].chunks == X.chunks and bwd[0].chunks == X.chunks
        assert fwd[-1].chunks == (rows, (1,))
        got_fwd = dask.compute(*fwd, scheduler="threads")
        got_bwd = dask.compute(*bwd, scheduler="threads")
        for got, want in zip(got_fwd + got_bwd, want_fwd + tuple(want_bwd)):
            assert same(got, want), rows


def test_meta_dtypes_and_chunks_without_computing():
    x = da.zeros((10, 4, 6), chunks=(3, 4, 6), dtype=np.float16)
    y, mean, rstd = cnd.layer_norm_forward(x, np.ones((4, 6), np.float32), axis=1)
    assert (y.dtype, mean.dtype, rstd.dtype) == (np.float16, np.float32, np.float32)
    assert type(y._meta) is np.ndarray and y._meta.dtype == np.float16 and mean._meta.dtype == np.float32
    assert y.chunks == x.chunks and mean.chunks == ((3, 3, 3, 1), (1,), (1,))
    dx, dw, db = cnd.layer_norm_backward(x, x, mean, rstd, np.ones((4, 6), np.float32), axis=1)
    assert (dx.dtype, dw.dtype, db.dtype) == (np.float16, np.float32, np.float32)
    assert dw.shape == (4, 6) and dw._meta.dtype == np.float32 and dx.chunks == x.chunks


@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[2]])
def test_leading_axes_chunked_and_normalized_axes_split(pair, rng):
    x, dy, w, b = make_inputs(rng, (6, 50, 8, 16), 2, pair)
    want_fwd, want_bwd = whole_array("layer", dy, x, w, b, 2)
    X = da.from_array(x, chunks=(4, 7, 8, 16))
    DY = da.from_array(dy, chunks=(1, 50, 3, 16))   # split along a normalized axis
    with pytest.warns(PerformanceWarning, match=r"rechunk\(\{2: -1\}\)"):
        fwd, bwd = lazy("layer", DY, X, w, b, 2)
    assert bwd[0].chunks == X.chunks
    for got, want in zip(dask.compute(*fwd, scheduler="sync") + dask.compute(*bwd, scheduler="sync"),
                         want_fwd + tuple(want_bwd)):
        assert same(got, want)


def test_block_rows_chunks_need_no_rechunk(rng):
    x, dy, w, b = make_inputs(rng, (4000, 64), -1, PAIRS[0].values[0])
    B = cnd.block_rows(x.shape, -1, x.dtype)
    X = da.from_array(x, chunks=(3 * B, 64))
    _, mean, rstd = cnd.layer_norm_forward(X, w, b)
    dx, dw, db = cnd.layer_norm_backward(X, X, mean, rstd, w)
    layers = dict(dw.dask.layers)
    assert not any(name.startswith("rechunk") for name in layers)
    _, mean0, rstd0 = cynorm.layer_norm_forward(x, w, b)
    assert same(dw.compute(), cynorm.layer_norm_backward(x, x, mean0, rstd0, w)[1])


def test_stays_close_to_float64(rng):
    x, dy, w, b = make_inputs(rng, (3000, 512), -1, PAIRS[0].values[0])
    X, DY = da.from_array(x, chunks=(700, 512)), da.from_array(dy, chunks=(700, 512))
    _, mean, rstd = cnd.layer_norm_forward(X, w, b)
    dw = cnd.layer_norm_backward(DY, X, mean, rstd, w)[1].compute()
    x64 = x.astype(F64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    dw64 = (dy.astype(F64) * xhat).sum(0)
    assert np.max(np.abs(dw - dw64)) <= 1e-5 * np.max(np.abs(dw64))


@pytest.mark.parametrize("call, exc, match", [
    (lambda X, w: cnd.layer_norm(X, w[:-1]), ValueError, "weight must have shape"),
    (lambda X, w: cnd.layer_norm(X.astype(np.int32), None), TypeError, "supported input dtypes"),
    (lambda X, w: cnd.layer_norm(X, w.astype(np.float16)), TypeError, "unsupported dtypes"),
    (lambda X, w: cnd.rms_norm(X[X[:, 0] > 0], w), ValueError, "compute_chunk_sizes"),
    (lambda X, w: cnd.layer_norm(X, w, eps=-1.0), ValueError, "eps"),
    (lambda X, w: cnd.layer_norm(X, w, num_threads=0), ValueError, "num_threads"),
    (lambda X, w: cnd.layer_norm_backward(X[:, :4], X, X[:, :1], X[:, :1], w), ValueError, "dy must have the shape"),
    (lambda X, w: cnd.layer_norm_backward(X, X, X[:, :1], X[:, :1].astype(np.float64), w), TypeError,
     "rstd must have dtype float32"),
    (lambda X, w: cnd.rms_norm_backward(X, X, X[:2, :1], w), ValueError, "rstd must have shape"),
])
def test_bad_input_is_refused_with_a_message(call, exc, match):
    X = da.ones((20, 8), chunks=(5, 8), dtype=np.float32)
    with pytest.raises(exc, match=match):
        call(X, np.ones(8, np.float32))


# ---------------------------------------------------------- distributed --

@pytest.fixture(scope="module")
def cluster():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # port-in-use notes from the dashboard
        with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                                      memory_limit="2GiB", silence_logs=40) as c, distributed.Client(c) as client:
            yield c, client


def test_on_a_local_cluster_of_worker_processes(cluster, rng):
    c, client = cluster
    assert len(client.scheduler_info()["workers"]) == 2
    x, dy, w, b = make_inputs(rng, (6000, 200), -1, PAIRS[3].values[0])
    want_fwd, want_bwd = whole_array("layer", dy, x, w, b, -1)
    X, DY = da.from_array(x, chunks=(900, 200)), da.from_array(dy, chunks=(900, 200))
    fwd, bwd = lazy("layer", DY, X, w, b, -1)
    with distributed.get_task_stream(client) as stream:
        got = client.compute(list(fwd) + list(bwd), sync=True)
    for g, want in zip(got, want_fwd + tuple(want_bwd)):
        assert same(g, want)
    ran = {t["worker"] for t in stream.data if t["key"][0].startswith("cynorm-layer_norm-backward")}
    assert len(ran) == 2   # the backward ran on both processes


def _threads_while_running(n_running):
    """cynorm.dask's thread count for a task, once n_running tasks run on this worker."""
    state = distributed.get_worker().state
    deadline = time.monotonic() + 20
    while len(state.executing) < n_running and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = cnd._task_threads(None), cnd._task_threads(1), len(state.executing)
    time.sleep(1.0)   # stay running while the other task (polling every 10 ms) looks
    return seen


def test_tasks_share_the_workers_threads(cluster):
    c, client = cluster
    addr = sorted(client.scheduler_info()["workers"])[0]
    assert client.submit(_threads_while_running, 1, workers=[addr], pure=False).result() == (2, 1, 1)
    pair = [client.submit(_threads_while_running, 2, workers=[addr], pure=False, key=f"t{k}") for k in range(2)]
    assert [f.result() for f in pair] == [(1, 1, 2), (1, 1, 2)]


def _slow_copy(block):
    time.sleep(0.15)
    return block.copy()


def test_a_worker_killed_mid_backward_changes_no_bit(cluster, rng):
    c, client = cluster
    x, dy, w, b = make_inputs(rng, (6000, 128), -1, PAIRS[0].values[0])
    _, want = whole_array("layer", dy, x, w, b, -1)
    X = da.from_array(x, chunks=(400, 128))
    DY = da.from_array(dy, chunks=(400, 128)).map_blocks(_slow_copy, dtype=dy.dtype)   # time to kill in
    _, mean, rstd = cnd.layer_norm_forward(X, w, b)
    dx, dw, db = cnd.layer_norm_backward(DY, X, mean, rstd, w)
    futures = client.compute([dx, dw, db])
    scheduler = c.scheduler
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # until some backward partials are held by workers
        held = [ts for key, ts in scheduler.tasks.items() 
                if key[0].startswith("cynorm-layer_norm-backward") and ts.state == "memory"]
        if held:
            break
        time.sleep(0.01)
    assert held and not futures[1].done()
    victim = next(iter(held[0].who_has)).address
    before = set(client.scheduler_info()["workers"])
    nanny = next(n for n in c.workers.values() if n.worker_address == victim)
    os.kill(nanny.process.process.pid, signal.SIGKILL)   # the worker process dies; its nanny starts another
    got = client.gather(futures)
    deadline = time.monotonic() + 30
    while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert victim in before and victim not in client.scheduler_info()["workers"]   # it did die
    for g, want_k in zip(got, want):
        assert same(g, want_k)


def _level():
    from cynorm._config import config
    return config()["isa"]


def test_a_cluster_of_mixed_cpu_levels_gives_one_calls_bits(rng):
    """Workers at the lowest and the highest ISA level this CPU runs (CYNORM_ISA), as
    on a cluster of mixed machines: the backward's dweight is still one call's."""
    from cynorm import _isa
    levels = _isa.available_levels()
    if len(levels) < 2:
        pytest.skip("this CPU runs only the baseline level: no second level to mix in")
    pick = (levels[0], levels[-1])
    workers = {lv: {"cls": distributed.Nanny, "options": {"nthreads": 1, "memory_limit": "1GiB",
                                                         "env": {"CYNORM_ISA": lv}}} for lv in pick}
    x, dy, w, b = make_inputs(rng, (4000, 300), -1, PAIRS[2].values[0])
    _, want = whole_array("layer", dy, x, w, b, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with distributed.SpecCluster(workers=workers, scheduler={"cls": distributed.Scheduler,
                                                                 "options": {"dashboard_address": None}},
                                     silence_logs=40) as c, distributed.Client(c) as client:
            client.wait_for_workers(2)
            assert sorted(client.run(_level).values()) == sorted(pick)
            X, DY = da.from_array(x, chunks=(250, 300)), da.from_array(dy, chunks=(250, 300))
            _, mean, rstd = cnd.layer_norm_forward(X, w, b)
            with distributed.get_task_stream(client) as stream:
                got = client.compute(list(cnd.layer_norm_backward(DY, X, mean, rstd, w)), sync=True)
    ran = {t["worker"] for t in stream.data if t["key"][0].startswith("cynorm-layer_norm-backward")}
    assert len(ran) == 2   # both levels computed blocks
    for g, want_k in zip(got, want):
        assert same(g, want_k)


# ------------------------------------------------- fused residual add + norm --

def fused_run(mod, norm, x, r, dy, dh, w, b, h_dtype):
    """The fused forward and backward through `mod` (cynorm on arrays, cynorm.dask lazily)."""
    if norm == "layer":
        fwd = mod.add_layer_norm_forward(x, r, w, b, residual_dtype=h_dtype)
        return fwd, mod.add_layer_norm_backward(dy, fwd[1], fwd[2], fwd[3], w, dh=dh)
    fwd = mod.add_rms_norm_forward(x, r, w, residual_dtype=h_dtype)
    return fwd, mod.add_rms_norm_backward(dy, fwd[1], fwd[2], w, dh=dh)


def fused_whole(*args):
    return fused_run(cynorm, *args)


def fused_lazy(*args):
    return fused_run(cnd, *args)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("case", [(np.float32, None), ("bfloat16", None), ("bfloat16", np.float32)],
                         ids=["f32", "bf16", "bf16-stream32"])
def test_fused_any_row_chunking_gives_the_whole_arrays_bits(case, norm, rng):
    xd, h_dtype = case
    pair = (np.dtype(xd), np.dtype(np.float32))
    x, dy, w, b = make_inputs(rng, (2100, 200), -1, pair)
    hd = np.dtype(h_dtype or xd)
    r = rng.standard_normal(x.shape).astype(hd)
    dh = rng.standard_normal(x.shape).astype(hd)
    want_fwd, want_bwd = fused_whole(norm, x, r, dy, dh, w, b, h_dtype)
    for _ in range(3):
        rows = random_chunks(rng, 2100)
        X, R = da.from_array(x, chunks=(rows, 200)), da.from_array(r, chunks=(random_chunks(rng, 2100), 200))
        DY, DH = da.from_array(dy, chunks=(rows, 200)), da.from_array(dh, chunks=(rows, 200))
        fwd, bwd = fused_lazy(norm, X, R, DY, DH, w, b, h_dtype)
        assert fwd[1].dtype == hd and bwd[0].dtype == hd and fwd[0].dtype == x.dtype
        got = dask.compute(*fwd, *[a for a in bwd if a is not None], scheduler="threads")
        want = list(want_fwd) + [a for a in want_bwd if a is not None]
        assert len(got) == len(want)
        for g, wnt in zip(got, want):
            assert same(g, wnt)


def test_fused_on_a_local_cluster_of_worker_processes(cluster, rng):
    c, client = cluster
    x, dy, w, b = make_inputs(rng, (5000, 200), -1, PAIRS[3].values[0])   # bf16 x, float32 params
    r = rng.standard_normal(x.shape).astype(np.float32)                  # an fp32 residual stream
    dh = rng.standard_normal(x.shape).astype(np.float32)
    want_fwd, want_bwd = fused_whole("layer", x, r, dy, dh, w, b, np.float32)
    X, R = da.from_array(x, chunks=(700, 200)), da.from_array(r, chunks=(700, 200))
    DY, DH = da.from_array(dy, chunks=(700, 200)), da.from_array(dh, chunks=(700, 200))
    fwd, bwd = fused_lazy("layer", X, R, DY, DH, w, b, np.float32)
    with distributed.get_task_stream(client) as stream:
        got = client.compute(list(fwd) + list(bwd), sync=True)
    for g, want in zip(got, want_fwd + tuple(want_bwd)):
        assert same(g, want)
    ran = {t["worker"] for t in stream.data if t["key"][0].startswith("cynorm-add_layer_norm-backward")}
    assert len(ran) == 2   # the fused backward ran on both processes


# ------------------------------------------------------------- GroupNorm --

def _group_inputs(rng, shape, pair):
    xd, pd = pair
    C = shape[1] if len(shape) else 0
    return ((rng.standard_normal(shape) * 2 + 1).astype(xd), rng.standard_normal(shape).astype(xd),
            (1 + 0.5 * rng.standard_normal(C)).astype(pd), (0.5 * rng.standard_normal(C)).astype(pd))


@pytest.mark.parametrize("channel_axis", [1, -1])
@pytest.mark.parametrize("pair", PAIRS)
def test_group_norm_any_batch_chunking_gives_the_whole_arrays_bits(pair, channel_axis, rng):
    x, dy, w, b = _group_inputs(rng, (37, 12, 5, 6), pair)
    if channel_axis == -1:
        x, dy = np.ascontiguousarray(np.moveaxis(x, 1, -1)), np.ascontiguousarray(np.moveaxis(dy, 1, -1))
    y, mean, rstd = cynorm.group_norm_forward(x, 4, w, b, channel_axis=channel_axis)
    want = (y, mean, rstd) + cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=4, channel_axis=channel_axis)
    for _ in range(3):
        batch = random_chunks(rng, 37)
        X = da.from_array(x, chunks=(batch,) + x.shape[1:])
        DY = da.from_array(dy, chunks=(batch,) + x.shape[1:])
        fwd = cnd.group_norm_forward(X, 4, w, b, channel_axis=channel_axis)
        bwd = cnd.group_norm_backward(DY, X, fwd[1], fwd[2], w, num_groups=4, channel_axis=channel_axis)
        assert all(isinstance(a, da.Array) for a in fwd + bwd) and fwd[0].chunks == X.chunks
        got = dask.compute(*fwd, *bwd, scheduler="threads")
        for g, e, name in zip(got, want, ("y", "mean", "rstd", "dx", "dweight", "dbias")):
            assert same(g, e), (name, batch)


def test_group_norm_split_channels_are_rechunked_with_a_warning(rng):
    x, dy, w, b = _group_inputs(rng, (6, 8, 4), (np.dtype(np.float32),) * 2)
    X = da.from_array(x, chunks=(3, 4, 2))
    with pytest.warns(PerformanceWarning, match="rechunking"):
        y = cnd.group_norm(X, 2, w, b)
    assert same(y.compute(scheduler="threads"), cynorm.group_norm(x, 2, w, b))
    with pytest.raises(ValueError, match="must divide"):
        cnd.group_norm(X, 3, w, b)
    with pytest.warns(PerformanceWarning, match="rechunking"):
        got = cnd.group_norm_backward(X, X, np.zeros((6, 2), np.float32), np.ones((6, 2), np.float32), None,
                                      num_groups=2)
    assert got[1:] == (None, None)


def test_group_norm_on_a_local_cluster_of_worker_processes(cluster, rng):
    c, client = cluster
    x, dy, w, b = _group_inputs(rng, (40, 320, 8, 8), PAIRS[3].values[0])   # bf16 x, float32 params
    x, dy = np.ascontiguousarray(np.moveaxis(x, 1, -1)), np.ascontiguousarray(np.moveaxis(dy, 1, -1))  # NHWC
    y, mean, rstd = cynorm.group_norm_forward(x, 32, w, b, channel_axis=-1)
    want = (y, mean, rstd) + cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=32, channel_axis=-1)
    X = da.from_array(x, chunks=(7,) + x.shape[1:])
    DY = da.from_array(dy, chunks=(7,) + x.shape[1:])
    fwd = cnd.group_norm_forward(X, 32, w, b, channel_axis=-1)
    bwd = cnd.group_norm_backward(DY, X, fwd[1], fwd[2], w, num_groups=32, channel_axis=-1)
    with distributed.get_task_stream(client) as stream:
        got = client.compute(list(fwd) + list(bwd), sync=True)
    for g, e in zip(got, want):
        assert same(g, e)
    ran = {t["worker"] for t in stream.data if "_group_backward_task" in str(t["key"])}
    assert len(ran) == 2   # the backward ran on both processes
