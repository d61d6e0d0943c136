#!/usr/bin/env python
"""python benchmarks/experiments/fused_page_faults.py  (and again with CYNORM_RECYCLE_MB=1024)

(8192, 8192) float32, 1 thread: the fused forward vs the unfused sequence with
fresh outputs and with preallocated ones, and what one fresh 256 MiB output costs."""
import os, statistics, time
import numpy as np, cynorm

def med(f, n=9):
    f(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3

shape = (8192, 8192)
rng = np.random.default_rng(0)
x = rng.standard_normal(shape, np.float32); r = rng.standard_normal(shape, np.float32)
w = np.ones(shape[-1], np.float32); b = np.zeros_like(w)
yo = np.zeros_like(x); ho = np.zeros_like(x)
rows = {}
for rnd in range(3):   # the variants take turns
    rows.setdefault("fused, fresh y and h", []).append(med(lambda: cynorm.add_layer_norm_forward(x, r, w, b, num_threads=1), 3))
    rows.setdefault("unfused, fresh (x + r, layer_norm_forward)", []).append(med(lambda: cynorm.layer_norm_forward(x + r, w, b, num_threads=1), 3))
    rows.setdefault("fused, out=(y, h)", []).append(med(lambda: cynorm.add_layer_norm_forward(x, r, w, b, num_threads=1, out=(yo, ho)), 3))
    rows.setdefault("unfused, out= (np.add(out=h), layer_norm_forward(out=y))", []).append(
        med(lambda: cynorm.layer_norm_forward(np.add(x, r, out=ho), w, b, num_threads=1, out=yo), 3))
    rows.setdefault("layer_norm_forward, fresh y", []).append(med(lambda: cynorm.layer_norm_forward(x, w, b, num_threads=1), 3))
    rows.setdefault("layer_norm_forward, out=y", []).append(med(lambda: cynorm.layer_norm_forward(x, w, b, num_threads=1, out=yo), 3))
print(f"CYNORM_RECYCLE_MB={os.environ.get('CYNORM_RECYCLE_MB', 'default (256)')}")
for k, v in rows.items():
    print(f"| {k} | {statistics.median(v):.1f} |")
