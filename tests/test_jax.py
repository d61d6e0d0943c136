"""cynorm.jax: the XLA FFI op against the NumPy API, bit for bit, eagerly and
under jit, grad, vmap (batched and unbatched weight), jit(vmap(grad)) and
jax.checkpoint, for every dtype pair."""

import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax extra is not installed (pip install 'cynorm[jax]')")
import jax.numpy as jnp  # noqa: E402

import cynorm  # noqa: E402
import cynorm.jax as cnj  # noqa: E402
from conftest import PAIRS, make_inputs, same_bits  # noqa: E402


@pytest.fixture(autouse=True)
def x64_for_float64(request):
    """float64 arrays stay float64 in JAX only with jax_enable_x64 (else JAX makes them float32)."""
    pair = getattr(request.node, "callspec", None) and request.node.callspec.params.get("pair")
    if pair is not None and pair[0] == np.float64:
        with jax.enable_x64(True):
            yield
    else:
        yield


def numpy_grads(norm, dy, x, w, b, axis):
    """cynorm's NumPy forward/backward: y and (dx, dweight, dbias)."""
    if norm == "layer":
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b, axis=axis)
        return y, cynorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)
    y, rstd = cynorm.rms_norm_forward(x, w, axis=axis)
    dx, dw = cynorm.rms_norm_backward(dy, x, rstd, w, axis=axis)
    return y, (dx, dw, None)


def jax_fn(norm, axis, **kw):
    if norm == "layer":
        return lambda x, w, b: cnj.layer_norm(x, w, b, axis=axis, **kw)
    return lambda x, w, b: cnj.rms_norm(x, w, axis=axis, **kw)


def test_import_cynorm_does_not_import_the_frameworks():
    code = "import sys, cynorm; print([m for m in ('jax', 'dask', 'onnx') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("shape, axis", [((37, 300), -1), ((3, 5, 7, 16), 2), ((2, 4100), 1), ((520, 1100), -1)])
def test_forward_and_vjp_match_the_numpy_api(pair, norm, shape, axis, rng):
    x, dy, w, b = make_inputs(rng, shape, axis, pair)
    y0, (dx0, dw0, db0) = numpy_grads(norm, dy, x, w, b, axis)
    f = jax_fn(norm, axis)
    assert same_bits(f(x, w, b), y0)
    y, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    dx, dw, db = vjp(jnp.asarray(dy))
    assert same_bits(y, y0) and same_bits(dx, dx0) and same_bits(dw, dw0)
    if norm == "layer":
        assert same_bits(db, db0)
    else:
        assert not np.asarray(db).any()   # rms_norm has no bias: its cotangent is zero


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_grad_under_jit_and_checkpoint(pair, norm, rng):
    x, dy, w, b = make_inputs(rng, (64, 96), -1, pair)
    _, (dx0, dw0, db0) = numpy_grads(norm, dy, x, w, b, -1)
    f = jax_fn(norm, -1)

    def loss(x, w, b):   # d loss / d y = dy, exactly
        return jnp.sum((f(x, w, b) * dy).astype(jnp.float32))

    for g in (jax.jit(jax.grad(loss, argnums=(0, 1))), jax.grad(jax.checkpoint(loss), argnums=(0, 1))):
        dx, dw = g(x, w, b)
        assert same_bits(dx, dx0) and same_bits(dw, dw0)


@pytest.mark.parametrize("pair", PAIRS)
def test_vmap_batched_weight_normalizes_each_example_with_its_own(pair, rng):
    xs, dys, ws, bs = zip(*(make_inputs(rng, (9, 40), -1, pair) for _ in range(5)))
    X, DY, W, Bi = (np.stack(a) for a in (xs, dys, ws, bs))

    def per_example(x, w, b, dy):
        y, vjp = jax.vjp(lambda x, w, b: cnj.layer_norm(x, w, b), x, w, b)
        return (y,) + vjp(dy)

    got = jax.jit(jax.vmap(per_example))(X, W, Bi, DY)
    for i in range(5):
        y0, (dx0, dw0, db0) = numpy_grads("layer", dys[i], xs[i], ws[i], bs[i], -1)
        for g, want in zip(got, (y0, dx0, dw0, db0)):
            assert same_bits(g[i], want)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("pair", PAIRS)
