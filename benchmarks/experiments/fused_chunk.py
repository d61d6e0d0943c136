"""The fused forward's chunk (rows of h added, then normalized from cache), which
was a tunable, fused_chunk_bytes, at commit b81d2f6: run this against a build of
that commit. Since then the chunk is a constant (core/policy.c), because no
size moved the times (results/intel_spr/fused/fused_chunk_*.md).

    python benchmarks/experiments/fused_chunk.py [--threads 1,2] [--sizes 16,64,256,1024] [--json F]

Times add_layer_norm_forward (fresh outputs) per chunk size in KiB, the sizes
taking turns round by round; ratio = time at the default / time at that size
(above 1: that size is faster). Also the unfused sequence (NumPy add, then
layer_norm_forward) for scale.
"""

import argparse
import json
import platform
import statistics
import time

import numpy as np
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa

CELLS = [((16384, 1024), np.float32), ((4096, 4096), bfloat16), ((458752, 56), np.float32), ((8192, 8192), np.float32)]


def _time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--sizes", default="16,64,256,1024", help="fused_chunk_bytes values in KiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    kernels = _isa.kernels
    default = kernels._policy("fused_chunk_bytes") // 1024
    sizes = sorted({int(s) for s in a.sizes.split(",")} | {default})
    rows = []
    for shape, dt in CELLS:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape, np.float32).astype(dt)
        r = rng.standard_normal(shape, np.float32).astype(dt)
        w = np.ones(shape[-1], np.float32)
        b = np.zeros(shape[-1], np.float32)
        for T in [int(t) for t in a.threads.split(",")]:
            times = {s: [] for s in sizes}
            unfused = []
            for rnd in range(a.rounds):
                for s in sizes[rnd % len(sizes):] + sizes[:rnd % len(sizes)]:
                    kernels._policy("fused_chunk_bytes", s * 1024)
                    times[s] += _time(lambda: cynorm.add_layer_norm_forward(x, r, w, b, num_threads=T), 3)
                unfused += _time(lambda: cynorm.layer_norm_forward(x + r, w, b, num_threads=T), 3)
            kernels._policy("fused_chunk_bytes", default * 1024)
            med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
            row = {"shape": list(shape), "dtype": np.dtype(dt).name, "threads": T, "ms": med,
                   "ratio": {s: med[default] / med[s] for s in sizes},
                   "unfused_ms": statistics.median(unfused) * 1e3}
            rows.append(row)
            print(f"{shape} {np.dtype(dt).name} T={T}: " + ", ".join(f"{s}K {med[s]:.2f}" for s in sizes)
                  + f" ms; unfused {row['unfused_ms']:.2f} ms", flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"\n### fused_chunk_bytes (default {default} KiB): add_layer_norm_forward, ms (median), {cpu}, "
          f"ISA {_isa.level}\n")
    print("| shape | dtype | threads | " + " | ".join(f"{s} KiB" for s in sizes) + " | unfused |")
    print("|---|---|---:|" + "---:|" * (len(sizes) + 1))
    for row in rows:
        print(f"| {tuple(row['shape'])} | {row['dtype']} | {row['threads']} | "
              + " | ".join(f"{row['ms'][s]:.2f}" for s in sizes) + f" | {row['unfused_ms']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu, "isa": _isa.level, "default_kib": default, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
