"""The tests' own helpers (conftest.py): each must fail where it should."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from conftest import assert_same_bits, bits_of, same_bits


def test_equal_arrays_have_the_same_bits():
    a = np.array([1.5, np.nan, -0.0, np.inf], np.float32)
    assert same_bits(a, a.copy())
    assert_same_bits(a, a.copy())
    assert same_bits(None, None)


@pytest.mark.parametrize("change", ["nan payload", "sign of zero", "one ulp", "dtype", "shape", "none"])
def test_any_difference_in_bits_dtype_or_shape_is_caught(change):
    a = np.array([1.5, np.nan, -0.0, 3.0], np.float32)
    b = a.copy()
    if change == "nan payload":
        b.view(np.uint32)[1] ^= 1
    elif change == "sign of zero":
        b[2] = 0.0
    elif change == "one ulp":
        b[3] = np.nextafter(b[3], np.float32(4))
    elif change == "dtype":
        b = a.view(np.int32)
    elif change == "shape":
        b = a.reshape(2, 2)
    else:
        b = None
    assert not same_bits(a, b)
    with pytest.raises(AssertionError, match="what I compared"):
        assert_same_bits(a, b, "what I compared")


def test_the_message_points_at_the_first_difference():
    a = np.zeros(10, bfloat16)
    b = a.copy()
    b[7] = 1
    with pytest.raises(AssertionError, match=r"index 7 .*1 of 10 elements"):
        assert_same_bits(a, b, "y")


def test_a_snapshot_does_not_follow_the_array():
    a = np.arange(4, dtype=np.float16)
    snap = bits_of(a)
    a[0] = 9
    assert not np.array_equal(snap, bits_of(a))
    assert bits_of(None) is None
