"""One arithmetic order on every CPU: every ISA level this machine can run gives
the same bits, and they are the bits in tests/golden_hashes.json, written on
another machine. So a laptop (AVX2), a server (AVX-512) and CI agree.

The cases: LayerNorm, RMSNorm and GroupNorm x every dtype pair x 1 and 2 threads x rows from 16
to 33000 elements (in registers, medium, chunked, the team path), C,H,W, an
8 MB array (streaming stores), and rows full of specials (NaN, inf, subnormals,
1e30, constant rows). Inputs come from integer hashing, not from NumPy's random
generators, whose streams may change between NumPy versions. NaN outputs are
hashed as one NaN: their sign and payload bits follow the order of an
instruction's operands, which compilers may swap (see the README).

    python tests/test_golden.py --write     # rewrite the golden file (every level must agree first)
"""

import hashlib
import json
import os
import sys
import zlib

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden_hashes.json")
PAIRS = [("float32", "float32"), ("float64", "float64"), ("bfloat16", "bfloat16"),
         ("bfloat16", "float32"), ("float16", "float16"), ("float16", "float32")]
DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
          "bfloat16": np.dtype(bfloat16), "float16": np.dtype(np.float16)}
#: (shape, axis, specials)
SHAPES = [((3, 8, 16), 2, False), ((37, 16), 1, False), ((50, 24), 1, False), ((33, 56), 1, False),
          ((21, 64), 1, False), ((20, 65), 1, False), ((17, 300), 1, False), ((9, 1024), 1, False),
          ((7, 2100), 1, False), ((5, 4100), 1, False), ((3, 9000), 1, False), ((2, 33000), 1, False),
          ((2, 8, 28, 28), 1, False), ((1024, 2048), 1, False), ((9, 300), 1, True), ((9, 2500), 1, True)]
#: GroupNorm: (shape, num_groups, channel_axis, specials): channels-first and -last, no
#: spatial dims, 3-d, InstanceNorm, one group of 8192 (chunked moments), a channel tail
GROUP_SHAPES = [((2, 32, 5, 7), 8, 1, False), ((2, 5, 7, 32), 8, -1, False), ((3, 12), 3, 1, False),
                ((2, 6, 4, 3, 5), 6, 1, False), ((2, 4, 3, 5, 6), 6, -1, False), ((2, 8, 32, 32), 1, 1, False),
                ((2, 17, 19, 40), 4, -1, False), ((3, 40, 9, 9), 40, 1, False), ((4, 8, 30), 2, 1, True),
                ((4, 30, 8), 2, -1, True)]


def _uniform(n, seed):
    """n numbers in [0, 1) from splitmix64 of (seed, index): the same on every machine."""
    z = np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float64) * 2.0 ** -24   # exact


def _normalish(shape, seed, scale, offset):
    n = int(np.prod(shape))
    s = sum(_uniform(n, seed * 4 + k) for k in range(4)) - 2.0   # Irwin-Hall: exact in float64
    return (s * scale + offset).reshape(shape)


_SPECIALS = np.array([np.nan, np.inf, -np.inf, 1e-40, -1e-42, 3e38, -3e38, 0.0, -0.0, 1e-30])


def _inputs(shape, axis, specials, pair, seed):
    xd, pd = DTYPES[pair[0]], DTYPES[pair[1]]
    x = _normalish(shape, seed, 3.0, 1.0)
    dy = _normalish(shape, seed + 1, 1.0, 0.0)
    if specials:   # every 7th element a special; row 0 constant, row 1 huge, row 2 tiny
        flat = x.reshape(-1)
        pick = (_uniform(flat.size, seed + 2) * len(_SPECIALS)).astype(int)
        flat[::7] = _SPECIALS[pick[::7]]
        x[0], x[1], x[2] = 5.0, 1e30, 1e-38
    ns = shape[axis:] if isinstance(axis, int) else (shape[axis[1]],)   # GroupNorm: (num_groups, channel_axis)
    w = 1 + 0.5 * _normalish(ns, seed + 3, 1.0, 0.0)
    b = 0.5 * _normalish(ns, seed + 4, 1.0, 0.0)
    with np.errstate(over="ignore"):
        return x.astype(xd), dy.astype(xd), w.astype(pd), b.astype(pd)


def _digest(a):
    a = np.ascontiguousarray(a).copy()
    nan = np.isnan(a.astype(np.float32) if a.dtype.itemsize == 2 else a)
    a.view(f"u{a.itemsize}")[nan] = 0x7FC0 if a.itemsize == 2 else (0x7FC00000 if a.itemsize == 4 else 0x7FF8 << 48)
    return hashlib.sha256(a.view(np.uint8).tobytes() + str(a.shape).encode()).hexdigest()[:16]


