"""Which (x dtype, parameter dtype) pairs cynorm computes, and in what dtypes.

    x          weight/bias        y, dx      mean, rstd   dweight, dbias
    float32    float32 or None    float32    float32      float32
    float64    float64 or None    float64    float64      float64
    bfloat16   bfloat16 or None   bfloat16   float32      bfloat16
    bfloat16   float32 (mixed)    bfloat16   float32      float32
    float16    float16 or None    float16    float32      float16
    float16    float32 (mixed)    float16    float32      float32

The pairs, their codes and the dtypes they compute in come from meson.build's
tables, as compiled (cynorm._core.tables()); this module only gives them
NumPy's names. Everything else is refused (cynorm._checks) with a TypeError
that names these pairs and the fix.
"""

from typing import NamedTuple

import numpy as np
import ml_dtypes  # noqa: F401  (registers "bfloat16" with NumPy)

from . import _core

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
BF16 = np.dtype("bfloat16")


class Pair(NamedTuple):
    code: int          # the pair's place in meson.build's dtype_pairs
    x: np.dtype        # x, y, dy, dx
    param: np.dtype    # weight, bias
    stat: np.dtype     # mean, rstd
    grad: np.dtype     # dweight, dbias


_TABLES = _core.tables()
#: dtype -> its code in include/cynorm.h (the C entry point's dtype numbers)
CODES = {np.dtype(k["dtype"]): k["code"] for k in _TABLES["kernels"]}
#: dtype -> the dtype it accumulates in (mean, rstd; the fp32 residual stream of 16-bit x)
ACCUMULATOR = {np.dtype(k["dtype"]): np.dtype(k["acc"]) for k in _TABLES["kernels"]}

PAIRS = {}
#: Parameter dtype used when no weight/bias is given, or for plain Python sequences:
#: x's first pair in the table.
DEFAULT_PARAM = {}
for _code, (_x, _p) in enumerate(_TABLES["pairs"]):
    _x, _p = np.dtype(_x), np.dtype(_p)
    PAIRS[(_x, _p)] = Pair(_code, _x, _p, ACCUMULATOR[_x], _p)
    DEFAULT_PARAM.setdefault(_x, _p)


def dtype_name(dt):
    return str(dt)


def supported_pairs_text():
    return ", ".join(f"({dtype_name(x)}, {dtype_name(p)})" for x, p in PAIRS)


def supported_x_text():
    return ", ".join(dtype_name(x) for x in DEFAULT_PARAM)


def round_float32(a, dtype):
    """float32 (or float64) values rounded to dtype as the kernels round them: round to
    nearest even, bfloat16 flushing float32 subnormals (the level's vector conversion)."""
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a
    if dtype.itemsize == 2 and a.dtype == F32:
        from . import _isa
        out = np.empty(a.shape, np.uint16)
        src = np.ascontiguousarray(a)
        (_isa.kernels.f32_to_bf16 if dtype == BF16 else _isa.kernels.f32_to_f16)(src, out)
        return out.view(dtype)
    return a.astype(dtype)
