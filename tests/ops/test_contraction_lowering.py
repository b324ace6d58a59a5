"""How narrow contractions reach XLA: narrow operands into a float32-result dot wherever the backend
has a kernel for it, widened exactly otherwise; checked on the compiled HLO and against float64."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.lax as hlax
import heddle.numpy as hnp

BF16, F32 = jnp.bfloat16, jnp.float32
CPU = jax.default_backend() == "cpu"


def _within_float32_accumulation(got, a, b, contract) -> None:
    """``got`` is the float32-accumulated contraction of ``a`` and ``b``, rounded once to bfloat16."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    exact, mag = contract(a64, b64), contract(np.abs(a64), np.abs(b64))
    n = a.size  # a generous bound on the length of any sum
    bound = n * 2.0**-24 * mag + np.abs(exact) * 2.0**-8
    assert got.dtype == ml_dtypes.bfloat16
    assert (np.abs(np.asarray(got, np.float64) - exact) <= bound).all()


def _operands(*shapes):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in shapes]


# (name, heddle call, float64 reference): the lhs contracts on a leading dimension while the rhs
# keeps two free ones, the dot XLA:CPU has no bfloat16 x bfloat16 -> float32 kernel for
TRANSPOSED = [
    (
        "tensordot",
        lambda a, b: hnp.tensordot(a, b, axes=([0], [2])),
        lambda a, b: np.tensordot(a, b, axes=([0], [2])),
    ),
    (
        "einsum",
        lambda a, b: hnp.einsum("ki,abk->iab", a, b),
        lambda a, b: np.einsum("ki,abk->iab", a, b),
    ),
    (
        "lax.dot_general",
        lambda a, b: hlax.dot_general(a, b, (((0,), (2,)), ((), ()))),
        lambda a, b: np.tensordot(a, b, axes=([0], [2])),
    ),
]


@pytest.mark.parametrize(("name", "f", "ref"), TRANSPOSED, ids=[t[0] for t in TRANSPOSED])
def test_transposed_narrow_contractions_compile_and_accumulate_in_float32(transform, name, f, ref):
    a, b = _operands((64, 16), (4, 8, 64))
    _within_float32_accumulation(transform(f)(a, b), a, b, ref)
    g = jax.jit(jax.grad(lambda a, b: f(a, b).astype(F32).sum(), argnums=(0, 1)))(a, b)
    assert [x.dtype for x in g] == [ml_dtypes.bfloat16] * 2


@pytest.mark.parametrize(
    "f",
    [
        lambda a, b: hnp.matmul(a, b),
        lambda a, b: hnp.einsum("ij,jk->ik", a, b),
        lambda a, b: hlax.dot_general(a, b, (((1,), (0,)), ((), ()))),
        lambda a, b: hlax.dot(a, b),
        lambda a, b: hnp.tensordot(a, b, 1),
        lambda a, b: hnp.tensordot(a, b, axes=([1], [0])),
        heddle.autocast(lambda a, b: a @ b),
        heddle.autocast(lambda a, b: jnp.einsum("ij,jk->ik", a, b)),
    ],
    ids=[
        "matmul",
        "einsum",
        "lax.dot_general",
        "lax.dot",
        "tensordot 1",
        "tensordot axes=",
        "autocast @",
        "autocast einsum",
    ],
)
def test_canonical_narrow_dots_keep_their_operands_narrow(f):
    """bfloat16 x bfloat16 -> float32 on every backend: no widening for a dot the fast path takes."""
    a, b = _operands((8, 64), (64, 8))
    (dot,) = [e for e in jax.make_jaxpr(f)(a, b).jaxpr.eqns if e.primitive.name == "dot_general"]
    assert [v.aval.dtype for v in dot.invars] == [BF16, BF16]
    assert dot.outvars[0].aval.dtype == np.float32
    assert dot.params["precision"] in (None, (None, None))  # no HIGHEST for narrow inputs
    _within_float32_accumulation(jax.jit(f)(a, b), a, b, lambda x, y: x @ y)


def _library_dots(compiled_text: str) -> tuple[int, int]:
    """(dots on XLA:CPU's library path, plain ``dot`` instructions) in an optimised HLO module."""
    entry = compiled_text[compiled_text.index("ENTRY") :]
    return len(re.findall(r"__ynn_fusion|__onednn|custom_call_target=\"__", entry)), len(
        re.findall(r" dot\(", entry)
    )


