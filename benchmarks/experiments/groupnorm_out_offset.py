#!/usr/bin/env python
"""python benchmarks/experiments/groupnorm_out_offset.py [--baseline-python PY] [--rounds 3] [--offset 16]

GroupNorm at 1 thread with out= buffers `--offset` bytes past a cache line
(16: where NumPy's own large arrays start, np.empty's usual place) and with
fresh outputs, forward and backward, both layouts, fp32 and bf16, on the
UNet-like and ResNet-like shapes of bench.py groupnorm (G=32). With
--baseline-python, that interpreter's cynorm runs the same cells in its own
process, the two alternating round by round; speed = baseline / this build."""
import argparse, collections, os, statistics, subprocess, sys, time

SHAPES = [(2, 320, 64, 64), (2, 640, 32, 32), (64, 128, 56, 56)]


def cells(offset):
    import ml_dtypes, numpy as np, cynorm

    def med(f, n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    def at_offset(like):
        buf = np.empty(like.nbytes + 128, np.uint8)
        start = (-buf.ctypes.data) % 64 + offset
        return buf[start:start + like.nbytes].view(like.dtype).reshape(like.shape)

    rng = np.random.default_rng(0)
    for layout in ("nhwc", "nchw"):
        for N, C, H, W in SHAPES:
            for name, dt in (("fp32", np.float32), ("bf16", ml_dtypes.bfloat16)):
                shape, ax = ((N, H, W, C), -1) if layout == "nhwc" else ((N, C, H, W), 1)
                x = rng.standard_normal(shape, np.float32).astype(dt)
                dy = rng.standard_normal(shape, np.float32).astype(dt)
                w, b = rng.standard_normal(C, np.float32), rng.standard_normal(C, np.float32)
                y, m, r = cynorm.group_norm_forward(x, 32, w, b, channel_axis=ax, num_threads=1)
                yo, dxo, mo, ro = at_offset(x), at_offset(x), np.empty_like(m), np.empty_like(r)
                n = 40 if N < 64 else 7
                key = f"{layout} {N}x{C}x{H}x{W} {name}"
                runs = {
                    "fwd out=": lambda: cynorm.group_norm_forward(x, 32, w, b, channel_axis=ax, num_threads=1,
                                                                  out=(yo, mo, ro)),
                    "bwd out=": lambda: cynorm.group_norm_backward(dy, x, m, r, w, num_groups=32, channel_axis=ax,
                                                                   num_threads=1, out=(dxo, None, None)),
                    "fwd fresh": lambda: cynorm.group_norm_forward(x, 32, w, b, channel_axis=ax, num_threads=1),
                    "bwd fresh": lambda: cynorm.group_norm_backward(dy, x, m, r, w, num_groups=32, channel_axis=ax,
                                                                    num_threads=1),
                }
                for what, f in runs.items():
                    print(f"{key}|{what}|{med(f, n):.5f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-python")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--offset", type=int, default=16)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return cells(args.offset)
    pythons = {"this": sys.executable}
    if args.baseline_python:
        pythons["baseline"] = args.baseline_python
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for who, py in pythons.items():
            out = subprocess.run([py, os.path.abspath(__file__), "--worker", "--offset", str(args.offset)],
                                 check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                key, what, t = line.split("|")
                times[(key, what, who)].append(float(t))
    print(f"Times in ms (median of {args.rounds} rounds' medians), 1 thread, out= {args.offset} bytes past a line.\n")
    cols = list(pythons)
    print("| cell | call | " + " | ".join(cols) + (" | speed |" if len(cols) > 1 else " |"))
    print("|---|---|" + "---:|" * (len(cols) + (len(cols) > 1)))
    for key, what in dict.fromkeys((k, w) for k, w, _ in times):
        t = {who: statistics.median(times[(key, what, who)]) for who in cols}
        speed = f" {t['baseline'] / t['this']:.2f} |" if len(cols) > 1 else ""
        print(f"| {key} | {what} | " + " | ".join(f"{t[c]:.4f}" for c in cols) + " |" + speed)


if __name__ == "__main__":
    main()
