"""Shared fixtures: dtype pairs, ISA levels, and a switch that forces the
parallel code paths on small inputs."""

import os
import sys

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa

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
    old_over = kernels._policy("oversubscribe", 1)   # odd partitions (3, 8 threads) even on 2 cores
    try:
        yield
    finally:
        kernels._policy("min_elems_per_thread", old)
        kernels._policy("oversubscribe", old_over)


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


def fmt_of(dtype):
    return {BF16: "bfloat16", F16: "float16", F32: "float32"}.get(np.dtype(dtype))
