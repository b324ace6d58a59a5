"""Every cotangent of a narrow value is float32 (POLICY.md 7): small gradients are never flushed.

A float16 value's cotangent is routinely orders of magnitude smaller than the value (a sum over its
uses of a loss normalised by a global batch); float16's smallest subnormal is 6e-8. JAX stores each
cotangent at its primal's dtype, so it flushes them; heddle.autodiff keeps them at float32 from the
loss to every leaf. References: float64 arithmetic, and the same model computed in float32.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import heddle
import heddle.numpy as hnp
from heddle import autodiff

F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32
NARROW = [F16, BF16]


def _small_loss(xp):
    def loss(p, x):  # the loss of issue 24: h's cotangent is 2.4e-10
        h = xp.matmul(x, p["w"].astype(x.dtype))
        return xp.mean(h.astype(F32)) * 1e-6

    return loss


def _small_case(dtype):
    x = jnp.full((4096, 256), 1e-3, dtype)
    p = {"w": jnp.full((256, 1), 0.01, F32)}
    exact = float(np.float64(np.asarray(x[0, 0], np.float64)) * 1e-6)  # mean over rows of x * 1e-6
    return p, x, exact


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
@pytest.mark.parametrize("xp", [jnp, hnp], ids=["jnp", "hnp"])
@pytest.mark.parametrize("how", ["grad", "autocast", "value_and_grad", "vjp"])
def test_the_issue_example_gives_1e_9(dtype, xp, how, transform):
    p, x, exact = _small_case(dtype)
    loss = _small_loss(xp)
    if how == "grad":
        g = transform(autodiff.grad(loss))(p, x)
    elif how == "autocast":
        g = transform(autodiff.grad(heddle.autocast(loss)))(p, x)
    elif how == "value_and_grad":
        g = transform(autodiff.value_and_grad(loss))(p, x)[1]
    else:
        g = transform(lambda p, x: autodiff.vjp(lambda p: loss(p, x), p)[1](F32(1.0))[0])(p, x)
    w = np.asarray(g["w"], np.float64)
    assert g["w"].dtype == F32
    np.testing.assert_allclose(w, exact, rtol=0.01)


def test_jax_grad_flushes_the_issue_example():
    """The reference check can fail: JAX's own float16 cotangent is 0 (so is autocast's under
    jax.grad: autocast's float16 values keep float16 cotangents in JAX's differentiation)."""
    p, x, _ = _small_case(F16)
    assert not np.asarray(jax.grad(_small_loss(jnp))(p, x)["w"]).any()
    assert not np.asarray(jax.grad(heddle.autocast(_small_loss(jnp)))(p, x)["w"]).any()


def test_forward_mode_keeps_float32_tangents():
    """jacfwd: h = 1 + w * 1e-4 is 1.0 in float16 with tangent 1e-4; x * h has tangent 1e-8, below
    float16's smallest subnormal: float32 in heddle, 0 in JAX."""
    x = jnp.full((64,), 1e-4, F16)

    def f(w):
        h = F16(1.0) + w.astype(F16) * F16(1e-4)
        return jnp.sum((x * h).astype(F32))

    w = jnp.float32(0.5)
    exact = 64 * float(np.float16(1e-4)) ** 2
    for jac in (autodiff.jacfwd, autodiff.jacrev):
        np.testing.assert_allclose(float(jac(f)(w)), exact, rtol=1e-6)
    assert float(jax.jacfwd(f)(w)) == 0.0


def _mlp(xp, params, x, dtype, act):
    h = x.astype(dtype)
    for i in range(3):
        h = xp.matmul(h, params[f"w{i}"].astype(dtype)) + params[f"b{i}"].astype(dtype)
        if i < 2:
            h = act(h)
    return h


def _mlp_loss(xp, dtype, act, scale=1e-7):
    def loss(params, x, y):
        out = _mlp(xp, params, x, dtype, act).astype(F32)
        return xp.mean((out - y) ** 2) * scale

    return loss