def test_per_example_gradients_of_an_unbatched_weight(pair, norm, rng):
    """jit(vmap(grad)) with in_axes=(0, None): one dweight per example, each what
    a call on that example alone gives."""
    X, DY, w, b = make_inputs(rng, (6, 11, 64), 2, pair)
    f = jax_fn(norm, -1)

    def grads(x, dy, w, b):
        _, vjp = jax.vjp(f, x, w, b)
        return vjp(dy)

    dx, dw, db = jax.jit(jax.vmap(grads, in_axes=(0, 0, None, None)))(X, DY, w, b)
    assert dw.shape == (6, 64)
    for i in range(6):
        _, (dx0, dw0, db0) = numpy_grads(norm, DY[i], X[i], w, b, -1)
        assert same_bits(dx[i], dx0) and same_bits(dw[i], dw0)
        if norm == "layer":
            assert same_bits(db[i], db0)


def test_nested_vmap_and_a_batch_axis_that_is_not_leading(rng):
    pair = PAIRS[0].values[0]
    X, _, w, b = make_inputs(rng, (3, 4, 5, 32), 3, pair)
    y = jax.vmap(jax.vmap(lambda x: cnj.layer_norm(x, w, b)))(X)
    assert same_bits(y, cynorm.layer_norm(X, w, b))
    Xt = np.ascontiguousarray(np.moveaxis(X, 0, 1))     # batch along axis 1
    y = jax.vmap(lambda x: cnj.layer_norm(x, w, b), in_axes=1, out_axes=1)(Xt)
    assert same_bits(y, cynorm.layer_norm(Xt, w, b))
    # a weight batched over the outer level only
    W = np.stack([w, 2 * w, 3 * w])
    y = jax.vmap(lambda x, w: jax.vmap(lambda x: cnj.layer_norm(x, w, b))(x))(X, W)
    for i in range(3):
        assert same_bits(y[i], cynorm.layer_norm(X[i], W[i], b))


def test_bias_without_weight_and_no_params(rng):
    pair = PAIRS[0].values[0]
    x, dy, w, b = make_inputs(rng, (10, 50), -1, pair)
    y, vjp = jax.vjp(lambda x, b: cnj.layer_norm(x, None, b), x, b)
    assert same_bits(y, cynorm.layer_norm(x, None, b))
    dx, db = vjp(jnp.asarray(dy))
    _, mean, rstd = cynorm.layer_norm_forward(x)
    dx0, _, db0 = cynorm.layer_norm_backward(dy, x, mean, rstd, np.ones_like(b))
    assert same_bits(dx, dx0) and same_bits(db, db0)
    dx = jax.grad(lambda x: jnp.sum(cnj.rms_norm(x) * dy))(x)
    _, rstd = cynorm.rms_norm_forward(x)
    assert same_bits(dx, cynorm.rms_norm_backward(dy, x, rstd)[0])


def test_num_threads_and_eps(rng):
    pair = PAIRS[0].values[0]
    x, _, w, b = make_inputs(rng, (300, 1000), -1, pair)
    want = cynorm.layer_norm(x, w, b, eps=0.5)
    for t in (None, 1, 2, 3):
        assert same_bits(cnj.layer_norm(x, w, b, eps=0.5, num_threads=t), want)


@pytest.mark.parametrize("call, exc, match", [
    (lambda x, w: cnj.layer_norm(x, w[:-1]), ValueError, "weight must have shape"),
    (lambda x, w: cnj.layer_norm(x.astype(jnp.int32), None), TypeError, "supported input dtypes"),
    (lambda x, w: cnj.layer_norm(x, w.astype(jnp.float16)), TypeError, "unsupported dtypes"),
    (lambda x, w: cnj.layer_norm(x, w, axis=2), ValueError, "axis"),
    (lambda x, w: cnj.layer_norm(x, w, axis=1.0), TypeError, "axis must be an int"),
    (lambda x, w: cnj.layer_norm(x, w, eps=-1.0), ValueError, "eps"),
    (lambda x, w: cnj.rms_norm(x, w, num_threads=0), ValueError, "num_threads"),
    (lambda x, w: cnj.rms_norm(x[:, :0], None), ValueError, "zero size"),
])
def test_bad_input_is_refused_with_a_message(call, exc, match):
    x = jnp.ones((4, 8), jnp.float32)
    w = jnp.ones((8,), jnp.float32)
    with pytest.raises(exc, match=match):
        call(x, w)


# ------------------------------------------------- fused residual add + norm --

