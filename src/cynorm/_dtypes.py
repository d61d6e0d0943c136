"""Which (x dtype, parameter dtype) pairs cynorm computes, and in what dtypes.

    x          weight/bias        y, dx      mean, rstd   dweight, dbias
    float32    float32 or None    float32    float32      float32
    float64    float64 or None    float64    float64      float64
    bfloat16   bfloat16 or None   bfloat16   float32      bfloat16
    bfloat16   float32 (mixed)    bfloat16   float32      float32
    float16    float16 or None    float16    float32      float16
    float16    float32 (mixed)    float16    float32      float32

Everything else is refused with a TypeError that names these pairs and the fix.
The pair codes are CN_PAIR_* in include/cn_ops.h.
"""

from typing import NamedTuple

import numpy as np
from ml_dtypes import bfloat16

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
BF16 = np.dtype(bfloat16)


class Pair(NamedTuple):
    code: int          # CN_PAIR_* in include/cn_ops.h
    x: np.dtype        # x, y, dy, dx
    param: np.dtype    # weight, bias
    stat: np.dtype     # mean, rstd
    grad: np.dtype     # dweight, dbias


PAIRS = {
    (F32, F32): Pair(0, F32, F32, F32, F32),
    (F64, F64): Pair(1, F64, F64, F64, F64),
    (BF16, BF16): Pair(2, BF16, BF16, F32, BF16),
    (BF16, F32): Pair(3, BF16, F32, F32, F32),
    (F16, F16): Pair(4, F16, F16, F32, F16),
    (F16, F32): Pair(5, F16, F32, F32, F32),
}

#: Parameter dtype used when no weight/bias is given, or for plain Python sequences.
DEFAULT_PARAM = {F32: F32, F64: F64, BF16: BF16, F16: F16}

_NAMES = {F32: "float32", F64: "float64", BF16: "bfloat16", F16: "float16"}


def dtype_name(dt):
    return _NAMES.get(dt, str(dt))


def supported_pairs_text():
    return ", ".join(f"({dtype_name(x)}, {dtype_name(p)})" for x, p in PAIRS)


def check_x_dtype(dt, name="x"):
    """Raise TypeError unless dt is a supported input dtype."""
    if dt not in DEFAULT_PARAM:
        raise TypeError(
            f"cynorm: {name} has dtype {dt}; supported input dtypes are float32, float64, "
            f"bfloat16 (ml_dtypes.bfloat16) and float16. Convert it first, e.g. {name}.astype(np.float32)."
        )


def resolve(x_dtype, param_dtype):
    """The Pair for x and its parameters (param_dtype None: no weight/bias)."""
    if param_dtype is None:
        param_dtype = DEFAULT_PARAM[x_dtype]
    pair = PAIRS.get((x_dtype, param_dtype))
    if pair is None:
        options = [dtype_name(p) for (x, p) in PAIRS if x == x_dtype]
        raise TypeError(
            f"cynorm: unsupported dtypes: x is {dtype_name(x_dtype)} but weight/bias are "
            f"{dtype_name(param_dtype)}. Supported (x, weight/bias) pairs: {supported_pairs_text()}. "
            f"Fix: cast weight and bias to {' or '.join(options)}, "
            f"e.g. weight.astype(np.{options[-1]})."
        )
    return pair