def _mlp_grad(xp, wrap=lambda f: f):
    def loss(w1, w2, x):
        h = xp.tanh(xp.matmul(x, w1))
        return jnp.mean(jnp.square(xp.matmul(h, w2).astype(F32)))

    return jax.jit(jax.grad(wrap(loss), argnums=(0, 1)))


@pytest.mark.skipif(not CPU, reason="XLA:CPU's dot lowerings")
@pytest.mark.parametrize("variant", ["heddle.numpy", "autocast"])
def test_mlp_backward_dots_take_the_library_path_at_least_as_often_as_jax_numpy(variant):
    x, w1, w2 = _operands((256, 64), (64, 128), (128, 10))
    ours = _mlp_grad(hnp) if variant == "heddle.numpy" else _mlp_grad(jnp, heddle.autocast)
    texts = [f.lower(w1, w2, x).compile().as_text() for f in (ours, _mlp_grad(jnp))]
    (h_lib, h_plain), (j_lib, j_plain) = map(_library_dots, texts)
    assert h_lib >= j_lib and h_plain <= j_plain


@pytest.mark.skipif(not CPU, reason="XLA:CPU's dot lowerings")
@pytest.mark.parametrize("vmapped", [True, False], ids=["vmapped", "3-D lhs"])
@pytest.mark.parametrize("variant", ["heddle.numpy", "autocast"])
def test_linear_layer_backward_dots_take_the_library_path_like_jax_numpy(vmapped, variant):
    """A Linear layer on [batch, tokens, features] (under vmap or not) times an unbatched weight:
    the weight gradient is no plain dot with both operands transposed (XLA:CPU's slow loop) where
    jax.numpy's gets the library path; and the values are the float32-accumulated ones."""
    x, w = _operands((32, 32, 64), (64, 256))

    def loss(xp, w, x):
        y = jax.vmap(lambda xi: xp.matmul(xi, w))(x) if vmapped else xp.matmul(x, w)
        return jnp.sum(jnp.tanh(y.astype(F32)))

    ours = (
        (lambda w, x: loss(hnp, w, x))
        if variant == "heddle.numpy"
        else heddle.autocast(lambda w, x: loss(jnp, w, x))
    )
    steps = [jax.jit(jax.grad(f, argnums=(0, 1))) for f in (ours, lambda w, x: loss(jnp, w, x))]
    texts = [s.lower(w, x).compile().as_text() for s in steps]
    (h_lib, _), (j_lib, _) = map(_library_dots, texts)
    assert h_lib >= j_lib
    assert not re.search(
        r" dot\([^\n]*lhs_contracting_dims=\{0\}, rhs_contracting_dims=\{1\}", texts[0]
    )
    y = jax.jit(
        lambda w, x: jax.vmap(lambda xi: hnp.matmul(xi, w))(x) if vmapped else hnp.matmul(x, w)
    )(w, x)
    _within_float32_accumulation(y, x, w, lambda a, b: a @ b)


@pytest.mark.skipif(not CPU, reason="XLA:CPU's dot lowerings")
@pytest.mark.parametrize(("k", "n"), [(4096, 64), (64, 512)], ids=["tall weight", "wide weight"])
def test_a_tall_weight_enters_transposed_only_when_differentiated(k, n):
    """x @ W with W [k, n], k > n: under jax.grad the weight enters the dot transposed (its gradient
    is then XLA:CPU's faster [n, k] dot), in a forward pass alone as it is (no float32 copies); a
    wide weight always as it is. Values: the float32-accumulated ones either way."""
    x, w = _operands((64, k), (k, n))

    def rhs_of_dot(jaxpr) -> str:
        eqns = jaxpr.eqns
        dot = next(e for e in eqns if e.primitive.name == "dot_general")
        producer = {o: e for e in eqns for o in e.outvars}.get(dot.invars[1])
        return producer.primitive.name if producer is not None else "argument"

    fwd = jax.make_jaxpr(hnp.matmul)(x, w).jaxpr
    assert rhs_of_dot(fwd) == "argument"

    def loss(w, x):
        return jnp.sum(jnp.square(hnp.matmul(x, w).astype(F32)))

    bwd = jax.make_jaxpr(jax.grad(loss))(w, x).jaxpr
    assert rhs_of_dot(bwd) == ("transpose" if k > n else "argument")
    _within_float32_accumulation(jax.jit(hnp.matmul)(x, w), x, w, lambda a, b: a @ b)
    g = jax.jit(jax.grad(loss))(w, x)
    assert g.dtype == ml_dtypes.bfloat16 and g.shape == (k, n)
    # d/dW sum(y_bf16**2) = x.T @ (2 y_bf16): float32 sums of exact products, one rounding
    y16 = np.asarray(jax.jit(hnp.matmul)(x, w), np.float64)
    want = np.asarray(x, np.float64).T @ (2 * y16)
    bound = (
        64 * 2.0**-24 * (np.abs(np.asarray(x, np.float64)).T @ np.abs(2 * y16))
        + np.abs(want) * 2.0**-8
    )
    assert (np.abs(np.asarray(g, np.float64) - want) <= bound).all()


