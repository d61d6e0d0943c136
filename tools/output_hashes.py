#!/usr/bin/env python
"""Hash every output of a fixed set of cynorm calls, to compare two builds bit for bit.

    python tools/output_hashes.py [--levels all|default|LEVEL,...] --json hashes.json
    python tools/output_hashes.py --compare old.json new.json

Cases: both norms x every dtype pair x shapes from tiny to large (in-register,
medium, chunked, long and few-long rows; normalized over the last dims or
C,H,W) x 1 and 2 threads x fresh outputs or out=. Each case hashes y, mean,
rstd (forward) and dx, dweight, dbias (backward) with SHA-256. It uses only
the public API that every cynorm version has (out= as a single array), so the
same script runs against the build before a change and after it.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

#: (shape, axis): in-register rows (16, 24, 56), medium rows (300, 1024), chunked
#: rows (2100, 4100), long rows (33000, 401408: the team path with 2 threads),
#: a wide batch and a transformer shape
SHAPES = [
    ((1, 8, 16), 2), ((37, 16), 1), ((600, 24), 1), ((33, 56), 1), ((70, 300), 1),
    ((256, 1024), 1), ((130, 2100), 1), ((5, 4100), 1), ((3, 9000), 1), ((70, 33000), 1),
    ((4, 8, 56, 56), 1), ((2, 128, 56, 56), 1), ((4096, 1024), 1),
]
PAIRS = [("float32", "float32"), ("float64", "float64"), ("bfloat16", "bfloat16"),
         ("bfloat16", "float32"), ("float16", "float16"), ("float16", "float32")]


def _digest(a):
    import numpy as np
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return hashlib.sha256(a.view(np.uint8).tobytes() + str(a.shape).encode() + str(a.dtype).encode()).hexdigest()[:20]


def _inputs(shape, axis, pair, seed):
    import numpy as np
    from ml_dtypes import bfloat16
    dt = {"float32": np.float32, "float64": np.float64, "bfloat16": bfloat16, "float16": np.float16}
    rng = np.random.default_rng(seed)
    xd, pd = dt[pair[0]], dt[pair[1]]
    ns = shape[axis:]
    x = (rng.standard_normal(shape, dtype=np.float32) * 3 + 1).astype(xd)
    dy = rng.standard_normal(shape, dtype=np.float32).astype(xd)
    w = (1 + 0.5 * rng.standard_normal(ns)).astype(pd)
    b = (0.5 * rng.standard_normal(ns)).astype(pd)
    return x, dy, w, b


def run_cases():
    """{case name: {output name: hash}} at the ISA level in use."""
    import numpy as np
    import cynorm

    results = {}
    for si, (shape, axis) in enumerate(SHAPES):
        for pi, pair in enumerate(PAIRS):
            x, dy, w, b = _inputs(shape, axis, pair, 1000 * si + pi)
            for norm in ("layer", "rms"):
                for T in (1, 2):
                    for use_out in (False, True):
                        name = f"{norm} {shape} axis={axis} {pair[0]}/{pair[1]} T={T} {'out=' if use_out else 'fresh'}"
                        yo = np.empty_like(x) if use_out else None
                        dxo = np.empty_like(x) if use_out else None
                        if norm == "layer":
                            y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis, num_threads=T, out=yo)
                            dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis,
                                                                    num_threads=T, out=dxo)
                        else:
                            y, rstd = cynorm.rms_norm_forward(x, w, axis=axis, num_threads=T, out=yo)
                            mean, db = None, None
                            dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w, axis=axis, num_threads=T, out=dxo)
                        results[name] = {k: _digest(v) for k, v in
                                         (("y", y), ("mean", mean), ("rstd", rstd), ("dx", dx),
                                          ("dweight", dw), ("dbias", db)) if v is not None}
    return results


def _child(level):
    env = dict(os.environ, CYNORM_ISA=level)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "_child"], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def cmd_hash(args):
    if args.levels == "default":
        levels = [None]
    else:
        import cynorm
        avail = cynorm.show_config.__globals__["config"]()["isa_available"]
        levels = avail if args.levels == "all" else args.levels.split(",")
    doc = {"levels": {}}
    for level in levels:
        res = _child(level) if level else json.loads(json.dumps(run_cases()))
        doc["levels"][level or "default"] = res
        print(f"{level or 'default'}: {len(res)} cases, {sum(len(v) for v in res.values())} outputs", file=sys.stderr)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)


def cmd_compare(args):
    with open(args.old) as f:
        old = json.load(f)["levels"]
    with open(args.new) as f:
        new = json.load(f)["levels"]
    bad = 0
    print("| level | cases | outputs | equal | differ |")
    print("|---|---:|---:|---:|---:|")
    for level in sorted(set(old) & set(new)):
        o, n = old[level], new[level]
        cases = sorted(set(o) | set(n))
        outs = eq = 0
        for c in cases:
            for k in sorted(set(o.get(c, {})) | set(n.get(c, {}))):
                outs += 1
                if o.get(c, {}).get(k) == n.get(c, {}).get(k):
                    eq += 1
                elif bad < 20:
                    print(f"  differs: {level} {c} {k}", file=sys.stderr)
                    bad += 1
        print(f"| {level} | {len(cases)} | {outs} | {eq} | {outs - eq} |")
        if eq != outs:
            bad += 1
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["_child"]:
        json.dump(run_cases(), sys.stdout)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="all", help="all (every level this CPU runs), default, or a comma list")
    p.add_argument("--json", help="write the hashes here")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two hash files")
    args = p.parse_args()
    if args.compare:
        args.old, args.new = args.compare
        return cmd_compare(args)
    if not args.json:
        p.error("--json is required when hashing")
    return cmd_hash(args) or 0


if __name__ == "__main__":
    sys.exit(main())
