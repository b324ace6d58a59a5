"""``contractions="scaled"``: backward contractions on narrow operands, cotangents still float32.

References: exact integer arithmetic (inputs whose every product and sum float32 holds exactly, so
the float32-accumulated contraction has one right answer), float64, the float32 model, and the
jaxpr (which dtypes each backward contraction reads).
"""

from __future__ import annotations

import itertools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle
import heddle.numpy as hnp
from heddle import autodiff, examples
from heddle.autodiff import _scaled

F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32
NARROW = [F16, BF16]

# Contractions as einsum specs: plain matmuls, transposed operands, batch dimensions in and out of
# front, several contracting dimensions in either order, vectors, a full contraction.
SPECS = [
    "ij,jk->ik",
    "ij,kj->ik",
    "ji,jk->ik",
    "bij,bjk->bik",
    "bqd,bkd->bqk",
    "ibj,bjk->bik",
    "ijk,kj->i",
    "abc,cbd->ad",
    "bij,jb->bi",
    "i,i->",
    "ij,j->i",
    "abcd,adce->abe",
]


def _dims(spec, a, b):
    """The dot_general dimension numbers jnp.einsum gives ``spec`` (and its operand shapes)."""
    f = lambda x, y: jnp.einsum(spec, x, y, preferred_element_type=F32)
    eqn = next(e for e in jax.make_jaxpr(f)(a, b).jaxpr.eqns if e.primitive.name == "dot_general")
    return eqn.params["dimension_numbers"], eqn.invars[0].aval.shape, eqn.invars[1].aval.shape


def _ints(rng, shape, dtype):
    return jnp.asarray(rng.integers(-8, 9, shape), dtype)


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
@pytest.mark.parametrize("spec", SPECS)
def test_transposes_are_the_exact_cotangents(spec, dtype, transform):
    """Both transposing contractions of every layout against integer arithmetic: small integers
    (exact in both formats) times 2**-40, a cotangent float16 flushes to zero unscaled."""
    rng = np.random.default_rng(0)
    ins, _ = spec.split("->")
    sizes = {c: int(rng.integers(2, 5)) for c in set(ins) - {","}}
    a_s, b_s = ins.split(",")
    a0 = jnp.zeros([sizes[c] for c in a_s], dtype)
    b0 = jnp.zeros([sizes[c] for c in b_s], dtype)
    dims, sa, sb = _dims(spec, a0, b0)
    lhs, rhs = _ints(rng, sa, dtype), _ints(rng, sb, dtype)
    out_shape = jax.eval_shape(
        lambda x, y: jax.lax.dot_general(x, y, dims, preferred_element_type=F32), lhs, rhs
    ).shape
    ct_int = rng.integers(-8, 9, out_shape)
    ct = jnp.asarray(ct_int * 2.0**-40, F32)
    d_lhs, d_rhs = transform(lambda c, a, b: _scaled.transposes(c, a, b, dims, None))(ct, lhs, rhs)

    # the reference: JAX's transposes of the same contraction in int64, times 2**-40
    f = lambda x, y: jax.lax.dot_general(x, y, dims)
    with jax.enable_x64(True):
        li, ri = (jnp.asarray(np.asarray(v, np.float64).astype(np.int64)) for v in (lhs, rhs))
        _, pull = jax.vjp(f, li.astype(jnp.float64), ri.astype(jnp.float64))
        ref_l, ref_r = pull(jnp.asarray(ct_int, jnp.float64))
        ref_l, ref_r = np.asarray(ref_l) * 2.0**-40, np.asarray(ref_r) * 2.0**-40
    assert d_lhs.dtype == d_rhs.dtype == F32
    np.testing.assert_array_equal(np.asarray(d_lhs, np.float64), ref_l)
    np.testing.assert_array_equal(np.asarray(d_rhs, np.float64), ref_r)
    assert np.abs(ref_l).max() > 0 and np.abs(ref_r).max() > 0  # the check can fail