@pytest.mark.parametrize(
    "f",
    [
        lambda a, b: hnp.matmul(a, b),
        lambda a, b: hnp.einsum("ij,jk->ik", a, b),
        lambda a, b: hlax.dot_general(a, b, (((1,), (0,)), ((), ()))),
    ],
    ids=["matmul", "einsum", "lax.dot_general"],
)
def test_sub_byte_float_contractions_widen_on_every_backend(transform, f):
    """float4_e2m1fn has no dot kernel on any backend: its operands are widened exactly to float32
    (as sub-byte integers to int32), and the float32 sum of exact products is rounded once."""
    f4 = ml_dtypes.float4_e2m1fn
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 32)).astype(f4)
    b = rng.standard_normal((32, 8)).astype(f4)
    got = transform(f)(a, b)
    assert got.dtype == f4
    # the products and their sums are exact in float32 here (few bits); one rounding to float4
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert (
        np.asarray(got).view(np.uint8) == exact.astype(np.float32).astype(f4).view(np.uint8)
    ).all()


# ---- under jax.vmap: the batched dot decides --------------------------------------------------


def _spec(la: int, lb: int) -> str:
    a, b = "ab", "cd"
    b = b.replace(b[lb], a[la])
    out = "".join(c for c in a + b if (a + b).count(c) == 1)
    return f"{a},{b}->{out}"


VMAPPED = {
    "tensordot": lambda la, lb: lambda x, y: hnp.tensordot(x, y, ([la], [lb])),
    "einsum": lambda la, lb: lambda x, y: hnp.einsum(_spec(la, lb), x, y),
    "lax.dot_general": lambda la, lb: (
        lambda x, y: hlax.dot_general(x, y, (((la,), (lb,)), ((), ())))
    ),
    "autocast einsum": lambda la, lb: heddle.autocast(lambda x, y: jnp.einsum(_spec(la, lb), x, y)),
    "autocast tensordot": lambda la, lb: heddle.autocast(
        lambda x, y: jnp.tensordot(x, y, ([la], [lb]))
    ),
}
IN_AXES = [(None, 0), (0, None), (0, 0), (None, 1), (1, None), (None, 2), (2, None), (2, 1)]


@pytest.mark.parametrize("name", list(VMAPPED))
def test_vmapped_narrow_contractions_run_and_accumulate_in_float32(name):
    """Every contraction of two 2-D operands under every placement of a vmapped dimension: a vmapped
    operand gains a dimension the unbatched shapes do not show, and a narrow dot XLA:CPU has no
    kernel for failed at run time (tensordot ([0], [0]) with a batched rhs, einsum "ki,kj->ij")."""
    rng = np.random.default_rng(0)
    failures = []
    for la in (0, 1):
        for lb in (0, 1):
            for axes in IN_AXES:
                ops = [rng.standard_normal((5, 5)).astype(ml_dtypes.bfloat16) for _ in range(2)]
                ops = [np.stack([o, -o, 2 * o], axis=ax) if ax is not None else o
                       for o, ax in zip(ops, axes, strict=True)]  # fmt: skip
                f = jax.jit(jax.vmap(VMAPPED[name](la, lb), in_axes=axes))
                try:
                    got = np.asarray(f(*ops), np.float64)
                except Exception as e:
                    failures.append((la, lb, axes, type(e).__name__))
                    continue
                a64, b64 = (np.asarray(o, np.float64) for o in ops)
                a64 = a64 if axes[0] is None else np.moveaxis(a64, axes[0], 0)
                b64 = b64 if axes[1] is None else np.moveaxis(b64, axes[1], 0)
                ref = np.stack([
                    np.tensordot(a64 if axes[0] is None else a64[i],
                                 b64 if axes[1] is None else b64[i], ([la], [lb]))
                    for i in range(3)
                ])  # fmt: skip
                mag = np.abs(ref) + 1
                if not (np.abs(got - ref) <= mag * 2.0**-8 + 5 * 2.0**-24 * mag).all():
                    failures.append((la, lb, axes, "value"))
    assert not failures


