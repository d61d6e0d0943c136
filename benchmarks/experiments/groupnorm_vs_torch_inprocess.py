#!/usr/bin/env python
"""T=<threads> python benchmarks/experiments/groupnorm_vs_torch_inprocess.py

Channels-last GroupNorm, cynorm against torch 2.13's F.group_norm on the same
memory (an NCHW tensor in channels_last format), in ONE process: the calls
alternate, 21 rounds of 20 calls each, fresh outputs, medians. Each block of
20 calls starts after a 5 ms pause and one untimed call: torch and cynorm each
bring an OpenMP runtime, and at 2 threads one runtime's threads, still
spinning after its last call, would otherwise take a core from the other's
first calls (without the pause, (2,320,64,64) fp32 fwd read 0.72-0.98; with
it, 1.17-1.36). bench.py
groupnorm times each library in its own worker process; on a shared VM the
process a library lands in can move a small strided walk by 20-40% (which
physical pages its arrays get), so this is the side-by-side check for the
cells near parity. Data as bench.py's: normal, mean 3, std 1; weight, bias
near 1 and 0. Speed = torch's time / cynorm's."""
import os, time
import numpy as np, ml_dtypes, torch, cynorm

T = int(os.environ.get("T", "1"))
torch.set_num_threads(T)
F = torch.nn.functional
for (N, C, H, W), G in [((2, 1280, 16, 16), 32), ((2, 640, 32, 32), 32), ((2, 320, 64, 64), 32)]:
    for dt in ("fp32", "bf16"):
        rng = np.random.default_rng(0)
        npdt = np.float32 if dt == "fp32" else ml_dtypes.bfloat16
        x = (rng.standard_normal((N, H, W, C), np.float32) + 3).astype(npdt)
        dy = rng.standard_normal((N, H, W, C), np.float32).astype(npdt)
        w = (1 + 0.1 * rng.standard_normal(C)).astype(np.float32)
        b = (0.1 * rng.standard_normal(C)).astype(np.float32)
        tdt = torch.float32 if dt == "fp32" else torch.bfloat16
        tx = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16) if dt == "bf16" else torch.from_numpy(x)
        tdy = torch.from_numpy(dy.view(np.uint16)).view(torch.bfloat16) if dt == "bf16" else torch.from_numpy(dy)
        tx, tdy = tx.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)
        tw, tb = torch.from_numpy(w).to(tdt), torch.from_numpy(b).to(tdt)
        xg, wg, bg = tx.detach().requires_grad_(True), tw.detach().requires_grad_(True), tb.detach().requires_grad_(True)
        yg = F.group_norm(xg, G, wg, bg, 1e-5)
        y, m, r = cynorm.group_norm_forward(x, G, w, b, channel_axis=-1, num_threads=T)

        def t_fwd():
            with torch.no_grad():
                return F.group_norm(tx, G, tw, tb, 1e-5)
        fs = {"fwd": (lambda: cynorm.group_norm_forward(x, G, w, b, channel_axis=-1, num_threads=T), t_fwd),
              "bwd": (lambda: cynorm.group_norm_backward(dy, x, m, r, w, num_groups=G, channel_axis=-1, num_threads=T),
                      lambda: torch.autograd.grad(yg, (xg, wg, bg), tdy, retain_graph=True))}
        for d, (fc, ft) in fs.items():
            ts = {"cynorm": [], "torch": []}
            for _ in range(21):
                for k, f in (("cynorm", fc), ("torch", ft)):
                    time.sleep(0.005); f(); t0 = time.perf_counter()
                    for _ in range(20): f()
                    ts[k].append((time.perf_counter() - t0) / 20 * 1e3)
            mc, mt = np.median(ts["cynorm"]), np.median(ts["torch"])
            print(f"T{T} {str((N, C, H, W)):18s} G={G} nhwc {dt} {d}: cynorm {mc:.4f} ms, torch {mt:.4f} ms, "
                  f"speed {mt / mc:.2f}", flush=True)
