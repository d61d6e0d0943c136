"""Outputs: the out= argument, and aliasing between outputs and inputs.

``out`` is None, one ndarray (the first output: y or dx), or a tuple with one
entry per output of the function, each an ndarray or None. Every given array
is checked before anything is written. Outputs must not overlap each other.
An output may be an input in place only where that is documented (y may be x;
dx may be dy or x, exactly the same array); any other overlap between an
output and an input makes cynorm copy that input first, so the result never
depends on the order in which the kernels write.
"""

import numpy as np

from . import _dtypes

_ndarray = np.ndarray


def unpack(out, names):
    """The out argument as one entry per output name: (arrays or None, labels for messages)."""
    if type(out) is _ndarray:
        return [out] + [None] * (len(names) - 1), ["out"] * len(names)
    if isinstance(out, tuple):
        if len(out) != len(names):
            raise ValueError(f"cynorm: out must be a tuple of {len(names)} entries ({', '.join(names)}), "
                             f"each an array or None; got {len(out)}")
        return list(out), [f"out[{i}] ({name})" for i, name in enumerate(names)]
    if isinstance(out, _ndarray):
        return [out.view(_ndarray) if type(out) is not _ndarray else out] + [None] * (len(names) - 1), \
            ["out"] * len(names)
    raise TypeError(f"cynorm: out must be a numpy.ndarray or a tuple of {len(names)} ({', '.join(names)}) "
                    f"arrays or None, got {type(out).__name__}")


def check(out, label, shape, dtype, other_shape=None):
    """A given output array: an ndarray of this dtype and shape (or other_shape),
    C-contiguous and writeable. Returns it."""
    if type(out) is _ndarray and out.dtype is dtype and out.shape == shape:   # fast path
        flags = out.flags
        if flags.c_contiguous and flags.writeable:
            return out
    if not isinstance(out, _ndarray):
        raise TypeError(f"cynorm: {label} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"cynorm: {label} must have dtype {_dtypes.dtype_name(dtype)}, "
                        f"got {_dtypes.dtype_name(out.dtype)}")
    if out.shape != shape and out.shape != other_shape:
        also = "" if other_shape is None or other_shape == shape else f" (or {other_shape})"
        raise ValueError(f"cynorm: {label} must have shape {shape}{also}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"cynorm: {label} must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"cynorm: {label} is read-only")
    return out


def _same(a, b):
    """a and b are the same memory, element for element (in-place use)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.strides == b.strides
            and a.flags.c_contiguous and a.nbytes == b.nbytes)


def check_disjoint(outputs, labels):
    """No two given outputs may share memory."""
    given = [(a, lab) for a, lab in zip(outputs, labels) if a is not None]
    for i in range(1, len(given)):
        for j in range(i):
            if np.may_share_memory(given[i][0], given[j][0]):
                raise ValueError(f"cynorm: {given[j][1]} and {given[i][1]} share memory; outputs must not overlap")


_may_share = np.may_share_memory


def protect(inputs, outputs, in_place=()):
    """inputs with a C-contiguous copy of any that overlaps a given output;
    in_place holds (input index, output index) pairs that may be the very same
    array. Inputs that overlap nothing are returned as they are."""
    copied = None
    for k, o in enumerate(outputs):
        if o is None:
            continue
        for i, a in enumerate(inputs):
            if a is None or not (a is o or _may_share(a, o)):
                continue
            if (i, k) in in_place and _same(a, o):
                continue
            if copied is None:
                copied = list(inputs)
            copied[i] = np.array(a, order="C", copy=True)
        if copied is not None:
            inputs = copied
    return inputs
