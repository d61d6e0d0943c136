#!/usr/bin/env python
"""T=<threads> [KNOB=BWDSPF] python benchmarks/experiments/bwd_rows_prefetch_lead.py [SHAPES] [MODES]

The backward's row path (pass 2 prefetches the rows pass 1 takes next): one
group of rows ahead (before) against at least CN_BWD_PREFETCH_BYTES of each row
stream over all threads, in whole groups (the policy now), in ONE process.
KNOB=BWDSPF: the short rows instead (the next block of 16 rows before; 32-bit
rows now CN_SHORT_PREFETCH_BYTES over all threads; give short SHAPES).
Needs a build with bwd_rows_prefetch_lead.patch applied (core/policy.c reads
BWDPF=<bytes> and BWDSPF=<bytes>; 0: as before). Rounds alternate; out= on
both sides; the outputs of every call must be bit-identical. Speed = before's
time / now's time (above 1: the longer lead is faster)."""
import os, sys, time
import numpy as np, ml_dtypes, cynorm

T = int(os.environ.get("T", "1"))
SHAPES = sys.argv[1] if len(sys.argv) > 1 else "524288x96,524288x128,262144x192,262144x256,131072x384,131072x512,65536x1024"
MODES = sys.argv[2] if len(sys.argv) > 2 else "fp32,bf16,mixed"
SETTINGS = {"before": "0", "now": None}


KNOB = os.environ.get("KNOB", "BWDPF")


def use(setting):
    if setting is None:
        os.environ.pop(KNOB, None)
    else:
        os.environ[KNOB] = setting


for shape in [tuple(int(v) for v in s.split("x")) for s in SHAPES.split(",")]:
    for mode in MODES.split(","):
        dt = np.float32 if mode == "fp32" else ml_dtypes.bfloat16
        pdt = ml_dtypes.bfloat16 if mode == "bf16" else np.float32
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape, dtype=np.float32).astype(dt)
        dy = rng.standard_normal(shape, dtype=np.float32).astype(dt)
        w = rng.standard_normal(shape[-1:], dtype=np.float32).astype(pdt)
        y, m, r = cynorm.layer_norm_forward(x, w, w, num_threads=T)
        dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(w)
        rows = {}
        for k, v in SETTINGS.items():
            use(v)
            rows[k] = cynorm.explain(x, w, num_threads=T, backward=True)["prefetch_rows_ahead"]
        ts, ref = {k: [] for k in SETTINGS}, None
        for _ in range(9):
            for k, v in SETTINGS.items():
                use(v)
                cynorm.layer_norm_backward(dy, x, m, r, w, num_threads=T, out=(dx, dw, db))
                t0 = time.perf_counter()
                for _ in range(5):
                    cynorm.layer_norm_backward(dy, x, m, r, w, num_threads=T, out=(dx, dw, db))
                ts[k].append((time.perf_counter() - t0) / 5 * 1e3)
                bits = (dx.tobytes(), dw.tobytes(), db.tobytes())
                ref = ref or bits
                assert bits == ref, f"{shape} {mode}: the outputs differ between settings"
        use(None)
        b, n = np.median(ts["before"]), np.median(ts["now"])
        print(f"T{T} {str(shape):15s} {mode:5s} rows ahead {rows['before']:>2} -> {rows['now']:>2}: "
              f"before {b:.2f} ms, now {n:.2f} ms, speed {b / n:.2f}", flush=True)