@pytest.mark.parametrize(
    "magnitude,dtype",
    [(2.0**-60, F16), (2.0**40, F16), (2.0**-120, BF16), (2.0**100, BF16), (1.0, F16)],
)
def test_cotangents_out_of_the_narrow_range_keep_their_values(magnitude, dtype):
    """A cotangent float16 cannot hold (2**-60 underflows, 2**40 overflows) or near bfloat16's
    ends: the scale moves it into range and back exactly; the narrowing only rounds significands
    (here none: the cotangent is 3 * magnitude, exact in both formats)."""
    lhs = jnp.asarray([[1.0, 2.0], [3.0, -4.0]], dtype)
    rhs = jnp.asarray([[0.5, -1.0], [2.0, 0.25]], dtype)
    dims = (((1,), (0,)), ((), ()))
    ct = jnp.full((2, 2), 3.0 * magnitude, F32)
    d_lhs, d_rhs = _scaled.transposes(ct, lhs, rhs, dims, None)
    ref_l = 3.0 * magnitude * np.asarray(rhs, np.float64).sum(axis=1)[None, :].repeat(2, 0)
    ref_r = 3.0 * magnitude * np.asarray(lhs, np.float64).sum(axis=0)[:, None].repeat(2, 1)
    np.testing.assert_allclose(np.asarray(d_lhs, np.float64), ref_l, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(d_rhs, np.float64), ref_r, rtol=1e-7)


def test_a_nonfinite_cotangent_is_not_finite_in_the_result():
    """inf and NaN reach the cotangents they touch (a skipped loss-scaling step sees them), and
    only those here."""
    lhs = jnp.ones((2, 2), F16)
    dims = (((1,), (0,)), ((), ()))
    for bad in (np.inf, np.nan):
        ct = jnp.asarray([[1.0, bad], [1.0, 1.0]], F32)
        d_lhs, d_rhs = _scaled.transposes(ct, lhs, lhs, dims, None)
        assert not np.isfinite(np.asarray(d_lhs)[0]).any()
        assert np.isfinite(np.asarray(d_lhs)[1]).all()
        assert not np.isfinite(np.asarray(d_rhs)[:, 1]).any()


def _small_loss(xp):
    def loss(p, x):  # the loss of issue 24: h's cotangent is 2.4e-10
        h = xp.matmul(x, p["w"].astype(x.dtype))
        return xp.mean(h.astype(F32)) * 1e-6

    return loss


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
@pytest.mark.parametrize("how", ["jnp", "hnp", "autocast"])
def test_the_issue_example_gives_1e_9_with_narrow_contractions(dtype, how, transform):
    x = jnp.full((4096, 256), 1e-3, dtype)
    p = {"w": jnp.full((256, 1), 0.01, F32)}
    exact = float(np.asarray(x[0, 0], np.float64)) * 1e-6
    loss = _small_loss(hnp if how == "hnp" else jnp)
    if how == "autocast":
        loss = heddle.autocast(loss)
    g = transform(autodiff.grad(loss, contractions="scaled"))(p, x)
    assert g["w"].dtype == F32
    np.testing.assert_allclose(np.asarray(g["w"], np.float64), exact, rtol=0.01)


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


def _mlp_loss(xp, dtype, scale=1e-7):
    def loss(params, x, y):
        h = x.astype(dtype)
        for i in range(3):
            h = xp.matmul(h, params[f"w{i}"].astype(dtype)) + params[f"b{i}"].astype(dtype)
            if i < 2:
                h = xp.tanh(h)
        return xp.mean((h.astype(F32) - y) ** 2) * scale

    return loss


def _rel(g, ref, k):
    diff = np.abs(np.asarray(g[k], np.float64) - np.asarray(ref[k], np.float64))
    return float(diff.max() / np.abs(np.asarray(ref[k], np.float64)).max())


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
def test_three_layer_mlp_with_loss_scale_1e_7(dtype, transform):
    """Every layer within 1% of the float32 model's gradient, as with float32 contractions (JAX's
    float16 gradient is all zeros here)."""
    params, x, y = _mlp_case()
    ref = jax.grad(_mlp_loss(jnp, F32))(params, x, y)
    for xp, wrap in ((jnp, lambda f: f), (jnp, heddle.autocast), (hnp, lambda f: f)):
        grad = autodiff.grad(wrap(_mlp_loss(xp, dtype)), contractions="scaled")
        g = transform(grad)(params, x, y)
        for k in ref:
            assert g[k].dtype == F32
            assert _rel(g, ref, k) <= 0.01, (k, _rel(g, ref, k))


def _dots(closed):
    """Every dot_general equation of a jaxpr, bodies included."""
    found = []

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name == "dot_general":
                found.append(e)
            for p in e.params.values():
                for q in p if isinstance(p, list | tuple) else [p]:
                    inner = getattr(q, "jaxpr", q)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(closed.jaxpr)
    return found


