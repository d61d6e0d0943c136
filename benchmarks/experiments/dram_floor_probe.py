#!/usr/bin/env python
"""python benchmarks/experiments/dram_floor_probe.py SHAPE MODES [leads|stores]

Why the forward at 1 thread reaches only part of a copy's speed on arrays
beyond the L3 (bench.py onednn's "frac"): in ONE process, out= on all, the
settings alternating round by round (7 rounds), every setting's outputs
bit-identical, and a NumPy copy of x into an existing array timed after them.

    leads   the medium rows' prefetch lead (CN_MEDIUM_PREFETCH_BYTES): the next
            block, 16 KB (the constant), 64 KB, 256 KB and 1 MB. Needs the
            LEAD_FWD_MEDIUM hunk of prefetch_leads.patch (core/policy.c reads
            the lead from $LEAD_FWD_MEDIUM); without it the script stops.
    stores  non-temporal stores (stream_min_bytes, the default) against plain
            stores, through the tunable: no patch.

frac = the copy's time / the setting's time (the same bytes: x read, y written).
Example (2097152 rows of 128: x is 1 GiB in fp32, 512 MiB in bf16):
    python benchmarks/experiments/dram_floor_probe.py 2097152x128 fp32,bf16 leads
"""
import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np

import cynorm
from cynorm import _isa
from inprocess_ab import alternate

SHAPE = tuple(int(v) for v in sys.argv[1].split("x"))
MODES = sys.argv[2].split(",")
WHAT = sys.argv[3] if len(sys.argv) > 3 else "stores"
NEVER = 1 << 60

if WHAT == "leads":
    SETTINGS = {"next block": "0", "16K": "16384", "64K": "65536", "256K": "262144", "1M": "1048576"}

    def use(value):
        os.environ["LEAD_FWD_MEDIUM"] = value
else:
    SETTINGS = {"stream": 8 << 20, "plain": NEVER}

    def use(value):
        _isa.kernels._policy("stream_min_bytes", value)

for mode in MODES:
    dt = np.float32 if mode == "fp32" else ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE, dtype=np.float32).astype(dt)
    w = np.ones(SHAPE[-1], np.float32).astype(dt)
    y, m, r = cynorm.layer_norm_forward(x, w, w, num_threads=1)
    if WHAT == "leads":
        ahead = set()
        for v in SETTINGS.values():
            use(v)
            ahead.add(cynorm.explain(x, w, num_threads=1)["prefetch_rows_ahead"])
        if len(ahead) < 2:
            sys.exit("this build ignores LEAD_FWD_MEDIUM: apply prefetch_leads.patch's LEAD_FWD_MEDIUM hunk")
    outs = (np.empty_like(x), np.empty_like(m), np.empty_like(r))
    ts = alternate(SETTINGS, use, lambda: cynorm.layer_norm_forward(x, w, w, num_threads=1, out=outs), outs, 7, 3)
    use(list(SETTINGS.values())[0 if WHAT == "stores" else 1])
    src = x.view(np.uint16) if x.itemsize == 2 else x
    dst = np.empty_like(src)
    copies = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append((time.perf_counter() - t0) * 1e3)
    c = statistics.median(copies)
    print(f"{SHAPE} {mode} copy {c:.1f} ms | " + " | ".join(
        f"{k}: {statistics.median(v):.1f} ms, frac {c / statistics.median(v):.2f}" for k, v in ts.items()), flush=True)