def cases():
    for shape, axis, specials in SHAPES:
        for pair in PAIRS:
            for norm in ("layer", "rms"):
                for threads in (1, 2):
                    name = f"{norm} {pair[0]}/{pair[1]} {shape} axis={axis}{' specials' if specials else ''} T={threads}"
                    yield name, shape, axis, specials, pair, norm, threads
    for shape, G, channel_axis, specials in GROUP_SHAPES:
        for pair in PAIRS:
            for threads in (1, 2):
                name = (f"group {pair[0]}/{pair[1]} {shape} groups={G} channel_axis={channel_axis}"
                        f"{' specials' if specials else ''} T={threads}")
                yield name, shape, (G, channel_axis), specials, pair, "group", threads


def run_all():
    """{case: {output: digest}} at the level in use."""
    out = {}
    with np.errstate(all="ignore"):
        for name, shape, axis, specials, pair, norm, T in cases():
            x, dy, w, b = _inputs(shape, axis, specials, pair, zlib.crc32(str((shape, axis, pair)).encode()))
            if norm == "group":
                G, ca = axis
                y, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=ca, num_threads=T)
                dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=ca,
                                                        num_threads=T)
                got = dict(y=y, mean=mean, rstd=rstd, dx=dx, dweight=dw, dbias=db)
            elif norm == "layer":
                y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis, num_threads=T)
                dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis, num_threads=T)
                got = dict(y=y, mean=mean, rstd=rstd, dx=dx, dweight=dw, dbias=db)
            else:
                y, rstd = cynorm.rms_norm_forward(x, w, axis=axis, num_threads=T)
                dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w, axis=axis, num_threads=T)
                got = dict(y=y, rstd=rstd, dx=dx, dweight=dw)
            out[name] = {k: _digest(v) for k, v in got.items()}
    return out


def _by_level():
    results = {}
    for level in _isa.available_levels():
        with _isa.using(level):
            results[level] = run_all()
    return results


def _differences(got, want):
    return [f"{case}: {out}" for case in want for out in want[case]
            if got.get(case, {}).get(out) != want[case][out]]


@pytest.fixture(scope="module")
def by_level():
    return _by_level()


def test_every_level_gives_the_same_bits(by_level):
    levels = list(by_level)
    assert len(by_level[levels[0]]) == len(list(cases())) >= 350
    for level in levels[1:]:
        diff = _differences(by_level[level], by_level[levels[0]])
        assert not diff, f"{level} differs from {levels[0]} in {len(diff)} outputs, e.g. {diff[:5]}"


def test_every_level_gives_the_golden_bits(by_level):
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert set(golden["hashes"]) == {name for name, *_ in cases()}
    for level, got in by_level.items():
        diff = _differences(got, golden["hashes"])
        assert not diff, (f"{level} on this CPU differs from the golden file (written on {golden['written_on']}) "
                          f"in {len(diff)} outputs, e.g. {diff[:5]}")


#: other machines' policies: the bits must not follow the caches or any tunable
MACHINES = {
    "Zen 3 caches (512 KB L2, 32 MB L3)": ((512 << 10), (32 << 20), {}),
    "no cache sizes known": (0, 0, {}),
    "every output streamed, long rows from 4 KB": (None, None, {"stream_min_bytes": 0, "long_row_bytes": 4096}),
    # a measured policy (cynorm.tune()) with every class at the alternatives tune() tries
    "tuned: every class at its alternatives": (None, None, "tuned"),
}


def _tuned_everywhere():
    from cynorm import _tune
    values = {}
    for cls in range(len(_isa.kernels.class_names())):
        values[cls] = {}
        for name, alts in _tune._OFF_OR_ON.items():
            values[cls][name] = alts(_isa.kernels.tunables(-1)[name])[0]
    return values


@pytest.mark.parametrize("machine", MACHINES)
def test_other_machines_policies_give_the_golden_bits(machine):
    l2, l3, tunables = MACHINES[machine]
    kernels = _isa.kernels
    with open(GOLDEN) as f:
        golden = json.load(f)["hashes"]
    try:
        if l2 is not None:
            kernels.set_caches(l2, l3)
        if tunables == "tuned":
            kernels.set_class_tunables(_tuned_everywhere())
        else:
            for name, value in tunables.items():
                kernels._policy(name, value)
        diff = _differences(run_all(), golden)
    finally:
        kernels.reset_policy()
        kernels.set_caches(_isa.l2_cache_bytes(), _isa.l3_cache_bytes())
    assert not diff, f"{len(diff)} outputs differ, e.g. {diff[:5]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    results = _by_level()
    first = next(iter(results.values()))
    for level, got in results.items():
        assert not _differences(got, first), f"{level} disagrees: fix that before writing the golden file"
    from cynorm._config import config
    cfg = config()
    with open(GOLDEN, "w") as f:
        json.dump({"written_on": f"{cfg.get('cpu_model', 'unknown CPU')}, levels {', '.join(results)}",
                   "hashes": first}, f, indent=0, sort_keys=True)
    print(f"wrote {GOLDEN}: {len(first)} cases, levels {list(results)} agree")
