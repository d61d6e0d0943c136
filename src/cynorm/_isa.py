"""Pick the kernels' ISA level that this CPU can run, once, at import.

The orchestration (cynorm._core) is compiled once, at baseline flags. Each
level's row kernels are separate C units compiled with that level's flags,
each exporting one table of function pointers; _core calls a level's
functions only after use_level(), which this module calls once the CPU (and
the OS, via XGETBV) are known to support the level. The levels, their order
and the features each needs come from meson.build's table (_core.tables()).

``CYNORM_ISA=<level>`` forces a level; an unknown level or one this CPU cannot
run makes ``import cynorm`` fail with a message that lists the choices.
"""

import contextlib
import os

from . import _core

_TABLE = _core.tables()["levels"]
#: Every level of the table, lowest (least preferred) first.
LEVELS = tuple(row["name"] for row in _TABLE)
#: CPU features each level needs.
REQUIRED_FEATURES = {row["name"]: frozenset(row["features"]) for row in _TABLE}

ENV_VAR = "CYNORM_ISA"
#: comma list of features to pretend this CPU lacks (for testing fallbacks)
MASK_VAR = "CYNORM_CPU_MASK"


def cpu_features():
    """SIMD features that this CPU and OS support (a frozenset of names), minus
    any listed in CYNORM_CPU_MASK."""
    masked = {f.strip() for f in os.environ.get(MASK_VAR, "").split(",") if f.strip()}
    return _core.cpu_features() - masked


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


def long_group_bytes(l3_bytes):
    """Bytes of rows the kernels take as one group when rows are too long to be
    read twice from L2: a sixteenth of the L3, within 8 and 32 MB (the policy's
    long_group_bytes, include/cn_policy.h)."""
    return _core.cache_tunables(0, l3_bytes, _core.long_row_bytes())["long_group_bytes"]


def cache_policies(l2_bytes, l3_bytes, long_row_bytes):
    """The tunables the policy derives from these cache sizes (core/policy.c,
    cn_tunables_for): long_group_bytes, parts_in_a_bytes, bwd_a_by_chunk,
    fresh_plain_row_bytes, short_prefetch_bytes (long_row_bytes is the
    long-row bound to use).
    None changes a bit; benchmarks/POLICY.md has the measurements."""
    return _core.cache_tunables(l2_bytes, l3_bytes, long_row_bytes)


def _load_with_policy(name):
    module = _load(name)
    module.set_caches(l2_cache_bytes(), l3_cache_bytes())
    if os.environ.get("CYNORM_OVERSUBSCRIBE", "").strip() not in ("", "0"):
        module.set_oversubscribe(True)   # allow num_threads above the core count
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
