"""autocast frees each intermediate after its last use (as ``jax.core.eval_jaxpr`` does): an eager
call holds about as many arrays at once as the plain program, not one (and its float32 versions)
per statement until it returns. ``benchmarks/autocast_eager.py`` measures the memory and time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle

SHAPE = (64, 1024)  # no other array of the test session has this shape


def _program(seen: list[int]):
    def probe(_):
        seen.append(sum(1 for a in jax.live_arrays() if a.shape == SHAPE))

    def f(x):
        for i in range(40):  # 40 statements, 3 arrays each (and float32 versions under autocast)
            x = x * 0.999 + jnp.sin(x) * (1.0 / (i + 2))
        jax.debug.callback(probe, x[0, 0])
        return jnp.sum(x.astype(jnp.float32))

    return f


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_an_eager_call_holds_few_intermediates_at_once(dtype):
    x = jnp.ones(SHAPE, dtype)
    plain: list[int] = []
    jax.block_until_ready(_program(plain)(x))
    ours: list[int] = []
    jax.block_until_ready(heddle.autocast(_program(ours))(x))
    # plain eager JAX: x, the last statement's result and a temporary; autocast adds at most the
    # float32 twin and shadow of the live ones (keeping them all would be about 480)
    assert ours[0] <= plain[0] + 4, (ours, plain)


def test_nothing_of_a_call_is_left_after_it_returns():
    x = jnp.ones(SHAPE, jnp.bfloat16)
    out = heddle.autocast(_program([]))(x)
    jax.block_until_ready(out)
    left = [a for a in jax.live_arrays() if a.shape == SHAPE and a is not x]
    assert not left, len(left)


def _constant_outputs():
    x = jnp.ones(3, jnp.bfloat16)
    return x, {
        "dict with a constant": lambda x: {"loss": jnp.sum(x), "step": jnp.asarray(1)},
        "literal output": lambda x: (x * 2, jnp.float32(3.0)),
        "jit body": lambda x: jax.jit(lambda a: (a * 2, 3.0))(x),
        "scan body": lambda x: jax.lax.scan(lambda c, xi: (c + xi, 1.0), x[0], x),
        "checkpoint body": lambda x: jax.checkpoint(lambda a: (a * 2, 2.0))(x),
    }


@pytest.mark.parametrize("name", list(_constant_outputs()[1]))
def test_a_constant_among_the_outputs_is_returned(name):
    """A jaxpr may return a literal (a constant output): it is no variable to free."""
    x, cases = _constant_outputs()
    fn = cases[name]
    for run in (heddle.autocast(fn), jax.jit(heddle.autocast(fn))):
        got, want = jax.tree.leaves(run(x)), jax.tree.leaves(jax.jit(fn)(x))
        assert [np.asarray(g).tolist() for g in got] == [np.asarray(w).tolist() for w in want]


def test_every_use_of_a_variable_shares_one_float32_twin():
    """x's twin, read first through a copy (x.T) and then by an inlined jit, is one conversion: the
    backward pass sums both uses' cotangents in float32 before the one rounding to bfloat16."""

    def f(x, w1, w2):
        a = jnp.sum(x.T.astype(jnp.float32) * w1)
        b = jax.jit(lambda t: t * t)(x)
        return a + jnp.sum(b.astype(jnp.float32) * w2)

    x = jnp.ones((8, 16), jnp.bfloat16)
    w1, w2 = jnp.ones((16, 8)), jnp.ones((8, 16))
    jaxpr = jax.make_jaxpr(heddle.autocast(f))(x, w1, w2).jaxpr
    widened = [
        e
        for e in jaxpr.eqns
        if e.primitive.name == "convert_element_type"
        and e.invars[0] is jaxpr.invars[0]
        and e.params["new_dtype"] == jnp.float32
    ]
    assert len(widened) == 1, jaxpr
