"""GroupNorm (bench.py groupnorm), side by side in one run.

    python benchmarks/bench.py groupnorm [--threads 1] [--modes fp32,bf16,mixed] [--layouts nchw,nhwc]
                                         [--quick] [--json F] [--baseline-python PY]

Columns (each library in its own worker process, the rounds taking them in turn; medians):

- cynorm: group_norm_forward / group_norm_backward (fresh outputs, as every column);
- torch: torch 2.13's F.group_norm (no_grad), NCHW or channels_last memory format;
  the backward by autograd (x, weight, bias);
- cynorm out=: the same with every output preallocated (as oneDNN's column);
- oneDNN (--onednn LIB): its group normalization primitive through the C API
  (benchmarks/onednn.py), every output preallocated, fp32 scale and shift (so
  its bf16 is cynorm's mixed); vs oneDNN = oneDNN / cynorm out=;
- ORT: ONNX Runtime's GroupNormalization (opset 21: per-channel scale and bias),
  forward, NCHW (the op's layout) float32 only where it runs;
- OpenVINO: its GroupNormalization (opset 12) compiled for the CPU plugin with
  inference precision f32 (its default on BF16 CPUs is bf16) and the thread
  count set, forward, NCHW float32 (the op's layout; it has no backward);
- floor: NumPy moving the same bytes into a fresh array -- forward a copy of x,
  backward an elementwise op of x and dy; 16-bit data as uint16;
- 2-read floor: the same after NumPy has read x (and dy) once more (a max over
  their bits): what any two-pass GroupNorm moves at the least, since a group's
  statistics come before its first output. Where a sample's group spans more
  than the L2 holds, the second read comes from L3 or memory, as here.

floor eff = floor / cynorm; 2-read eff = 2-read floor / cynorm; vs torch =
torch / cynorm (above 1: cynorm is faster).
--baseline-python PY adds an A/B table: the cynorm of another build (e.g. the
commit before a change) in its own worker, in the same rounds.
"""

import math
import sys

#: (channels-first shape, num_groups): UNet-like, ResNet-like (GroupNorm and InstanceNorm), tiny
SHAPES = [((2, 320, 64, 64), 32), ((2, 640, 32, 32), 32), ((2, 1280, 16, 16), 32),
          ((64, 128, 56, 56), 32), ((64, 128, 56, 56), 128), ((1, 32, 8, 8), 8)]
LIBS = ["cynorm", "numpy", "torch", "ort", "openvino"]
LARGE = 100_000


def _data(shape, layout, mode):
    import ml_dtypes  # noqa: F401  (registers bfloat16 in workers that do not import cynorm)
    import numpy as np

    import worker
    xd, pd = worker.MODES[mode]
    stored = shape if layout == "nchw" else (shape[0],) + shape[2:] + (shape[1],)
    rng = np.random.default_rng(0)
    x, dy = np.empty(stored, xd), np.empty(stored, xd)
    worker._fill_normal(rng, x, 3.0, 1.0)
    worker._fill_normal(rng, dy)
    C = shape[1]
    w = (1 + 0.1 * rng.standard_normal(C)).astype(pd)
    b = (0.1 * rng.standard_normal(C)).astype(pd)
    return x, dy, w, b


_DATA = {}
_ENGINES = {}