def fused_numpy(norm, x, r, dy, dh, w, b, h_dtype):
    if norm == "layer":
        y, h, mean, rstd = cynorm.add_layer_norm_forward(x, r, w, b, residual_dtype=h_dtype)
        return (y, h), cynorm.add_layer_norm_backward(dy, h, mean, rstd, w, dh=dh)
    y, h, rstd = cynorm.add_rms_norm_forward(x, r, w, residual_dtype=h_dtype)
    dsum, dw = cynorm.add_rms_norm_backward(dy, h, rstd, w, dh=dh)
    return (y, h), (dsum, dw, None)


FUSED_CASES = [pytest.param((np.float32, np.float32, None), id="f32"),
               pytest.param(("bfloat16", "bfloat16", None), id="bf16"),
               pytest.param(("bfloat16", np.float32, np.float32), id="bf16-f32-stream32")]


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("case", FUSED_CASES)
def test_fused_jit_grad_vmap_match_numpy(case, norm, rng):
    xd, pd, h_dtype = case
    x, dy, w, b = make_inputs(rng, (6, 40, 96), -1, (np.dtype(xd), np.dtype(pd)))
    hd = np.dtype(h_dtype or xd)
    r = rng.standard_normal(x.shape).astype(hd)
    dh = rng.standard_normal(x.shape).astype(hd)
    (y, h), (dsum, dw, db) = fused_numpy(norm, x, r, dy, dh, w, b, h_dtype)
    if norm == "layer":
        fn = lambda x, r, w, b: cnj.add_layer_norm(x, r, w, b, residual_dtype=h_dtype)
    else:
        fn = lambda x, r, w, b: cnj.add_rms_norm(x, r, w, residual_dtype=h_dtype)
    jy, jh = jax.jit(fn)(x, r, w, b)
    assert same_bits(jy, y) and same_bits(jh, h)
    # vjp with cotangents (dy, dh): the gradient of x and residual is dsum
    _, vjp = jax.vjp(fn, x, r, w, b)
    gx, gr, gw, gb = vjp((jnp.asarray(dy), jnp.asarray(dh)))
    assert same_bits(gr, dsum.astype(np.asarray(r).dtype))
    assert same_bits(gx, dsum.astype(x.dtype))
    assert same_bits(gw, dw)
    if norm == "layer":
        assert same_bits(gb, db)
    # grad of a scalar loss through both outputs, jitted
    loss = lambda x, r, w, b: (fn(x, r, w, b)[0].astype(jnp.float32) * dy.astype(np.float32)).sum() + \
        (fn(x, r, w, b)[1].astype(jnp.float32) * dh.astype(np.float32)).sum()
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, r, w, b)
    assert g[0].dtype == x.dtype and g[1].dtype == r.dtype
    # vmap over the leading axis: each example's bits are those of a call on it alone
    vy, vh = jax.vmap(fn, in_axes=(0, 0, None, None))(x, r, w, b)
    for i in range(x.shape[0]):
        (yi, hi), _ = fused_numpy(norm, x[i], r[i], dy[i], dh[i], w, b, h_dtype)
        assert same_bits(vy[i], yi) and same_bits(vh[i], hi)
    per_example = jax.vmap(lambda x, r, dy, dh: jax.vjp(lambda w: fn(x, r, w, b), w)[1]((dy, dh))[0],
                           in_axes=(0, 0, 0, 0))(x, r, jnp.asarray(dy), jnp.asarray(dh))
    for i in range(x.shape[0]):
        _, (_, dwi, _) = fused_numpy(norm, x[i], r[i], dy[i], dh[i], w, b, h_dtype)
        assert same_bits(per_example[i], dwi)


def test_fused_bad_input():
    x = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(ValueError, match="residual must have the shape"):
        cnj.add_layer_norm(x, jnp.ones((4, 7), jnp.float32))
    with pytest.raises(TypeError, match="residual_dtype must be"):
        cnj.add_layer_norm(x, x, residual_dtype=np.float16)


# ------------------------------------------------------------- GroupNorm --

def _group_case(rng, pair, channel_axis, shape=(3, 16, 5, 6), G=4):
    xd, pd = pair
    if channel_axis == -1:
        shape = (shape[0],) + shape[2:] + (shape[1],)
    C = shape[channel_axis]
    x = (rng.standard_normal(shape) * 2 + 1).astype(xd)
    dy = rng.standard_normal(shape).astype(xd)
    return x, dy, (1 + 0.5 * rng.standard_normal(C)).astype(pd), (0.5 * rng.standard_normal(C)).astype(pd), G


