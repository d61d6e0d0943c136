"""cynorm.onnx against ONNX Runtime (not a test dependency): the random cases of
tests/test_onnx.py (broadcast Scale/B included), 40 per op and dtype; prints how
many agree in type, shape and value (within 16 epsilons of the working type:
float32 for float64 X, which ONNX Runtime computes in float64).

    pip install onnxruntime; python tools/onnx_vs_ort.py
"""

import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import cynorm.onnx as cno  # noqa: E402
from conftest import F16, F32, F64  # noqa: E402
from test_onnx import random_case  # noqa: E402


def session(op, X, S, B, **attrs):
    tp = helper.np_dtype_to_tensor_dtype
    names = ["X", "S"] + ([] if B is None else ["B"])
    ins = [helper.make_tensor_value_info(n, tp(a.dtype), a.shape) for n, a in zip(names, (X, S, B))]
    if op == "LayerNormalization":
        outs = [helper.make_tensor_value_info("Y", tp(X.dtype), None),
                helper.make_tensor_value_info("Mean", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("InvStdDev", TensorProto.FLOAT, None)]
    else:
        outs = [helper.make_tensor_value_info("Y", tp(S.dtype), None)]
    node = helper.make_node(op, names, [o.name for o in outs], **attrs)
    opset = 17 if op == "LayerNormalization" else 23
    m = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]), names


def main():
    rng = np.random.default_rng(7)
    for op in ("LayerNormalization", "RMSNormalization"):
        for dt in (F32, F16, F64):
            agree = total = 0
            worst = 0.0
            for _ in range(40):
                X, S, B, axis = random_case(rng, dt)
                if op == "RMSNormalization":
                    B = None
                s, names = session(op, X, S, B, axis=axis, epsilon=1e-5)
                want = s.run(None, {n: np.asarray(a) for n, a in zip(names, (X, S, B))})
                got = (cno.layer_normalization(X, S, B, axis=axis) if op == "LayerNormalization"
                       else (cno.rms_normalization(X, S, axis=axis),))
                eps = np.finfo(F32 if dt == F64 else dt).eps
                same_kind = all(g.dtype == w.dtype and g.shape == w.shape for g, w in zip(got, want))
                d = max(float(np.max(np.abs(g.astype(F64) - w.astype(F64)) / np.maximum(np.abs(w.astype(F64)), 1)))
                        for g, w in zip(got, want)) / eps
                worst = max(worst, d)
                total += 1
                agree += same_kind and d <= 16
            print(f"{op} {dt}: {agree}/{total} agree; worst {worst:.1f} eps")


if __name__ == "__main__":
    main()
