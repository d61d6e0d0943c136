"""oneDNN's layer and group normalization through its C API (ctypes), for `bench.py onednn`
and `bench.py groupnorm --onednn`.

The library is found in this order:
  - the path given to bench.py (--onednn LIB[,LIB2]; one worker per library);
  - CYNORM_ONEDNN_LIB;
  - the `onednn-cpu-gomp` wheel's libdnnl.so.3 under sys.prefix/lib
    (pip install onednn-cpu-gomp==2023.2.0: oneDNN 3.2, CPU engine, GNU OpenMP).
The newer `onednn` wheels are SYCL builds whose CPU engine does not open. To build
3.13 (28 minutes on a 2-core Xeon, layer normalization and reorder only), see
benchmarks/README.md, "Against oneDNN".

oneDNN computes in fp32 whatever the data type, keeps scale/shift in fp32 (so its
"bf16" is cynorm's "mixed") and writes the variance where cynorm writes rstd (the
same bytes). Every output goes to a preallocated buffer, as cynorm's out= does:
forward y, mean, variance (forward_training); backward dx, dscale, dshift.
"""

import ctypes
import glob
import math
import os
import sys

# dnnl_types.h / dnnl_common_types.h (stable across 3.x)
_F16, _BF16, _F32 = 1, 2, 3
_TAG_A, _TAG_AB = 2, 3
_CPU = 1
_FWD_TRAINING, _BACKWARD = 64, 128
_USE_SCALE, _USE_SHIFT = 0x2, 0x4
_ARG_SRC, _ARG_DST, _ARG_MEAN, _ARG_VARIANCE, _ARG_SCALE, _ARG_SHIFT = 1, 17, 49, 50, 51, 52
_ARG_DIFF_SRC, _ARG_DIFF_DST, _ARG_DIFF_SCALE, _ARG_DIFF_SHIFT = 129, 145, 255, 256


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


def default_library():
    path = os.environ.get("CYNORM_ONEDNN_LIB")
    if path:
        return path
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libdnnl.so.3*")))
    return found[0] if found else None