def run_request(lib, req):
    import gc

    import numpy as np

    import worker
    shape, G, layout, mode = tuple(req["shape"]), req["groups"], req["layout"], req["mode"]
    threads, budget, d = req["threads"], req["budget"], req["direction"]
    worker._WARMUP = req.get("warmup", 0.3)
    key = (shape, layout, mode)
    if key not in _DATA:
        _DATA.clear()
        gc.collect()
        _DATA[key] = _data(shape, layout, mode)
    x, dy, w, b = _DATA[key]
    ca = 1 if layout == "nchw" else -1
    t = worker._timeit
    out = {}
    if lib == "numpy":
        v = (lambda a: a.view(np.uint16)) if x.itemsize == 2 else (lambda a: a)
        xv, dyv = v(x), v(dy)
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize]
        xb, dyb = x.view(bits).ravel(), dy.view(bits).ravel()
        if d == "fwd":
            out[d] = t(lambda: np.copy(xv), budget)
            out[d + "_2read"] = t(lambda: (np.maximum.reduce(xb), np.copy(xv)), budget)
        else:
            out[d] = t(lambda: np.add(xv, dyv), budget)
            out[d + "_2read"] = t(lambda: (np.maximum.reduce(xb), np.maximum.reduce(dyb), np.add(xv, dyv)), budget)
    elif lib == "cynorm":
        import cynorm
        y, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=ca, num_threads=threads)
        dx, dw, db = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=ca,
                                                num_threads=threads)
        if d == "fwd":
            out[d] = t(lambda: cynorm.group_norm_forward(x, G, w, b, channel_axis=ca, num_threads=threads), budget)
            fo = tuple(np.empty_like(a) for a in (y, mean, rstd))
            out[d + "_out"] = t(lambda: cynorm.group_norm_forward(x, G, w, b, channel_axis=ca, num_threads=threads,
                                                                  out=fo), budget)
        else:
            out[d] = t(lambda: cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=ca,
                                                          num_threads=threads), budget)
            bo = tuple(np.empty_like(a) for a in (dx, dw, db))
            out[d + "_out"] = t(lambda: cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=ca,
                                                                   num_threads=threads, out=bo), budget)
    elif lib.startswith("onednn:"):
        import onednn
        path = lib.split(":", 1)[1]
        if path not in _ENGINES:
            _ENGINES[path] = onednn.OneDNN(path)
        fwd, bwd, _ = _ENGINES[path].group_norm(x, dy, w.astype(np.float32), b.astype(np.float32), G,
                                                layout == "nhwc", 1e-5, threads)
        fwd()   # (the backward reads the forward's mean and variance)
        out[d] = t(fwd if d == "fwd" else bwd, budget)
    elif lib == "torch":
        import torch
        torch.set_num_threads(threads)
        tx, tdy, tw, tb = (worker._torch_cast(torch.from_numpy(worker._torch_view(a)), a) for a in (x, dy, w, b))
        if layout == "nhwc":   # the same memory as an NCHW tensor in channels_last format
            perm = (0, x.ndim - 1) + tuple(range(1, x.ndim - 1))
            tx, tdy = tx.permute(perm), tdy.permute(perm)
        F = torch.nn.functional
        if d == "fwd":
            def fwd():
                with torch.no_grad():
                    return F.group_norm(tx, G, tw, tb, 1e-5)
            out[d] = t(fwd, budget)
        else:
            xg, wg, bg = tx.detach().requires_grad_(True), tw.detach().requires_grad_(True), tb.detach().requires_grad_(True)
            yg = F.group_norm(xg, G, wg, bg, 1e-5)
            out[d] = t(lambda: torch.autograd.grad(yg, (xg, wg, bg), tdy, retain_graph=True), budget)
    elif lib == "ort":
        if d != "fwd" or layout != "nchw" or x.dtype != np.float32 or w.dtype != np.float32:
            return out
        import onnxruntime as ort
        sess, err = _ort_session(ort, G, shape, threads)
        if sess is None:
            return {"error": f"GroupNormalization: {err}"}
        feeds = {"x": x, "w": w, "b": b}
        out[d] = t(lambda: sess.run(None, feeds), budget)
    elif lib == "openvino":
        if d != "fwd" or layout != "nchw" or x.dtype != np.float32 or w.dtype != np.float32:
            return out
        req_ = _ov_request(G, shape, threads)
        out[d] = t(lambda: req_.infer({0: x, 1: w, 2: b}), budget)
    del x, dy, w, b
    gc.collect()
    return out


def _ov_request(G, shape, threads):
    import openvino as ov
    import openvino.opset12 as ops
    params = [ops.parameter(list(shape), ov.Type.f32), ops.parameter([shape[1]], ov.Type.f32),
              ops.parameter([shape[1]], ov.Type.f32)]
    y = ops.group_normalization(*params, num_groups=G, epsilon=1e-5)
    model = ov.Model([y], params, "gn")
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                      "INFERENCE_PRECISION_HINT": "f32"})
    return compiled.create_infer_request()