def _mlp_case():
    rng = np.random.default_rng(0)
    sizes = (32, 64, 64, 8)
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(m), F32)
        params[f"b{i}"] = jnp.asarray(rng.standard_normal(n) * 0.1, F32)
    x = jnp.asarray(rng.standard_normal((256, 32)), F32)
    y = jnp.asarray(rng.standard_normal((256, 8)), F32)
    return params, x, y


def _rel(g, ref):
    return max(
        float(np.max(np.abs(np.asarray(g[k], np.float64) - np.asarray(ref[k], np.float64))))
        / float(np.max(np.abs(np.asarray(ref[k], np.float64))))
        for k in ref
    )


def _mlp_modes():
    """Every activation and dtype under jax.jit; eagerly (seconds each) gelu in float16 and relu in
    bfloat16 by default, the rest with the slow marker."""
    for mode in ("jit", "eager"):
        for act, a in ((jnp.tanh, "tanh"), (jax.nn.relu, "relu"), (jax.nn.gelu, "gelu")):
            for dtype, d in zip(NARROW, ("f16", "bf16"), strict=True):
                quick = mode == "jit" or (a, d) in {("gelu", "f16"), ("relu", "bf16")}
                marks = () if quick else pytest.mark.slow
                yield pytest.param(dtype, act, mode, id=f"{mode}-{a}-{d}", marks=marks)


@pytest.mark.parametrize("dtype,act,mode", list(_mlp_modes()))
def test_three_layer_mlp_with_loss_scale_1e_7(dtype, act, mode):
    """Every layer's gradient within 1% of the float32 model's (float16: JAX's is all zeros).

    relu's kinks make the narrow forward pass itself differ from float32's by more than that (units
    whose pre-activation changes sign: measured 3.6% float16, 5.5% bfloat16 on w1), so its reference
    is JAX's gradient of the same narrow model with the loss unscaled (no cotangent underflows
    there), times 1e-7."""
    params, x, y = _mlp_case()
    if act is jax.nn.relu:
        unscaled = jax.grad(_mlp_loss(jnp, dtype, act, scale=1.0))(params, x, y)
        ref = {k: v.astype(F32) * F32(1e-7) for k, v in unscaled.items()}
    else:
        ref = jax.grad(_mlp_loss(jnp, F32, act))(params, x, y)
    transform = jax.jit if mode == "jit" else (lambda f: f)
    for xp, wrap in ((jnp, lambda f: f), (jnp, heddle.autocast), (hnp, lambda f: f)):
        g = transform(autodiff.grad(wrap(_mlp_loss(xp, dtype, act))))(params, x, y)
        assert all(v.dtype == F32 for v in g.values())
        for k in ref:  # every layer, weights and biases
            assert _rel({k: g[k]}, {k: ref[k]}) <= 0.01, (k, _rel({k: g[k]}, {k: ref[k]}))
    if dtype == F16:
        plain = jax.grad(_mlp_loss(jnp, dtype, act))(params, x, y)
        assert not any(np.asarray(v).any() for v in plain.values())


