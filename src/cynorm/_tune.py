"""cynorm.tune(): measure this machine's policy once, keep the winners, reuse them.

The policy's defaults (include/cn_policy.h) are right on the CPU kinds they were
measured on; on another kind some lose. tune() times, on this machine, the
decisions that kinds disagree on: for each class of call (direction, 16-bit or
wider data, row class, one thread or all), a representative cell with each
relevant tunable at its default and at its alternative, alternating round by
round, and keeps an alternative only where it is faster beyond noise twice.
The winners go to a per-user cache file keyed by the CPU, its caches and
cynorm's version; `import cynorm` loads that file when the key matches
(FFTW's wisdom: measured once, reused, never required). No tunable changes a
result bit, so a tuned policy gives the same bits as the defaults.

    CYNORM_POLICY=off      the defaults, whatever is cached
    CYNORM_POLICY=<file>   that file's policy (a file for another machine: a warning)
"""

import hashlib
import json
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np

from . import _core, _isa
from ._version import __version__

ENV_VAR = "CYNORM_POLICY"
NEVER = 1 << 60
MARGIN = 0.03           # an alternative must be this much faster, twice

#: the cells that stand for each row class (32-bit and 16-bit data alike): the first
#: decides; the others are guards, small arrays of the same class that an alternative
#: must not slow down beyond noise (a setting that helps a large array can cost a
#: small one its few microseconds)
CELLS = {"short": [(262144, 56), (32, 56)], "medium": [(16384, 1024), (32, 128)], "rows": [(4096, 4096), (8, 4096)],
         "long": [(64, 200704)]}
#: a measured call of a guard cell repeats the kernel until it takes about this long
GUARD_SECONDS = 200e-6

_ROW_CLASS_NAMES = {"short": "rows of <= 64", "medium": "rows of <= 8 KB", "rows": "rows of <= 64 KB",
                    "long": "longer rows"}

#: (direction, row class) -> the tunables measured there, each with its alternatives
#: (a function of the value in use: the other settings worth trying)
_OFF_OR_ON = {
    "medium_block_bytes": lambda v: [0] if v else [32 << 10],
    "prefetch_max": lambda v: [0] if v else [8192],
    "short_prefetch_bytes": lambda v: [0] if v else [8 << 10],
    "long_row_bytes": lambda v: [NEVER] if v < NEVER else [64 << 10],
    "long_group_bytes": lambda v: [8 << 20] if v > 8 << 20 else [32 << 20],
    "bwd_group_bytes": lambda v: [0] if v else [256 << 10],
    "part_cache_bytes": lambda v: [NEVER] if v < NEVER else [256 << 10],
    "parts_in_a_bytes": lambda v: [0] if v else [1 << 30],
    "bwd_a_by_chunk": lambda v: [a for a in (0, 1, 2) if a != v],
}
PLAN = {
    ("fwd", "short"): ["short_prefetch_bytes"],
    ("fwd", "medium"): ["medium_block_bytes", "prefetch_max"],
    ("fwd", "rows"): ["prefetch_max"],
    ("fwd", "long"): ["long_row_bytes", "long_group_bytes", "prefetch_max"],
    ("bwd", "medium"): ["bwd_group_bytes", "prefetch_max", "part_cache_bytes"],
    ("bwd", "rows"): ["bwd_group_bytes", "prefetch_max", "part_cache_bytes"],
    ("bwd", "long"): ["part_cache_bytes", "parts_in_a_bytes", "bwd_a_by_chunk", "long_group_bytes"],
}

#: what import loaded: {"path", "source": "cache" | "CYNORM_POLICY", "measured": {class: {tunable: value}}}
loaded = None


# ------------------------------------------------------------------ the key --

def machine_key():
    """What a tuned policy is valid for: this CPU, its caches and cores, the ISA level and cynorm."""
    from ._config import _cpu_model
    return {"cpu_model": _cpu_model(), "cpu_features": sorted(_isa.cpu_features()),
            "l2_bytes": _isa.l2_cache_bytes(), "l3_bytes": _isa.l3_cache_bytes(), "cores": os.cpu_count() or 1,
            "isa": _isa.level, "machine": platform.machine(), "version": __version__}


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cynorm")


