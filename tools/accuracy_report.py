#!/usr/bin/env python
"""Accuracy against the float64 oracle (tests/reference.py), as a table to
compare two builds: run it under each and diff.

    python tools/accuracy_report.py [--md out.md]

For every dtype pair, norm and output: over a fixed set of shapes and two data
sets (centred; mean 1000 x the spread, where the pivot matters):
- float32/float64 outputs: the largest error relative to the array's scale
  (its largest |value|), as in tests/accuracy.py;
- bfloat16/float16 outputs: the share correctly rounded and the largest error
  in ulps of the output format.
"""

import argparse
import os
import sys

import numpy as np
from ml_dtypes import bfloat16

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import reference as ref  # noqa: E402

import cynorm  # noqa: E402

PAIRS = [("float32", "float32"), ("float64", "float64"), ("bfloat16", "bfloat16"),
         ("bfloat16", "float32"), ("float16", "float16"), ("float16", "float32")]
DT = {"float32": np.float32, "float64": np.float64, "bfloat16": bfloat16, "float16": np.float16}
SHAPES = [(512, 64), (1000, 56), (256, 1024), (64, 4100), (8, 33000)]
DATA = {"centred": (3.0, 1.0), "offset 1e3": (1.0, 1e3)}


def _err(got, want, name):
    got = np.asarray(got, np.float64).ravel()
    want = np.asarray(want, np.float64).ravel()
    if name in ("float32", "float64"):
        scale = max(np.max(np.abs(want)), np.finfo(np.float64).tiny)
        return ("rel", float(np.max(np.abs(got - want)) / scale))
    rounded = ref.round_to(want, name)
    ulps = np.abs(got - want) / ref.ulp(want, name)
    return ("rounded", float(np.mean(got == rounded)), float(np.max(ulps)))


def collect():
    rng = np.random.default_rng(20261204)
    acc = {}
    for xd, pd in PAIRS:
        for data, (spread, offset) in DATA.items():
            for shape in SHAPES:
                x = (rng.standard_normal(shape) * spread + offset).astype(DT[xd])
                dy = rng.standard_normal(shape).astype(DT[xd])
                w = (1 + 0.5 * rng.standard_normal(shape[1:])).astype(DT[pd])
                b = (0.5 * rng.standard_normal(shape[1:])).astype(DT[pd])
                for norm in ("layer", "rms"):
                    if norm == "layer":
                        y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
                        dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w)
                        ry, rmean, rrstd = ref.layer_norm(x, w, b)
                        rdx, rdw, rdb = ref.layer_norm_backward(dy, x, rmean, rrstd, w)
                        outs = [("y", y, ry, xd), ("mean", mean, rmean, "float64" if xd == "float64" else "float32"),
                                ("rstd", rstd, rrstd, "float64" if xd == "float64" else "float32"),
                                ("dx", dx, rdx, xd), ("dweight", dw, rdw, pd), ("dbias", db, rdb, pd)]
                    else:
                        y, rstd = cynorm.rms_norm_forward(x, w)
                        dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w)
                        ry, rrstd = ref.rms_norm(x, w)
                        rdx, rdw = ref.rms_norm_backward(dy, x, rrstd, w)
                        outs = [("y", y, ry, xd), ("rstd", rstd, rrstd, "float64" if xd == "float64" else "float32"),
                                ("dx", dx, rdx, xd), ("dweight", dw, rdw, pd)]
                    for name, got, want, fmt in outs:
                        key = (f"{xd}/{pd}", norm, name)
                        e = _err(got, want, fmt)
                        acc.setdefault(key, []).append(e)
    return acc


def table(acc):
    lines = ["| pair | norm | output | float32/64: max error / scale | 16-bit: correctly rounded | 16-bit: max ulps |",
             "|---|---|---|---:|---:|---:|"]
    for (pair, norm, name), es in acc.items():
        if es[0][0] == "rel":
            lines.append(f"| {pair} | {norm} | {name} | {max(e[1] for e in es):.2e} | | |")
        else:
            share = np.mean([e[1] for e in es])
            lines.append(f"| {pair} | {norm} | {name} | | {100 * share:.3f}% | {max(e[2] for e in es):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--md", help="also write the table here")
    args = p.parse_args()
    t = table(collect())
    print(t)
    if args.md:
        with open(args.md, "w") as f:
            f.write(t + "\n")
