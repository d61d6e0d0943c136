#!/usr/bin/env python
"""python benchmarks/experiments/groupnorm_two_pass_bound.py  (1 thread)

How far the UNet GroupNorm cells can go against bench.py groupnorm's floor (a
NumPy copy of x; backward an elementwise op of x and dy). A group's mean and
rstd come before its first output, so any exact GroupNorm reads x twice (the
backward x and dy twice). These cells' samples (2.6-5.2 MB) exceed the L2 (the
channels-first groups fit it; their second read then comes from L2, but the
first one from L3 all the same), so the least such a kernel moves is NumPy
reading x once (a max over its bits) and then copying it: the "2-read floor".
The channels-first cells also time two_pass_minimal.c (the loop structure of
cynorm's channels-first forward and backward with none of their exactness:
compiled here with gcc -O3 where the CPU has AVX-512; bfloat16 where it also has
AVX512_BF16): "minimal".
In ONE process, the calls alternating, 9 rounds, medians; cynorm with fresh
outputs, and also into preallocated aligned ones ("out="), as the minimal
kernel writes. eff = floor / cynorm; bound = floor / 2-read floor;
of bound = eff / bound."""
import ctypes
import os
import statistics
import subprocess
import tempfile
import time

import ml_dtypes
import numpy as np

import cynorm


def timed(fn, budget=0.1):
    ts, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < budget:
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def minimal_kernels():
    """{(dtype, direction): two_pass_minimal*} from two_pass_minimal.c, for what can be built and run here"""
    flags = open("/proc/cpuinfo").read().split()
    if "avx512f" not in flags:
        return {}
    bf16 = "avx512_bf16" in flags
    lib = os.path.join(tempfile.mkdtemp(), "two_pass_minimal.so")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_pass_minimal.c")
    isa = ["-mavx512f", "-mfma"] + (["-mavx512bw", "-mavx512vl", "-mavx512bf16"] if bf16 else [])
    if subprocess.run(["gcc", "-O3", *isa, "-shared", "-fPIC", "-o", lib, src]).returncode:
        return {}
    so = ctypes.CDLL(lib)
    f32, b16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
    fns = {(f32, "fwd"): so.two_pass_minimal, (f32, "bwd"): so.two_pass_minimal_bwd}
    if bf16:
        fns.update({(b16, "fwd"): so.two_pass_minimal_bf16, (b16, "bwd"): so.two_pass_minimal_bwd_bf16})
    for (_, d), fn in fns.items():
        fn.argtypes = [ctypes.c_void_p] * (2 if d == "fwd" else 3) + [ctypes.c_long, ctypes.c_long]
    return fns


def aligned(shape, dt):
    n = int(np.prod(shape))
    buf = np.empty(n * np.dtype(dt).itemsize + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + n * np.dtype(dt).itemsize].view(dt).reshape(shape)


minimal = minimal_kernels()
rng = np.random.default_rng(0)
print("| cell | dir | cynorm ms | cynorm out= ms | floor ms | 2-read floor ms | minimal ms | eff | out= eff | bound "
      "| minimal eff | of bound |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for dt in (np.float32, ml_dtypes.bfloat16):
    bits = np.uint32 if dt == np.float32 else np.uint16
    for N, C, H, G in ((2, 320, 64, 32), (2, 640, 32, 32), (2, 1280, 16, 32)):
        for ax in (1, -1):
            shape = (N, C, H, H) if ax == 1 else (N, H, H, C)
            x = (rng.standard_normal(shape) + 3).astype(dt)
            dy = rng.standard_normal(shape).astype(dt)
            w = (1 + 0.1 * rng.standard_normal(C)).astype(dt)
            b = (0.1 * rng.standard_normal(C)).astype(dt)
            y, m, r = cynorm.group_norm_forward(x, G, w, b, channel_axis=ax, num_threads=1)
            outs = (aligned(shape, dt), np.empty_like(m), np.empty_like(r))
            grads = (aligned(shape, dt), np.empty_like(w), np.empty_like(b))
            xb, db = x.view(bits).ravel(), dy.view(bits).ravel()
            fns = {
                "fwd": lambda: cynorm.group_norm_forward(x, G, w, b, channel_axis=ax, num_threads=1),
                "fwd out=": lambda: cynorm.group_norm_forward(x, G, w, b, channel_axis=ax, num_threads=1, out=outs),
                "bwd": lambda: cynorm.group_norm_backward(dy, x, m, r, w, num_groups=G, channel_axis=ax,
                                                          num_threads=1),
                "bwd out=": lambda: cynorm.group_norm_backward(dy, x, m, r, w, num_groups=G, channel_axis=ax,
                                                               num_threads=1, out=grads),
                "copy": lambda: xb.copy(),
                "read+copy": lambda: (np.maximum.reduce(xb), xb.copy()),
                "op": lambda: np.add(xb, db),
                "read2+op": lambda: (np.maximum.reduce(xb), np.maximum.reduce(db), np.add(xb, db)),
            }
            if (np.dtype(dt), "fwd") in minimal and ax == 1:
                out, L = aligned(x.shape, dt), x.size // (N * G)
                fwd_k, bwd_k = minimal[np.dtype(dt), "fwd"], minimal[np.dtype(dt), "bwd"]
                fns["fwd minimal"] = lambda: fwd_k(x.ctypes.data, out.ctypes.data, x.size, L)
                fns["bwd minimal"] = lambda: bwd_k(x.ctypes.data, dy.ctypes.data, out.ctypes.data, x.size, L)
            got = {k: [] for k in fns}
            for k in range(9):
                for name, fn in (fns.items() if k % 2 == 0 else reversed(list(fns.items()))):
                    got[name].append(timed(fn))
            md = {k: statistics.median(v) * 1e3 for k, v in got.items()}
            cell = f"{np.dtype(dt).name} {'nchw' if ax == 1 else 'nhwc'} {(N, C, H, H)}"
            for d, floor, two in (("fwd", "copy", "read+copy"), ("bwd", "op", "read2+op")):
                eff, bound = md[floor] / md[d], md[floor] / md[two]
                mini = md.get(f"{d} minimal")
                pre = md.get(f"{d} out=")
                print(f"| {cell} | {d} | {md[d]:.3f} | {f'{pre:.3f}' if pre else ''} | {md[floor]:.3f} | "
                      f"{md[two]:.3f} | {f'{mini:.3f}' if mini else ''} | {eff:.2f} | "
                      f"{f'{md[floor] / pre:.2f}' if pre else ''} | {bound:.2f} | "
                      f"{f'{md[floor] / mini:.2f}' if mini else ''} | {eff / bound:.2f} |", flush=True)