def _dot_operands(closed):
    """The operand dtypes of every dot_general of a jaxpr, bodies included."""
    return [tuple(np.dtype(v.aval.dtype) for v in e.invars) for e in _dots(closed)]


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
@pytest.mark.parametrize("how", ["jnp", "hnp", "autocast"])
def test_every_backward_contraction_of_a_transformer_block_reads_narrow_operands(dtype, how):
    """The sweep: every dot of the gradient of a transformer block (attention, projections, MLP)
    reads two narrow operands with contractions="scaled"; with the default, the backward ones read
    float32 (the check can fail)."""
    rng = np.random.default_rng(0)
    p = {k: jnp.asarray(v, dtype) for k, v in examples.init_block(rng, 32, 64).items()}
    x = jnp.asarray(rng.standard_normal((2, 8, 32)), dtype)
    xp = hnp if how == "hnp" else jnp
    loss = lambda p, x: jnp.mean(examples.block(xp, p, x).astype(F32) ** 2)
    if how == "autocast":
        loss = heddle.autocast(loss)
    scaled = _dot_operands(jax.make_jaxpr(autodiff.grad(loss, contractions="scaled"))(p, x))
    default = _dot_operands(jax.make_jaxpr(autodiff.grad(loss))(p, x))
    want = np.dtype(dtype)
    assert len(scaled) >= 3 * 8  # eight contractions, each with its two transposes
    assert all(ops == (want, want) for ops in scaled), sorted(set(scaled))
    assert any(ops == (np.dtype(F32), np.dtype(F32)) for ops in default)


def _uncanonical_dots(closed):
    """The dimension numbers of each ``dot_general`` in a jaxpr (bodies included) that is not a
    (batched) matmul as row-major kernels take it: batch axes leading, the lhs contracted over its
    trailing axes."""
    found = []
    for e in _dots(closed):
        (lc, _), (lb, _) = e.params["dimension_numbers"]
        nd = e.invars[0].aval.ndim
        trailing = sorted(lc) == list(range(nd - len(lc), nd))
        if not trailing or sorted(lb) != list(range(len(lb))):
            found.append(e.params["dimension_numbers"])
    return found


@pytest.mark.parametrize("contractions", ["float32", "scaled"])
@pytest.mark.parametrize("how", ["jnp", "hnp"])
def test_backward_contractions_are_matmuls_as_row_major_kernels_take_them(how, contractions):
    """Every contraction of a transformer block's gradient is a (batched) matmul with its lhs
    contracted over its trailing axes (a weight's cotangent is ``x^T @ dC``, the operand
    transposed). JAX's transpose rule contracts a weight's cotangent over the cotangent's leading
    axes and transposes the result, which XLA:CPU compiles into a transposing copy of the whole
    cotangent (the block's gradient step took 1.2-1.35x jax.grad's time so). jax.grad's program of
    the same block has such contractions: the check can fail."""
    rng = np.random.default_rng(0)
    p = {k: jnp.asarray(v, BF16) for k, v in examples.init_block(rng, 32, 64).items()}
    x = jnp.asarray(rng.standard_normal((2, 8, 32)), BF16)
    xp = hnp if how == "hnp" else jnp
    loss = lambda p, x: jnp.mean(examples.block(xp, p, x).astype(F32) ** 2)
    ours = jax.make_jaxpr(autodiff.grad(loss, contractions=contractions))(p, x)
    assert _uncanonical_dots(ours) == []
    assert len(_uncanonical_dots(jax.make_jaxpr(jax.grad(loss))(p, x))) >= 6


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
def test_the_forward_values_are_the_plain_values_bit_for_bit(dtype, transform):
    """The narrow output of a transformer block, computed under the gradient, is the plain call's
    (the float32 mean after it may sum in another order in another compiled program)."""
    rng = np.random.default_rng(1)
    p = {k: jnp.asarray(v, dtype) for k, v in examples.init_block(rng, 32, 64).items()}
    x = jnp.asarray(rng.standard_normal((2, 8, 32)), dtype)

    def loss(p, x):
        out = examples.block(hnp, p, x)
        return jnp.mean(out.astype(F32) ** 2), out

    (_, out), _ = transform(autodiff.value_and_grad(loss, has_aux=True, contractions="scaled"))(
        p, x
    )
    plain = transform(examples.block)(hnp, p, x) if transform is not jax.jit else None
    if plain is None:
        plain = jax.jit(examples.block, static_argnums=0)(hnp, p, x)
    assert out.dtype == plain.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))


