"""cynorm.onnx against the onnx package: its reference evaluator on random cases
(broadcast Scale/B included) and the node-test case generators in the wheel;
the spec's types where the evaluator's differ; a float64 evaluation of the
spec's function body as the accuracy oracle."""

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install 'cynorm[onnx]')")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import cynorm.onnx as cno  # noqa: E402
from conftest import BF16, F16, F32, F64  # noqa: E402
import reference as ref  # noqa: E402

DTYPES = [pytest.param(d, id=str(d)) for d in (F32, F16, BF16, F64)]
#: how far the reference evaluator may be from us, in units of the working type's
#: epsilon (float32 for float64 X: the spec normalizes it in the stash type, the
#: evaluator in float64), times the values' magnitude
REF_ULPS = 16


def model(op, X, S, B, **attrs):
    tp = helper.np_dtype_to_tensor_dtype
    names = ["X", "S"] + ([] if B is None else ["B"])
    ins = [helper.make_tensor_value_info(n, tp(a.dtype), a.shape) for n, a in zip(names, (X, S, B))]
    outs = ["Y", "Mean", "InvStdDev"] if op == "LayerNormalization" else ["Y"]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                                 for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17 if outs[1:] else 23)]), names


def run_reference(op, X, S, B=None, **attrs):
    m, names = model(op, X, S, B, **attrs)
    return ReferenceEvaluator(m).run(None, dict(zip(names, (X, S, B))))


def spec_body(X, S, B, axis, eps, stash, rms=False):
    """The spec's function body in float64, with its casts: stage one in the stash type's
    range (evaluated in float64), stage two in X's type (LayerNorm) or S's type (RMS)."""
    x = X.astype(F64)
    red = tuple(range(axis, X.ndim))
    mean = 0.0 if rms else x.mean(red, keepdims=True)
    inv = 1.0 / np.sqrt(((x - mean) ** 2).mean(red, keepdims=True) + eps)
    n = ((x - mean) * inv).astype(X.dtype)
    out_t = S.dtype if rms else X.dtype
    y = n.astype(F64) * S.astype(F64) + (0.0 if B is None else B.astype(F64))
    return y.astype(out_t), np.broadcast_to(mean, inv.shape).astype(stash), inv.astype(stash)


def ulps(got, want, eps):
    """|got - want| in units of eps (a dtype's epsilon, or the value) at want's magnitude (at least 1)."""
    eps = np.finfo(eps).eps if isinstance(eps, np.dtype) else eps
    g, w = got.astype(F64), want.astype(F64)
    return np.max(np.abs(g - w) / (eps * np.maximum(np.abs(w), 1.0)))


