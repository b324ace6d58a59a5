"""The interpreter core autocast and heddle.autodiff share (``heddle/programs/_interpret.py``): one
run loop that frees every variable after its last use, one frame class whose lazy twins resolve
without recursion, one descent into inlined calls."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle
from heddle.autodiff import _twins
from heddle.policy._policy import current
from heddle.programs._evaluate import Evaluator


def _program(x):
    inner = jax.jit(lambda a: jnp.tanh(a) * a)  # an inlined body: its variables are freed too
    for i in range(6):
        x = inner(x.T * 0.5 + jnp.sin(x).T) + (i + 1.0)
    return jnp.sum(x.astype(jnp.float32)), x


def _frames():
    """Each consumer's frame and run function."""
    ev = Evaluator(current())
    return {"autocast": (ev.frame(), ev.run), "autodiff": (_twins._frame(), _twins._run)}


@pytest.mark.parametrize("consumer", ["autocast", "autodiff"])
def test_after_a_run_the_frame_holds_only_the_outputs(consumer):
    x = jnp.linspace(-2, 2, 48, dtype=jnp.bfloat16).reshape(6, 8)
    closed = jax.make_jaxpr(_program)(x)
    frame, run = _frames()[consumer]
    for v, c in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        frame.write(v, c)
    (invar,) = closed.jaxpr.invars
    frame.write(invar, x)
    run(frame, closed.jaxpr)
    outs = set(closed.jaxpr.outvars)
    for table in (frame.env, frame.pending, frame.twins, frame.pending_twins, frame.shadows):
        assert set(table) <= outs, (consumer, len(set(table) - outs))
    # and what is left computes the program's values (the twin of a narrow output: exactly it)
    loss, y = (frame.read(v) for v in closed.jaxpr.outvars)
    assert np.asarray(frame.twin(closed.jaxpr.outvars[1])).tolist() == (
        np.asarray(y).astype(np.float32).tolist()
    )
    assert np.isfinite(float(loss))


DEPTH = sys.getrecursionlimit() + 50  # longer than Python could recurse


def test_a_chain_of_copies_longer_than_the_recursion_limit_is_differentiated():
    """Each copy's twin is the same copy of its operand's twin, made lazily: asking for the last
    one resolves the whole chain with an explicit stack."""

    def f(x):
        for i in range(DEPTH):
            x = x.reshape(8, 4) if i % 2 == 0 else x.reshape(4, 8)
        return jnp.sum(x.astype(jnp.float32) ** 2)

    x = jnp.linspace(-1, 1, 32, dtype=jnp.bfloat16).reshape(4, 8)
    g = jax.grad(heddle.autocast(f))(x)
    assert g.dtype == jnp.bfloat16
    assert np.asarray(g, np.float64).tolist() == (2 * np.asarray(x, np.float64)).tolist()


@pytest.mark.slow  # about 5 s: a thousand custom derivatives traced
def test_a_chain_of_derived_twins_longer_than_the_recursion_limit_is_differentiated():
    def f(x):
        for i in range(DEPTH):
            x = x * (2.0 if i % 2 == 0 else 0.5)  # exact in bfloat16: the product is x itself
        return jnp.sum(x.astype(jnp.float32) * jnp.arange(32.0).reshape(4, 8))

    x = jnp.ones((4, 8), jnp.bfloat16)
    g = heddle.autodiff.grad(f)(x)
    assert np.asarray(g, np.float64).tolist() == np.arange(32.0).reshape(4, 8).tolist()
