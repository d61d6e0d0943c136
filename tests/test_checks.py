"""One message per mistake, wherever it is made: the NumPy API, the fused
functions, cynorm.jax, cynorm.dask and cynorm.onnx all check through
cynorm._checks."""

import numpy as np
import pytest

import cynorm
import cynorm.onnx as cno

X = np.ones((4, 8), np.float32)
W = np.ones(8, np.float32)

# (mistake, keyword arguments of a layer_norm call, exception)
MISTAKES = [
    ("weight shape", dict(weight=np.ones(7, np.float32)), ValueError),
    ("x dtype", dict(x=X.astype(np.int32)), TypeError),
    ("pair", dict(weight=np.ones(8, np.float16)), TypeError),
    ("axis range", dict(axis=2), ValueError),
    ("axis type", dict(axis=1.0), TypeError),
    ("eps", dict(eps=-1.0), ValueError),
    ("eps nan", dict(eps=float("nan")), ValueError),
    ("threads", dict(num_threads=0), ValueError),
    ("threads limit", dict(num_threads=4096), ValueError),
    ("threads type", dict(num_threads=2.0), TypeError),
    ("zero size", dict(x=X[:, :0], weight=None), ValueError),
]


def _call(fn, case):
    kw = dict(x=X, weight=W, axis=-1, eps=1e-5, num_threads=None)
    kw.update(case)
    with pytest.raises(Exception) as info:
        fn(kw.pop("x"), kw.pop("weight"), **kw)
    return type(info.value), str(info.value)


def _numpy(x, w, **kw):
    return cynorm.layer_norm(x, w, **kw)


def _fused(x, w, **kw):
    return cynorm.add_layer_norm_forward(x, x, w, **kw)


FRONTS = {"numpy": _numpy, "fused": _fused}


def _jax(x, w, **kw):
    import jax.numpy as jnp
    import cynorm.jax as cnj
    return cnj.layer_norm(jnp.asarray(x), None if w is None else jnp.asarray(w), **kw)


def _dask(x, w, **kw):
    import dask.array as da
    import cynorm.dask as cnd
    return cnd.layer_norm(da.from_array(x, chunks=(2,) + x.shape[1:]), w, **kw)


def _front(name):
    if name in ("jax", "dask"):
        pytest.importorskip(name, reason=f"the {name} extra is not installed")
        return {"jax": _jax, "dask": _dask}[name]
    return FRONTS[name]


@pytest.mark.parametrize("front", ["fused", "jax", "dask"])
@pytest.mark.parametrize("mistake, case, exc", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_every_front_gives_the_numpy_apis_message(front, mistake, case, exc):
    want_type, want = _call(_numpy, case)
    assert want_type is exc and want.startswith("cynorm: "), want
    got_type, got = _call(_front(front), case)
    assert (got_type, got) == (want_type, want)


@pytest.mark.parametrize("mistake, case, exc", [m for m in MISTAKES if m[0] in ("axis range", "axis type", "eps",
                                                                                 "zero size")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_onnx_shares_the_messages_of_what_it_shares(mistake, case, exc):
    """ONNX's own rules (broadcasting, stash_type, the type T) have messages of their
    own; the axis, eps and the normalized size are checked as everywhere else."""
    want_type, want = _call(_numpy, case)
    kw = dict(axis=case.get("axis", -1), epsilon=case.get("eps", 1e-5))
    x = case.get("x", X)
    with pytest.raises(exc) as info:
        cno.layer_normalization(x, np.ones(x.shape[-1:] or (1,), np.float32), **kw)
    assert str(info.value) == want
