#!/usr/bin/env python
"""python benchmarks/experiments/part_cache_threads.py [SHAPES] [MODES] [THREADS] [ROUNDS]

The backward's choice between the block path (each thread its own blocks of rows,
its own partial sums of dweight/dbias) and the team path (the threads split the
columns), which part_cache_bytes makes: partials of k x N x 4 bytes beyond it
take the team path. In ONE process, alternating round by round: the default
(256 KB), the L2 of one core, and never (the block path whenever there are
enough blocks). out=; every setting's dx, dweight and dbias must be bit-identical.
Speed = the default's time / each setting's (above 1: faster than the default)."""
import sys, time
import numpy as np, ml_dtypes, cynorm
from cynorm import _isa
from inprocess_ab import alternate

SHAPES = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else "2048x40000,512x100000,256x200000,64x401408"
MODES = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else "fp32,bf16"
THREADS = [int(t) for t in (sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else "1,2").split(",")]
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 9
L2 = _isa.l2_cache_bytes() or 1 << 20
SETTINGS = {"default": _isa.kernels._policy("part_cache_bytes"), "L2": L2, "never": 1 << 60}
print(f"# L2 {L2 >> 10} KiB, default part_cache_bytes {SETTINGS['default']}", flush=True)

for T in THREADS:
    for shape in [tuple(int(v) for v in s.split("x")) for s in SHAPES.split(",")]:
        for mode in MODES.split(","):
            dt = np.float32 if mode == "fp32" else ml_dtypes.bfloat16
            rng = np.random.default_rng(0)
            x = rng.standard_normal(shape, dtype=np.float32).astype(dt)
            dy = rng.standard_normal(shape, dtype=np.float32).astype(dt)
            w = rng.standard_normal(shape[-1:], dtype=np.float32).astype(dt)
            y, m, r = cynorm.layer_norm_forward(x, w, w, num_threads=T)
            outs = (np.empty_like(x), np.empty_like(w), np.empty_like(w))
            call = lambda: cynorm.layer_norm_backward(dy, x, m, r, w, num_threads=T, out=outs)
            paths = {}
            for k, v in SETTINGS.items():
                _isa.kernels._policy("part_cache_bytes", v)
                paths[k] = cynorm.explain(x, w, num_threads=T, backward=True)["path"].split(":")[0]
            call(); t0 = time.perf_counter(); call()
            reps = max(2, int(0.05 / (time.perf_counter() - t0)))
            ts = alternate(SETTINGS, lambda v: _isa.kernels._policy("part_cache_bytes", v), call, outs, ROUNDS, reps)
            _isa.kernels._policy("part_cache_bytes", SETTINGS["default"])
            med = {k: float(np.median(v)) for k, v in ts.items()}
            parts_kb = 2 * shape[1] * 4 >> 10
            print(f"T{T} {str(shape):15s} {mode:5s} partials {parts_kb:5d} KB: default {med['default']:.2f} ms ({paths['default']}); "
                  + "; ".join(f"{k} {med['default'] / med[k]:.3f} ({paths[k]})" for k in ("L2", "never")), flush=True)
