"""show_config(): what this installation is and what it will use."""

import platform
import sys

import numpy as np

from . import _alloc, _isa
from ._version import __version__


def _openmp_runtime():
    """The OpenMP library threadpoolctl sees in this process (or None)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    for info in threadpool_info():
        if info.get("user_api") == "openmp":
            return {"internal_api": info.get("internal_api"), "filepath": info.get("filepath"),
                    "version": info.get("version"), "num_threads": info.get("num_threads")}
    return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _tune_status():
    from . import _tune
    return _tune.status()


def config():
    """The configuration as a dict (what show_config prints)."""
    import ml_dtypes

    kernels = _isa.kernels
    return {
        "version": __version__,
        "isa": _isa.level,
        "isa_available": _isa.available_levels(),
        "isa_compiled": _isa.compiled_levels(),
        "cpu_features": sorted(_isa.cpu_features()),
        "cpu_model": _cpu_model(),
        "openmp": bool(kernels.openmp()),
        "openmp_runtime": _openmp_runtime(),
        "max_threads": int(kernels.max_threads()),
        "hugepage_outputs": bool(_alloc.enabled),
        "recycle_limit_bytes": int(_alloc.recycle_limit()),
        "l2_cache_bytes": _isa.l2_cache_bytes(),
        "l3_cache_bytes": _isa.l3_cache_bytes(),
        # what the kernels use now (set from the caches at import; see _isa.cache_policies)
        "cache_policies": {name: int(kernels._policy(name)) for name in _isa.cache_policies(0, 0, 0)},
        "policy": _tune_status(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "platform": platform.platform(),
    }


def show_config():
    """Print a readable summary of cynorm's build and runtime, and return it as a dict.

    Keys include ``version``, ``isa`` (the level in use), ``isa_available``
    (levels this CPU can run, lowest first, starting with ``"baseline"``),
    ``openmp`` (built with OpenMP?), ``max_threads`` (the default thread count) and
    ``hugepage_outputs`` (large outputs on huge pages? see the README's Memory section) and
    ``policy`` (whether a measured policy, cynorm.tune(), is loaded, and from where).
    """
    cfg = config()
    omp = cfg["openmp_runtime"]
    lines = [
        f"cynorm {cfg['version']}",
        f"  ISA level in use : {cfg['isa']}   (set CYNORM_ISA to force another)",
        f"  ISA levels here  : {', '.join(cfg['isa_available'])}",
        f"  compiled levels  : {', '.join(cfg['isa_compiled'])}",
        f"  CPU              : {cfg['cpu_model']}",
        f"  CPU features     : {', '.join(cfg['cpu_features']) or '(none detected)'}",
        f"  OpenMP           : {'yes' if cfg['openmp'] else 'no (serial build)'}"
        + (f", {omp['internal_api']} {omp['version'] or ''} ({omp['filepath']})" if omp else ""),
        f"  default threads  : {cfg['max_threads']}   (OMP_NUM_THREADS / threadpoolctl)",
        f"  huge-page outputs: {'yes' if cfg['hugepage_outputs'] else 'no'}   (outputs >= 1 MiB; CYNORM_HUGEPAGES=0 to turn off)",
        f"  recycled outputs : up to {cfg['recycle_limit_bytes'] / 2**20:g} MiB kept   (CYNORM_RECYCLE_MB)",
        f"  caches           : L2 {cfg['l2_cache_bytes'] / 2**20:g} MiB, L3 {cfg['l3_cache_bytes'] / 2**20:g} MiB"
        f"   (long-row groups up to {cfg['cache_policies']['long_group_bytes'] / 2**20:g} MiB)",
        "  policy           : " + (f"tuned, {cfg['policy']['decisions']} measured decisions in "
                                   f"{cfg['policy']['classes']} classes ({cfg['policy']['path']})"
                                   if cfg["policy"]["tuned"] else
                                   "the defaults   (cynorm.tune() measures this machine's; CYNORM_POLICY)"),
        f"  python {cfg['python']}, numpy {cfg['numpy']}, ml_dtypes {cfg['ml_dtypes']}",
    ]
    print("\n".join(lines))
    return cfg
