"""Every contraction primitive keeps float32 cotangents for its narrow operands (POLICY.md 7).

A contraction of narrow operands into a float32 result (``preferred_element_type=float32``: a
``dot_general``, a convolution, a ragged dot) is where a narrow model's values meet its float32
residual stream; JAX's transpose rules round the cotangents of its operands to their narrow dtype.
The sweep below has one case per contraction primitive of the table (a new one fails
``test_every_contraction_primitive_has_a_case``), differentiated with heddle.autodiff, with and
without ``heddle.autocast`` (autocast also as it runs on GPU, where narrow operands are not widened),
eagerly and jitted. References: float64 arithmetic on the rounded operands, and scale equivariance:
a loss scaled by ``2**-40`` has exactly the scaled float32 gradient, which float16 cotangents flush.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import heddle
import heddle.programs._evaluate as evaluate
from heddle import autodiff
from heddle.programs._table import Rule, names

F16, BF16, F32, F64 = jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64
TINY = 2.0**-40  # the cotangents of the loss times TINY are below float16's smallest subnormal


def _dot(a, b, acc):
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=acc)


def _conv(a, b, acc):
    return lax.conv_general_dilated(a, b, (1, 1), "SAME", preferred_element_type=acc)


def _ragged(a, b, acc):
    return lax.ragged_dot(a, b, jnp.array([3, 5, 4], jnp.int32), preferred_element_type=acc)


def _convolve(a, b, acc):
    return jnp.convolve(a, b, preferred_element_type=acc)


# primitive -> (contraction, lhs shape, rhs shape); jnp.convolve is a second conv_general_dilated
CASES = {
    "dot_general": (_dot, (6, 8), (8, 5)),
    "conv_general_dilated": (_conv, (2, 3, 6, 6), (4, 3, 3, 3)),
    "ragged_dot_general": (_ragged, (12, 8), (3, 8, 5)),
}
EXTRA = {"convolve": (_convolve, (16,), (5,))}
ALL = {**CASES, **EXTRA}


def test_every_contraction_primitive_has_a_case():
    assert set(CASES) == set(names(Rule.CONTRACTION))


def _loss(contraction, dtype, scale=1.0):
    def loss(a, b):  # float32 leaves, narrow operands, a float32 result
        y = contraction(a.astype(dtype), b.astype(dtype), F32)
        return jnp.sum(jnp.tanh(y)) * scale

    return loss


def _operands(case, dtype):
    _, sa, sb = ALL[case]
    ka, kb = jax.random.split(jax.random.key(sum(sa) + sum(sb)))
    a = jax.random.normal(ka, sa, F32)
    b = jax.random.normal(kb, sb, F32)
    return a.astype(dtype).astype(F32), b.astype(dtype).astype(F32)  # narrow values, held exactly


def _reference(case, a, b):
    """The gradient in float64 of the same loss on the same (rounded) operand values."""
    contraction = ALL[case][0]
    with jax.enable_x64(True):
        loss = lambda a, b: jnp.sum(jnp.tanh(contraction(a, b, F64)))
        g = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a, F64), jnp.asarray(b, F64))
        return [np.asarray(x) for x in g]


@pytest.fixture(params=["plain", "autocast", "autocast-narrow"])
def wrap(request, monkeypatch):
    """The loss as written, under autocast, and under autocast binding narrow contractions as it
    does on GPU (XLA:CPU otherwise has autocast widen their operands)."""
    if request.param == "plain":
        return lambda f: f
    if request.param == "autocast-narrow":
        monkeypatch.setattr(evaluate, "widens_narrow_contractions", lambda name=None: False)
    return heddle.autocast


@pytest.mark.parametrize("case", list(ALL))
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_contraction_gradients_match_float64(case, dtype, wrap, transform):
    a, b = _operands(case, dtype)
    grad = transform(autodiff.grad(wrap(_loss(ALL[case][0], dtype)), argnums=(0, 1)))
    got = grad(a, b)
    for g, r in zip(got, _reference(case, a, b), strict=True):
        assert g.dtype == F32
        # float32 cotangents: float32 rounding; narrow ones are off by 2**-9 (bf16), 2**-12 (f16)
        err = np.max(np.abs(np.asarray(g, np.float64) - r)) / np.max(np.abs(r))
        assert err < 2e-6, err


@pytest.mark.parametrize("case", list(ALL))
def test_a_tiny_float16_loss_has_exactly_the_scaled_gradient(case, wrap, transform):
    a, b = _operands(case, F16)
    contraction = ALL[case][0]
    plain = transform(autodiff.grad(wrap(_loss(contraction, F16)), argnums=(0, 1)))(a, b)
    tiny = transform(autodiff.grad(wrap(_loss(contraction, F16, TINY)), argnums=(0, 1)))(a, b)
    for g, t in zip(plain, tiny, strict=True):
        assert np.all(np.asarray(g) != 0)
        np.testing.assert_array_equal(np.asarray(t) / TINY, np.asarray(g))
