"""What a first call of autocast and audit looks like: the decorator form, torch's ``with`` habit,
flax linen and equinox modules passed as they are, and outputs that are not float arrays."""

from __future__ import annotations

import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import heddle
from heddle import policy

BF16, F32 = jnp.bfloat16, jnp.float32
NA = "narrow_accumulation"


def _cumsum(x):
    return x.cumsum()


X = jnp.full(4096, 0.1, BF16)
EXACT = heddle.numpy.cumsum(X)  # heddle's own: float32 partial sums, rounded once


# ---- the decorator, and ``with`` --------------------------------------------------------------


def test_autocast_without_a_function_is_a_decorator():
    deco = heddle.autocast(precision="mixed_bfloat16")
    assert repr(deco) == "heddle.autocast(precision='mixed_bfloat16')"

    @heddle.autocast(precision="mixed_bfloat16")
    def loss(x):
        return x.cumsum()

    out = loss(X.astype(F32))
    assert out.dtype == F32  # output dtype of the precision
    assert float(out[-1]) == float(EXACT[-1])
    assert heddle.autocast()(_cumsum)(X).dtype == BF16


def test_autocast_without_a_function_checks_its_precision_at_once():
    with pytest.raises(policy.UnknownDTypeError, match="mixed_bfloat16"):
        heddle.autocast(precision="mixed_bfloat17")


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"precision": "mixed_bfloat16"}, "precision='mixed_bfloat16'"),
        ({"policy": policy.HEDDLE, "precision": "mixed_bfloat16"}, "policy="),
    ],
)
def test_with_autocast_block_and_precision_is_refused_with_the_wrapping_form(kwargs, shown):
    entered = False
    with pytest.raises(TypeError) as e:
        with heddle.autocast(**kwargs):
            entered = True
    assert not entered  # the block never ran outside the policy
    msg = str(e.value)
    assert msg.startswith(f"with heddle.autocast({shown}")
    assert "a block has neither" in msg
    assert "heddle.autocast(fn" in msg and "(*args)" in msg
    # the fix, both ways
    assert float(heddle.autocast(_cumsum, **kwargs)(X)[-1]) == float(EXACT[-1])
    assert float(heddle.autocast(**kwargs)(_cumsum)(X)[-1]) == float(EXACT[-1])


def test_with_autocast_block_runs_its_statements_under_the_policy():
    with heddle.autocast():
        out = _cumsum(X)
    assert float(out[-1]) == float(EXACT[-1])


# ---- flax linen ---------------------------------------------------------------------------------


class Summer(linen.Module):
    @linen.compact
    def __call__(self, x):
        w = self.param("w", linen.initializers.ones, (x.shape[-1],), BF16)
        return (x * w).cumsum()


def test_autocast_of_an_unbound_linen_module_is_autocast_of_its_apply():
    module = Summer()
    variables = module.init(jax.random.key(0), X)
    want = heddle.autocast(module.apply)(variables, X)
    got = heddle.autocast(module)(variables, X)
    assert got.dtype == BF16 and float(got[-1]) == float(want[-1]) == float(EXACT[-1])
    assert float(module.apply(variables, X)[-1]) != float(EXACT[-1])  # plain flax: bf16 sums
    grads = jax.grad(lambda v: heddle.autocast(module)(v, X)[-1].astype(F32))(variables)
    assert grads["params"]["w"].shape == (4096,)
    mixed = heddle.autocast(module, precision="mixed_bfloat16")(variables, X.astype(F32))
    assert mixed.dtype == F32


def test_autocast_of_a_bound_linen_module_calls_it():
    module = Summer()
    variables = module.init(jax.random.key(0), X)
    bound = module.bind(variables)
    assert float(heddle.autocast(bound)(X)[-1]) == float(EXACT[-1])


def test_audit_of_an_unbound_linen_module_audits_its_apply():
    module = Summer()
    variables = module.init(jax.random.key(0), X)
    report = heddle.audit(module, variables, X, include_backward=True)
    assert report.counts == heddle.audit(module.apply, variables, X, include_backward=True).counts
    assert report.counts[NA] >= 1
    assert "Summer" in str(report)
    assert heddle.audit(heddle.autocast(module), variables, X).counts[NA] == 0


# ---- equinox and nnx modules as the function ---------------------------------------------------


def test_autocast_of_an_equinox_module():
    model = eqx.nn.Linear(16, 4, key=jax.random.key(0))
    x = jnp.ones(16, F32)
    assert jnp.array_equal(heddle.autocast(model)(x), model(x))
    narrow = jax.tree.map(lambda a: a.astype(BF16) if eqx.is_inexact_array(a) else a, model)
    xb = x.astype(BF16)
    assert jnp.array_equal(
        heddle.autocast(narrow)(xb), heddle.autocast(lambda m, x: m(x))(narrow, xb)
    )
    assert heddle.audit(heddle.autocast(narrow), xb).counts[NA] == 0
    # precision= casts the module's own weights, as it casts every other floating input
    out = heddle.autocast(model, precision="mixed_bfloat16")(x)
    assert out.dtype == F32
    want = heddle.autocast(lambda m, x: m(x), precision="mixed_bfloat16")(model, x)
    assert jnp.array_equal(out, want)
    g = eqx.filter_grad(lambda m: heddle.autocast(m, precision="mixed_bfloat16")(x).sum())(model)
    assert g.weight.dtype == F32 and g.weight.shape == (4, 16)


def test_autocast_of_an_nnx_module_with_precision_casts_its_params():
    model = nnx.Linear(16, 4, rngs=nnx.Rngs(0))
    x = jnp.ones(16, F32)
    kernel = np.asarray(model.kernel[...])
    out = heddle.autocast(model, precision="mixed_bfloat16")(x)
    want = heddle.autocast(lambda m, x: m(x), precision="mixed_bfloat16")(model, x)
    assert out.dtype == F32 and jnp.array_equal(out, want)
    assert model.kernel[...].dtype == F32 and np.array_equal(model.kernel[...], kernel)


# ---- outputs that are not float arrays ----------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x * 2, 3),
        lambda x: (x * 2, None),
        lambda x: (x * 2, "tag"),
        lambda x: {"loss": x.sum(), "n": jnp.arange(3), "s": 2.5, "ok": True, "name": "sst2"},
        lambda x: [x.cumsum(), (x > 0).sum(), x.astype(jnp.int32)],
        lambda x: (x.cumsum(), jax.random.key(0)),
    ],
    ids=["int", "none", "str", "dict", "ints", "key"],
)
def test_audit_backward_of_outputs_that_are_not_float_arrays(fn):
    x = jnp.ones(64, BF16)
    report = heddle.audit(fn, x, include_backward=True)
    forward = heddle.audit(fn, x)
    assert report.counts[NA] >= forward.counts[NA]
    if not any(isinstance(o, str) for o in jax.tree.leaves(fn(x))):
        jax.vjp(fn, x)  # JAX's own takes the ones that are not strings


def test_audit_backward_finds_the_backward_accumulation_beside_a_python_int():
    # the shape of a train step that returns a Python int beside the loss
    def step(w, x):
        return (x @ w).sum(), 1

    w, x = jnp.ones((32, 8), BF16), jnp.ones((16, 32), BF16)
    report = heddle.audit(step, w, x, include_backward=True)
    assert any(f.backward and f.kind == NA for f in report)