def test_the_scaled_gradient_of_a_block_is_as_close_to_float32_as_the_default():
    """Against the float32 model: the scaled contractions' error stays within 1.5x the float32
    contractions' (both are dominated by the narrow forward pass), float16 and bfloat16."""
    rng = np.random.default_rng(2)
    p32 = {k: jnp.asarray(v, F32) for k, v in examples.init_block(rng, 32, 64).items()}
    x32 = jnp.asarray(rng.standard_normal((2, 8, 32)), F32)
    loss = lambda p, x: jnp.mean(examples.block(hnp, p, x).astype(F32) ** 2)
    ref = jax.grad(loss)(p32, x32)
    for dtype in NARROW:
        p, x = jax.tree.map(lambda a: a.astype(dtype), (p32, x32))
        exact = jax.jit(autodiff.grad(loss))(p, x)
        scaled = jax.jit(autodiff.grad(loss, contractions="scaled"))(p, x)
        for k in ref:
            assert _rel(scaled, ref, k) <= 1.5 * _rel(exact, ref, k) + 1e-3, k


def test_other_operand_dtypes_keep_the_float32_rule():
    """float8 operands and mixed dtypes: the default rule, bit for bit."""
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((8, 4)), F32)
    b = jnp.asarray(rng.standard_normal((4, 3)), F32)
    cases = [
        (jnp.float8_e4m3fn, jnp.float8_e4m3fn),
        (BF16, F16),
        (BF16, F32),
    ]
    for da, db in cases:
        loss = lambda a, b, da=da, db=db: jnp.sum(
            jnp.matmul(a.astype(da), b.astype(db), preferred_element_type=F32) ** 2
        )
        want = autodiff.grad(loss, argnums=(0, 1))(a, b)
        got = autodiff.grad(loss, argnums=(0, 1), contractions="scaled")(a, b)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_vmapped_per_example_gradients():
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.standard_normal((16, 4)), F32)
    xs = jnp.asarray(rng.standard_normal((5, 3, 16)), F16)
    loss = lambda w, x: jnp.sum(jnp.matmul(x, w.astype(F16)).astype(F32) ** 2) * 1e-6
    got = jax.vmap(autodiff.grad(loss, contractions="scaled"), in_axes=(None, 0))(w, xs)
    x64, w64 = np.asarray(xs, np.float64), np.asarray(w.astype(F16), np.float64)
    ref = np.stack([2e-6 * x.T @ (x @ w64) for x in x64])  # float64, w rounded as the model does
    err = np.abs(np.asarray(got, np.float64) - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
    assert got.dtype == F32 and err.max() <= 1e-2, err


@pytest.mark.parametrize("fn", ["grad", "value_and_grad", "vjp", "jacrev"])
def test_an_unknown_mode_is_refused(fn):
    with pytest.raises(
        ValueError, match=rf"^{fn}\(\.\.\., contractions='bf16'.*must be one of 'float32', 'scaled'"
    ):  # the function the user called is named (before: grad's said value_and_grad)
        if fn == "vjp":
            autodiff.vjp(jnp.sin, jnp.ones(2), contractions="bf16")
        else:
            getattr(autodiff, fn)(jnp.sin, contractions="bf16")


def test_vjp_and_jacrev_take_it():
    x = jnp.asarray([[1.0, 2.0], [3.0, 4.0]], F16)
    w = jnp.asarray([[1e-6, 0.0], [0.0, 1e-6]], F16)
    f = lambda x: jnp.matmul(x, w, preferred_element_type=F32) * 1e-6
    _, pull = autodiff.vjp(f, x, contractions="scaled")
    (ct,) = pull(jnp.ones((2, 2), F32))
    ref = np.ones((2, 2)) @ np.asarray(w, np.float64).T * 1e-6
    np.testing.assert_allclose(np.asarray(ct, np.float64), ref, rtol=1e-3)
    jac = autodiff.jacrev(f, contractions="scaled")(x)
    assert jac.shape == (2, 2, 2, 2) and jac.dtype == F32
    assert float(jac[0, 0, 0, 0]) == pytest.approx(float(w[0, 0]) * 1e-6, rel=1e-3)


def test_sharded_inputs_on_8_devices(on_8_devices):
    """Explicit axes (jax.make_mesh's default) and auto axes run scaled: every contraction reads
    two narrow operands, and under explicit axes each gradient keeps its weight's sharding;
    batch-sharded inputs, replicated and FSDP-sharded weights, a scan over layers, batch
    dimensions. (Before: explicit axes raised ShardingTypeError, then kept the float32 rule; a
    scan under explicit axes raised TypeError, with either rule; arrays on an explicit mesh with
    jax.jit called outside jax.set_mesh raised ShardingTypeError, scaled only, and so did plain
    weights beside explicitly sharded inputs.)"""
    results = on_8_devices(pathlib.Path(__file__).with_name("_scaled_devices.py"))
    assert len(results) == 16
    for name, err in results.items():
        assert isinstance(err, float), (name, err)
        assert err <= (2e-2 if "bfloat16" in name else 2e-3), (name, err)


@pytest.mark.parametrize("contractions", ["float32", "scaled"])
@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
def test_an_empty_batch_gives_zero_gradients(dtype, contractions, transform):
    """Before: float16's scale took the maximum of an empty cotangent and raised."""
    w = jnp.ones((4, 3), F32)
    x = jnp.ones((0, 4), dtype)
    for out in (F32, dtype):  # a float32-result and a narrow-result contraction
        loss = lambda w, x, out=out: jnp.sum(
            jnp.matmul(x, w.astype(dtype), preferred_element_type=out).astype(F32)
        )
        g = transform(autodiff.grad(loss, contractions=contractions))(w, x)
        assert g.dtype == F32 and g.shape == (4, 3) and not np.asarray(g).any()


def test_forward_over_reverse_is_the_float32_derivative():
    """jax.jvp / jax.jacfwd of a scaled gradient (Hessian-vector products): the narrowed
    cotangent's derivative is the float32 contraction's. Here x @ w is 0, so the cotangent is 0
    and float16's scale is 2**15: the tangent 6 was scaled with it, overflowing to inf before.
    The exact Hessian-vector product is 2 x^T x v = [6, 12]."""
    x = jnp.asarray([[1.0, 2.0]], F16)
    w = jnp.asarray([[2.0], [-1.0]], F32)
    loss = lambda w: jnp.sum(jnp.matmul(x, w.astype(F16), preferred_element_type=F32) ** 2)
    g = autodiff.grad(loss, contractions="scaled")
    assert jax.jvp(g, (w,), (jnp.ones_like(w),))[1].ravel().tolist() == [6.0, 12.0]
    assert jax.jacfwd(g)(w).ravel().tolist() == [2.0, 4.0, 4.0, 8.0]


def test_a_nan_changes_no_other_rows_rounding():
    """The float16 scale comes from the largest finite magnitude: a NaN in one row of the
    cotangent leaves the other rows as the default computes them (before: 1e5 overflowed to inf
    once the NaN set the scale to 1)."""
    x = jnp.ones((2, 1), F16)
    w = jnp.full((1, 1), 0.5, F16)
    f = lambda x, w: jnp.matmul(x, w, preferred_element_type=F32)
    ct = jnp.asarray([[np.nan], [1e5]], F32)
    (dx, _) = autodiff.vjp(f, x, w, contractions="scaled")[1](ct)
    assert np.isnan(np.asarray(dx)[0, 0])
    # 1e5 * 2**-2 rounded to float16's 11 bits (0.5 is exact): 99968 / 2
    assert float(dx[1, 0]) == float(np.float16(1e5 / 4)) * 2


@pytest.mark.parametrize("dtype", NARROW, ids=["f16", "bf16"])
def test_contractions_inside_loop_and_branch_bodies_run_narrow(dtype):
    """A scan over layers, a fori_loop and a cond: their backward contractions read narrow
    operands too (before: float32 x float32 inside every body), and the gradient matches the
    default's to the narrow cotangent's precision."""
    rng = np.random.default_rng(5)
    ws = jnp.asarray(rng.standard_normal((3, 16, 16)) / 4, F32)
    x = jnp.asarray(rng.standard_normal((8, 16)), dtype)

    def layer(h, w):
        return jnp.tanh(jnp.matmul(h, w.astype(dtype))) + h

    losses = {
        "scan": lambda ws, x: jax.lax.scan(lambda h, w: (layer(h, w), None), x, ws)[0],
        "fori": lambda ws, x: jax.lax.fori_loop(0, 3, lambda i, h: layer(h, ws[i]), x),
        "cond": lambda ws, x: jax.lax.cond(x.sum() > 0, layer, lambda h, w: -layer(h, w), x, ws[0]),
    }
    for name, body in losses.items():
        loss = lambda ws, x, body=body: jnp.mean(body(ws, x).astype(F32) ** 2)
        scaled = autodiff.grad(loss, contractions="scaled")
        ops = _dot_operands(jax.make_jaxpr(scaled)(ws, x))
        assert ops and all(o == (np.dtype(dtype),) * 2 for o in ops), (name, sorted(set(ops)))
        want, got = autodiff.grad(loss)(ws, x), scaled(ws, x)
        err = float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(want).max())
        assert err <= (2e-2 if dtype == BF16 else 2e-3), (name, err)


