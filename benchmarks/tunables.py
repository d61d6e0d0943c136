#!/usr/bin/env python
"""Does each tunable of the execution policy move a measured figure? A/B in one process.

    CYNORM_RECYCLE_MB=0 python benchmarks/tunables.py [--only NAME,...] [--rounds 5] [--json F] [--md F]

For every tunable (include/cn_policy.h) this times the cells it decides, with
the tunable at the value the cell's class runs with on this machine ("default":
the measured one after cynorm.tune(), else the default) and at an alternative
(usually: the mechanism off), alternating the two round by round, and reports
median time alt / default per cell: above 1 the value in use is faster. Run it
with CYNORM_POLICY=off for the defaults alone. A tunable "moves" a figure where some cell differs by
3% or more. Allocating cells pay for fresh output pages only with recycling
off (CYNORM_RECYCLE_MB=0, as above). benchmarks/POLICY.md collects the verdicts
from each CPU kind.
"""

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
from ml_dtypes import bfloat16

import cynorm
from cynorm import _core

NEVER = 1 << 60
DT = {"f32": (np.float32, np.float32), "bf16": (bfloat16, bfloat16), "mixed": (bfloat16, np.float32),
      "f64": (np.float64, np.float64)}
CHW = (64, 128 * 56 * 56)

# name -> (alternative value, [(shape, mode, direction, threads, out=?), ...][, other tunables to set meanwhile])
PLAN = {
    "min_elems_per_thread": (1, [((64, 256), "f32", "fwd", 2, True), ((128, 256), "f32", "bwd", 2, True),
                                 ((256, 100), "bf16", "fwd", 2, True)]),
    "stream_min_bytes": (NEVER, [((4096, 4096), "f32", "fwd", 1, True), ((4096, 4096), "bf16", "fwd", 1, True),
                                 ((4096, 4096), "f32", "bwd", 1, True), ((16384, 1024), "bf16", "bwd", 1, True),
                                 (CHW, "f32", "fwd", 1, True), (CHW, "bf16", "bwd", 1, True),
                                 ((4096, 4096), "f32", "fwd", 2, True), (CHW, "bf16", "fwd", 2, True)]),
    "fresh_plain_row_bytes": ("plain", [((4096, 4096), "f32", "fwd", 1, False), ((4096, 4096), "bf16", "fwd", 1, False),
                                  ((16384, 1024), "f32", "fwd", 1, False), ((4096, 4096), "bf16", "bwd", 1, False),
                                  ((65536, 256), "f32", "fwd", 1, False), ((4096, 4096), "f32", "fwd", 2, False)]),
    "long_row_bytes": (NEVER, [(CHW, "f32", "fwd", 1, True), (CHW, "bf16", "fwd", 1, True),
                               ((64, 50176), "f32", "fwd", 1, True), (CHW, "bf16", "fwd", 2, True)]),
    "long_group_bytes": (8 << 20, [(CHW, "bf16", "fwd", 1, True), (CHW, "f32", "fwd", 1, True),
                                   (CHW, "bf16", "bwd", 2, True), (CHW, "bf16", "fwd", 2, True)]),
    "medium_block_bytes": (0, [((16384, 1024), "f32", "fwd", 1, True), ((16384, 1024), "bf16", "fwd", 1, True),
                               ((65536, 256), "f32", "fwd", 1, True), ((65536, 256), "bf16", "fwd", 2, True)]),
    "bwd_group_bytes": (0, [((4096, 4096), "bf16", "bwd", 1, True), ((16384, 1024), "f32", "bwd", 1, True),
                            ((16384, 1024), "bf16", "bwd", 2, True)]),
    "short_prefetch_bytes": ("short", [((262144, 56), "f32", "fwd", 1, True), ((262144, 64), "f32", "fwd", 1, True),
                                       ((1048576, 24), "f32", "fwd", 1, True), ((262144, 56), "f32", "fwd", 2, True)]),
    "prefetch_max": (0, [((4096, 4096), "f32", "fwd", 1, True), ((4096, 4096), "bf16", "bwd", 1, True),
                         ((16384, 4096), "bf16", "fwd", 1, True), ((4096, 4096), "f32", "bwd", 2, True)]),
    "part_cache_bytes": (NEVER, [(CHW, "bf16", "bwd", 1, True), ((512, 100000), "bf16", "bwd", 1, True),
                                 ((512, 100000), "f32", "bwd", 2, True)]),
    "parts_in_a_bytes": ("flip0", [((512, 100000), "bf16", "bwd", 1, True), ((2048, 40000), "bf16", "bwd", 1, True),
                                   (CHW, "bf16", "bwd", 1, True)]),
    "bwd_a_by_chunk": (0, [(CHW, "bf16", "bwd", 1, True), (CHW, "f32", "bwd", 1, True),
                           (CHW, "bf16", "bwd", 2, True), ((512, 100000), "mixed", "bwd", 2, True)]),

}

_DATA = {}


def _data(shape, mode):
    key = (shape, mode)
    if key not in _DATA:
        if len(_DATA) > 2:
            _DATA.clear()
        xd, pd = DT[mode]
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape, dtype=np.float32).astype(xd)
        dy = rng.standard_normal(shape, dtype=np.float32).astype(xd)
        w = (1 + 0.1 * rng.standard_normal(shape[1], dtype=np.float32)).astype(pd)
        b = (0.1 * rng.standard_normal(shape[1], dtype=np.float32)).astype(pd)
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
        _DATA[key] = (x, dy, w, b, mean, rstd)
    return _DATA[key]