class OneDNN:
    """One CPU engine and stream of the library at `path`; primitives are made per
    (shape, dtype, threads) and kept."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        lib.dnnl_version.restype = ctypes.POINTER(_Version)
        v = lib.dnnl_version().contents
        self.version = f"{v.major}.{v.minor}.{v.patch}"
        self.path = path
        self.engine, self.stream = ctypes.c_void_p(), ctypes.c_void_p()
        self._ok(lib.dnnl_engine_create(ctypes.byref(self.engine), _CPU, ctypes.c_size_t(0)), "engine_create")
        self._ok(lib.dnnl_stream_create(ctypes.byref(self.stream), self.engine, ctypes.c_uint(1)), "stream_create")
        lib.dnnl_primitive_desc_query_md.restype = ctypes.c_void_p
        self._gomp = ctypes.CDLL("libgomp.so.1")   # the OpenMP runtime libdnnl was linked with
        self._cache = {}

    @staticmethod
    def _ok(status, what):
        if status != 0:
            raise RuntimeError(f"oneDNN {what} failed with status {status}")

    def _md(self, dims, dtype):
        md = ctypes.c_void_p()
        arr = (ctypes.c_int64 * 12)(*dims)
        self._ok(self.lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(dims), arr, dtype,
                                                           _TAG_A if len(dims) == 1 else _TAG_AB), "md")
        return md

    def _primitives(self, M, N, dtype, eps):
        key = (M, N, dtype, eps)
        if key in self._cache:
            return self._cache[key]
        lib = self.lib
        data, stat, par = self._md((M, N), dtype), self._md((M,), _F32), self._md((N,), _F32)
        flags = ctypes.c_uint(_USE_SCALE | _USE_SHIFT)
        fpd, bpd = ctypes.c_void_p(), ctypes.c_void_p()
        self._ok(lib.dnnl_layer_normalization_forward_primitive_desc_create(
            ctypes.byref(fpd), self.engine, _FWD_TRAINING, data, data, stat, ctypes.c_float(eps), flags, None),
            "forward primitive_desc")
        self._ok(lib.dnnl_layer_normalization_backward_primitive_desc_create(
            ctypes.byref(bpd), self.engine, _BACKWARD, data, data, data, stat, ctypes.c_float(eps), flags, fpd,
            None), "backward primitive_desc")
        fwd, bwd = ctypes.c_void_p(), ctypes.c_void_p()
        self._ok(lib.dnnl_primitive_create(ctypes.byref(fwd), fpd), "forward primitive")
        self._ok(lib.dnnl_primitive_create(ctypes.byref(bwd), bpd), "backward primitive")
        self._cache[key] = (fwd, bwd, data, stat, par)
        return self._cache[key]

    def _mem(self, md, arr):
        m = ctypes.c_void_p()
        self._ok(self.lib.dnnl_memory_create(ctypes.byref(m), md, self.engine, ctypes.c_void_p(arr.ctypes.data)),
                 "memory_create")
        return m

    def _runner(self, prim, args):
        """A zero-argument callable executing prim on these (arg, memory) pairs."""
        lib, stream = self.lib, self.stream
        n = len(args)
        arr = (_ExecArg * n)(*[_ExecArg(a, m) for a, m in args])
        keep = args   # (the memory objects must outlive the callable)

        def run():
            if lib.dnnl_primitive_execute(prim, stream, n, arr) != 0:
                raise RuntimeError("oneDNN execute failed")
            lib.dnnl_stream_wait(stream)
        run.keep = keep
        return run

    def _md_strided(self, dims, strides, dtype):
        md = ctypes.c_void_p()
        self._ok(self.lib.dnnl_memory_desc_create_with_strides(
            ctypes.byref(md), len(dims), (ctypes.c_int64 * 12)(*dims), dtype, (ctypes.c_int64 * 12)(*strides)), "md")
        return md

    def group_norm(self, x, dy, w, b, groups, channels_last, eps, threads):
        """(forward, backward, outputs) as layer_norm, for oneDNN's group normalization of
        x, dy in NCHW-like (or channels_last: N, spatial..., C) memory; fp32 w, b (C,)."""
        self._gomp.omp_set_num_threads(threads)
        lib = self.lib
        shape = x.shape if not channels_last else (x.shape[0], x.shape[-1]) + x.shape[1:-1]
        N, C = shape[:2]
        dtype = {"float32": _F32, "bfloat16": _BF16, "float16": _F16}[x.dtype.name]
        key = ("group", shape, channels_last, dtype, groups, eps)
        if key not in self._cache:
            if channels_last:   # strides of (N, C, spatial...) over NHWC memory
                sp = shape[2:]
                strides = [C * math.prod(sp), 1] + [C * math.prod(sp[k + 1:]) for k in range(len(sp))]
            else:
                strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
            data = self._md_strided(shape, strides, dtype)
            stat, par = self._md((N, groups), _F32), self._md((C,), _F32)
            flags = ctypes.c_uint(_USE_SCALE | _USE_SHIFT)
            fpd, bpd = ctypes.c_void_p(), ctypes.c_void_p()
            self._ok(lib.dnnl_group_normalization_forward_primitive_desc_create(
                ctypes.byref(fpd), self.engine, _FWD_TRAINING, data, data, ctypes.c_int64(groups), ctypes.c_float(eps),
                flags, None), "group forward primitive_desc")
            self._ok(lib.dnnl_group_normalization_backward_primitive_desc_create(
                ctypes.byref(bpd), self.engine, _BACKWARD, data, data, data, ctypes.c_int64(groups),
                ctypes.c_float(eps), flags, fpd, None), "group backward primitive_desc")
            fwd, bwd = ctypes.c_void_p(), ctypes.c_void_p()
            self._ok(lib.dnnl_primitive_create(ctypes.byref(fwd), fpd), "group forward primitive")
            self._ok(lib.dnnl_primitive_create(ctypes.byref(bwd), bpd), "group backward primitive")
            self._cache[key] = (fwd, bwd, data, stat, par)
        fwd, bwd, data, stat, par = self._cache[key]
        return self._bind(fwd, bwd, data, stat, par, x, dy, w, b, (N, groups), C)

    def layer_norm(self, x, dy, w, b, eps, threads):
        """(forward, backward) callables for x, dy of shape (M, N), 16- or 32-bit, and
        fp32 w, b of shape (N,), each writing into buffers made here (returned too)."""
        self._gomp.omp_set_num_threads(threads)
        M, N = x.shape
        dtype = {"float32": _F32, "bfloat16": _BF16, "float16": _F16}[x.dtype.name]
        fwd, bwd, data, stat, par = self._primitives(M, N, dtype, eps)
        return self._bind(fwd, bwd, data, stat, par, x, dy, w, b, (M,), N)

    def _bind(self, fwd, bwd, data, stat, par, x, dy, w, b, stat_shape, n_params):
        """The primitives bound to x, dy, w, b and outputs made here: (forward, backward, outputs)."""
        import numpy as np
        y, dx = np.empty_like(x), np.empty_like(x)
        mean, var = np.empty(stat_shape, np.float32), np.empty(stat_shape, np.float32)
        dw, db = np.empty(n_params, np.float32), np.empty(n_params, np.float32)
        mem = self._mem
        mx, mdy, my, mdx = mem(data, x), mem(data, dy), mem(data, y), mem(data, dx)
        mm, mv = mem(stat, mean), mem(stat, var)
        mw, mb, mdw, mdb = mem(par, w), mem(par, b), mem(par, dw), mem(par, db)
        run_fwd = self._runner(fwd, [(_ARG_SRC, mx), (_ARG_DST, my), (_ARG_MEAN, mm), (_ARG_VARIANCE, mv),
                                     (_ARG_SCALE, mw), (_ARG_SHIFT, mb)])
        run_bwd = self._runner(bwd, [(_ARG_SRC, mx), (_ARG_DIFF_DST, mdy), (_ARG_MEAN, mm), (_ARG_VARIANCE, mv),
                                     (_ARG_SCALE, mw), (_ARG_SHIFT, mb), (_ARG_DIFF_SRC, mdx),
                                     (_ARG_DIFF_SCALE, mdw), (_ARG_DIFF_SHIFT, mdb)])
        return run_fwd, run_bwd, {"y": y, "mean": mean, "var": var, "dx": dx, "dw": dw, "db": db}


# ------------------------------------------------------------- bench.py onednn --

# The seed table's shapes (over C,H,W and over the last axis) and the campaign's:
# rows of 56 (image models normalized over W), the transformer rows, LLM heads of 128.
SHAPES = [((1, 8, 16), "chw"), ((8, 8, 16), "chw"), ((32, 8, 16), "chw"),
          ((1, 8, 16), "last"), ((8, 8, 16), "last"), ((32, 8, 16), "last"),
          ((64, 128, 56, 56), "chw"), ((64, 128, 56, 56), "last"),
          ((4096, 4096), "last"), ((16384, 1024), "last"), ((131072, 128), "last"),
          ((64, 128, 256, 256), "chw"), ((64, 128, 256, 256), "last")]

_ENGINES = {}
_DATA = {}


def run_request(lib, req):
    """Time one cell for one worker: lib is "cynorm", "numpy" or "onednn:PATH"."""
    import gc

    import numpy as np


    import worker
    shape, axis, mode, threads = tuple(req["shape"]), req["axis"], req["mode"], req["threads"]
    budget, directions = req["budget"], req["directions"]
    worker._WARMUP = req.get("warmup", 0.3)
    key = (shape, axis, mode)
    if key not in _DATA:
        _DATA.clear()
        gc.collect()
        _DATA[key] = worker._make_data(shape, axis, mode)
    x, dy, w, b = _DATA[key]
    t = worker._timeit
    out = {}
    if lib == "numpy":      # the floor: a copy into an existing array
        xv = x.view(np.uint16) if x.itemsize == 2 else x
        dst = np.empty_like(xv)
        out["copy"] = t(lambda: np.copyto(dst, xv), budget)
        return out
    if lib == "cynorm":
        import cynorm
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis, num_threads=threads)
        dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis, num_threads=threads)
        fo = tuple(np.empty_like(a) for a in (y, mean, rstd))
        bo = tuple(np.empty_like(a) for a in (dx, dw, db))
        fwd = lambda: cynorm.layer_norm_forward(x, w, b, axis=axis, num_threads=threads, out=fo)
        bwd = lambda: cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis, num_threads=threads, out=bo)
    else:
        path = lib.split(":", 1)[1]
        if path not in _ENGINES:
            _ENGINES[path] = OneDNN(path)
        n = math.prod(shape[axis:])
        x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)
        w2, b2 = w.reshape(n).astype(np.float32), b.reshape(n).astype(np.float32)
        fwd, bwd, _ = _ENGINES[path].layer_norm(x2, dy2, w2, b2, 1e-5, threads)
        fwd()   # (the backward reads the forward's mean and variance)
    if "fwd" in directions:
        out["fwd"] = t(fwd, budget)
    if "bwd" in directions:
        out["bwd"] = t(bwd, budget)
    return out


def hello(lib):
    path = lib.split(":", 1)[1]
    try:
        return {"ready": True, "version": OneDNN(path).version, "path": path}
    except (OSError, RuntimeError) as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


def cmd_onednn(args):
    import bench
    libs = args.onednn.split(",") if args.onednn else [default_library()]
    if not libs or libs[0] is None:
        raise SystemExit("no oneDNN library: pip install onednn-cpu-gomp==2023.2.0, or pass --onednn PATH "
                         "(a CPU build's libdnnl.so)")
    onednn_libs = [f"onednn:{os.path.abspath(p)}" for p in libs]
    workers = {lib: bench.Worker(lib) for lib in ["cynorm", "numpy"] + onednn_libs}
    for lib in onednn_libs:
        if not workers[lib].available:
            raise SystemExit(f"{lib}: {workers[lib].info.get('unavailable')}")
    if args.shapes:
        axes = ["chw", "last"] if args.axes == "both" else [args.axes]
        cases = [(tuple(s), ax) for s in args.shapes for ax in (axes if len(s) > 2 else ["last"])]
    else:
        cases = [c for c in SHAPES if not (args.quick and c[0] == (64, 128, 256, 256))]
    rows = []
    try:
        for shape, ax in cases:
            axis = 1 if ax == "chw" else len(shape) - 1
            n = math.prod(shape)
            for mode in args.modes:
                bench._progress(f"onednn {shape} {ax} {mode} ...")
                req = {"shape": shape, "axis": axis, "mode": mode, "threads": args.threads,
                       "budget": (0.15 if args.quick else 0.5) * (3 if n >= 1e8 else 1),
                       "directions": ["fwd", "bwd"], "kind": "onednn"}
                libs_here = [lib for lib in workers if lib != "numpy" or n >= bench.LARGE]
                got = bench._measure(workers, req, libs_here)
                for lib, r in got.items():
                    if "error" in r:
                        bench._progress(f"  {lib}: {r['error']}")
                row = {"shape": list(shape), "axes": ax, "mode": mode, "elements": n, "threads": args.threads}
                itemsize = 4 if mode == "fp32" else 2
                copy = got.get("numpy", {}).get("copy")
                row["copy_ms"] = copy * 1e3 if copy else None
                for d, moved in (("fwd", 2), ("bwd", 3)):
                    c = got["cynorm"].get(d)
                    row[f"{d}_cynorm_ms"] = c * 1e3 if c else None
                    row[f"{d}_copy_frac"] = (moved * n * itemsize / c) / (2 * n * itemsize / copy) \
                        if (c and copy) else None
                    for k, lib in enumerate(onednn_libs):
                        o = got[lib].get(d)
                        row[f"{d}_onednn{k}_ms"] = o * 1e3 if o else None
                        row[f"{d}_onednn{k}_ratio"] = (o / c) if (o and c) else None
                rows.append(row)
    finally:
        for w in workers.values():
            w.close()
    versions = [workers[lib].info.get("version") for lib in onednn_libs]
    meta = {"command": "onednn", "threads": args.threads, "machine": bench._machine(),
            "cynorm": workers["cynorm"].info, "onednn": [workers[lib].info for lib in onednn_libs]}
    _print(rows, meta, versions)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


def _print(rows, meta, versions):
    import bench
    f = bench._fmt
    cfg = meta["cynorm"].get("config", {})
    print(f"\n### cynorm {meta['cynorm'].get('version')} ({cfg.get('isa')}) vs oneDNN "
          f"{', '.join(versions)} -- LayerNorm, all outputs preallocated, {meta['threads']} thread(s), "
          f"{meta['machine']['cpu_model']}\n")
    print("Medians in ms. ratio = oneDNN / cynorm (above 1: cynorm is faster). frac = cynorm's bandwidth "
          "(fwd: x read, y written; bwd: x, dy read, dx written) / a NumPy copy into an existing array, "
          "same run. oneDNN's bf16 keeps fp32 scale/shift: the bf16 and mixed rows time the same oneDNN call.\n")
    head = ["shape", "axes", "mode"]
    for d in ("fwd", "bwd"):
        head += [f"{d} cynorm"] + [f"{d} oneDNN {v}" for v in versions] + \
            [f"{d} ratio {v}" for v in versions] + [f"{d} frac"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|" + "---:|" * (len(head) - 3))
    ratios = {}
    for r in rows:
        cells = [str(tuple(r["shape"])), r["axes"], r["mode"]]
        for d in ("fwd", "bwd"):
            cells.append(f(r[f"{d}_cynorm_ms"]))
            cells += [f(r[f"{d}_onednn{k}_ms"]) for k in range(len(versions))]
            cells += [f(r[f"{d}_onednn{k}_ratio"], 2) for k in range(len(versions))]
            cells.append(f(r[f"{d}_copy_frac"], 2))
            for k in range(len(versions)):
                if r[f"{d}_onednn{k}_ratio"]:
                    ratios.setdefault(k, []).append((r[f"{d}_onednn{k}_ratio"],
                                                     f"{tuple(r['shape'])} {r['axes']} {r['mode']} {d}"))
        print("| " + " | ".join(cells) + " |")
    print()
    for k, v in enumerate(versions):
        if ratios.get(k):
            lo = min(ratios[k])
            print(f"oneDNN {v}: lowest ratio {lo[0]:.2f} ({lo[1]}), geometric mean "
                  f"{bench._geomean([a for a, _ in ratios[k]]):.2f} over {len(ratios[k])} cells.")
