"""The flax recipe of docs/mixed-precision.md, and ``Precision``'s casts over flax's pytrees.

The recipe block (under ``<!-- optional-recipe: flax -->``) runs after the page's setup block, as a
reader would run them; its two trainings (2000 steps of a 64-128-10 linen MLP on scikit-learn's
digits, float32 and mixed_bfloat16) run once per module. Skipped when flax is not installed.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import autodiff, policy
from heddle.policy import Precision

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "mixed-precision.md"
F32, BF16, F64 = np.dtype("float32"), np.dtype(ml_dtypes.bfloat16), np.dtype("float64")
MIXED = Precision.parse("mixed_bfloat16")


def block(marker: str) -> str:
    text = DOC.read_text()
    found = re.findall(rf"<!-- {marker} -->\n```python\n(.*?)```", text, re.S)
    assert len(found) == 1, marker
    return found[0]


def shown(marker: str) -> str:
    """What the page shows the block under ``marker`` printing."""
    text = DOC.read_text()
    pattern = rf"<!-- {marker} -->\n```python\n.*?```\n\nprints\n\n```text\n(.*?)```"
    found = re.findall(pattern, text, re.S)
    assert len(found) == 1, marker
    return found[0]


@pytest.fixture(scope="module")
def runs():
    """Executes the setup and the flax recipe once, and trains the float32 baseline."""
    with jax.numpy_dtype_promotion("strict"):
        ns: dict = {}
        exec(compile(block("recipe: setup"), f"{DOC}:setup", "exec"), ns)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block("optional-recipe: flax"), f"{DOC}:flax", "exec"), ns)
        return {
            "ns": ns,
            "printed": out.getvalue(),
            "mixed_bfloat16": (ns["params"], ns["opt_state"], ns["acc"]),
            "float32": ns["train_flax"]("float32"),
        }


def dtypes(tree) -> set[np.dtype]:
    return {np.dtype(x.dtype) for x in jax.tree.leaves(tree) if hasattr(x, "dtype")}


def float_dtypes(tree) -> set[np.dtype]:
    return {d for d in dtypes(tree) if d.kind == "f" or d == BF16}


# ---- the recipe --------------------------------------------------------------------------------


@pytest.mark.slow
def test_float32_baseline_learns(runs):
    params, opt_state, acc = runs["float32"]
    assert dtypes(params) == {F32} and float_dtypes(opt_state) == {F32}
    assert acc > 93.0  # 10 classes: chance is 10%


def test_bfloat16_compute_with_float32_masters_matches_float32(runs):
    params, opt_state, acc = runs["mixed_bfloat16"]
    assert isinstance(params, dict) and set(params) == {"Dense_0", "Dense_1"}
    assert dtypes(params) == {F32}  # every kernel and bias: the float32 masters
    assert float_dtypes(opt_state) == {F32}  # the momentum
    assert abs(acc - runs["float32"][2]) <= 0.5


def test_the_recipe_prints_what_the_page_shows(runs, prints_as_shown):
    prints_as_shown(runs["printed"], shown("optional-recipe: flax"))


def test_documented_numbers_are_the_measured_ones(runs):
    text = DOC.read_text()
    table = text.split("<!-- flax numbers: begin -->")[1].split("<!-- flax numbers: end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].split("`")[1]] = float(cells[-1])
    assert set(rows) == {"float32", "mixed_bfloat16"}
    for name, documented in rows.items():
        assert abs(documented - runs[name][2]) <= 0.5, name  # other CPUs may differ by a sample


def _walk(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside its equations."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in p if isinstance(p, tuple | list) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _walk(inner)


def test_gradients_float32_and_activations_bfloat16(runs):
    ns = runs["ns"]
    x, y = next(ns["batches"](1, seed=1))
    params = ns["flax_model"](MIXED).init(jax.random.key(1), x[:1])["params"]
    assert dtypes(params) == {F32}
    with jax.numpy_dtype_promotion("strict"):
        loss, grads = jax.jit(autodiff.value_and_grad(ns["flax_loss"]), static_argnums=3)(
            params, x, y, MIXED
        )
        # the reference: plain jax.grad of the same model in float32 throughout
        ref = jax.jit(jax.grad(ns["flax_loss"]), static_argnums=3)(
            params, x, y, Precision.parse("float32")
        )
        jaxpr = jax.make_jaxpr(ns["flax_loss"], static_argnums=3)(params, x, y, MIXED)
        _, inter = ns["flax_model"](MIXED).apply(
            {"params": MIXED.cast_to_compute(params)},
            MIXED.cast_to_compute(x),
            capture_intermediates=True,
            mutable=["intermediates"],
        )
    assert np.dtype(loss.dtype) == F32
    assert jax.tree.structure(grads) == jax.tree.structure(params) and dtypes(grads) == {F32}
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
        err = np.linalg.norm(np.asarray(g) - np.asarray(r)) / np.linalg.norm(np.asarray(r))
        assert 0 < err < 0.05  # the bfloat16 forward pass: close to float32, not equal
    # inside the model: both layers' outputs, both matmuls and the ReLU are bfloat16
    layers = inter["intermediates"]
    for name in ("Dense_0", "Dense_1"):
        assert np.dtype(layers[name]["__call__"][0].dtype) == BF16, name
    eqns = list(_walk(jaxpr.jaxpr))
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    relus = [e for e in eqns if e.primitive.name == "jit" and e.params.get("name") == "relu"]
    assert len(dots) == 2 and relus
    for e in dots + relus:
        assert {np.dtype(v.aval.dtype) for v in [*e.invars, *e.outvars]} == {BF16}, e


# ---- the casts over flax pytrees ------------------------------------------------------------------


class _Counted(nn.Module):
    """A Dense layer and an int32 counter in a second collection."""

    dtype: object = jnp.float32
    param_dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x):
        seen = self.variable("counters", "seen", lambda: jnp.asarray(7, jnp.int32))
        seen.value = seen.value + x.shape[0]
        return nn.Dense(3, dtype=self.dtype, param_dtype=self.param_dtype)(x)


def test_casts_over_linen_variables(transform):
    model = _Counted(dtype=jnp.bfloat16)
    variables = model.init(jax.random.key(0), jnp.ones((1, 4)))
    kernel = np.asarray(variables["params"]["Dense_0"]["kernel"])
    seen0 = variables["counters"]["seen"]
    assert kernel.dtype == F32 and np.dtype(seen0.dtype) == np.int32
    out = transform(MIXED.cast_to_compute)(variables)
    assert jax.tree.structure(out) == jax.tree.structure(variables)
    assert dtypes(out["params"]) == {BF16}
    seen = out["counters"]["seen"]
    assert np.dtype(seen.dtype) == np.int32 and int(seen) == int(seen0)  # int leaves untouched
    # float32 -> bfloat16 is one rounding, which ml_dtypes' conversion also does
    got = np.asarray(out["params"]["Dense_0"]["kernel"])
    np.testing.assert_array_equal(got.view(np.uint16), kernel.astype(BF16).view(np.uint16))
    back = transform(MIXED.cast_to_param)(out)
    assert dtypes(back["params"]) == {F32} and np.dtype(back["counters"]["seen"].dtype) == np.int32
    np.testing.assert_array_equal(
        np.asarray(back["params"]["Dense_0"]["kernel"]), got.astype(np.float32)
    )
    assert dtypes(policy.cast_to_output(out, "mixed_bfloat16")["params"]) == {F32}
    # the cast variables run the model: it computes in bfloat16 and updates the int counter
    y, state = model.apply(out, jnp.ones((2, 4), jnp.bfloat16), mutable=["counters"])
    assert np.dtype(y.dtype) == BF16 and int(state["counters"]["seen"]) == int(seen0) + 2
    # one-hot rows read the kernel back: flax's own float32 -> bfloat16 cast rounds once too
    eye = jnp.eye(4, dtype=jnp.bfloat16)
    for tree in (out, variables):
        y, _ = model.apply(tree, eye, mutable=["counters"])
        np.testing.assert_array_equal(np.asarray(y).view(np.uint16), got.view(np.uint16))


class _NnxNet(nnx.Module):
    def __init__(self, rngs, dropout=False):
        self.linear = nnx.Linear(4, 3, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=rngs)
        self.steps = nnx.Variable(jnp.asarray(5, jnp.int32))
        self.dropout = nnx.Dropout(0.5, rngs=rngs) if dropout else None

    def __call__(self, x):
        return self.linear(x)


def test_casts_over_nnx_state(transform):
    graphdef, state = nnx.split(_NnxNet(nnx.Rngs(0)))
    kernel = np.asarray(state["linear"]["kernel"].get_value())
    out = transform(MIXED.cast_to_compute)(state)
    assert isinstance(out, nnx.State)
    assert jax.tree.structure(out) == jax.tree.structure(state)
    assert np.dtype(out["linear"]["kernel"].get_value().dtype) == BF16
    assert np.dtype(out["linear"]["bias"].get_value().dtype) == BF16
    steps = out["steps"].get_value()
    assert np.dtype(steps.dtype) == np.int32 and int(steps) == 5  # int leaves untouched
    got = np.asarray(out["linear"]["kernel"].get_value())
    np.testing.assert_array_equal(got.view(np.uint16), kernel.astype(BF16).view(np.uint16))
    model = nnx.merge(graphdef, out)
    assert np.dtype(model(jnp.ones((2, 4), jnp.bfloat16)).dtype) == BF16
    back = transform(MIXED.cast_to_param)(out)
    assert float_dtypes(back) == {F32}


def test_casts_over_nnx_params_split_from_a_module_with_rngs(transform):
    graphdef, params, rest = nnx.split(_NnxNet(nnx.Rngs(0), dropout=True), nnx.Param, ...)
    out = transform(MIXED.cast_to_compute)(params)
    assert isinstance(out, nnx.State) and dtypes(out) == {BF16}
    assert dtypes(nnx.merge(graphdef, out, rest).linear.kernel.get_value()) == {BF16}


def test_casts_over_nnx_state_with_rng_keys():
    _, state = nnx.split(_NnxNet(nnx.Rngs(0), dropout=True))
    out = MIXED.cast_to_compute(state)
    assert dtypes(out["linear"]) == {BF16}
    keys = [
        x for x in jax.tree.leaves(state) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    ]
    kept = [x for x in jax.tree.leaves(out) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]
    assert keys and len(kept) == len(keys)
    for a, b in zip(keys, kept, strict=True):  # untouched: same key data
        assert np.array_equal(jax.random.key_data(a), jax.random.key_data(b))


# ---- float64 masters: one rounding -----------------------------------------------------------------


def _round_to_bfloat16(v: float) -> float:
    """``v`` (a normal bfloat16 magnitude) rounded once to bfloat16, ties to even, in Fractions."""
    x = Fraction(v)
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    ulp = Fraction(2) ** (e - 7)  # 8 significant bits
    q, r = divmod(x, ulp)
    if r > ulp / 2 or (r == ulp / 2 and q % 2 == 1):
        q += 1
    return sign * float(q * ulp)


TINY = 2.0**-30
HALFWAY = [
    1 + 2**-8 + TINY,  # just above the tie between 1 and 1 + 2**-7: up, to 1.0078125
    1 + 2**-8,  # the tie itself: to even, 1.0
    1 + 3 * 2**-8 - TINY,  # just below a tie: down, to 1.0078125
    1 + 3 * 2**-8,  # a tie: to even, 1.015625
    0.75 + 2**-9 + TINY,  # just above a tie: up, to 0.75 + 2**-8
    -(1 + 2**-8 + TINY),
]


def test_round_reference():
    assert _round_to_bfloat16(1 + 2**-8 + TINY) == 1 + 2**-7
    assert _round_to_bfloat16(1 + 2**-8) == 1.0
    assert _round_to_bfloat16(1 + 3 * 2**-8) == 1 + 2**-6
    assert _round_to_bfloat16(-(0.75 + 2**-9 + TINY)) == -(0.75 + 2**-8)
    assert _round_to_bfloat16(0.75 + 2**-9) == 0.75  # a tie: to even


def test_float64_linen_masters_round_once_like_heddle_astype(transform):
    with jax.enable_x64(True), jax.numpy_dtype_promotion("strict"):
        model = _Counted(dtype=jnp.bfloat16, param_dtype=jnp.float64)
        variables = model.init(jax.random.key(0), jnp.ones((1, len(HALFWAY)), jnp.float64))
        kernel = np.tile(np.asarray(HALFWAY, np.float64)[:, None], (1, 3))
        variables["params"]["Dense_0"]["kernel"] = jnp.asarray(kernel)
        assert dtypes(variables["params"]) == {F64}
        prec = Precision("float64", "bfloat16", "float64")
        out = transform(prec.cast_to_compute)(variables)
        got = out["params"]["Dense_0"]["kernel"]
        assert np.dtype(got.dtype) == BF16
        assert np.dtype(out["counters"]["seen"].dtype) == np.int32
        ref = np.asarray([[_round_to_bfloat16(v)] * 3 for v in HALFWAY])
        np.testing.assert_array_equal(np.asarray(got, np.float64), ref)
        astype = jax.jit(hnp.astype, static_argnums=1)(jnp.asarray(kernel), BF16)
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16),
                                      np.asarray(astype).view(np.uint16))  # fmt: skip
        # the values do discriminate: through float32, 1 + 2**-8 + TINY rounds twice, to 1.0
        twice = kernel.astype(np.float32).astype(BF16).astype(np.float64)
        assert np.any(twice != ref)
        # flax uses the cast kernel as it is: one-hot rows read it back exactly
        eye = jnp.eye(len(HALFWAY), dtype=jnp.bfloat16)
        y, _ = model.apply(out, eye, mutable=["counters"])
        np.testing.assert_array_equal(np.asarray(y, np.float64), ref)
        if jax.default_backend() == "cpu":  # what the page says of flax's own cast on CPU
            y_flax, _ = model.apply(variables, eye, mutable=["counters"])
            assert float(y_flax[0, 0]) == 1.0 and float(y[0, 0]) == 1 + 2**-7