def test_flax_and_equinox_layers_under_autocast():
    """flax.linen.Dense and equinox.nn.Linear MLPs in float16, loss scaled by 1e-7."""
    flax_nn = pytest.importorskip("flax.linen")
    eqx = pytest.importorskip("equinox")
    params, x, y = _mlp_case()

    class Net(flax_nn.Module):
        @flax_nn.compact
        def __call__(self, h):
            for i, n in enumerate((64, 64, 8)):
                h = flax_nn.Dense(n, dtype=F16, param_dtype=F32, name=f"d{i}")(h)
                if i < 2:
                    h = jnp.tanh(h)
            return h

    fparams = {
        "params": {f"d{i}": {"kernel": params[f"w{i}"], "bias": params[f"b{i}"]} for i in range(3)}
    }

    def flax_loss(fp, x, y):
        return jnp.mean((Net().apply(fp, x).astype(F32) - y) ** 2) * 1e-7

    ref = jax.grad(_mlp_loss(jnp, F32, jnp.tanh))(params, x, y)
    g = jax.jit(autodiff.grad(heddle.autocast(flax_loss)))(fparams, x, y)
    got = {k: g["params"][f"d{k[1]}"]["kernel" if k[0] == "w" else "bias"] for k in ref}
    assert _rel(got, ref) <= 0.01
    plain = jax.grad(flax_loss)(fparams, x, y)
    assert not any(np.asarray(v).any() for v in jax.tree.leaves(plain))

    keys = jax.random.split(jax.random.key(0), 3)
    model = []
    for i, k in enumerate(keys):
        w = params[f"w{i}"]
        lay = eqx.nn.Linear(w.shape[0], w.shape[1], key=k)
        model.append(eqx.tree_at(lambda m: (m.weight, m.bias), lay, (w.T, params[f"b{i}"])))

    def eqx_loss(model, x, y):
        half = jax.tree.map(lambda a: a.astype(F16) if eqx.is_inexact_array(a) else a, model)
        h = x.astype(F16)
        for i, lay in enumerate(half):
            h = jax.vmap(lay)(h)
            if i < 2:
                h = jnp.tanh(h)
        return jnp.mean((h.astype(F32) - y) ** 2) * 1e-7

    g = jax.jit(autodiff.grad(heddle.autocast(eqx_loss)))(model, x, y)
    got = {}
    for i in range(3):
        got[f"w{i}"], got[f"b{i}"] = g[i].weight.T, g[i].bias
    assert _rel(got, ref) <= 0.01
    plain = jax.grad(eqx_loss)(model, x, y)
    assert not any(np.asarray(v).any() for v in jax.tree.leaves(plain))


def test_one_rounding_through_exact_ops_is_bit_exact():
    """A cotangent of 3e-10 through a float16 rounding, a copy and an exact float16 product by 2:
    the gradient is 2 * 3e-10 in float32, bit for bit (float64 reference rounded once)."""
    c = np.float32(3e-10)

    def f(w):
        h = w.astype(F16)  # rounding; its derivative is 1
        h = jnp.reshape(h, (2, 2)).T * F16(2.0)  # exact in float16
        return jnp.sum(h.astype(F32)) * c

    g = jax.jit(autodiff.grad(f))(jnp.full(4, 0.5, F32))
    assert g.dtype == F32
    assert (
        np.asarray(g).tobytes()
        == np.full(4, np.float64(c) * 2, np.float64).astype(np.float32).tobytes()
    )
    assert not np.asarray(jax.grad(f)(jnp.full(4, 0.5, F32))).any()


def _scan_loss(w):
    x = jnp.full((64,), 1e-3, F16)

    def step(c, xi):
        c = jnp.tanh(c + xi * w.astype(F16))
        return c, c

    return jnp.sum(jax.lax.scan(step, jnp.zeros((), F16), x)[1].astype(F32)) * 1e-6


def _cond_loss(w):
    x = jnp.full((64,), 1e-3, F16)
    h = jax.lax.cond(w > 0, lambda v: jnp.tanh(x * v.astype(F16)), lambda v: x * v.astype(F16), w)
    return jnp.sum(h.astype(F32)) * 1e-6


def _fori_loss(w):
    x = jnp.full((64,), 1e-3, F16)
    h = jax.lax.fori_loop(0, 3, lambda i, h: h * F16(1.5), x * w.astype(F16))
    return jnp.sum(h.astype(F32)) * 1e-6


def _float64_twin(loss):
    """The same loss in float64 (the float16 constants rounded as the float16 program has them)."""

    def f(w):
        x = jnp.full((64,), float(np.float16(1e-3)), jnp.float64)
        if loss is _scan_loss:

            def step(c, xi):
                c = jnp.tanh(c + xi * w)
                return c, c

            return jnp.sum(jax.lax.scan(step, jnp.zeros((), jnp.float64), x)[1]) * 1e-6
        if loss is _cond_loss:
            return jnp.sum(jnp.tanh(x * w)) * 1e-6
        return jnp.sum(x * w * 1.5**3) * 1e-6

    return f