def _ort_session(ort, G, shape, threads):
    from onnx import TensorProto, helper
    node = helper.make_node("GroupNormalization", ["x", "w", "b"], ["y"], epsilon=1e-5, num_groups=G)
    f = TensorProto.FLOAT
    graph = helper.make_graph([node], "gn", [helper.make_tensor_value_info("x", f, list(shape)),
                                             helper.make_tensor_value_info("w", f, [shape[1]]),
                                             helper.make_tensor_value_info("b", f, [shape[1]])],
                              [helper.make_tensor_value_info("y", f, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]), None
    except Exception as exc:
        return None, str(exc).splitlines()[0][:120]


def cmd_groupnorm(args):
    import os

    import bench
    onednn_libs = [f"onednn:{os.path.abspath(p)}" for p in args.onednn.split(",")] if args.onednn else []
    workers = {lib: bench.Worker(lib) for lib in LIBS + onednn_libs}
    if args.baseline_python:   # A/B: another build's cynorm, in the same rounds
        workers["cynorm_base"] = bench.Worker("cynorm_base", args.baseline_python)
    for lib, w in workers.items():
        if not w.available:
            bench._progress(f"{lib} not available ({w.info.get('unavailable')}): its columns left empty")
    budget = 0.15 if args.quick else 0.4
    rows = []
    cells = [(s, g, lay, m) for s, g in SHAPES for lay in args.layouts for m in args.modes]
    try:
        for i, (shape, G, layout, mode) in enumerate(cells, 1):
            bench._progress(f"[{i}/{len(cells)}] {shape} G={G} {layout} {mode} ...")
            row = {"shape": list(shape), "groups": G, "layout": layout, "mode": mode,
                   "elements": math.prod(shape), "threads": args.threads}
            for d in ("fwd", "bwd"):
                req = {"kind": "groupnorm", "shape": shape, "groups": G, "layout": layout, "mode": mode,
                       "threads": args.threads, "budget": budget, "direction": d}
                res = bench._measure(workers, req, [lib for lib, w in workers.items() if w.available])
                for lib, rr in res.items():
                    if "error" in rr:
                        bench._progress(f"  {lib}: {rr['error']}")
                vals = {lib: res.get(lib, {}).get(d) for lib in LIBS}
                cy = vals["cynorm"]
                for lib, v in vals.items():
                    row[f"{d}_{lib}_ms"] = v * 1e3 if v else None
                cy_out = res.get("cynorm", {}).get(d + "_out")
                one = res.get(onednn_libs[0], {}).get(d) if onednn_libs else None
                row[f"{d}_cynorm_out_ms"] = cy_out * 1e3 if cy_out else None
                row[f"{d}_onednn_ms"] = one * 1e3 if one else None
                row[f"{d}_vs_onednn"] = one / cy_out if one and cy_out else None
                row[f"{d}_floor_eff"] = vals["numpy"] / cy if cy and vals["numpy"] else None
                two = res.get("numpy", {}).get(d + "_2read")
                row[f"{d}_2read_ms"] = two * 1e3 if two else None
                row[f"{d}_2read_eff"] = two / cy if two and cy else None
                row[f"{d}_vs_torch"] = vals["torch"] / cy if cy and vals["torch"] else None
                row[f"{d}_vs_ort"] = vals["ort"] / cy if cy and vals["ort"] else None
                row[f"{d}_vs_openvino"] = vals["openvino"] / cy if cy and vals["openvino"] else None
                base = res.get("cynorm_base", {}).get(d)
                row[f"{d}_base_ms"] = base * 1e3 if base else None
                row[f"{d}_vs_base"] = base / cy if base and cy else None
            rows.append(row)
    finally:
        for w in workers.values():
            w.close()
    meta = {"command": "groupnorm", "threads": args.threads, "machine": bench._machine(),
            "versions": {lib.split(":")[0]: w.info.get("version") for lib, w in workers.items()},
            "isa": workers["cynorm"].info.get("config", {}).get("isa"),
            "baseline": workers["cynorm_base"].info if "cynorm_base" in workers else None}
    _print(rows, meta)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        bench._progress(f"wrote {args.json}")


def _geomean(vals):
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _print_ab(rows):
    """This build against --baseline-python's, cell by cell (fresh outputs)."""
    from bench import _fmt
    print("A/B (fresh outputs): speed = baseline time / this build's time (above 1: this build is faster).\n")
    print("| shape | G | layout | mode | fwd baseline | fwd this | fwd speed | bwd baseline | bwd this | bwd speed |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cells = [_fmt(r[f"{d}_{k}"]) for d in ("fwd", "bwd") for k in ("base_ms", "cynorm_ms")]
        print(f"| {tuple(r['shape'])} | {r['groups']} | {r['layout']} | {r['mode']} | {cells[0]} | {cells[1]} | "
              f"{_fmt(r['fwd_vs_base'], 2)} | {cells[2]} | {cells[3]} | {_fmt(r['bwd_vs_base'], 2)} |")
    for d in ("fwd", "bwd"):
        for layout in sorted({r["layout"] for r in rows}):
            v = [r[f"{d}_vs_base"] for r in rows if r["layout"] == layout and r[f"{d}_vs_base"]]
            if v:
                print(f"{d} {layout}: vs baseline lowest {min(v):.2f}, geometric mean {_geomean(v):.2f}")
    print()


def _print(rows, meta):
    from bench import _fmt
    v = meta["versions"]
    print(f"\n### GroupNorm -- cynorm {v.get('cynorm')} ({meta['isa']}), torch {v.get('torch')}, onnxruntime "
          f"{v.get('ort')}, OpenVINO {v.get('openvino')}, oneDNN {v.get('onednn')}, {meta['threads']} thread(s), {meta['machine']['cpu_model']}\n")
    print("Times in ms (median). cynorm, torch, ORT, floor: fresh outputs; cynorm out=, oneDNN: preallocated. "
          "eff = floor / cynorm (2-read eff: the 2-read floor / cynorm); vs torch, vs ORT, vs OV = their time / "
          "cynorm's; vs oneDNN = oneDNN / cynorm out=.\n")
    for d, title in (("fwd", "forward"), ("bwd", "backward")):
        print(f"{title}:\n")
        print("| shape | G | layout | mode | cynorm | torch | ORT | OpenVINO | floor | 2-read floor | cynorm out= "
              "| oneDNN | floor eff | 2-read eff | vs torch | vs ORT | vs OV | vs oneDNN |")
        print("|---|---:|---|---|" + "---:|" * 14)
        for r in rows:
            cells = [r[f"{d}_cynorm_ms"], r[f"{d}_torch_ms"], r[f"{d}_ort_ms"], r[f"{d}_openvino_ms"],
                     r[f"{d}_numpy_ms"], r.get(f"{d}_2read_ms"), r[f"{d}_cynorm_out_ms"], r[f"{d}_onednn_ms"]]
            ratios = [r[f"{d}_floor_eff"], r.get(f"{d}_2read_eff"), r[f"{d}_vs_torch"], r[f"{d}_vs_ort"],
                      r[f"{d}_vs_openvino"], r[f"{d}_vs_onednn"]]
            print(f"| {tuple(r['shape'])} | {r['groups']} | {r['layout']} | {r['mode']} | "
                  + " | ".join(_fmt(c) for c in cells) + " | " + " | ".join(_fmt(c, 2) for c in ratios) + " |")
        print()
    if meta.get("baseline"):
        _print_ab(rows)
    for d in ("fwd", "bwd"):
        for layout in sorted({r["layout"] for r in rows}):
            sel = [r for r in rows if r["layout"] == layout]
            vo = [r[f"{d}_vs_onednn"] for r in sel if r[f"{d}_vs_onednn"]]
            if vo:
                print(f"{d} {layout}: vs oneDNN lowest {min(vo):.2f}, geometric mean {_geomean(vo):.2f}")
            for lib in ("ort", "openvino"):
                vl = [r[f"{d}_vs_{lib}"] for r in sel if r[f"{d}_vs_{lib}"]]
                if vl:
                    print(f"{d} {layout}: vs {lib} lowest {min(vl):.2f}, geometric mean {_geomean(vl):.2f}")
            vt = [r[f"{d}_vs_torch"] for r in sel if r[f"{d}_vs_torch"]]
            big = [r[f"{d}_vs_torch"] for r in sel if r[f"{d}_vs_torch"] and r["elements"] >= LARGE]
            eff = [r[f"{d}_floor_eff"] for r in sel if r[f"{d}_floor_eff"] and r["elements"] >= LARGE]
            eff2 = [r[f"{d}_2read_eff"] for r in sel if r.get(f"{d}_2read_eff") and r["elements"] >= LARGE]
            if vt:
                print(f"{d} {layout}: vs torch lowest {min(vt):.2f}, geometric mean over large cells "
                      f"{_geomean(big) or float('nan'):.2f}; floor eff on large cells lowest "
                      f"{min(eff) if eff else float('nan'):.2f}, 2-read eff lowest "
                      f"{min(eff2) if eff2 else float('nan'):.2f}")
    sys.stdout.flush()
