"""The C entry point (include/cynorm.h), reached the way another extension
module reaches it: through the capsule cynorm._core._C_API. Called here with
ctypes, which releases the GIL around each call."""

import ctypes
import os
import threading

import numpy as np
import pytest

import cynorm
from cynorm import _core
from conftest import PAIRS, make_inputs

c_int, c_int64, c_double, c_uint, c_void_p = ctypes.c_int, ctypes.c_int64, ctypes.c_double, ctypes.c_uint, ctypes.c_void_p
F32, F64, BF16, F16, NO_PARAMS = 0, 1, 2, 3, -1
CODES = {"float32": F32, "float64": F64, "bfloat16": BF16, "float16": F16}


class Desc(ctypes.Structure):
    _fields_ = [("norm", c_int), ("x_dtype", c_int), ("param_dtype", c_int), ("rows", c_int64), ("cols", c_int64),
                ("eps", c_double), ("num_threads", c_int), ("flags", c_uint), ("block_rows", c_int64)]


class FwdBufs(ctypes.Structure):
    _fields_ = [(n, c_void_p) for n in ("x", "weight", "bias", "y", "mean", "rstd")]


class BwdBufs(ctypes.Structure):
    _fields_ = [(n, c_void_p) for n in ("dy", "x", "mean", "rstd", "weight", "dx", "dweight", "dbias",
                                        "dweight_blocks", "dbias_blocks")]


class Api(ctypes.Structure):
    _fields_ = [("abi_version", c_int),
                ("forward", ctypes.CFUNCTYPE(c_int, ctypes.POINTER(Desc), ctypes.POINTER(FwdBufs))),
                ("backward", ctypes.CFUNCTYPE(c_int, ctypes.POINTER(Desc), ctypes.POINTER(BwdBufs))),
                ("error_string", ctypes.CFUNCTYPE(ctypes.c_char_p, c_int)),
                ("block_rows", ctypes.CFUNCTYPE(c_int64, c_int64, c_int64, c_int))]


@pytest.fixture(scope="module")
def api():
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = Api.from_address(get(_core._C_API, b"cynorm._core._C_API"))
    header = open(os.path.join(cynorm.get_include(), "cynorm.h")).read()
    assert f"#define CYNORM_ABI_VERSION {table.abi_version}" in header
    return table


def _ptr(a):
    return None if a is None else a.ctypes.data


def _stat(x):
    return np.float64 if x.dtype == np.float64 else np.float32


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_same_bits_as_the_python_api(api, pair, norm, rng):
    for shape, T in (((37, 16), 1), ((70, 1031), 2), ((3, 9000), 2)):
        x, dy, w, b = make_inputs(rng, shape, 1, pair)
        M, N = shape
        b = b if norm == "layer" else None
        layer = norm == "layer"
        want = (cynorm.layer_norm_forward(x, w, b, num_threads=T) if layer
                else (lambda y, r: (y, None, r))(*cynorm.rms_norm_forward(x, w, num_threads=T)))
        wantb = (cynorm.layer_norm_backward(dy, x, want[1], want[2], w, num_threads=T) if layer
                 else cynorm.rms_norm_backward(dy, x, want[2], w, num_threads=T) + (None,))
        d = Desc(0 if layer else 1, CODES[x.dtype.name], CODES[w.dtype.name], M, N, 1e-5 if layer else 1e-6, T, 0)
        y, rstd = np.empty_like(x), np.empty((M, 1), _stat(x))
        mean = np.empty((M, 1), _stat(x)) if layer else None
        assert api.forward(ctypes.byref(d), ctypes.byref(FwdBufs(_ptr(x), _ptr(w), _ptr(b), _ptr(y), _ptr(mean),
                                                                 _ptr(rstd)))) == 0
        for g, e in zip((y, mean, rstd), want):
            assert (g is None and e is None) or np.array_equal(g.view(np.uint8), e.view(np.uint8))
        dx, dw = np.empty_like(x), np.empty_like(w)
        db = np.empty_like(w) if layer else None
        rc = api.backward(ctypes.byref(d), ctypes.byref(BwdBufs(_ptr(dy), _ptr(x), _ptr(mean), _ptr(rstd), _ptr(w),
                                                                _ptr(dx), _ptr(dw), _ptr(db))))
        assert rc == 0
        for g, e in zip((dx, dw, db), wantb):
            assert (g is None and e is None) or np.array_equal(g.view(np.uint8), e.view(np.uint8))