@pytest.mark.parametrize("channel_axis", [-1, 1])
@pytest.mark.parametrize("pair", PAIRS)
def test_group_norm_jit_grad_match_the_numpy_api(pair, channel_axis, rng):
    x, dy, w, b, G = _group_case(rng, pair, channel_axis)
    y0, mean, rstd = cynorm.group_norm_forward(x, G, w, b, channel_axis=channel_axis)
    want = cynorm.group_norm_backward(dy, x, mean, rstd, w, num_groups=G, channel_axis=channel_axis)
    y = cnj.group_norm(x, G, w, b, channel_axis=channel_axis)
    assert same_bits(y, y0)
    loss = jax.jit(lambda x, w, b: jnp.sum((cnj.group_norm(x, G, w, b, channel_axis=channel_axis)
                                            * dy).astype(jnp.float32 if x.dtype != np.float64 else x.dtype)))
    _, vjp = jax.vjp(lambda x, w, b: cnj.group_norm(x, G, w, b, channel_axis=channel_axis), x, w, b)
    got = vjp(jnp.asarray(dy))
    for g, e, name in zip(got, want, ("dx", "dweight", "dbias")):
        assert same_bits(g, e), name
    assert np.isfinite(np.asarray(jax.grad(loss)(x, w, b), dtype=np.float64)).all()


def test_group_norm_vmap_per_example_weights_and_gradients(rng):
    """vmap over examples: a batched weight normalizes each with its own; the gradient of
    an unbatched weight is per example, each the bits of a call on that example alone."""
    pair = (np.dtype(np.float32),) * 2
    xs, dys = zip(*[_group_case(rng, pair, -1)[:2] for _ in range(3)])
    x, dy = np.stack(xs), np.stack(dys)
    _, _, w, b, G = _group_case(rng, pair, -1)
    ws = np.stack([w * (k + 1) for k in range(3)])
    y = jax.vmap(lambda xi, wi: cnj.group_norm(xi, G, wi, b))(x, ws)
    for k in range(3):
        assert same_bits(y[k], cynorm.group_norm(x[k], G, ws[k], b, channel_axis=-1))
    per = jax.vmap(lambda xi, dyi: jax.grad(lambda w: jnp.sum(cnj.group_norm(xi, G, w, b) * dyi))(w))(x, dy)
    for k in range(3):
        _, m, r = cynorm.group_norm_forward(x[k], G, w, b, channel_axis=-1)
        assert same_bits(per[k], cynorm.group_norm_backward(dy[k], x[k], m, r, w, num_groups=G, channel_axis=-1)[1])


def test_instance_norm_and_no_params(rng):
    x, dy, w, b, _ = _group_case(rng, (np.dtype(np.float32),) * 2, -1)
    assert same_bits(cnj.instance_norm(x, w, b), cynorm.instance_norm(x, w, b, channel_axis=-1))
    assert same_bits(cnj.group_norm(x, 2), cynorm.group_norm(x, 2, channel_axis=-1))
    gb = jax.grad(lambda b: jnp.sum(cnj.group_norm(x, 2, None, b) * dy))(b)   # bias without weight
    _, m, r = cynorm.group_norm_forward(x, 2, None, b, channel_axis=-1)
    assert same_bits(gb, cynorm.group_norm_backward(dy, x, m, r, np.ones_like(b), num_groups=2, channel_axis=-1)[2])


@pytest.mark.parametrize("call, exc, match", [
    (lambda x, w: cnj.group_norm(x, 3, w), ValueError, "must divide the number of channels"),
    (lambda x, w: cnj.group_norm(x, 2.0, w), TypeError, "num_groups must be an int"),
    (lambda x, w: cnj.group_norm(x, 2, w, channel_axis=2), ValueError, "channel_axis must be 1"),
    (lambda x, w: cnj.group_norm(x, 2, w[:3]), ValueError, "weight must have shape (C,)"),
])
def test_group_norm_bad_input(call, exc, match):
    x = jnp.ones((2, 3, 4, 8), jnp.float32)
    with pytest.raises(exc) as info:
        call(x, jnp.ones(8, jnp.float32))
    assert match in str(info.value)
