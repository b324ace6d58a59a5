"""autocast frees each intermediate after its last use (as ``jax.core.eval_jaxpr`` does): an eager
call holds about as many arrays at once as the plain program, not one (and its float32 versions)
per statement until it returns. ``benchmarks/autocast_eager.py`` measures the memory and time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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