def cache_path(key=None):
    """The cache file for this machine (or for `key`)."""
    key = machine_key() if key is None else key
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"policy-{digest}.json")


# ------------------------------------------------------------ load and keep --

def _classes_by_name():
    return {name: i for i, name in enumerate(_core.class_names())}


def apply(policy):
    """Make `policy` (a tune() result, or its "measured" part) the policy in use."""
    measured = policy.get("measured", policy)
    by_name = _classes_by_name()
    unknown = [c for c in measured if c not in by_name]
    if unknown:
        raise ValueError(f"cynorm: unknown policy classes {unknown}; the classes are {list(by_name)}")
    names = _core.tunable_names()
    unknown = sorted({k for vals in measured.values() for k in vals if k not in names})
    if unknown:   # a file from a cynorm whose tunables differ (bwd_far_bytes was folded)
        raise ValueError(f"cynorm: unknown tunables {unknown}; the tunables are {list(names)}")
    _core.set_class_tunables({by_name[c]: {k: int(v) for k, v in vals.items()} for c, vals in measured.items()})


def load(path, source="CYNORM_POLICY"):
    """Load a policy file; returns it. A file for another machine or version is
    loaded with a warning (the bits stay the same; only the speed may not)."""
    global loaded
    with open(path) as f:
        policy = json.load(f)
    if not isinstance(policy, dict) or "measured" not in policy:
        raise ValueError(f"cynorm: {path} is not a policy file written by cynorm.tune()")
    if policy.get("key") != machine_key():
        warnings.warn(f"cynorm: the policy in {path} was measured on another machine or cynorm version "
                      f"({policy.get('key', {}).get('cpu_model')}, {policy.get('key', {}).get('version')}); "
                      f"using it anyway, as {ENV_VAR} asks", RuntimeWarning, stacklevel=3)
    apply(policy)
    loaded = {"path": path, "source": source, "measured": policy["measured"]}
    return policy