@pytest.mark.parametrize("contractions", ["float32", "scaled"])
def test_float16_dot_product_attention(contractions):
    """jax.nn.dot_product_attention of float16 asks for the F16_F16_F32 algorithm, which XLA:CPU
    refuses (jax.grad falls back eagerly; heddle.autodiff re-issued it and raised): the gradient
    is within float16's precision of the float64 one."""
    rng = np.random.default_rng(6)
    q = jnp.asarray(rng.standard_normal((1, 4, 2, 8)), F16)
    k = jnp.asarray(rng.standard_normal((1, 6, 2, 8)), F16)
    f = lambda q, k: jnp.sum(jax.nn.dot_product_attention(q, k, k).astype(F32) ** 2)
    with jax.numpy_dtype_promotion("standard"):  # JAX's attention mixes float16 and float32
        got = autodiff.grad(f, contractions=contractions)(q, k)
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        q64, k64 = (jnp.asarray(np.asarray(a, np.float64)) for a in (q, k))
        want = jax.grad(lambda q: jnp.sum(jax.nn.dot_product_attention(q, k64, k64) ** 2))(q64)
    err = np.abs(np.asarray(got, np.float64) - np.asarray(want)).max() / np.abs(want).max()
    assert got.dtype == F32 and err <= 5e-3, err


