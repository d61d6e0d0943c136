"""Pick the kernels' ISA level that this CPU can run, once, at import.

The orchestration (cynorm._core) is compiled once, at baseline flags. Each
level's row kernels are separate C units compiled with that level's flags,
each exporting one table of function pointers; _core calls a level's
functions only after use_level(), which this module calls once the CPU (and
the OS, via XGETBV) are known to support the level.

``CYNORM_ISA=<level>`` forces a level; an unknown level or one this CPU cannot
run makes ``import cynorm`` fail with a message that lists the choices.
"""

import contextlib
import os

from . import _core, _cpuinfo

#: Levels from lowest to highest.
LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")

_AVX2 = frozenset({"avx2", "fma", "f16c"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
#: CPU features each level needs.
REQUIRED_FEATURES = {
    "baseline": frozenset(),
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512_bf16": _AVX512 | {"avx512_bf16"},
}

ENV_VAR = "CYNORM_ISA"
#: comma list of features to pretend this CPU lacks (for testing fallbacks)
MASK_VAR = "CYNORM_CPU_MASK"


def cpu_features():
    """SIMD features that this CPU and OS support (a frozenset of names), minus
    any listed in CYNORM_CPU_MASK."""
    masked = {f.strip() for f in os.environ.get(MASK_VAR, "").split(",") if f.strip()}
    return _cpuinfo.features() - masked


def compiled_levels():
    """Levels this installation was built with (lowest first)."""
    built = set(_core.compiled_levels())
    return [lvl for lvl in LEVELS if lvl in built]


def available_levels():
    """Levels that are both compiled and runnable on this CPU (lowest first)."""
    features = cpu_features()
    return [lvl for lvl in compiled_levels() if REQUIRED_FEATURES[lvl] <= features]


def _load(level):
    if level not in LEVELS:
        raise ValueError(f"unknown ISA level {level!r}; the levels are {', '.join(LEVELS)} "
                         f"(this CPU can run: {', '.join(available_levels())})")
    available = available_levels()
    if level not in available:
        missing = sorted(REQUIRED_FEATURES[level] - cpu_features())
        why = (f"this CPU lacks {', '.join(missing)}" if missing
               else "this installation was built without it")
        raise ValueError(f"ISA level {level!r} cannot be used: {why}. "
                         f"Levels available here: {', '.join(available)}")
    _core.use_level(level)
    return _core


def _initial_level():
    forced = os.environ.get(ENV_VAR, "").strip()
    if forced:
        try:
            _load(forced)
        except ValueError as exc:
            raise ImportError(f"{ENV_VAR}={forced!r}: {exc}") from None
        return forced
    return available_levels()[-1]


def _cache_bytes(sysconf_name, index):
    try:
        size = os.sysconf(sysconf_name)   # glibc
        if size > 0:
            return int(size)
    except (ValueError, OSError, AttributeError):
        pass
    try:   # other Linux C libraries: sysfs (on x86 and arm64, index2 is the L2, index3 the L3)
        with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
            text = f.read().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return 0


def l3_cache_bytes():
    """The last-level (L3) cache size the OS reports, in bytes; 0 when unknown."""
    return _cache_bytes("SC_LEVEL3_CACHE_SIZE", 3)


def l2_cache_bytes():
    """The per-core L2 cache size the OS reports, in bytes; 0 when unknown."""
    return _cache_bytes("SC_LEVEL2_CACHE_SIZE", 2)


#: An L3 this large is a mesh shared by many cores: one core reads it slowly
#: (Xeon, 480 MB L3: 29 GB/s from 16 MB arrays, 115 from its 2 MB L2), unlike
#: the 32 MB L3 of an AMD CCD that the defaults were measured on.
MESH_L3_BYTES = 64 << 20
#: Group budget for long rows: a sixteenth of the L3, at least the 8 MB measured on
#: Zen 3/5 (32 MB L3), at most 32 MB (16 rows of 2 MB, the most a group takes).
GROUP_BYTES_MIN, GROUP_BYTES_MAX = 8 << 20, 32 << 20


def long_group_bytes(l3_bytes):
    """Bytes of rows the kernels take as one group when rows are too long to be
    read twice from L2 (see LONG_GROUP_BYTES in _kernels.pxi). A larger L3 holds
    larger groups, which read the weight/bias and block partials fewer times."""
    return min(max(l3_bytes // 16, GROUP_BYTES_MIN), GROUP_BYTES_MAX)


def cache_policies(l2_bytes, l3_bytes, long_row_bytes):
    """The kernels' cache-dependent scheduling for these cache sizes (none changes a bit);
    long_row_bytes is the kernels' own long_row_bytes() (CN_LONG_ROW_BYTES):

    - ``long_group_bytes``: see long_group_bytes();
    - ``parts_in_a_bytes``: one thread adds the backward's block partials a pair of
      rows at a time while they take at most this much (4 MB, measured on Zen 5);
      on a mesh L3 only while they fit in L2, since each pair rereads them;
    - ``bwd_a_by_chunk``: 1, column-chunk walks with more threads only; 2 (mesh
      L3) also with one thread when the pairs do not take the partials;
    - ``fresh_plain_row_bytes``: fresh outputs of rows up to this long are written
      with plain stores instead of non-temporal ones: 0 (never) but on a mesh L3,
      where every row but the long ones (longer than long_row_bytes) is;
    - ``prefetch_into_l2``: 1 (mesh L3) has the forward's row paths prefetch the
      next rows into L2 instead of L1 while they normalize a row (PREFETCH_INTO_L2 in _kernels.pxi).

    Measured on the Xeon (2 MB L2, 480 MB L3), 1 thread, out=: partials of 3.2 MB,
    (64,401408) bf16, pairs 21.0 ms, chunks 19.3; partials of 0.3-0.8 MB,
    (512,100000) and (2048,40000) bf16, pairs 34.3 / 47.7, chunks 38.3 / 56.8.
    Next rows into L2, forward, time against L1, medians of alternating rounds:
    out=, 1 thread, (4096,4096) bf16 0.95, mixed 0.95, fp32 0.98, (16384,1024) bf16
    0.95; 2 threads 0.95-0.99; allocating (recycled outputs), (4096,4096) fp32
    0.85-0.94, bf16 0.94-0.96, (16384,1024) 0.98-1.01. The long-row walk lost with it
    (C,H,W bf16 1.05-1.12), and so did the backward's row path now and then
    ((4096,4096) fp32, allocating, 11.4 ms against 14-15 in some runs): both keep L1."""
    mesh = l3_bytes >= MESH_L3_BYTES
    return {
        "long_group_bytes": long_group_bytes(l3_bytes),
        "parts_in_a_bytes": (l2_bytes or 1 << 20) if mesh else 4 << 20,
        "bwd_a_by_chunk": 2 if mesh else 1,
        "fresh_plain_row_bytes": long_row_bytes if mesh else 0,
        "prefetch_into_l2": 1 if mesh else 0,
    }


def _load_with_policy(name):
    module = _load(name)
    if os.environ.get("CYNORM_OVERSUBSCRIBE", "").strip() not in ("", "0"):
        module._policy("oversubscribe", 1)   # allow num_threads above the core count
    for policy, value in cache_policies(l2_cache_bytes(), l3_cache_bytes(), module.long_row_bytes()).items():
        module._policy(policy, value)
    return module


#: Name of the level in use, and its module (what _api calls).
level = _initial_level()
kernels = _load_with_policy(level)


def use(name):
    """Switch the active level for the whole process (used by the tests)."""
    global level, kernels
    kernels = _load_with_policy(name)
    level = name


@contextlib.contextmanager
def using(name):
    """Context manager: run a block with another ISA level, then switch back."""
    previous = level
    use(name)
    try:
        yield
    finally:
        use(previous)