def _call(shape, mode, direction, threads, use_out):
    x, dy, w, b, mean, rstd = _data(shape, mode)
    if direction == "fwd":
        out = (np.empty_like(x), np.empty_like(mean), np.empty_like(rstd)) if use_out else None
        return lambda: cynorm.layer_norm_forward(x, w, b, num_threads=threads, out=out)
    out = (np.empty_like(x), np.empty_like(w), np.empty_like(b)) if use_out else None
    return lambda: cynorm.layer_norm_backward(dy, x, mean, rstd, w, num_threads=threads, out=out)


def _round(fn, budget):
    fn()
    times = []
    t_end = time.perf_counter() + budget
    while len(times) < 3 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _class_of(shape, mode, direction, threads):
    pair = {"f32": 0, "f64": 1, "bf16": 2, "mixed": 3}[mode]
    return _core.class_of(direction == "bwd", pair, shape[0], shape[1], threads)


def _set(cls, name, value, measured):
    """tunable `name` of class `cls` set to value, over the measured policy in use"""
    values = {c: dict(v) for c, v in measured.items()}
    values.setdefault(cls, {})[name] = value
    _core.set_class_tunables(values)


def measure(name, alt, cells, rounds, budget, context=None):
    """Each cell with the tunable at the value its class runs with (a measured one,
    after cynorm.tune(), or the default) and at the alternative, alternating."""
    measured = _core.class_tunables()
    olds = {k: _core._policy(k, v) for k, v in (context or {}).items()}
    rows = []
    try:
        for shape, mode, direction, threads, use_out in cells:
            cls = _class_of(shape, mode, direction, threads)
            default = _core.tunables(cls)[name]
            other = alt
            if alt == "flip":
                other = 1 - default
            elif alt == "flip0":
                other = 0 if default else 1 << 30
            elif alt == "plain":   # the other rule: plain stores up to the long-row bound where the default is 0
                other = 0 if default else _core.tunables(cls)["long_row_bytes"]
            elif alt == "short":   # the other rule: 8 KB ahead where the default is the next block (0)
                other = 0 if default else 8 << 10
            elif alt == 0 and default == 0:
                other = {"prefetch_max": 8192, "medium_block_bytes": 32 << 10, "bwd_group_bytes": 256 << 10,
                         "bwd_a_by_chunk": 1}.get(name, 1)
            fn = _call(shape, mode, direction, threads, use_out)
            got = {"default": [], "alt": []}
            for r in range(rounds):
                for which in (("default", "alt") if r % 2 == 0 else ("alt", "default")):
                    _set(cls, name, default if which == "default" else other, measured)
                    got[which].append(_round(fn, budget))
            _core.set_class_tunables(measured)
            d, a = statistics.median(got["default"]), statistics.median(got["alt"])
            rows.append({"tunable": name, "default": default, "alt": other, "shape": list(shape), "mode": mode,
                         "direction": direction, "threads": threads, "out": use_out,
                         "default_ms": d * 1e3, "alt_ms": a * 1e3, "ratio": a / d,
                         "measured": name in measured.get(cls, {})})
            print(f"  {name}: {shape} {mode} {direction} T={threads} {'out=' if use_out else 'alloc'}: "
                  f"{d * 1e3:.3f} -> {a * 1e3:.3f} ms ({a / d:.3f})", file=sys.stderr, flush=True)
    finally:
        _core.set_class_tunables(measured)
        for k, v in olds.items():
            _core._policy(k, v)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma list of tunables")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.12, help="seconds per round and setting")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(PLAN)
    cfg = cynorm.show_config.__globals__["config"]()
    rows = []
    for name in names:
        alt, cells, *context = PLAN[name]
        rows += measure(name, alt, cells, args.rounds, args.budget, context[0] if context else None)
    pol = cfg["policy"]
    lines = [f"### Tunables A/B: {cfg['cpu_model']}, {cfg['isa']}, L2 {cfg['l2_cache_bytes'] >> 20} MiB, "
             f"L3 {cfg['l3_cache_bytes'] >> 20} MiB, recycle limit {cfg['recycle_limit_bytes'] >> 20} MiB, policy: "
             + (f"tuned ({pol['decisions']} measured values)" if pol["tuned"] else "the defaults"),
             "", "ratio = alt / default (median of alternating rounds): above 1, the default is faster.", "",
             "| tunable | default | alt | shape | mode | dir | threads | out | default ms | alt ms | ratio |",
             "|---|---:|---:|---|---|---|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['tunable']}{' (measured)' if r['measured'] else ''} | {r['default']} | {r['alt']} | {tuple(r['shape'])} | {r['mode']} | "
                     f"{r['direction']} | {r['threads']} | {'out=' if r['out'] else 'alloc'} | {r['default_ms']:.3f} | "
                     f"{r['alt_ms']:.3f} | {r['ratio']:.3f} |")
    lines.append("")
    for name in names:
        ratios = [r["ratio"] for r in rows if r["tunable"] == name]
        moved = max(abs(1 - v) for v in ratios)
        lines.append(f"- {name}: largest change {moved * 100:.1f}% ({'moves' if moved >= 0.03 else 'does not move'} "
                     f"a figure by 3%); best for the default {max(ratios):.3f}, worst {min(ratios):.3f}")
    text = "\n".join(lines)
    print(text)
    meta = {"machine": platform.platform(), "config": {k: cfg[k] for k in ("cpu_model", "isa", "l2_cache_bytes",
                                                                          "l3_cache_bytes", "recycle_limit_bytes")}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
