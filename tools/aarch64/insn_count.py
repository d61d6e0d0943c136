#!/usr/bin/env python
"""Guest instructions per element of cynorm's kernels on aarch64, under qemu-user.

    python tools/aarch64/insn_count.py --python tools/aarch64/env/py --plugin insn_count.so

Speed cannot be timed under emulation; the executed instruction count can. For
each (level, dtype, direction) the guest runs the call once and three times in
two processes, each counted by the insn_count plugin (tools/aarch64/insn_count.c);
(three - once) / 2 is one call's count, divided by the elements. One thread.
Prints a markdown table: each level's instructions per element, and the
portable level's count over each other level's.
"""

import argparse
import os
import subprocess

GUEST = r"""
import sys, numpy as np, cynorm
from cynorm import _isa
from ml_dtypes import bfloat16
level, dtype, direction, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows, n = (int(v) for v in sys.argv[5].split("x"))
dt = {"fp32": np.float32, "bf16": bfloat16}[dtype]
rng = np.random.default_rng(0)
x = rng.standard_normal((rows, n)).astype(dt)
w = rng.standard_normal(n).astype(dt)
b = rng.standard_normal(n).astype(dt)
dy = rng.standard_normal((rows, n)).astype(dt)
y = np.empty_like(x)
with _isa.using(level):
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b, num_threads=1)
    for _ in range(calls):
        if direction == "fwd":
            cynorm.layer_norm_forward(x, w, b, num_threads=1, out=y)
        else:
            cynorm.layer_norm_backward(dy, x, mean, rstd, w, num_threads=1)
"""


def count(args, level, dtype, direction, calls):
    env = dict(os.environ, QEMU_EXTRA_ARGS=f"-plugin {os.path.abspath(args.plugin)}", OMP_NUM_THREADS="1",
               CYNORM_POLICY="off")
    r = subprocess.run([args.python, "-c", GUEST, level, dtype, direction, str(calls), args.shape],
                       capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("insns: ")]
    if r.returncode != 0 or not lines:
        raise SystemExit(f"{level} {dtype} {direction}: failed\n{r.stderr[-2000:]}")
    return int(lines[-1].split()[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="the aarch64 python (a wrapper that runs it under qemu)")
    p.add_argument("--plugin", required=True, help="insn_count.so, built from tools/aarch64/insn_count.c")
    p.add_argument("--shape", default="4096x1024", help="ROWSxN (default 4096x1024)")
    p.add_argument("--levels", default="baseline,neon")
    args = p.parse_args()
    rows, n = (int(v) for v in args.shape.split("x"))
    levels = args.levels.split(",")
    print(f"Guest instructions per element, {args.shape}, 1 thread (qemu-aarch64 + insn_count plugin)\n")
    print("| dtype | direction | " + " | ".join(levels) + " | " + " | ".join(f"{levels[0]} / {lv}" for lv in levels[1:]) + " |")
    print("|---|---|" + "---:|" * (2 * len(levels) - 1))
    for dtype in ("fp32", "bf16"):
        for direction in ("fwd", "bwd"):
            per = []
            for lv in levels:
                once, thrice = count(args, lv, dtype, direction, 1), count(args, lv, dtype, direction, 3)
                per.append((thrice - once) / 2 / (rows * n))
            print(f"| {dtype} | {direction} | " + " | ".join(f"{v:.2f}" for v in per) + " | "
                  + " | ".join(f"{per[0] / v:.2f}" for v in per[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