def test_flax_and_equinox_layers_under_autocast():
    """flax.linen.Dense and equinox.nn.Linear float16 MLPs under autocast, loss scaled by 1e-7,
    with contractions="scaled": every layer within 1% of the float32 model's gradient, and every
    contraction of the gradient reads float16 operands."""
    flax_nn = pytest.importorskip("flax.linen")
    eqx = pytest.importorskip("equinox")
    params, x, y = _mlp_case()
    ref = jax.grad(_mlp_loss(jnp, F32))(params, x, y)

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

    grad = autodiff.grad(heddle.autocast(flax_loss), contractions="scaled")
    assert {o for o in _dot_operands(jax.make_jaxpr(grad)(fparams, x, y))} == {
        (np.dtype(F16), np.dtype(F16))
    }
    g = jax.jit(grad)(fparams, x, y)
    got = {k: g["params"][f"d{k[1]}"]["kernel" if k[0] == "w" else "bias"] for k in ref}
    for k in ref:
        assert _rel(got, ref, k) <= 0.01, (k, _rel(got, ref, k))

    keys = jax.random.split(jax.random.key(0), 3)
    model = []
    for i, key in enumerate(keys):
        w = params[f"w{i}"]
        lay = eqx.nn.Linear(w.shape[0], w.shape[1], key=key)
        model.append(eqx.tree_at(lambda m: (m.weight, m.bias), lay, (w.T, params[f"b{i}"])))

    def eqx_loss(model, x, y):
        half = jax.tree.map(lambda a: a.astype(F16) if eqx.is_inexact_array(a) else a, model)
        h = x.astype(F16)
        for i, lay in enumerate(half):
            h = jax.vmap(lay)(h)
            if i < 2:
                h = jnp.tanh(h)
        return jnp.mean((h.astype(F32) - y) ** 2) * 1e-7

    g = jax.jit(autodiff.grad(heddle.autocast(eqx_loss), contractions="scaled"))(model, x, y)
    got = {}
    for i in range(3):
        got[f"w{i}"], got[f"b{i}"] = g[i].weight.T, g[i].bias
    for k in ref:
        assert _rel(got, ref, k) <= 0.01, (k, _rel(got, ref, k))
