"""Fused residual add + LayerNorm (bench.py fused), side by side in one run.

    python benchmarks/bench.py fused [--threads 1] [--modes fp32,bf16,mixed] [--quick] [--json F]

Forward: h = x + r; y = layer_norm(h). Backward: the gradient of h is
layer_norm_backward(dy) + dh (dh arriving along the residual stream). Columns:

- fused: cynorm.add_layer_norm_forward / add_layer_norm_backward (dh given);
- unfused: cynorm's own sequence, NumPy's x + r then layer_norm_forward;
  layer_norm_backward then NumPy's dx + dh;
- torch: torch 2.13's composite, x + r then F.layer_norm (no_grad), and the
  backward by autograd through both (grad_outputs dy for y and dh for h);
- ORT: ONNX Runtime's com.microsoft SkipLayerNormalization (forward, CPU
  provider, float32/float16 only: no bfloat16 kernel), outputs y and h;
- floor: NumPy moving the same bytes into fresh arrays -- forward two copies
  (2 read, 2 written), backward np.clip(a, b, c) (3 read, 1 written); 16-bit
  data as uint16.

Each library runs in its own worker process (bench.py's workers), the rounds
take them in turn; medians. floor eff = floor / fused; vs unfused = unfused /
fused; vs torch = torch / fused; vs ORT = ORT / fused.
"""

import math
import sys

SHAPES = [(4096, 4096), (16384, 1024), (64, 128, 56, 56), (8192, 8192)]
LIBS = ["cynorm", "numpy", "torch", "ort"]


def _data(shape, mode):
    import numpy as np


    import worker
    x, dy, w, b = worker._make_data(shape, len(shape) - 1, mode, seed=0)
    r, dh = np.empty_like(x), np.empty_like(x)
    rng = np.random.default_rng(1)
    worker._fill_normal(rng, r)
    worker._fill_normal(rng, dh)
    return x, r, dy, dh, w, b


_DATA = {}


def run_request(lib, req):
    import gc

    import numpy as np


    import worker
    shape, mode, threads = tuple(req["shape"]), req["mode"], req["threads"]
    budget, directions = req["budget"], req["directions"]
    worker._WARMUP = req.get("warmup", 0.3)
    key = (shape, mode)
    if key not in _DATA:
        _DATA.clear()
        gc.collect()
        _DATA[key] = _data(shape, mode)
    x, r, dy, dh, w, b = _DATA[key]
    t = worker._timeit
    out = {}
    if lib == "numpy":
        v = (lambda a: a.view(np.uint16)) if x.itemsize == 2 else (lambda a: a)
        xv, rv, dyv, dhv = v(x), v(r), v(dy), v(dh)
        if "fwd" in directions:
            out["fwd_floor"] = t(lambda: (np.copy(xv), np.copy(rv)), budget)
        if "bwd" in directions:
            out["bwd_floor"] = t(lambda: np.clip(dyv, xv, dhv), budget)
    elif lib == "cynorm":
        import cynorm
        y, h, mean, rstd = cynorm.add_layer_norm_forward(x, r, w, b, num_threads=threads)
        if "fwd" in directions:
            out["fwd_fused"] = t(lambda: cynorm.add_layer_norm_forward(x, r, w, b, num_threads=threads), budget)
            out["fwd_unfused"] = t(lambda: cynorm.layer_norm_forward(x + r, w, b, num_threads=threads), budget)
        if "bwd" in directions:
            out["bwd_fused"] = t(lambda: cynorm.add_layer_norm_backward(dy, h, mean, rstd, w, dh=dh,
                                                                        num_threads=threads), budget)

            def unfused():
                dx, dw, db = cynorm.layer_norm_backward(dy, h, mean, rstd, w, num_threads=threads)
                return dx + dh, dw, db
            out["bwd_unfused"] = t(unfused, budget)
    elif lib == "torch":
        import torch
        torch.set_num_threads(threads)
        tx, tr, tdy, tdh, tw, tb = (worker._torch_cast(torch.from_numpy(worker._torch_view(a)), a)
                                    for a in (x, r, dy, dh, w, b))
        ns = [shape[-1]]
        F = torch.nn.functional
        if "fwd" in directions:
            def fwd():
                with torch.no_grad():
                    h = tx + tr
                    return F.layer_norm(h, ns, tw, tb, 1e-5), h
            out["fwd"] = t(fwd, budget)
        if "bwd" in directions:
            xg, rg = tx.detach().requires_grad_(True), tr.detach().requires_grad_(True)
            wg, bg = tw.detach().requires_grad_(True), tb.detach().requires_grad_(True)
            hg = xg + rg
            yg = F.layer_norm(hg, ns, wg, bg, 1e-5)
            out["bwd"] = t(lambda: torch.autograd.grad((yg, hg), (xg, rg, wg, bg), (tdy, tdh),
                                                       retain_graph=True), budget)
    elif lib == "ort":
        if x.dtype.name == "bfloat16" or "fwd" not in directions:
            return out
        import onnxruntime as ort
        sess = _ort_session(ort, x.dtype, w.dtype, shape[-1], threads)
        if sess is None:
            return {"error": "SkipLayerNormalization: no CPU kernel for these dtypes"}
        feeds = {"x": x.reshape(1, -1, shape[-1]), "r": r.reshape(1, -1, shape[-1]), "w": w, "b": b}
        out["fwd"] = t(lambda: sess.run(None, feeds), budget)
    del x, r, dy, dh, w, b
    gc.collect()
    return out


