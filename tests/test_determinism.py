"""Every output is bit-identical for any num_threads, and from one call to the next."""

import numpy as np
import pytest

import cynorm
from cynorm import _isa
from conftest import PAIRS, bits_of, make_inputs

# in-register rows, short rows, chunked rows, row blocks, few huge rows (team path)
SHAPES = [(37, 16), (33, 56), (70, 300), (130, 2100), (5, 4100), (3, 9000), (2, 20000), (600, 24)]
THREADS = [1, 2, 3, 8]


def _bits(arrays):
    return [bits_of(a) for a in arrays]


def _run(norm, x, dy, w, b, T):
    if norm == "layer":
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b, num_threads=T)
        return _bits((y, mean, rstd) + cynorm.layer_norm_backward(dy, x, mean, rstd, w, num_threads=T))
    y, rstd = cynorm.rms_norm_forward(x, w, num_threads=T)
    return _bits((y, rstd) + cynorm.rms_norm_backward(dy, x, rstd, w, num_threads=T))


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_bit_identical_across_thread_counts(isa_level, pair, norm, rng, force_parallel):
    for shape in SHAPES:
        x, dy, w, b = make_inputs(rng, shape, 1, pair)
        want = _run(norm, x, dy, w, b, 1)
        for T in THREADS[1:]:
            got = _run(norm, x, dy, w, b, T)
            for i, (g, e) in enumerate(zip(got, want)):
                assert np.array_equal(g, e), f"{shape} output {i} differs between 1 and {T} threads"
        assert all(np.array_equal(g, e) for g, e in zip(_run(norm, x, dy, w, b, 3), want))


def test_default_thread_count_is_deterministic_too(rng):
    """The default (threshold-governed) thread count gives the same bits as 1 thread."""
    x, dy, w, b = make_inputs(rng, (256, 4096), 1, PAIRS[3].values[0])
    for g, e in zip(_run("layer", x, dy, w, b, None), _run("layer", x, dy, w, b, 1)):
        assert np.array_equal(g, e)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_large_output_paths_change_no_bit(isa_level, pair, norm, rng, force_parallel):
    """Streaming stores, page population and out= vs fresh outputs are memory
    traffic only: the same bits as the plain path, at 1 and 3 threads. Fresh
    outputs go both ways: streamed, and plain after population (a mesh L3's
    policy for all but long rows, fresh_plain_row_bytes)."""
    cases = [(make_inputs(rng, shape, 1, pair), shape) for shape in SHAPES]
    want = {(shape, T): _run(norm, x, dy, w, b, T) for (x, dy, w, b), shape in cases for T in (1, 3)}
    old = _isa.kernels._policy("stream_min_bytes", 0)
    old_plain = _isa.kernels._policy("fresh_plain_row_bytes")
    try:
        for (x, dy, w, b), shape in cases:
            for T in (1, 3):
                for fresh_plain in (0, 1 << 40):
                    _isa.kernels._policy("fresh_plain_row_bytes", fresh_plain)
                    got = _run(norm, x, dy, w, b, T)
                    for i, (g, e) in enumerate(zip(got, want[(shape, T)])):
                        assert np.array_equal(g, e), f"{shape} T={T}: output {i} differs when streamed ({fresh_plain})"
                # into preallocated (not fresh) outputs
                out = np.empty_like(x)
                if norm == "layer":
                    y = cynorm.layer_norm(x, w, b, num_threads=T, out=out)
                else:
                    y = cynorm.rms_norm(x, w, num_threads=T, out=out)
                assert y is out and np.array_equal(out.view(np.uint8), want[(shape, T)][0])
    finally:
        _isa.kernels._policy("stream_min_bytes", old)
        _isa.kernels._policy("fresh_plain_row_bytes", old_plain)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_long_rows_any_grouping(isa_level, pair, norm, rng, force_parallel):
    """Rows whose dweight/dbias partials outgrow the cache (blocks of 64 rows,
    two here): the same bits for any thread count and any row-group size of
    the team path and of the forward's long rows, including groups that split
    the rows taken four at a time."""
    x, dy, w, b = make_inputs(rng, (70, 33000), 1, pair)
    want = _run(norm, x, dy, w, b, 1)
    k = _isa.kernels

    def same_bits_with(policies, threads, label):
        olds = {name: k._policy(name, value) for name, value in policies.items()}
        try:
            for T in threads:
                got = _run(norm, x, dy, w, b, T)
                for i, (g, e) in enumerate(zip(got, want)):
                    assert np.array_equal(g, e), f"{label}, T={T}: output {i} differs"
        finally:
            for name, old in olds.items():
                k._policy(name, old)

    # -1 leaves the default. Rows of 33000 elements (over 64 KB in every dtype:
    # the forward's long-row groups too): 300K fits fewer than 4 fp32/fp64 rows
    # (so _long_group's count) and 4 16-bit ones; 900K 6 fp32 rows; 64M the cap of 16.
    for group_bytes in (-1, 300 << 10, 900 << 10, 64 << 20):
        same_bits_with({"long_group_bytes": group_bytes}, (1, 2, 3), f"group bytes {group_bytes}")
    # the backward adds the rows into the block partials in phase A by pairs of
    # rows (one thread), in phase A by column chunk, or in phase C: same bits
    same_bits_with({"parts_in_a_bytes": 1 << 30}, (1,), "pairs")
    same_bits_with({"parts_in_a_bytes": 0, "bwd_a_by_chunk": 2}, (1, 2, 3), "column chunks")
    same_bits_with({"parts_in_a_bytes": 0, "bwd_a_by_chunk": 0}, (1, 2, 3), "phase C")