def random_case(rng, dtype):
    rank = int(rng.integers(1, 5))
    shape = tuple(int(s) for s in rng.integers(1, 7, size=rank))
    shape = shape[:-1] + (int(rng.integers(1, 70)),)
    axis = int(rng.integers(-rank, rank))
    ax = axis % rank
    X = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)

    def param():   # unidirectionally broadcastable to X: trailing dims kept or 1, some leading dropped
        drop = int(rng.integers(0, rank + 1))
        dims = [d if rng.random() < 0.6 else 1 for d in shape[drop:]]
        return (1 + 0.5 * rng.standard_normal(dims)).astype(dtype), ax

    S, _ = param()
    B = param()[0] if rng.random() < 0.7 else None
    return X, S, B, axis


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_normalization_matches_the_reference_evaluator(dtype, rng):
    checked = 0
    for _ in range(40):
        X, S, B, axis = random_case(rng, dtype)
        eps = float(rng.choice([1e-5, 1e-2, 0.5]))
        Y, Mean, Inv = cno.layer_normalization(X, S, B, axis=axis, epsilon=eps)
        rY, rMean, rInv = run_reference("LayerNormalization", X, S, B, axis=axis, epsilon=eps)
        assert Y.shape == rY.shape and Y.dtype == X.dtype
        assert Mean.shape == rMean.shape and Inv.shape == rInv.shape
        assert Mean.dtype == F32 and Inv.dtype == F32   # the stash type; the evaluator gives X's type
        tol = REF_ULPS * np.finfo(F32 if dtype == F64 else dtype).eps
        for got, want in ((Y, rY), (Mean, rMean), (Inv, rInv)):
            scale = np.maximum(np.abs(want.astype(F64)), 1.0)
            assert np.all(np.abs(got.astype(F64) - want.astype(F64)) <= tol * scale * (1 + np.abs(S).max() * 4))
        # and the spec's body in float64 is within a few ulps of ours
        sY, sMean, sInv = spec_body(X, S, B, axis % X.ndim, eps, F32)
        assert ulps(Mean, sMean, F32) <= 8 and ulps(Inv, sInv, F32) <= 8
        coarse = np.finfo(F32 if dtype == F64 else dtype).eps
        n = np.abs((X.astype(F64) - sMean) * sInv)
        size = 1 + n * np.abs(S.astype(F64)) + (0 if B is None else np.abs(B.astype(F64)))   # the terms' magnitude
        assert np.all(np.abs(Y.astype(F64) - sY.astype(F64)) <= 3 * coarse * size)
        checked += 1
    assert checked == 40


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_normalization_matches_the_reference_evaluator(dtype, rng):
    for k in range(40):
        X, S, _, axis = random_case(rng, dtype)
        if k % 2:
            S = S.astype(F32)   # a scale of another type: Y takes the scale's type
        Y = cno.rms_normalization(X, S, axis=axis, epsilon=1e-5)
        (rY,) = run_reference("RMSNormalization", X, S, axis=axis, epsilon=1e-5)
        assert Y.shape == rY.shape and Y.dtype == S.dtype   # the evaluator gives X's type
        sY, _, _ = spec_body(X, S, None, axis % X.ndim, 1e-5, F32, rms=True)
        coarse = max(np.finfo(F32 if dtype == F64 else dtype).eps, np.finfo(S.dtype).eps)
        assert ulps(Y, sY, coarse) <= 2
        if dtype.itemsize == 2 and math.prod(X.shape[axis % X.ndim:]) > 128:
            continue   # the evaluator sums squares in 16 bits: far off for long rows (the spec body decides)
        tol = REF_ULPS * np.finfo(F32 if dtype == F64 else dtype).eps
        scale = np.maximum(np.abs(rY.astype(F64)), 1.0)
        assert np.all(np.abs(Y.astype(F64) - rY.astype(F64)) <= tol * scale * 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stash_type_bfloat16_and_the_spec_body(dtype, rng):
    X = (rng.standard_normal((5, 3, 40)) + 2).astype(dtype)
    S = rng.standard_normal((3, 40)).astype(dtype)
    Y, Mean, Inv = cno.layer_normalization(X, S, None, axis=1, stash_type=16)
    assert Mean.dtype == BF16 and Inv.dtype == BF16 and Mean.shape == (5, 1, 1)
    _, sMean, sInv = spec_body(X, S, None, 1, 1e-5, F64)
    assert ulps(Mean, sMean, BF16) <= 1 and ulps(Inv, sInv, BF16) <= 1
    Y32, _, _ = cno.layer_normalization(X, S, None, axis=1)
    assert np.array_equal(Y.view(np.uint8), Y32.view(np.uint8))   # the stash type changes the stats only


def test_broadcast_scale_over_leading_dims_follows_the_spec(rng):
    """A scale varying over a leading dim: stage two runs as the spec writes it."""
    X = rng.standard_normal((3, 4, 5)).astype(F32)
    for shape in [(3, 1, 1), (4, 5), (1,), (1, 1, 4, 5)[1:], (3, 4, 5)]:
        S = rng.standard_normal(shape).astype(F32)
        B = rng.standard_normal(shape).astype(F32)
        Y, _, _ = cno.layer_normalization(X, S, B, axis=1)
        sY, _, _ = spec_body(X, S, B, 1, 1e-5, F32)
        assert Y.shape == X.shape and ulps(Y, sY, F32) <= 8, shape


def _node_cases(module_name, monkeypatch):
    """(node, inputs, outputs, name) of every case the onnx wheel's generator exports."""
    import importlib
    mod = importlib.import_module(f"onnx.backend.test.case.node.{module_name}")
    cases = []
    monkeypatch.setattr(mod, "expect", lambda node, inputs, outputs, name, **kw: cases.append(
        (node, inputs, outputs, name)))
    cls = next(v for k, v in vars(mod).items() if isinstance(v, type) and k.lower() == module_name)
    for attr in dir(cls):
        if attr.startswith("export"):
            getattr(cls, attr)()
    return cases


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_the_onnx_wheels_layer_normalization_cases(monkeypatch):
    cases = _node_cases("layernormalization", monkeypatch)
    assert len(cases) >= 10
    for node, inputs, outputs, name in cases:
        a = _attrs(node)
        got = cno.layer_normalization(*inputs, axis=a.get("axis", -1), epsilon=a.get("epsilon", 1e-5),
                                      stash_type=a.get("stash_type", 1))
        assert len(got) >= len(outputs), name
        for g, want in zip(got, outputs):
            assert g.shape == want.shape, name
            np.testing.assert_allclose(g.astype(F64), want.astype(F64), rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_onnx_wheels_rms_normalization_cases(monkeypatch):
    cases = _node_cases("rmsnormalization", monkeypatch)
    assert len(cases) >= 10
    for node, inputs, outputs, name in cases:
        a = _attrs(node)
        (want,) = outputs
        got = cno.rms_normalization(*inputs, axis=a.get("axis", -1), epsilon=a.get("epsilon", 1e-5),
                                    stash_type=a.get("stash_type", 1))
        assert got.shape == want.shape and got.dtype == inputs[1].dtype, name
        np.testing.assert_allclose(got.astype(F64), want.astype(F64), rtol=1e-5, atol=1e-5, err_msg=name)


def run_group_reference(X, S, B, **attrs):
    tp = helper.np_dtype_to_tensor_dtype
    ins = [helper.make_tensor_value_info(n, tp(a.dtype), a.shape) for n, a in zip("XSB", (X, S, B))]
    node = helper.make_node("GroupNormalization", ["X", "S", "B"], ["Y"], **attrs)
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("Y", TensorProto.UNDEFINED, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(m).run(None, {"X": X, "S": S, "B": B})[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_normalization_matches_the_reference_evaluator(dtype, rng):
    """Random shapes (no spatial dims to 3-d), group counts and the spec's stash types,
    against the evaluator's run of the spec's function body."""
    for _ in range(12):
        G = int(rng.choice([1, 2, 3, 4]))
        C = G * int(rng.integers(1, 5))
        shape = (int(rng.integers(1, 4)), C) + tuple(int(s) for s in rng.integers(1, 6, size=int(rng.integers(0, 4))))
        X = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
        S = (1 + 0.5 * rng.standard_normal(C)).astype(dtype)
        B = (0.5 * rng.standard_normal(C)).astype(dtype)
        for stash in (1, 11) if dtype == F64 else (1,):
            Y = cno.group_normalization(X, S, B, num_groups=G, epsilon=1e-5, stash_type=stash)
            rY = run_group_reference(X, S, B, num_groups=G, epsilon=1e-5, stash_type=stash)
            assert Y.shape == X.shape and Y.dtype == X.dtype == rY.dtype
            if dtype == F64 and stash == 11:
                # the body's variance, E[x^2] - E[x]^2, cancels in float64 too: judged against
                # an accurate float64 evaluation, and the evaluator within that cancellation
                want = ref.group_norm(X, G, S, B)[0]
                assert ulps(Y, want, 1e-12) <= 1 and ulps(Y, rY, 1e-9) <= 1, (shape, G)
                continue
            work = F32 if dtype == F64 else dtype
            assert ulps(Y, rY, np.dtype(work)) <= REF_ULPS * (4 if dtype.itemsize == 2 else 1), (shape, G, stash)


def test_the_onnx_wheels_group_normalization_cases(monkeypatch):
    cases = _node_cases("groupnormalization", monkeypatch)
    assert len(cases) >= 2
    for node, inputs, outputs, name in cases:
        a = _attrs(node)
        (want,) = outputs
        got = cno.group_normalization(*inputs, num_groups=a["num_groups"], epsilon=a.get("epsilon", 1e-5),
                                      stash_type=a.get("stash_type", 1))
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("call, exc, match", [
    (lambda X: cno.group_normalization(X, np.ones(5, F32), np.ones(5, F32), num_groups=2), ValueError,
     "must divide the number of channels"),
    (lambda X: cno.group_normalization(X, np.ones(4, F32), np.ones(5, F32), num_groups=5), ValueError,
     "scale must have shape (C,) = (5,)"),
    (lambda X: cno.group_normalization(X, np.ones(5, F16), np.ones(5, F32), num_groups=5), TypeError,
     "scale must have X's type"),
    (lambda X: cno.group_normalization(X, np.ones(5, F32), np.ones(5, F32), num_groups=5, stash_type=2),
     ValueError, "stash_type"),
])
def test_group_normalization_refuses_bad_input(call, exc, match):
    X = np.ones((4, 5), F32)
    with pytest.raises(exc) as info:
        call(X)
    assert match in str(info.value)


@pytest.mark.parametrize("call, exc, match", [
    (lambda X: cno.layer_normalization(X, np.ones(3, F32)), ValueError, "not unidirectionally broadcastable"),
    (lambda X: cno.layer_normalization(X, np.ones(5, F16)), TypeError, "must have X's type"),
    (lambda X: cno.layer_normalization(X, np.ones(5, F32), axis=2), ValueError, "out of range"),
    (lambda X: cno.layer_normalization(X, np.ones(5, F32), stash_type=11), ValueError, "stash_type"),
    (lambda X: cno.rms_normalization(X.astype(np.int32), np.ones(5, F32)), TypeError, "float16, float, double"),
    (lambda X: cno.rms_normalization(X, np.ones((2, 4, 5), F32)), ValueError, "not unidirectionally"),
    (lambda X: cno.rms_normalization(X[:, :0], np.ones(1, F32), axis=1), ValueError, "zero size"),
])
def test_bad_input_is_refused_with_a_message(call, exc, match):
    X = np.ones((4, 5), F32)
    with pytest.raises(exc, match=match):
        call(X)
    assert np.all(X == 1)