def load_at_import():
    """The policy import uses: CYNORM_POLICY=off -> the defaults; =<file> -> that file;
    else this machine's cache file, where one matches. Never fails the import."""
    global loaded
    loaded = None
    choice = os.environ.get(ENV_VAR, "").strip()
    if choice.lower() == "off":
        return
    try:
        if choice:
            load(choice)
            return
        path = cache_path()
        if os.path.exists(path):
            with open(path) as f:
                policy = json.load(f)
            if policy.get("key") == machine_key():
                apply(policy)
                loaded = {"path": path, "source": "cache", "measured": policy["measured"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"cynorm: tuned policy not loaded ({exc}); using the defaults", RuntimeWarning)
        _core.set_class_tunables({})


def status():
    """How the policy in use came about, for show_config() and explain()."""
    if loaded is None:
        return {"tuned": False, "source": "defaults", "path": None, "classes": 0, "decisions": 0}
    return {"tuned": True, "source": loaded["source"], "path": loaded["path"], "classes": len(loaded["measured"]),
            "decisions": sum(len(v) for v in loaded["measured"].values())}


# -------------------------------------------------------------- measuring --

def _data(shape, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    dy = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(shape[1], dtype=np.float32)).astype(dtype)
    b = (0.1 * rng.standard_normal(shape[1], dtype=np.float32)).astype(dtype)
    import cynorm
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
    return {"x": x, "dy": dy, "w": w, "b": b, "mean": mean, "rstd": rstd,
            "fwd_out": (y, np.empty_like(mean), np.empty_like(rstd)),
            "bwd_out": (np.empty_like(x), np.empty_like(w), np.empty_like(b))}


def _call(d, direction, threads):
    import cynorm
    if direction == "fwd":
        return lambda: cynorm.layer_norm_forward(d["x"], d["w"], d["b"], num_threads=threads, out=d["fwd_out"])
    return lambda: cynorm.layer_norm_backward(d["dy"], d["x"], d["mean"], d["rstd"], d["w"], num_threads=threads,
                                              out=d["bwd_out"])


def _round(fn, budget):
    fn()
    times = []
    end = time.perf_counter() + budget
    while len(times) < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _compare(fn, settings, rounds, budget, measure=None):
    """Median time of fn under each setting (a callable that installs it), the
    settings alternating round by round in a rotating order."""
    measure = measure or _round
    got = [[] for _ in settings]
    for r in range(rounds):
        order = list(range(len(settings)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            settings[i]()
            got[i].append(measure(fn, budget))
    return [statistics.median(g) for g in got]


def decide(fn, cls, name, current, install, rounds, budget, measure=None, guards=(), policy_of=None):
    """Whether an alternative of tunable `name` beats its value in class `cls`: each
    alternative timed against the value in use, kept only where it is MARGIN faster in
    two separate comparisons on `fn` and no more than MARGIN slower on any of `guards`
    (other calls of the same class). Returns (value to keep, {alternative: time ratio});
    a guard's veto shows as its ratio, above 1. measure(fn, budget, cls): a stand-in
    for the clock (tests). policy_of(): fn's whole policy under the tunables installed
    now; an alternative that leaves it as it is is not timed (16-bit short rows, for
    one, do not read short_prefetch_bytes)."""
    measure = _round if measure is None else (lambda f, b, m=measure: m(f, b, cls))
    base = current.get(name, _core.tunables(cls)[name])
    best, ratios = base, {}
    for alt in _OFF_OR_ON[name](base):
        with_best = lambda: install(cls, dict(current, **{name: best}))     # noqa: E731
        with_alt = lambda: install(cls, dict(current, **{name: alt}))       # noqa: E731
        if policy_of is not None and _same_policy(policy_of, with_best, with_alt):
            continue
        times = _compare(fn, [with_best, with_alt], rounds, budget, measure)
        ratio = times[1] / times[0]
        if ratio < 1 - MARGIN:   # confirm: a second comparison, the order turned around
            again = _compare(fn, [with_alt, with_best], rounds, budget, measure)
            ratio = max(ratio, again[0] / again[1])
        for guard in guards if ratio < 1 - MARGIN else ():
            times = _compare(guard, [with_best, with_alt], rounds, budget, measure)
            if times[1] / times[0] > 1 + MARGIN:
                ratio = times[1] / times[0]
                break
        ratios[alt] = ratio
        if ratio < 1 - MARGIN:
            best = alt
    install(cls, dict(current, **{name: best}))
    return best, ratios


def _same_policy(policy_of, *settings):
    """Whether the call gets the same policy under each of the settings."""
    policies = []
    for install in settings:
        install()
        policies.append(policy_of())
    return all(p == policies[0] for p in policies)


def _policy_of(d, direction, threads):
    """The whole policy of _call(d, direction, threads) under the tunables installed now."""
    from ._api import _policy_of as policy
    backward = direction == "bwd"
    out = d["bwd_out" if backward else "fwd_out"][0]
    return lambda: policy(d["x"], d["w"], -1, threads, "layer_norm", backward, out, every_field=True)[0]


def _repeated(fn):
    """fn, repeated so that one call of the result takes about GUARD_SECONDS."""
    fn()
    t0 = time.perf_counter()
    fn()
    reps = max(1, int(GUARD_SECONDS / max(time.perf_counter() - t0, 1e-7)))

    def calls():
        for _ in range(reps):
            fn()
    return calls


def _progress(done, total, what, start, out):
    if out is None:
        return
    width = 30
    filled = int(width * done / max(total, 1))
    out.write(f"\rcynorm.tune [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
              f"{time.perf_counter() - start:5.0f} s  {what[:48]:<48}")
    out.flush()


def tune(seconds=120, *, threads=None, save=True, path=None, progress=True, _measure=None):
    """Measure this machine's policy decisions (about `seconds` in all), apply the
    winners and keep them in the cache file (or `path`) for later imports.

    Each class of call (direction, 16-bit or 32/64-bit data, row class, one thread or
    `threads`, default all cores) is timed on one representative cell with out=
    preallocated; an alternative replaces a default only where it is at least 3%
    faster in two comparisons. Returns the policy written: {"key", "measured":
    {class: {tunable: value}}, "ratios": ...}. Tuning changes no result bit."""
    import ml_dtypes
    out = sys.stderr if progress else None
    all_threads = threads or _core.max_threads()
    thread_counts = [1] + ([all_threads] if all_threads > 1 else [])
    names = _core.class_names()
    jobs = []
    for (direction, rows), tunables in PLAN.items():
        for dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
            for t in thread_counts:
                jobs.append((direction, rows, dtype, t, tunables))
    total = sum(len(j[4]) for j in jobs)
    rounds = 3
    # each decision: about 2 comparisons x rounds x 2 settings of `budget`, plus its data and warm-up
    budget = max(0.01, seconds / (total * rounds * 2 * 2.2))
    _core.set_class_tunables({})
    measured, ratios, current_by_cls = {}, {}, {}

    def install(cls, values):
        current_by_cls[cls] = values
        _core.set_class_tunables({c: v for c, v in current_by_cls.items() if v})

    start = time.perf_counter()
    done = 0
    data_key, data = None, None
    try:
        for direction, rows, dtype, t, tunables in jobs:
            shape, *guard_shapes = CELLS[rows]
            if data_key != (rows, dtype):
                data_key, data = (rows, dtype), None
                data = [_data(s, dtype) for s in CELLS[rows]]
            pair = 0 if dtype.itemsize == 4 else 2
            cls = _core.class_of(direction == "bwd", pair, shape[0], shape[1], t)
            for s in CELLS[rows]:
                if _core.class_of(direction == "bwd", pair, s[0], s[1], t) != cls:
                    raise ValueError(f"cynorm.tune: cell {s} of {dtype} is not in class {names[cls]!r}")
            if _ROW_CLASS_NAMES[rows] not in names[cls]:
                raise ValueError(f"cynorm.tune: cell {shape} of {dtype} is in class {names[cls]!r}, not {rows}")
            fn = _call(data[0], direction, t)
            fn()
            guards = [_repeated(_call(d, direction, t)) for d in data[1:]]
            current = {}
            for name in tunables:
                _progress(done, total, f"{names[cls]}: {name}", start, out)
                value, r = decide(fn, cls, name, current, install, rounds, budget, _measure, guards,
                                  _policy_of(data[0], direction, t))
                ratios.setdefault(names[cls], {})[name] = {str(k): round(v, 3) for k, v in r.items()}
                if value != _core.tunables(-1)[name]:
                    current[name] = value
                install(cls, current)
                done += 1
            if current:
                measured[names[cls]] = current
    finally:
        data = None
        _progress(done, total, "done", start, out)
        if out is not None:
            out.write("\n")
    policy = {"key": machine_key(), "measured": measured, "ratios": ratios,
              "seconds": round(time.perf_counter() - start, 1), "threads": thread_counts,
              "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    apply(policy)
    global loaded
    target = path or cache_path()
    if save:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        tmp = target + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(policy, f, indent=1, sort_keys=True)
        os.replace(tmp, target)
    loaded = {"path": target if save else None, "source": "tune()", "measured": measured}
    return policy


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m cynorm.tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=120, help="about how long to measure (default 120)")
    p.add_argument("--threads", type=int, help="the 'all threads' count (default: every core)")
    p.add_argument("--output", help="write the policy here instead of the per-user cache file")
    args = p.parse_args(argv)
    policy = tune(args.seconds, threads=args.threads, path=args.output)
    print(f"measured in {policy['seconds']} s; written to {args.output or cache_path()}")
    if not policy["measured"]:
        print("every default held its own: nothing differs from them")
    for cls, values in policy["measured"].items():
        print(f"  {cls}: " + ", ".join(f"{k} = {v}" for k, v in values.items()))
