#!/usr/bin/env python
"""cynorm benchmarks, side by side with PyTorch (optional) and the memory floor.

    python benchmarks/bench.py seed [--threads N] [--axes chw|last|both] [--quick] [--aligned] [--json F]
    python benchmarks/bench.py roofline [--threads N] [--aligned] [--json F]
    python benchmarks/bench.py scaling --threads 1,2,4,8 [--quick] [--rounds R] --json F --plot P.png  (scaling.py)
    python benchmarks/bench.py jax | dask       (cynorm from JAX and Dask: benchmarks/frameworks.py)
    python benchmarks/bench.py fused [--threads N]  (fused residual add + LayerNorm: benchmarks/fused.py)
    python benchmarks/bench.py onednn [--threads N] [--onednn LIB[,LIB2]]  (against oneDNN: benchmarks/onednn.py)
    python benchmarks/bench.py groupnorm [--threads N] [--layouts nchw,nhwc] [--onednn LIB]  (benchmarks/groupnorm.py)

seed and roofline take --baseline-python PY: a second cynorm worker runs under
that interpreter (another build, e.g. the commit before a change; or, with
--baseline-env CYNORM_POLICY=off, this build with its default policy), alternating
with this one round by round, and the tables add its times and the speed ratio
(baseline time / this build's time: above 1, this build is faster).

Each library runs in its own worker process (two OpenMP runtimes in one process
disturb each other); the parent walks the cells and asks every worker in turn,
so each cell's numbers are taken side by side. Times are medians after
warm-up; progress goes to stderr, tables to stdout.

Floors (NumPy, same run): forward = np.copy(x) into a fresh array; backward =
an elementwise op of x and dy into a fresh array (16-bit data as uint16).
Floor efficiency = floor time / cynorm time.

torch is optional: without it the torch columns are empty. Install the CPU
build with `pip install torch==2.13.0`; THP_MEM_ALLOC_ENABLE=1 (its fastest
allocator) is set for the torch worker.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------ cases --

SEED_SHAPES = [(1, 8, 16), (8, 8, 16), (32, 8, 16), (64, 128, 56, 56), (64, 128, 256, 256)]
TRANSFORMER_SHAPES = [(4096, 4096), (16384, 1024)]
LARGE = 100_000  # cells with at least this many elements count as "large"


def cells_for(args):
    """The (shape, axis, mode) cells of a seed run."""
    shapes = [tuple(s) for s in args.shapes] if args.shapes else [
        s for s in SEED_SHAPES if not (args.quick and s == (64, 128, 256, 256))]
    axes = ["chw", "last"] if args.axes == "both" else [args.axes]
    cells = []
    for ax in axes:
        for shape in shapes:
            axis = 1 if ax == "chw" else len(shape) - 1
            for mode in args.modes:
                cells.append((shape, axis, mode))
        if ax == "last" and not args.shapes:
            for shape in TRANSFORMER_SHAPES:
                for mode in args.modes:
                    cells.append((shape, len(shape) - 1, mode))
    # the transformer rows are "last" cells; add them once for chw-only runs too
    if args.axes == "chw" and not args.shapes and not args.no_transformer:
        for shape in TRANSFORMER_SHAPES:
            for mode in args.modes:
                cells.append((shape, len(shape) - 1, mode))
    return cells


# ----------------------------------------------------------------- worker --
# (the worker side is benchmarks/worker.py)
sys.path.insert(0, HERE)
from worker import MODES, _worker_main  # noqa: E402


ROUNDS = 5


def _measure(workers, req, libs):
    """Median per library over ROUNDS rounds that take the libraries in turn
    (each library in its own process): a burst of system noise -- e.g. the
    kernel compacting memory for huge pages -- then hits every library alike."""
    pooled = {lib: {} for lib in libs}
    sub = dict(req, budget=req["budget"] / ROUNDS)
    for rnd in range(ROUNDS):
        order = libs[rnd % len(libs):] + libs[: rnd % len(libs)]
        for lib in order:
            res = workers[lib].ask(dict(sub, warmup=0.3 if rnd == 0 else 0.05))
            if "error" in res:
                pooled[lib]["error"] = res["error"]
            for key, samples in res.items():
                if isinstance(samples, list):
                    pooled[lib].setdefault(key, []).extend(samples)
    return {lib: {k: (_median(v) if isinstance(v, list) else v) for k, v in d.items()} for lib, d in pooled.items()}


class Worker:
    def __init__(self, lib, python=None, extra_env=None):
        env = dict(os.environ, **(extra_env or {}))
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS pools must not steal cores
        env.setdefault("MKL_NUM_THREADS", "1")
        if lib == "torch":
            env["THP_MEM_ALLOC_ENABLE"] = "1"
        self.lib = lib
        self.proc = subprocess.Popen([python or sys.executable, os.path.abspath(__file__), "_worker",
                                      "cynorm" if lib == "cynorm_base" else lib],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = json.loads(self.proc.stdout.readline() or '{"unavailable": "worker died"}')
        self.available = "ready" in hello
        self.info = hello

    def ask(self, req):
        if not self.available:
            return {}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.available = False
            return {"error": "worker died"}
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _progress(msg):
    print(msg, file=sys.stderr, flush=True)


def _machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu_model": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def _fmt(v, digits=None):
    if v is None:
        return ""
    if digits is None:
        digits = 4 if v < 0.01 else 3 if v < 1 else 2 if v < 100 else 1
    return f"{v:.{digits}f}"


def _geomean(vals):
    vals = [v for v in vals if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _median(vals):
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])


def _axes_name(shape, axis):
    return "last" if axis == len(shape) - 1 else "chw" if axis == 1 else f"axis={axis}"


def _workers(libs, args):
    workers = {lib: Worker(lib) for lib in libs}
    base_env = dict(kv.split("=", 1) for kv in (getattr(args, "baseline_env", None) or []))
    if getattr(args, "baseline_python", None) or base_env:
        workers["cynorm_base"] = Worker("cynorm_base", getattr(args, "baseline_python", None), base_env)
        if not workers["cynorm_base"].available:
            raise SystemExit(f"the baseline worker did not start: {workers['cynorm_base'].info}")
    return workers


def cmd_seed(args):
    libs = ["cynorm", "numpy"] + ([] if args.no_torch else ["torch"])
    workers = _workers(libs, args)
    if "torch" in workers and not workers["torch"].available:
        _progress(f"torch not available ({workers['torch'].info.get('unavailable')}): torch columns left empty")
    cells = cells_for(args)
    budget = 0.15 if args.quick else 0.5
    rows = []
    try:
        for i, (shape, axis, mode) in enumerate(cells, 1):
            n = math.prod(shape)
            big = n >= LARGE
            cell_budget = budget * (3 if n >= 1e8 else 1)
            req = {"shape": shape, "axis": axis, "mode": mode, "threads": args.threads, "norm": args.norm,
                   "budget": cell_budget, "directions": ["fwd", "bwd"], "aligned": args.aligned}
            _progress(f"[{i}/{len(cells)}] {shape} {_axes_name(shape, axis)} {mode} ...")
            libs = [lib for lib, w in workers.items() if w.available and (lib != "numpy" or big)]
            res = {lib: {} for lib in workers}
            res.update(_measure(workers, req, libs))
            for lib, r in res.items():
                if "error" in r:
                    _progress(f"  {lib}: {r['error']}")
            row = {"shape": list(shape), "axes": _axes_name(shape, axis), "mode": mode, "elements": n,
                   "threads": args.threads, "norm": args.norm}
            for d in ("fwd", "bwd"):
                c = res["cynorm"].get(d)
                t = res.get("torch", {}).get(d)
                f = res["numpy"].get(d)
                base = res.get("cynorm_base", {}).get(d)
                if "cynorm_base" in res:
                    row[f"{d}_base_ms"] = base * 1e3 if base else None
                    row[f"{d}_ab"] = (base / c) if (base and c) else None
                row[f"{d}_cynorm_ms"] = c * 1e3 if c else None
                row[f"{d}_torch_ms"] = t * 1e3 if t else None
                row[f"{d}_speedup"] = (t / c) if (c and t) else None
                row[f"{d}_floor_ms"] = f * 1e3 if f else None
                row[f"{d}_floor_eff"] = (f / c) if (c and f) else None
            rows.append(row)
    finally:
        for w in workers.values():
            w.close()
    meta = {"command": "seed", "threads": args.threads, "norm": args.norm, "machine": _machine(),
            "aligned": args.aligned,
            "cynorm": workers["cynorm"].info, "torch": workers.get("torch").info if "torch" in workers else None,
            "baseline": workers["cynorm_base"].info if "cynorm_base" in workers else None}
    _print_seed(rows, meta)
    if "cynorm_base" in workers:
        _print_ab(rows, meta, [("fwd", "fwd_cynorm_ms"), ("bwd", "bwd_cynorm_ms")])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        _progress(f"wrote {args.json}")
    return rows


def _print_seed(rows, meta):
    cfg = meta["cynorm"].get("config", {})
    tv = (meta.get("torch") or {}).get("version")
    print(f"\n### cynorm {meta['cynorm'].get('version')} ({cfg.get('isa')}) vs "
          f"{'torch ' + tv if tv else 'no torch'} -- {meta['norm']} norm, {meta['threads']} thread(s), "
          f"{meta['machine']['cpu_model']}{', 64-byte aligned inputs' if meta.get('aligned') else ''}\n")
    print("Times in ms (median). speedup = torch / cynorm. floor = NumPy copy (fwd) or elementwise op (bwd) "
          "into a fresh array; eff = floor / cynorm.\n")
    print("| shape | axes | mode | fwd cynorm | fwd torch | fwd speedup | bwd cynorm | bwd torch | bwd speedup "
          "| fwd floor | fwd eff | bwd floor | bwd eff |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {tuple(r['shape'])} | {r['axes']} | {r['mode']} | {_fmt(r['fwd_cynorm_ms'])} | "
              f"{_fmt(r['fwd_torch_ms'])} | {_fmt(r['fwd_speedup'], 2)} | {_fmt(r['bwd_cynorm_ms'])} | "
              f"{_fmt(r['bwd_torch_ms'])} | {_fmt(r['bwd_speedup'], 2)} | {_fmt(r['fwd_floor_ms'])} | "
              f"{_fmt(r['fwd_floor_eff'], 2)} | {_fmt(r['bwd_floor_ms'])} | {_fmt(r['bwd_floor_eff'], 2)} |")
    large = [r for r in rows if r["elements"] >= LARGE]
    effs = [r[f"{d}_floor_eff"] for r in large for d in ("fwd", "bwd") if r[f"{d}_floor_eff"]]
    sps = [r[f"{d}_speedup"] for r in large for d in ("fwd", "bwd") if r[f"{d}_speedup"]]
    tiny = [r[f"{d}_speedup"] for r in rows if r["elements"] < LARGE for d in ("fwd", "bwd") if r[f"{d}_speedup"]]
    print()
    if effs:
        print(f"Large cells (>= {LARGE:,} elements): floor efficiency median {_median(effs):.2f}, "
              f"min {min(effs):.2f} over {len(effs)} fwd/bwd cells.")
    if sps:
        print(f"Large cells vs torch: geometric-mean speedup {_geomean(sps):.2f}x, min {min(sps):.2f}x.")
    if tiny:
        print(f"Tiny cells vs torch: min speedup {min(tiny):.2f}x, geometric mean {_geomean(tiny):.2f}x.")


def _print_ab(rows, meta, directions):
    """This build against the baseline build, cell by cell (seed or roofline rows)."""
    base = meta.get("baseline") or {}
    print(f"\n### A/B: this build ({meta['cynorm'].get('version')}) against the baseline build "
          f"({base.get('config', {}).get('isa')}), {rows[0]['threads']} thread(s), alternating rounds\n")
    print("speed = baseline time / this build's time (above 1: this build is faster).\n")
    print("| shape | axes | mode | " + " | ".join(f"{d} ms | {d} base ms | {d} speed" for d, _ in directions) + " |")
    print("|---|---|---|" + "---:|---:|---:|" * len(directions))
    ratios, large = [], []
    for r in rows:
        cells = []
        for d, key in directions:
            new, old, ab = r.get(key), r.get(f"{d}_base_ms"), r.get(f"{d}_ab")
            cells.append(f"{_fmt(new)} | {_fmt(old)} | {_fmt(ab, 3)}")
            if ab:
                ratios.append(ab)
                if r.get("elements", LARGE) >= LARGE:
                    large.append((ab, f"{tuple(r['shape'])} {r['axes']} {r['mode']} {d}"))
        print(f"| {tuple(r['shape'])} | {r['axes']} | {r['mode']} | " + " | ".join(cells) + " |")
    if ratios:
        worst = min(large) if large else (None, "")
        print(f"\nA/B: geometric-mean speed {_geomean(ratios):.3f} over {len(ratios)} cells; "
              f"lowest large cell {worst[0]:.3f} ({worst[1]}).")


def cmd_roofline(args):
    workers = _workers(("cynorm", "numpy"), args)
    shapes = [tuple(s) for s in args.shapes] if args.shapes else [(64, 128, 56, 56), (4096, 4096)]
    rows = []
    try:
        for shape in shapes:
            axis = 1 if len(shape) == 4 else len(shape) - 1
            for mode in args.modes:
                _progress(f"roofline {shape} {mode} ...")
                req = {"shape": shape, "axis": axis, "mode": mode, "threads": args.threads, "norm": args.norm,
                       "budget": 0.5, "directions": ["fwd", "bwd"], "prealloc": True,
                       "aligned": args.aligned}
                got = _measure(workers, req, list(workers))
                c, f = got["cynorm"], got["numpy"]
                itemsize = 2 if MODES[mode][0] in ("bfloat16", "float16") else 4
                nbytes = math.prod(shape) * itemsize
                copy_bw = 2 * nbytes / f["copy_prealloc"] / 1e9
                fwd_bw = 2 * nbytes / c["fwd"] / 1e9
                bwd_bw = 3 * nbytes / c["bwd"] / 1e9
                row = {"shape": list(shape), "axes": _axes_name(shape, axis), "mode": mode,
                       "threads": args.threads, "copy_GBps": copy_bw, "elements": math.prod(shape),
                       "fwd_ms": c["fwd"] * 1e3, "fwd_GBps": fwd_bw, "fwd_frac": fwd_bw / copy_bw,
                       "bwd_ms": c["bwd"] * 1e3, "bwd_GBps": bwd_bw, "bwd_frac": bwd_bw / copy_bw}
                if "cynorm_base" in got:
                    b = got["cynorm_base"]
                    for d in ("fwd", "bwd"):
                        row[f"{d}_base_ms"] = b[d] * 1e3
                        row[f"{d}_ab"] = b[d] / c[d]
                rows.append(row)
    finally:
        for w in workers.values():
            w.close()
    print(f"\n### Roofline, out= preallocated, {args.threads} thread(s), {_machine()['cpu_model']}"
          f"{', 64-byte aligned arrays' if args.aligned else ''}\n")
    print("Bandwidth = bytes moved / median time: forward reads x and writes y; backward reads x and dy and "
          "writes dx. frac = fraction of a NumPy copy into an existing array (np.copyto), measured in the "
          "same run.\n")
    print("| shape | axes | mode | numpy copy GB/s | fwd ms | fwd GB/s | fwd frac | bwd ms | bwd GB/s | bwd frac |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {tuple(r['shape'])} | {r['axes']} | {r['mode']} | {r['copy_GBps']:.1f} | {r['fwd_ms']:.2f} | "
              f"{r['fwd_GBps']:.1f} | {r['fwd_frac']:.2f} | {r['bwd_ms']:.2f} | {r['bwd_GBps']:.1f} | "
              f"{r['bwd_frac']:.2f} |")
    if "cynorm_base" in workers:
        _print_ab(rows, {"cynorm": workers["cynorm"].info, "baseline": workers["cynorm_base"].info},
                  [("fwd", "fwd_ms"), ("bwd", "bwd_ms")])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"command": "roofline", "machine": _machine()}, "rows": rows}, f, indent=1)
    return rows


def cmd_scaling(args):
    """Thread scaling, the counts alternating round by round: benchmarks/scaling.py."""
    sys.path.insert(0, HERE)
    import scaling
    return scaling.cmd_scaling(args, sys.modules[__name__])


def _frameworks(argv):
    sys.path.insert(0, HERE)
    import frameworks
    p = argparse.ArgumentParser(prog=f"bench.py {argv[0]}", description=frameworks.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5 if argv[0] == "jax" else 3)
    p.add_argument("--json", help="also write the results here")
    if argv[0] == "dask":
        p.add_argument("--gib", type=float, default=4.0, help="size of x in GiB (dy is as large)")
    args = p.parse_args(argv[1:])
    (frameworks.cmd_jax if argv[0] == "jax" else frameworks.cmd_dask)(args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_worker":
        _worker_main(argv[1])
        return
    if argv and argv[0] in ("jax", "dask"):   # the framework benchmarks (benchmarks/frameworks.py)
        return _frameworks(argv)
    if argv and argv[0] == "fused":
        sys.path.insert(0, HERE)
        import fused
        fp = argparse.ArgumentParser(prog="bench.py fused", description=fused.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        fp.add_argument("--threads", type=int, default=1)
        fp.add_argument("--modes", type=lambda s: s.split(","), default=["fp32", "bf16", "mixed"])
        fp.add_argument("--quick", action="store_true", help="shorter timing budgets")
        fp.add_argument("--json", help="also write the results here")
        return fused.cmd_fused(fp.parse_args(argv[1:]))
    if argv and argv[0] == "groupnorm":
        sys.path.insert(0, HERE)
        import groupnorm
        gp = argparse.ArgumentParser(prog="bench.py groupnorm", description=groupnorm.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        gp.add_argument("--threads", type=int, default=1)
        gp.add_argument("--modes", type=lambda s: s.split(","), default=["fp32", "bf16", "mixed"])
        gp.add_argument("--layouts", type=lambda s: s.split(","), default=["nchw", "nhwc"])
        gp.add_argument("--quick", action="store_true", help="shorter timing budgets")
        gp.add_argument("--onednn", help="a libdnnl.so (3.3 or later: group normalization) for the oneDNN column")
        gp.add_argument("--json", help="also write the results here")
        gp.add_argument("--baseline-python", help="A/B: also time the cynorm installed for this interpreter")
        return groupnorm.cmd_groupnorm(gp.parse_args(argv[1:]))
    if argv and argv[0] == "onednn":
        sys.path.insert(0, HERE)
        import onednn
        op = argparse.ArgumentParser(prog="bench.py onednn", description=onednn.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        op.add_argument("--threads", type=int, default=1)
        op.add_argument("--onednn", help="comma list of libdnnl.so paths (default: the onednn-cpu-gomp wheel's)")
        op.add_argument("--modes", type=lambda s: s.split(","), default=["fp32", "bf16", "mixed"])
        op.add_argument("--shapes", type=lambda s: [tuple(int(v) for v in part.split("x")) for part in s.split(",")],
                        help="comma list like 64x128x56x56,4096x4096 (2-d: over the last axis)")
        op.add_argument("--axes", choices=["chw", "last", "both"], default="both",
                        help="--shapes of 3 or more dims: normalized over C,H,W, the last axis, or both")
        op.add_argument("--quick", action="store_true", help="shorter timing budgets, no 2-GB shape")
        op.add_argument("--json", help="also write the results here")
        return onednn.cmd_onednn(op.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp, threads_default="1"):
        sp.add_argument("--modes", type=lambda s: s.split(","), default=["fp32", "bf16", "mixed"],
                        help="comma list of " + ",".join(MODES))
        sp.add_argument("--norm", choices=["layer", "rms"], default="layer")
        sp.add_argument("--shapes", type=lambda s: [tuple(int(v) for v in part.split("x")) for part in s.split(",")],
                        help="comma list like 64x128x56x56,4096x4096 (overrides the defaults)")
        sp.add_argument("--json", help="also write the results here")
        sp.add_argument("--quick", action="store_true", help="fewer repetitions, no 2-GB shape")
        sp.add_argument("--aligned", action="store_true",
                        help="x and dy (and out= buffers) on 64-byte boundaries, as torch and JAX allocate "
                             "them; by default they are NumPy's own (large ones start 16 bytes past one)")

    s = sub.add_parser("seed", help="the seed table, side by side with torch and the floors")
    common(s)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--axes", choices=["chw", "last", "both"], default="chw")
    s.add_argument("--no-torch", action="store_true", help="skip torch even if it is installed")
    s.add_argument("--no-transformer", action="store_true", help="chw runs: skip the (4096,4096)/(16384,1024) rows")

    r = sub.add_parser("roofline", help="GB/s with out= preallocated, against a NumPy copy")
    common(r)
    r.add_argument("--threads", type=int, default=1)
    for sp in (s, r):
        sp.add_argument("--baseline-python", help="A/B: also time the cynorm installed for this interpreter")
        sp.add_argument("--baseline-env", action="append", metavar="KEY=VALUE",
                        help="A/B: the baseline worker runs with this in its environment (e.g. CYNORM_POLICY=off "
                             "against a tuned policy); repeatable; with no --baseline-python, this interpreter")

    c = sub.add_parser("scaling", help="thread-scaling experiment")
    common(c)
    c.set_defaults(modes=None)
    c.add_argument("--threads", default="1,2,4,8", help="comma list of thread counts")
    c.add_argument("--plot", help="write a speedup plot (PNG) here, with the rounds' spread as error bars")
    c.add_argument("--rounds", type=int, help="rounds, each timing every count once (default 7; --quick 5)")

    args = p.parse_args(argv)
    if getattr(args, "modes", None):
        bad = [m for m in args.modes if m not in MODES]
        if bad:
            p.error(f"unknown mode(s) {bad}; choose from {list(MODES)}")
    {"seed": cmd_seed, "roofline": cmd_roofline, "scaling": cmd_scaling}[args.command](args)


if __name__ == "__main__":
    main()