def _ort_session(ort, x_dtype, p_dtype, n, threads):
    import numpy as np
    from onnx import TensorProto, helper
    if p_dtype != x_dtype:   # the contrib op takes one type for all inputs
        return None
    et = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}[np.dtype(x_dtype)]
    node = helper.make_node("SkipLayerNormalization", ["x", "r", "w", "b"], ["y", "", "", "h"],
                            domain="com.microsoft", epsilon=1e-5)
    graph = helper.make_graph(
        [node], "skip_ln",
        [helper.make_tensor_value_info("x", et, [1, None, n]), helper.make_tensor_value_info("r", et, [1, None, n]),
         helper.make_tensor_value_info("w", et, [n]), helper.make_tensor_value_info("b", et, [n])],
        [helper.make_tensor_value_info("y", et, [1, None, n]), helper.make_tensor_value_info("h", et, [1, None, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:
        return None


def ort_ready():
    import onnxruntime
    return onnxruntime.__version__


def cmd_fused(args):
    import bench
    workers = {lib: bench.Worker(lib) for lib in LIBS}
    for lib, w in workers.items():
        if not w.available:
            bench._progress(f"{lib} not available ({w.info.get('unavailable')}): its columns left empty")
    budget = 0.15 if args.quick else 0.4
    rows = []
    cells = [(s, m) for s in SHAPES for m in args.modes]
    try:
        for i, (shape, mode) in enumerate(cells, 1):
            bench._progress(f"[{i}/{len(cells)}] {shape} {mode} ...")
            n = math.prod(shape)
            row = {"shape": list(shape), "mode": mode, "elements": n, "threads": args.threads}
            for d in ("fwd", "bwd"):
                req = {"kind": "fused", "shape": shape, "mode": mode, "threads": args.threads,
                       "budget": budget * (2 if n >= 5e7 else 1), "directions": [d]}
                libs = [lib for lib, w in workers.items() if w.available and not (lib == "ort" and d == "bwd")]
                res = bench._measure(workers, req, libs)
                for lib, rr in res.items():
                    if "error" in rr:
                        bench._progress(f"  {lib}: {rr['error']}")
                fused = res["cynorm"].get(f"{d}_fused")
                vals = {"fused": fused, "unfused": res["cynorm"].get(f"{d}_unfused"),
                        "floor": res.get("numpy", {}).get(f"{d}_floor"), "torch": res.get("torch", {}).get(d),
                        "ort": res.get("ort", {}).get(d)}
                for k, v in vals.items():
                    row[f"{d}_{k}_ms"] = v * 1e3 if v else None
                row[f"{d}_floor_eff"] = vals["floor"] / fused if fused and vals["floor"] else None
                for k in ("unfused", "torch", "ort"):
                    row[f"{d}_vs_{k}"] = vals[k] / fused if fused and vals[k] else None
            rows.append(row)
    finally:
        for w in workers.values():
            w.close()
    meta = {"command": "fused", "threads": args.threads, "machine": bench._machine(),
            "versions": {lib: w.info.get("version") for lib, w in workers.items()},
            "isa": workers["cynorm"].info.get("config", {}).get("isa")}
    _print(rows, meta)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        bench._progress(f"wrote {args.json}")


def _print(rows, meta):
    from bench import _fmt
    v = meta["versions"]
    print(f"\n### fused residual add + LayerNorm -- cynorm {v.get('cynorm')} ({meta['isa']}), torch {v.get('torch')}, "
          f"onnxruntime {v.get('ort')}, {meta['threads']} thread(s), {meta['machine']['cpu_model']}\n")
    print("Times in ms (median). eff = floor / fused; the other ratios: their time / fused (above 1: fused is faster).\n")
    for d, title in (("fwd", "forward"), ("bwd", "backward")):
        ort = d == "fwd"
        print(f"{title}:\n")
        print("| shape | mode | fused | unfused | floor | torch |" + (" ORT |" if ort else "")
              + " floor eff | vs unfused | vs torch |" + (" vs ORT |" if ort else ""))
        print("|---|---|" + "---:|" * (7 + 2 * ort))
        for r in rows:
            cells = [r[f"{d}_fused_ms"], r[f"{d}_unfused_ms"], r[f"{d}_floor_ms"], r[f"{d}_torch_ms"]]
            cells += [r[f"{d}_ort_ms"]] if ort else []
            ratios = [r[f"{d}_floor_eff"], r[f"{d}_vs_unfused"], r[f"{d}_vs_torch"]]
            ratios += [r[f"{d}_vs_ort"]] if ort else []
            print(f"| {tuple(r['shape'])} | {r['mode']} | " + " | ".join(_fmt(c) for c in cells) + " | "
                  + " | ".join(_fmt(c, 2) for c in ratios) + " |")
        print()
    for d in ("fwd", "bwd"):
        effs = [r[f"{d}_floor_eff"] for r in rows if r[f"{d}_floor_eff"]]
        unf = [r[f"{d}_vs_unfused"] for r in rows if r[f"{d}_vs_unfused"]]
        if effs and unf:
            print(f"{d}: lowest floor eff {min(effs):.2f}, lowest vs unfused {min(unf):.2f}")
    sys.stdout.flush()