def test_nested_vmaps_of_a_narrow_tensordot_run():
    a = np.ones((2, 3, 16, 4), ml_dtypes.bfloat16)
    b = np.ones((16, 5), ml_dtypes.bfloat16)
    f = jax.vmap(
        jax.vmap(lambda x, y: hnp.tensordot(x, y, ([0], [0])), in_axes=(0, None)), (0, None)
    )
    out = jax.jit(f)(a, b)
    assert out.shape == (2, 3, 4, 5) and float(out[0, 0, 0, 0]) == 16.0


@pytest.mark.parametrize(
    "axes", [([3], [0]), ([1], [2]), (3, 0), (-3, 0), ([1], [0, 1]), ([1], 0), 3],
    ids=str,
)  # fmt: skip
def test_tensordot_refuses_the_axes_jax_numpy_refuses(axes):
    """Narrow operands on CPU went through heddle's own axes handling, which wrapped axis 3 of a
    2-D operand round to axis 1 and returned a result."""
    a, b = _operands((3, 4), (4, 5))
    with pytest.raises((ValueError, TypeError)) as want:
        jnp.tensordot(a.astype(np.float32), b.astype(np.float32), axes)
    with pytest.raises(type(want.value)):
        hnp.tensordot(a, b, axes)


def test_tensordot_passes_out_sharding_and_precision_on():
    a, b = _operands((4, 3), (2, 5, 4))
    mesh = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    for kw in ({"out_sharding": None}, {"precision": jax.lax.Precision.HIGHEST}):
        _within_float32_accumulation(
            hnp.tensordot(a, b, ([0], [2]), **kw), a, b, lambda x, y: np.tensordot(x, y, ([0], [2]))
        )
    with jax.set_mesh(mesh):
        out = hnp.tensordot(a, b, ([0], [2]), out_sharding=jax.P())
    assert out.shape == (3, 2, 5)
    text = jax.jit(lambda x, y: hnp.tensordot(x, y, 1, precision=jax.lax.Precision.HIGHEST))
    assert "HIGHEST" in text.lower(a.T, b[0].T).as_text()


def test_every_placement_of_batch_contracting_and_free_dims_runs():
    """lax.dot_general of two rank-3 narrow operands, every order of their batch, contracting and
    free dimensions (36 dots): XLA:CPU had no kernel for four the rule kept narrow, among them
    einsum("bcm,cbn->bmn"), and they failed at run time. Values: the float32-accumulated ones."""
    import itertools

    sizes = {"b": 2, "c": 24, "m": 5, "n": 6}
    rng = np.random.default_rng(0)
    failures = []
    for lp in itertools.permutations("bcm"):
        for rp in itertools.permutations("bcn"):
            a = rng.standard_normal([sizes[d] for d in lp]).astype(ml_dtypes.bfloat16)
            b = rng.standard_normal([sizes[d] for d in rp]).astype(ml_dtypes.bfloat16)
            dn = (((lp.index("c"),), (rp.index("c"),)), ((lp.index("b"),), (rp.index("b"),)))
            try:
                got = np.asarray(jax.jit(lambda x, y, dn=dn: hlax.dot_general(x, y, dn))(a, b))
            except Exception as e:
                failures.append(("".join(lp), "".join(rp), type(e).__name__))
                continue
            spec = f"{''.join(lp)},{''.join(rp)}->bmn"
            _within_float32_accumulation(got, a, b, lambda x, y, s=spec: np.einsum(s, x, y))
    assert not failures
