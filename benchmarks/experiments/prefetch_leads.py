#!/usr/bin/env python
"""T=<threads> python benchmarks/experiments/prefetch_leads.py KNOB [SHAPES] [MODES] [ROUNDS]

The four prefetch leads of core/policy.c (CN_SHORT_PREFETCH_BYTES for the
forward's and the backward's short rows, CN_MEDIUM_PREFETCH_BYTES,
CN_BWD_PREFETCH_BYTES) against the lead they replaced (the next block or group
of rows), in ONE process, with a third setting, the first again, as a
control. Needs a build with prefetch_leads.patch applied (it applies to
ee0d73f, before the forward's short-row lead became the tunable
short_prefetch_bytes): core/policy.c then reads each lead in bytes from $KNOB
(0: the next block). KNOB is LEAD_FWD_SHORT, LEAD_FWD_MEDIUM, LEAD_BWD_SHORT or
LEAD_BWD_ROWS. Rounds alternate the three settings; out= on all; every call's
outputs must be bit-identical. Speed = before's time / now's time (above 1: the lead
in the policy now is faster)."""
import os, sys, time
import numpy as np, ml_dtypes, cynorm
from inprocess_ab import alternate

KNOB = sys.argv[1]
DEFAULT_SHAPES = {"LEAD_FWD_SHORT": "262144x56,262144x64,1048576x24,1048576x16",
                  "LEAD_FWD_MEDIUM": "131072x128,65536x256,262144x96",
                  "LEAD_BWD_SHORT": "1048576x16,262144x64",
                  "LEAD_BWD_ROWS": "524288x96,262144x256,131072x512,65536x1024"}
SHAPES = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else DEFAULT_SHAPES[KNOB]
MODES = sys.argv[3] if len(sys.argv) > 3 else "fp32,bf16,mixed"
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 9
T = int(os.environ.get("T", "1"))
BACKWARD = KNOB.startswith("LEAD_BWD")
SETTINGS = {"before": "0", "now": None, "control": "0"}   # control: before again (the noise)


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
        w = rng.standard_normal(shape[-1:], dtype=np.float32).astype(pdt)
        y, m, r = cynorm.layer_norm_forward(x, w, w, num_threads=T)
        if BACKWARD:
            dy = rng.standard_normal(shape, dtype=np.float32).astype(dt)
            outs = (np.empty_like(x), np.empty_like(w), np.empty_like(w))
            call = lambda: cynorm.layer_norm_backward(dy, x, m, r, w, num_threads=T, out=outs)
        else:
            outs = (np.empty_like(x), np.empty_like(m), np.empty_like(r))
            call = lambda: cynorm.layer_norm_forward(x, w, w, num_threads=T, out=outs)
        rows = {}
        for k, v in SETTINGS.items():
            use(v)
            rows[k] = cynorm.explain(x, w, num_threads=T, backward=BACKWARD)["prefetch_rows_ahead"]
        call(); t0 = time.perf_counter(); call()
        reps = max(3, int(0.05 / (time.perf_counter() - t0)))
        ts = alternate(SETTINGS, use, call, outs, ROUNDS, reps)
        use(None)
        b, n, c = (np.median(ts[k]) for k in ("before", "now", "control"))
        print(f"{KNOB} T{T} {str(shape):16s} {mode:5s} rows ahead {rows['before']:>3} -> {rows['now']:>3}: "
              f"before {b:.3f} ms, now {n:.3f} ms, speed {b / n:.3f} (control: before / before again {b / c:.3f})", flush=True)
