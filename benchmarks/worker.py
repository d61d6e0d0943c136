"""The worker side of bench.py: one process per library, serving timing
requests (JSON lines on stdin) -- the data of each cell, the timed calls of
cynorm, torch and the NumPy floors. bench.py starts it as `bench.py _worker LIB`;
fused.py and onednn.py add their own requests."""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {  # name -> (x dtype, param dtype): bench.MODES
    "fp32": ("float32", "float32"),
    "bf16": ("bfloat16", "bfloat16"),
    "mixed": ("bfloat16", "float32"),
    "fp16": ("float16", "float16"),
    "fp16mixed": ("float16", "float32"),
}


# ----------------------------------------------------------------- worker --

def _worker_main(lib):
    """Serve timing requests (JSON lines on stdin) for one library."""
    import numpy as np

    if lib == "torch":
        try:
            import torch
        except ImportError:
            print(json.dumps({"unavailable": "torch is not installed"}), flush=True)
            return
        print(json.dumps({"ready": True, "version": torch.__version__}), flush=True)
    elif lib == "cynorm":
        import cynorm
        print(json.dumps({"ready": True, "version": cynorm.__version__,
                          "config": {k: v for k, v in cynorm._config.config().items()
                                     if k in ("isa", "isa_available", "openmp", "max_threads", "cpu_model")}}),
              flush=True)
    elif lib.startswith("onednn:"):   # benchmarks/onednn.py
        sys.path.insert(0, HERE)
        import onednn
        hello = onednn.hello(lib)
        print(json.dumps(hello), flush=True)
        if "ready" not in hello:
            return
    elif lib == "ort":
        try:
            import onnxruntime
        except ImportError:
            print(json.dumps({"unavailable": "onnxruntime is not installed"}), flush=True)
            return
        print(json.dumps({"ready": True, "version": onnxruntime.__version__}), flush=True)
    elif lib == "openvino":
        try:
            import openvino
        except ImportError:
            print(json.dumps({"unavailable": "openvino is not installed"}), flush=True)
            return
        print(json.dumps({"ready": True, "version": openvino.__version__.split("-")[0]}), flush=True)
    else:
        print(json.dumps({"ready": True, "version": np.__version__}), flush=True)

    for line in sys.stdin:
        req = json.loads(line)
        try:
            res = _run_request(lib, req)
        except MemoryError:
            res = {"error": "out of memory"}
        except Exception as exc:  # report, keep serving
            res = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(res), flush=True)


def _timeit(fn, budget, min_reps=3, max_reps=2000, warmup=None):
    """Per-call times (seconds) of fn, after warming up for `warmup` seconds
    (after large frees the OS compacts memory for huge pages, which stalls
    the first big allocations for a while). Fast calls are timed in batches."""
    warmup = _WARMUP if warmup is None else warmup
    t_start = time.perf_counter()
    calls = 0
    while calls < 3 or time.perf_counter() - t_start < warmup:
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        calls += 1
    batch = max(1, int(2e-4 / one))            # each sample at least ~0.2 ms
    reps = int(min(max_reps, max(min_reps, budget / (one * batch))))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return samples


_WARMUP = 0.3


