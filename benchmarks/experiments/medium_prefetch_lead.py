#!/usr/bin/env python
"""T=<threads> python benchmarks/experiments/medium_prefetch_lead.py LEAD,LEAD,...

How far ahead the forward's medium rows prefetch (core/policy.c's prefetch_rows
for them), in one process: needs a build with medium_prefetch_lead.patch applied,
which reads the lead (bytes, rounded up to whole blocks; 1 = the next block)
from $MEDPF once per call. LayerNorm forward, out= (all three outputs), weight and
bias, rows of 128, 256 and 96 (SHAPES= to change), fp32/bf16/mixed; 9 rounds
alternating the leads, each round as many calls as take about 30 ms; medians.
Speed = the first lead's time / each other lead's time."""
import os, sys, time
import numpy as np, ml_dtypes, cynorm

confs = sys.argv[1].split(",")
T = int(os.environ.get("T", "1"))
for shp in eval(os.environ.get("SHAPES", "[(131072,128),(65536,256),(262144,96)]")):
    for dt in ("float32", "bfloat16", "mixed"):
        npdt = np.float32 if dt == "float32" else ml_dtypes.bfloat16
        x = np.random.default_rng(0).standard_normal(shp, np.float32).astype(npdt)
        w = np.ones(shp[-1], np.float32 if dt != "bfloat16" else ml_dtypes.bfloat16)
        y = np.empty_like(x); m = np.empty(shp[0], np.float32); r = m.copy()
        f = lambda: cynorm.layer_norm_forward(x, w, w, num_threads=T, out=(y, m, r))
        f(); t = time.perf_counter(); f(); reps = max(3, int(0.03 / (time.perf_counter() - t)))
        ts = {c: [] for c in confs}
        for _ in range(9):
            for c in confs:
                os.environ["MEDPF"] = c
                f(); t = time.perf_counter()
                for _ in range(reps): f()
                ts[c].append((time.perf_counter() - t) / reps * 1e3)
        med = {c: np.median(v) for c, v in ts.items()}; b = med[confs[0]]
        print(f"T{T} {str(shp):14s} {dt:8s} lead {confs[0]}: {b:.3f} ms; "
              + " ".join(f"{c}: {b / med[c]:.3f}" for c in confs[1:]), flush=True)
