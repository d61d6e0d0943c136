"""cynorm.explain(): the policy a call would run with, from the same function
the call uses (cn_policy_for), and the same argument checks as the call."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa

KEYS = {"norm", "direction", "isa", "rows", "cols", "x_dtype", "param_dtype", "requested_threads", "threads",
        "path", "group_rows", "stream", "populate", "tunables"}


def test_keys_and_basic_fields():
    x = np.empty((4, 8, 300), bfloat16)
    e = cynorm.explain(x, np.ones(300, np.float32), num_threads=1)
    assert KEYS <= set(e)
    assert (e["rows"], e["cols"], e["x_dtype"], e["param_dtype"]) == (32, 300, "bfloat16", "float32")
    assert e["isa"] == _isa.level and e["direction"] == "forward" and e["threads"] == 1
    assert e["path"] == "medium rows in blocks"
    assert set(e["tunables"]) == set(_isa.kernels.tunables())


def test_paths_follow_row_length():
    small = _isa.kernels.small_row_limit(0)   # float32 rows in registers at this level
    f32 = np.float32
    assert cynorm.explain(np.empty((64, small), f32))["path"] == "small rows in registers"
    assert cynorm.explain(np.empty((64, small + 1), f32))["path"] == "medium rows in blocks"
    assert cynorm.explain(np.empty((64, 5000), f32))["path"] == "rows by chunks"
    assert cynorm.explain(np.empty((64, 40000), f32))["path"] == "long rows in groups"
    assert cynorm.explain(np.empty((64, 16), f32), backward=True)["path"] == "small rows in registers"
    assert cynorm.explain(np.empty((64, 5000), f32), backward=True)["path"] == "rows by chunks"
    # partials of 2 x 33000 x 4 bytes do not stay in cache while a block's rows pass: the team path
    e = cynorm.explain(np.empty((70, 33000), f32), np.ones(33000, f32), backward=True, num_threads=1)
    assert e["path"] == "team: columns split across threads" and e["block_rows"] == 64
    assert e["partials_added_in"] in ("phase C", "phase A, pairs of rows", "phase A, column chunks")


@pytest.mark.parametrize("short_lead", [None, 0, 8 << 10])
@pytest.mark.parametrize("cols", [16, 56, 128, 256, 1024])
@pytest.mark.parametrize("dtype", [np.float32, bfloat16])
def test_forward_blocks_prefetch_whole_blocks_ahead(cols, dtype, short_lead):
    """Short and medium rows prefetch the same row whole blocks ahead: 32-bit
    short rows at least short_prefetch_bytes (this machine's, or set: 0 is the
    next block), medium rows at least 16 KB, 16-bit short rows the next block
    (the policy's lead, policy.c)."""
    old = _isa.kernels._policy("short_prefetch_bytes", short_lead) if short_lead is not None else None
    try:
        lead_32 = _isa.kernels._policy("short_prefetch_bytes")
        e = cynorm.explain(np.empty((1 << 16, cols), dtype), num_threads=1)
    finally:
        if old is not None:
            _isa.kernels._policy("short_prefetch_bytes", old)
    assert e["path"] in ("small rows in registers", "medium rows in blocks")
    ahead, block = e["prefetch_rows_ahead"], e["group_rows"]
    assert ahead % block == 0 and ahead >= block
    row_bytes = cols * np.dtype(dtype).itemsize
    if e["path"] == "medium rows in blocks":
        lead = 16 << 10
    else:
        lead = lead_32 if np.dtype(dtype).itemsize == 4 else 0
    if lead <= block * row_bytes:
        assert ahead == block
    else:
        assert ahead * row_bytes >= lead and (ahead - block) * row_bytes < lead


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cols", [24, 56, 96, 128, 256, 512, 2048])
@pytest.mark.parametrize("dtype", [np.float32, bfloat16])
def test_backward_rows_prefetch_whole_groups_ahead(cols, dtype, threads):
    """The backward prefetches whole groups ahead, at least 8 KB of a row stream
    over all threads (each of T threads 1/T of it), one group at least; 16-bit
    short rows the next block, as the forward's (the policy's lead, policy.c)."""
    old = _isa.kernels.set_oversubscribe(True)
    try:
        e = cynorm.explain(np.empty((1 << 17, cols), dtype), num_threads=threads, backward=True)
    finally:
        _isa.kernels.set_oversubscribe(old)
    short = e["path"] == "small rows in registers"
    assert e["path"] == ("small rows in registers" if cols <= 64 else "rows by chunks")
    ahead, group, t = e["prefetch_rows_ahead"], e["group_rows"], e["threads"]
    assert ahead % group == 0 and ahead >= group
    row_bytes, lead = cols * np.dtype(dtype).itemsize, (8 << 10) // t
    if short and np.dtype(dtype).itemsize == 2:
        assert ahead == group
        return
    assert ahead == group or (ahead * row_bytes >= lead and (ahead - group) * row_bytes < lead)
    assert (ahead == group) == (group * row_bytes >= lead)


def test_threads_and_team_path():
    assert cynorm.explain(np.empty((8, 8, 16), np.float32), num_threads=2)["threads"] == 1   # tiny: one thread
    old = _isa.kernels.set_oversubscribe(True)
    try:
        e = cynorm.explain(np.empty((2, 200000), np.float32), num_threads=2)
        if _isa.kernels.openmp():
            assert e["threads"] == 2 and e["path"] == "team: columns split across threads"
        else:
            assert e["threads"] == 1
    finally:
        _isa.kernels.set_oversubscribe(old)


def test_follows_the_tunables():
    x = np.empty((4096, 1024), np.float32)
    out = np.empty_like(x)
    old = _isa.kernels._policy("stream_min_bytes", 1 << 40)
    try:
        assert cynorm.explain(x, out=out)["stream"] is False
        _isa.kernels._policy("stream_min_bytes", 0)
        assert cynorm.explain(x, out=out)["stream"] is True
        assert cynorm.explain(x, out=out)["tunables"]["stream_min_bytes"] == 0
    finally:
        _isa.kernels._policy("stream_min_bytes", old)


def test_same_checks_as_the_call():
    x = np.empty((4, 6), np.float32)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        cynorm.explain(x, axis=2)
    with pytest.raises(TypeError, match="unsupported dtypes"):
        cynorm.explain(x, np.ones(6, np.float64))
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        cynorm.explain(x, num_threads=0)
    with pytest.raises(ValueError, match="norm must be"):
        cynorm.explain(x, norm="batch_norm")
    with pytest.raises(ValueError, match="out must have shape"):
        cynorm.explain(x, out=np.empty((4, 5), np.float32))


# ------------------------------------------------------------------ GroupNorm --

def test_group_norm_fields_in_both_layouts():
    f32 = np.float32
    e = cynorm.explain(np.empty((2, 64, 8, 8), f32), np.ones(64, f32), norm="group_norm", num_groups=32,
                       num_threads=1)
    assert (e["norm"], e["layout"], e["direction"]) == ("group_norm", "channels_first", "forward")
    assert (e["batch"], e["channels"], e["groups"], e["positions"], e["group_elems"]) == (2, 64, 32, 64, 128)
    assert (e["split"], e["units"], e["scratch_bytes_per_thread"], e["threads"]) == ("rows (sample, group)", 64, 0, 1)
    assert e["isa"] == _isa.level and e["policy"]["class"] in _isa.kernels.class_names()
    e = cynorm.explain(np.empty((3, 5, 7, 48), bfloat16), norm="group_norm", num_groups=12, channel_axis=-1,
                       backward=True, num_threads=1)
    assert (e["layout"], e["direction"], e["x_dtype"], e["param_dtype"]) == ("channels_last", "backward",
                                                                              "bfloat16", "bfloat16")
    assert (e["batch"], e["channels"], e["positions"], e["group_elems"]) == (3, 48, 35, 140)
    assert (e["split"], e["units"]) == ("samples", 3)
    wider = cynorm.explain(np.empty((3, 5, 7, 96), bfloat16), norm="group_norm", num_groups=12, channel_axis=-1)
    assert 0 < e["scratch_bytes_per_thread"] and wider["scratch_bytes_per_thread"] == 2 * e["scratch_bytes_per_thread"]


@pytest.mark.parametrize("shape, groups, axis", [((8, 64, 32, 32), 32, 1), ((8, 32, 32, 64), 32, -1),
                                                  ((1, 32, 32, 256), 8, -1), ((2, 4, 3), 2, 1)])
@pytest.mark.parametrize("backward", [False, True])
def test_group_norm_threads_are_layer_norms_over_the_same_rows(shape, groups, axis, backward):
    """The thread count is the one LayerNorm over the (sample, group) rows gets, at most
    one thread per unit of work (a row channels-first, a sample channels-last)."""
    x = np.empty(shape, np.float32)
    C = shape[axis]
    L = x.size // (shape[0] * groups)
    for T in (1, 2, 3):
        e = cynorm.explain(x, norm="group_norm", num_groups=groups, channel_axis=axis, backward=backward,
                           num_threads=T)
        rows = cynorm.explain(np.empty((shape[0] * groups, L), np.float32), backward=backward, num_threads=T)
        units = shape[0] if axis == -1 else shape[0] * groups
        assert e["units"] == units and e["channels"] == C
        assert e["threads"] == min(rows["threads"], units), (T, e, rows)
        assert 1 <= e["threads"] <= T


def test_group_norm_explain_errors():
    x = np.empty((2, 6, 4), np.float32)
    with pytest.raises(ValueError, match="num_groups"):
        cynorm.explain(x, norm="group_norm")
    with pytest.raises(ValueError, match="divide|divisible|multiple"):
        cynorm.explain(x, norm="group_norm", num_groups=4)
    with pytest.raises(ValueError, match=r"\(C,\)"):
        cynorm.explain(x, np.ones(4, np.float32), norm="group_norm", num_groups=3)
    with pytest.raises(ValueError, match="shape"):
        cynorm.explain(x, norm="group_norm", num_groups=3, out=np.empty((2, 6, 5), np.float32))
    with pytest.raises(ValueError, match="3 entries"):
        cynorm.explain(x, norm="group_norm", num_groups=3, out=(np.empty_like(x),))
    with pytest.raises(ValueError, match="group_norm"):
        cynorm.explain(x, norm="batch_norm")