def _guarded(shape, dtype, offset):
    """(buffer, view, start, nbytes): an empty array `offset` bytes past a 64-byte boundary,
    at buffer[start:start + nbytes]; the other bytes hold a pattern a call must not touch."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = int(np.prod(shape)) * itemsize
    buf = np.full(nbytes + 192, 0xA5, np.uint8)
    start = 64 + (offset - buf.ctypes.data) % 64
    view = buf[start:start + nbytes].view(dtype).reshape(shape)
    assert view.ctypes.data % 64 == offset
    return buf, view, start, nbytes


def _at(a, offset):
    """A copy of a whose data starts `offset` bytes past a 64-byte boundary."""
    out = _guarded(a.shape, a.dtype, offset)[1]
    out[...] = a
    return out


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_array_addresses_change_no_bit(isa_level, pair, norm, rng, force_parallel):
    """The backward takes another route through the rows when x, dy and dx
    all start on 64-byte boundaries (as NumPy's large arrays do not): the
    same bits as from arrays 16 bytes off, streamed or not, at 1 and 3 threads."""
    for shape in [(70, 1024), (33, 2064)]:
        x, dy, w, b = make_inputs(rng, shape, 1, pair)
        if norm == "layer":
            _, mean, rstd = cynorm.layer_norm_forward(x, w, b)
            call = lambda x_, dy_, out, T: cynorm.layer_norm_backward(dy_, x_, mean, rstd, w, num_threads=T, out=out)
        else:
            _, rstd = cynorm.rms_norm_forward(x, w)
            call = lambda x_, dy_, out, T: cynorm.rms_norm_backward(dy_, x_, rstd, w, num_threads=T, out=out)
        for stream_min in (None, 0):
            old = _isa.kernels._policy("stream_min_bytes", stream_min if stream_min is not None else -1)
            try:
                for T in (1, 3):
                    runs = []
                    for offset in (0, 16):
                        got = call(_at(x, offset), _at(dy, offset), _at(np.zeros_like(x), offset), T)
                        runs.append(_bits(got))
                    for i, (g, e) in enumerate(zip(*runs)):
                        assert np.array_equal(g, e), f"{shape} T={T}: output {i} depends on the addresses"
            finally:
                _isa.kernels._policy("stream_min_bytes", old)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_streamed_rows_at_any_alignment(isa_level, pair, norm, rng, force_parallel):
    """Streamed rows end in partial vectors, which stream too (in 4-byte
    pieces) when the output is not aligned to the vector width. Outputs at
    every element offset from a 64-byte boundary: the same bits as unstreamed
    aligned ones, and not a byte written outside the output."""
    for shape in [(33, 250), (17, 1031), (3, 9000), (2, 20000)]:
        x, dy, w, b = make_inputs(rng, shape, 1, pair)
        itemsize = x.dtype.itemsize
        if norm == "layer":
            y0, mean, rstd = cynorm.layer_norm_forward(x, w, b)
            fwd = lambda out, T: cynorm.layer_norm(x, w, b, num_threads=T, out=out)
            bwd = lambda out, T: cynorm.layer_norm_backward(dy, x, mean, rstd, w, num_threads=T, out=out)
        else:
            y0, rstd = cynorm.rms_norm_forward(x, w)
            fwd = lambda out, T: cynorm.rms_norm(x, w, num_threads=T, out=out)
            bwd = lambda out, T: cynorm.rms_norm_backward(dy, x, rstd, w, num_threads=T, out=out)
        dx0 = bwd(None, 1)[0]
        old = _isa.kernels._policy("stream_min_bytes", 0)
        try:
            for offset in range(0, 33, itemsize):
                for T in (1, 3):
                    for call, want, what in ((fwd, y0, "y"), (lambda o, T: bwd(o, T)[0], dx0, "dx")):
                        buf, out, start, nbytes = _guarded(x.shape, x.dtype, offset)
                        call(out, T)
                        where = f"{shape}, {what} {offset} bytes off, T={T}"
                        assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), where
                        assert (buf[:start] == 0xA5).all() and (buf[start + nbytes:] == 0xA5).all(), \
                            f"{where}: bytes outside the output were written"
        finally:
            _isa.kernels._policy("stream_min_bytes", old)
