"""Shared fixtures: dtype pairs, ISA levels, and a switch that forces the
parallel code paths on small inputs."""

import os
import sys

import numpy as np
import pytest
from ml_dtypes import bfloat16

# the default policy, whatever this machine has tuned and cached (tests/test_tune.py loads its own)
os.environ["CYNORM_POLICY"] = "off"

import cynorm  # noqa: E402
from cynorm import _isa  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # for `import reference`

BF16 = np.dtype(bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

#: every supported (x dtype, param dtype) pair, with a readable id
PAIRS = [
    pytest.param((F32, F32), id="f32"),
    pytest.param((F64, F64), id="f64"),
    pytest.param((BF16, BF16), id="bf16"),
    pytest.param((BF16, F32), id="bf16-f32"),
    pytest.param((F16, F16), id="f16"),
    pytest.param((F16, F32), id="f16-f32"),
]

LEVELS = _isa.available_levels()


def pytest_configure(config):
    # here rather than in pyproject.toml: a copy of tests/ run against the
    # installed package (wheel or conda test step) sees no pyproject
    config.addinivalue_line("markers", "slow: long or memory-hungry tests (opt in with -m slow)")


def pytest_collection_modifyitems(config, items):
    """Slow tests are opt-in: deselected unless the caller picks with -m."""
    slow = [item for item in items if "slow" in item.keywords]
    if slow and not config.option.markexpr:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]


@pytest.fixture(params=LEVELS)
def isa_level(request):
    """Run the test once per ISA level this machine can run."""
    with _isa.using(request.param):
        yield request.param


@pytest.fixture
def force_parallel():
    """Make even tiny inputs take the multi-threaded (and team) code paths."""
    kernels = _isa.kernels
    old = kernels._policy("min_elems_per_thread", 1)
    old_over = kernels.set_oversubscribe(True)   # odd partitions (3, 8 threads) even on 2 cores
    try:
        yield
    finally:
        kernels._policy("min_elems_per_thread", old)
        kernels.set_oversubscribe(old_over)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def make_inputs(rng, shape, axis, pair, scale=3.0, offset=1.0, affine=True):
    """x, dy (x dtype) and weight, bias (param dtype) for normalizing over shape[axis:]."""
    xd, pd = pair
    x = (rng.standard_normal(shape) * scale + offset).astype(xd)
    dy = rng.standard_normal(shape).astype(xd)
    ns = tuple(shape)[axis:]
    w = (1 + 0.5 * rng.standard_normal(ns)).astype(pd) if affine else None
    b = (0.5 * rng.standard_normal(ns)).astype(pd) if affine else None
    return x, dy, w, b


# ------------------------------------------------------------ bit comparisons --
# (tests/test_helpers.py tests these)

def bits_of(a):
    """A snapshot of a's bytes (a copy, as uint8), or None for None: what a later
    comparison with np.array_equal sees bit for bit."""
    return None if a is None else np.ascontiguousarray(np.asarray(a)).view(np.uint8).copy()


def same_bits(a, b):
    """Whether a and b are both None, or arrays (NumPy, JAX, anything np.asarray takes)
    of one dtype and shape whose bytes are equal: every bit, NaN payloads and the sign
    of zero included (NaN == NaN here; 0.0 and -0.0 differ)."""
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits_of(a), bits_of(b))


def assert_same_bits(a, b, what="arrays"):
    """Fail, naming `what` and the first element that differs, unless same_bits(a, b)."""
    if same_bits(a, b):
        return
    if a is None or b is None:
        raise AssertionError(f"{what}: one is None ({a is None}, {b is None})")
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        raise AssertionError(f"{what}: {a.dtype}{a.shape} against {b.dtype}{b.shape}")
    ua = a.view(f"u{a.dtype.itemsize}").reshape(-1)
    ub = b.view(f"u{b.dtype.itemsize}").reshape(-1)
    i = int(np.flatnonzero(ua != ub)[0])
    raise AssertionError(f"{what}: bits differ at flat index {i} ({a.reshape(-1)[i]!r} against "
                         f"{b.reshape(-1)[i]!r}; {int(np.count_nonzero(ua != ub))} of {ua.size} elements)")


def fmt_of(dtype):
    return {BF16: "bfloat16", F16: "float16", F32: "float32"}.get(np.dtype(dtype))