def _aligned(a):
    """A copy of a whose data starts on a 64-byte boundary."""
    import numpy as np
    buf = np.empty(a.nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _fill_normal(rng, a, scale=1.0, shift=0.0):
    """a[...] = shift + scale * standard normal (float32 draws, cast to a's dtype), a million
    at a time: no array-sized temporaries, whose freeing would keep the OS busy (handing the
    pages back to the host) while the timed calls run. Same numbers as one big draw."""
    import numpy as np
    flat = a.reshape(-1)
    buf = np.empty(min(flat.size, 1 << 20), np.float32)
    for i in range(0, flat.size, buf.size):
        part = buf[: min(buf.size, flat.size - i)]
        rng.standard_normal(dtype=np.float32, out=part)
        if scale != 1.0 or shift != 0.0:
            part *= np.float32(scale)
            part += np.float32(shift)
        flat[i:i + part.size] = part


def _make_data(shape, axis, mode, seed=0, aligned=False):
    import numpy as np
    from ml_dtypes import bfloat16

    dt = {"float32": np.float32, "float16": np.float16, "bfloat16": bfloat16, "float64": np.float64}
    xd, pd = (dt[n] for n in MODES[mode])
    rng = np.random.default_rng(seed)
    ns = shape[axis:]
    x, dy = np.empty(shape, xd), np.empty(shape, xd)
    w, b = np.empty(ns, pd), np.empty(ns, pd)
    _fill_normal(rng, x)
    _fill_normal(rng, dy)
    _fill_normal(rng, w, 0.1, 1.0)
    _fill_normal(rng, b, 0.1)
    if aligned:
        x, dy = _aligned(x), _aligned(dy)
    return x, dy, w, b


# A worker keeps the inputs of the cell it is timing from one round to the next
# (the rounds take the libraries in turn); a new cell replaces them.
_DATA = {}


def _cell_data(shape, axis, mode, aligned):
    import gc

    key = (tuple(shape), axis, mode, aligned)
    if key not in _DATA:
        _DATA.clear()
        gc.collect()
        _DATA[key] = _make_data(shape, axis, mode, aligned=aligned)
    return _DATA[key]


def _run_request(lib, req):
    import gc

    if req.get("kind") == "fused":   # benchmarks/fused.py
        sys.path.insert(0, HERE)
        import fused
        return fused.run_request(lib, req)
    if req.get("kind") == "groupnorm":   # benchmarks/groupnorm.py
        sys.path.insert(0, HERE)
        import groupnorm
        return groupnorm.run_request(lib, req)
    if req.get("kind") == "onednn" or lib.startswith("onednn:"):   # benchmarks/onednn.py
        sys.path.insert(0, HERE)
        import onednn
        return onednn.run_request(lib, req)

    import numpy as np

    shape, axis, mode = tuple(req["shape"]), req["axis"], req["mode"]
    threads, budget, norm = req["threads"], req["budget"], req.get("norm", "layer")
    warmup = req.get("warmup", 0.3)
    directions = req["directions"]
    prealloc = req.get("prealloc", False)
    global _WARMUP
    _WARMUP = warmup
    aligned = req.get("aligned", False)
    x, dy, w, b = _cell_data(shape, axis, mode, aligned)
    empty_like = (lambda a: _aligned(np.empty_like(a))) if aligned else np.empty_like
    out = {}
    if lib == "numpy":
        # the floors: same bytes, no math
        xv = x.view(np.uint16) if x.itemsize == 2 else x
        dyv = dy.view(np.uint16) if x.itemsize == 2 else dy
        if prealloc:
            dst = empty_like(xv)
            out["copy_prealloc"] = _timeit(lambda: np.copyto(dst, xv), budget)
        else:
            if "fwd" in directions:
                out["fwd"] = _timeit(lambda: np.copy(xv), budget)
            if "bwd" in directions:
                out["bwd"] = _timeit(lambda: np.add(xv, dyv), budget)
    elif lib == "cynorm":
        import cynorm

        if norm == "layer":
            y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis, num_threads=threads)
            yo = empty_like(x) if prealloc else None
            dxo = empty_like(x) if prealloc else None
            fwd = lambda: cynorm.layer_norm_forward(x, w, b, axis=axis, num_threads=threads, out=yo)
            bwd = lambda: cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis, num_threads=threads, out=dxo)
        else:
            y, rstd = cynorm.rms_norm_forward(x, w, axis=axis, num_threads=threads)
            yo = empty_like(x) if prealloc else None
            dxo = empty_like(x) if prealloc else None
            fwd = lambda: cynorm.rms_norm_forward(x, w, axis=axis, num_threads=threads, out=yo)
            bwd = lambda: cynorm.rms_norm_backward(dy, x, rstd, w, axis=axis, num_threads=threads, out=dxo)
        if "fwd" in directions:
            out["fwd"] = _timeit(fwd, budget)
        if "bwd" in directions:
            out["bwd"] = _timeit(bwd, budget)
    elif lib == "torch":
        import torch

        torch.set_num_threads(threads)
        tx, tdy = torch.from_numpy(_torch_view(x)), torch.from_numpy(_torch_view(dy))
        tw, tb = torch.from_numpy(_torch_view(w)), torch.from_numpy(_torch_view(b))
        tx, tdy, tw, tb = (_torch_cast(t, a) for t, a in ((tx, x), (tdy, dy), (tw, w), (tb, b)))
        ns = list(shape[axis:])
        if norm == "layer":
            eps = 1e-5
            y, mean, rstd = torch.native_layer_norm(tx, ns, tw, tb, eps)
            fwd = lambda: torch.native_layer_norm(tx, ns, tw, tb, eps)
            bwd = lambda: torch.ops.aten.native_layer_norm_backward(tdy, tx, ns, mean, rstd, tw, tb,
                                                                    [True, True, True])
        else:
            # torch 2.13 has no fused CPU RMSNorm: functional rms_norm runs as composite ops
            eps = 1e-6
            fwd = lambda: torch.nn.functional.rms_norm(tx, ns, tw, eps)
            xg, wg = tx.detach().requires_grad_(True), tw.detach().requires_grad_(True)
            yg = torch.nn.functional.rms_norm(xg, ns, wg, eps)
            bwd = lambda: torch.autograd.grad(yg, (xg, wg), tdy, retain_graph=True)
        with torch.no_grad() if norm == "layer" else _nullcontext():
            if "fwd" in directions:
                out["fwd"] = _timeit(fwd, budget)
        if "bwd" in directions:
            out["bwd"] = _timeit(bwd, budget)
    del x, dy, w, b
    gc.collect()
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _torch_view(a):
    import numpy as np
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _torch_cast(t, a):
    import torch
    return t.view(torch.bfloat16) if a.dtype.name == "bfloat16" else t


# ------------------------------------------------------------------ parent --