def test_invalid_descriptors(api, rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y, r = np.empty_like(x), np.empty((4, 1), np.float32)
    bufs = FwdBufs(_ptr(x), None, None, _ptr(y), None, _ptr(r))
    bad = [Desc(0, F32, F64, 4, 8, 1e-5, 0, 0), Desc(0, 7, NO_PARAMS, 4, 8, 1e-5, 0, 0),
           Desc(2, F32, NO_PARAMS, 4, 8, 1e-5, 0, 0), Desc(0, F32, NO_PARAMS, -1, 8, 1e-5, 0, 0),
           Desc(0, F32, NO_PARAMS, 4, 0, 1e-5, 0, 0), Desc(0, F32, NO_PARAMS, 4, 8, float("nan"), 0, 0),
           Desc(0, F32, NO_PARAMS, 4, 8, -1.0, 0, 0), Desc(0, F32, NO_PARAMS, 4, 8, 1e-5, -3, 0)]
    y[...] = 7
    for d in bad:
        assert api.forward(ctypes.byref(d), ctypes.byref(bufs)) == 2
    assert (y == 7).all()   # refused before anything was written
    d = Desc(0, F32, NO_PARAMS, 4, 8, 1e-5, 0, 0)
    assert api.forward(ctypes.byref(d), ctypes.byref(FwdBufs(None, None, None, _ptr(y), None, _ptr(r)))) == 2
    # backward: dbias without dweight, dweight without weight
    dw = np.empty(8, np.float32)
    assert api.backward(ctypes.byref(d), ctypes.byref(BwdBufs(_ptr(x), _ptr(x), _ptr(r), _ptr(r), None, _ptr(y),
                                                              _ptr(dw), None))) == 2
    assert b"invalid descriptor" in api.error_string(2) and api.error_string(0) == b"ok"
    assert api.block_rows(4096, 1024, F32) == _core.block_rows(4096, 1024, 4) == 64
    assert api.block_rows(100, 8, F64) == _core.block_rows(100, 8, 8) == 8


def test_no_rows_zeroes_the_gradients(api):
    x = np.empty((0, 8), np.float32)
    w = np.ones(8, np.float32)
    dw, db = np.full(8, 5, np.float32), np.full(8, 5, np.float32)
    d = Desc(0, F32, F32, 0, 8, 1e-5, 0, 0)
    m = np.empty((0, 1), np.float32)
    rc = api.backward(ctypes.byref(d), ctypes.byref(BwdBufs(_ptr(x), _ptr(x), _ptr(m), _ptr(m), _ptr(w), _ptr(x),
                                                            _ptr(dw), _ptr(db))))
    assert rc == 0 and (dw == 0).all() and (db == 0).all()


def test_without_the_gil_from_many_threads(api, rng):
    """ctypes calls without the GIL: eight Python threads at once, each result
    equal to the serial one."""
    xs = [rng.standard_normal((64, 2048)).astype(np.float32) for _ in range(8)]
    want = [cynorm.layer_norm(x, num_threads=1) for x in xs]
    got = [np.empty_like(x) for x in xs]

    def work(i):
        d = Desc(0, F32, NO_PARAMS, 64, 2048, 1e-5, 2, 0)
        r = np.empty((64, 1), np.float32)
        for _ in range(5):
            assert api.forward(ctypes.byref(d), ctypes.byref(FwdBufs(_ptr(xs[i]), None, None, _ptr(got[i]), None,
                                                                     _ptr(r)))) == 0

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, e in zip(got, want):
        assert np.array_equal(g, e)


# ------------------------------------------------------------- GroupNorm (ABI 3) --

class GroupDesc(ctypes.Structure):
    _fields_ = [("x_dtype", c_int), ("param_dtype", c_int), ("batch", c_int64), ("channels", c_int64),
                ("spatial", c_int64), ("groups", c_int64), ("channels_last", c_int), ("eps", c_double),
                ("num_threads", c_int)]


class GroupFwdBufs(ctypes.Structure):
    _fields_ = [(n, c_void_p) for n in ("x", "weight", "bias", "y", "mean", "rstd")]


class GroupBwdBufs(ctypes.Structure):
    _fields_ = [(n, c_void_p) for n in ("dy", "x", "mean", "rstd", "weight", "dx", "dweight", "dbias", "terms")]


class ApiV3(ctypes.Structure):
    _fields_ = Api._fields_ + [("add_forward", c_void_p), ("add_backward", c_void_p),
                               ("group_forward", ctypes.CFUNCTYPE(c_int, ctypes.POINTER(GroupDesc),
                                                                  ctypes.POINTER(GroupFwdBufs))),
                               ("group_backward", ctypes.CFUNCTYPE(c_int, ctypes.POINTER(GroupDesc),
                                                                   ctypes.POINTER(GroupBwdBufs)))]


@pytest.fixture(scope="module")
def api3(api):
    assert api.abi_version >= 3
    return ApiV3.from_address(ctypes.addressof(api))


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("pair", PAIRS)
def test_group_norm_same_bits_as_the_python_api(api3, pair, channels_last, rng):
    N, C, S, G = 6, 12, 35, 4
    shape = (N, S, C) if channels_last else (N, C, S)
    x, dy, _, _ = make_inputs(rng, shape, 1, pair)
    w = (1 + 0.5 * rng.standard_normal(C)).astype(pair[1])
    b = (0.5 * rng.standard_normal(C)).astype(pair[1])
    ca = -1 if channels_last else 1
    y0, m0, r0 = cynorm.group_norm_forward(x, G, w, b, channel_axis=ca)
    dx0, dw0, db0 = cynorm.group_norm_backward(dy, x, m0, r0, w, num_groups=G, channel_axis=ca)
    d = GroupDesc(CODES[x.dtype.name], CODES[w.dtype.name], N, C, S, G, channels_last, 1e-5, 2)
    y, m, r = np.empty_like(x), np.empty((N, G), _stat(x)), np.empty((N, G), _stat(x))
    assert api3.group_forward(ctypes.byref(d), ctypes.byref(GroupFwdBufs(*map(_ptr, (x, w, b, y, m, r))))) == 0
    for g, e in ((y, y0), (m, m0), (r, r0)):
        assert np.array_equal(g.view(np.uint8), e.view(np.uint8))
    # the backward in two batch ranges, their terms added in order: the whole batch's bits
    terms = np.empty((N, 2, C), np.float64)
    dx = np.empty_like(x)
    for lo, hi in ((0, 2), (2, N)):
        dr = GroupDesc(CODES[x.dtype.name], CODES[w.dtype.name], hi - lo, C, S, G, channels_last, 0.0, 1)
        bufs = GroupBwdBufs(_ptr(dy[lo:hi]), _ptr(x[lo:hi]), _ptr(m[lo:hi]), _ptr(r[lo:hi]), _ptr(w), _ptr(dx[lo:hi]),
                            None, None, _ptr(terms[lo:hi]))
        assert api3.group_backward(ctypes.byref(dr), ctypes.byref(bufs)) == 0
    assert np.array_equal(dx.view(np.uint8), dx0.view(np.uint8))
    from cynorm import _checks, _group
    dw, db = _group.param_grads(terms, _checks.pair(x.dtype, w.dtype))
    assert np.array_equal(dw.view(np.uint8), dw0.view(np.uint8)) and np.array_equal(db.view(np.uint8), db0.view(np.uint8))


def test_group_norm_invalid_descriptors(api3):
    x = np.ones((2, 6, 5), np.float32)
    y, m, r, w = np.empty_like(x), np.empty((2, 3), np.float32), np.empty((2, 3), np.float32), np.ones(6, np.float32)
    bufs = GroupFwdBufs(*map(_ptr, (x, w, None, y, m, r)))
    for fields in ({"groups": 4}, {"groups": 0}, {"spatial": 0}, {"channels_last": 2}, {"x_dtype": 9},
                   {"param_dtype": F64}, {"eps": -1.0}, {"num_threads": -1}):
        kw = dict(x_dtype=F32, param_dtype=F32, batch=2, channels=6, spatial=5, groups=3, channels_last=0,
                  eps=1e-5, num_threads=1)
        kw.update(fields)
        assert api3.group_forward(ctypes.byref(GroupDesc(**kw)), ctypes.byref(bufs)) == 2, fields
    d = GroupDesc(F32, F32, 2, 6, 5, 3, 0, 0.0, 1)
    half = GroupBwdBufs(_ptr(x), _ptr(x), _ptr(m), _ptr(r), _ptr(w), _ptr(y), _ptr(w.copy()), None, None)
    assert api3.group_backward(ctypes.byref(d), ctypes.byref(half)) == 2   # dweight without dbias