@pytest.mark.parametrize("loss", [_scan_loss, _cond_loss, _fori_loss], ids=["scan", "cond", "fori"])
def test_loop_and_branch_bodies_keep_float32_cotangents(loss, transform):
    """The cotangents inside scan, cond and while bodies are float32 too (float64 reference)."""
    with jax.enable_x64(True):
        exact = float(jax.grad(_float64_twin(loss))(0.5))
    got = float(transform(autodiff.grad(loss))(jnp.float32(0.5)))
    np.testing.assert_allclose(got, exact, rtol=2e-3)
    plain = float(jax.grad(loss)(jnp.float32(0.5)))
    assert abs(plain - exact) > 4e-3 * abs(exact)  # float16 cotangents: flushed or subnormal


_IDX = jnp.array([0, 2, 2])
_SEG = jnp.array([0, 0, 1, 1, 2, 2, 3, 3])
_TAKE = jnp.array([0, 1, 1, 2, 3, 4, 5, 6])


def _conv(w):
    x = jnp.linspace(-1, 1, 64).reshape(1, 1, 8, 8).astype(BF16)
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")


# Primitives whose parameters are NamedTuples of dimension numbers (scatter, gather, conv), at the top
# level and inside a loop body: their float32 versions must keep the parameters' types.
STRUCTURED = {
    "scatter-add": (lambda v: jnp.zeros(8, BF16).at[_IDX].add(v[:3]), jnp.arange(8) / 8),
    "scatter-max": (lambda v: jnp.zeros(8, BF16).at[_IDX].max(v[:3]), jnp.arange(8) / 8),
    "segment_sum": (lambda v: jax.ops.segment_sum(v, _SEG, 4), jnp.arange(8) / 8),
    "conv": (_conv, jnp.ones((1, 1, 3, 3)) / 9),
    "gather in fori": (
        lambda v: jax.lax.fori_loop(0, 2, lambda i, c: c * v[_TAKE], v),
        jnp.arange(1, 9) / 8,
    ),
}


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_structured_parameters_differentiate(name, transform):
    """As jax.grad does, at float32: within the rounding of JAX's bfloat16 gradient."""
    fn, arg = STRUCTURED[name]
    arg = jnp.asarray(arg, BF16)

    def loss(v):
        return jnp.sum(fn(v).astype(F32))

    g = transform(autodiff.grad(loss))(arg)
    assert g.dtype == F32
    plain = np.asarray(jax.grad(loss)(arg), np.float64)
    np.testing.assert_allclose(np.asarray(g, np.float64), plain, rtol=2.0**-7, atol=1e-30)


def test_a_loop_follows_the_narrow_trajectory():
    """The derivative of a scan is taken along the values the bfloat16 program computes: s + 0.001
    stays 1.0 in bfloat16, so the branch never fires and dy/dy0 is 1 (along a float32 trajectory
    the branch fires 50 times: 1.5**50)."""

    def h(y0):
        def step(c, _):
            s, y = c
            s = s + BF16(0.001)
            return (s, jnp.where(s > BF16(1.05), y * BF16(1.5), y)), None

        init = (jnp.array(1.0, BF16), y0.astype(BF16))
        return jax.lax.scan(step, init, None, length=100)[0][1].astype(F32)

    assert float(h(jnp.float32(1.0))) == 1.0
    for tr in (lambda f: f, jax.jit):
        assert float(tr(autodiff.grad(h))(jnp.float32(1.0))) == 1.0
        assert float(tr(autodiff.jacfwd(h))(jnp.float32(1.0))) == 1.0


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: jnp.where(x > 0, x * x, x + x).astype(F32).sum(),
        lambda x: jnp.max(x * x).astype(F32),
        lambda x: jnp.abs((x * x).T).astype(F32).sum(),
    ],
    ids=["where", "max", "abs-transpose"],
)
def test_jitted_value_is_the_plain_value_bit_for_bit(fn):
    """XLA may drop a narrow rounding it sees round-tripped through float32; the value returned by
    value_and_grad must still be the plain program's, under jax.jit too."""
    x = jax.random.normal(jax.random.key(0), (4, 8)).astype(BF16)
    value = jax.jit(autodiff.value_and_grad(fn))(x)[0]
    assert np.asarray(value).tobytes() == np.asarray(jax.jit(fn)(x)).tobytes()
    assert np.asarray(value).tobytes() == np.asarray(fn(x)).tobytes()


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
@pytest.mark.parametrize("to", [F32, jnp.complex64], ids=["float32", "complex64"])
def test_a_narrow_value_converted_to_a_wide_dtype_keeps_a_float32_cotangent(dtype, to, transform):
    """A narrow value converted to float32 or to complex64 (``h.astype(jnp.complex64)``): with
    float32 cotangents the gradient of ``loss * 2**-40`` is the gradient of ``loss`` times
    2**-40 exactly (powers of two, nothing near float32's limits). Before: complex64 kept h's
    cotangent narrow, so float16 flushed every element (bfloat16 rounded them)."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((4, 32)), dtype)
    w = jnp.asarray(rng.standard_normal((32, 32)) * 0.2, F32)
    c = jnp.asarray(rng.standard_normal((4, 32)), F32)
    rot = jnp.exp(1j * jnp.arange(32, dtype=F32).astype(jnp.complex64))

    def loss(w, scale):
        h = (x @ w.astype(dtype)).astype(to).astype(jnp.complex64)
        return jnp.sum((h * rot).real * c) * scale

    def via_float32(w):  # the same value spelled through float32 first
        h = (x @ w.astype(dtype)).astype(F32).astype(jnp.complex64)
        return jnp.sum((h * rot).real * c)

    g = transform(autodiff.grad(loss))(w, 1.0)
    small = transform(autodiff.grad(loss))(w, 2.0**-40)
    assert g.dtype == F32 and np.asarray(g).any()
    np.testing.assert_array_equal(np.asarray(small) * 2.0**40, np.asarray(g))
    # bfloat16 keeps float32's range, so the scaling cannot show its rounding; this can (a
    # bfloat16 cotangent is off by ~4e-3 of the largest element; float32 sums differ in order)
    ref = np.asarray(transform(autodiff.grad(via_float32))(w))
    np.testing.assert_allclose(np.asarray(g), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("bits", [(5, 10), (4, 3), (8, 7)], ids=["f16", "e4m3", "bf16"])
def test_reduce_precision_is_a_rounding_with_derivative_1(bits, transform):
    # lax.reduce_precision rounds in place; JAX's derivative rounds the tangent the same way (a
    # float16 cotangent of 2**-40 is flushed); as a narrowing conversion, it has derivative 1
    x = jnp.linspace(0.25, 2.0, 16, dtype=F32)

    def loss(x, scale):
        r = lax.reduce_precision(x.astype(F16), *bits)
        return jnp.sum(jnp.tanh(r).astype(F32)) * scale

    rounded = np.asarray(lax.reduce_precision(x.astype(F16), *bits), np.float64)
    ref = 1.0 - np.tanh(rounded) ** 2  # d tanh(round(x)) / dx with round' = 1, in float64
    for scale in (1.0, 2.0**-40):
        g = np.asarray(transform(autodiff.grad(loss))(x, scale), np.float64) / scale
        np.testing.assert_allclose(g, ref, rtol=0, atol=1e-6)  # float32 tanh: a few ulp
    assert not np.asarray(jax.grad(loss)(x, 2.0**-40)).any()  # JAX's: flushed
