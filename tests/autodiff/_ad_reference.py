"""A float64 reference for the backward pass of a narrow-float model.

The model (written against the jax.numpy API, see ``_ad_models``) runs once through ``Recording``,
which calls heddle.numpy and keeps every op's output, inside the differentiated function, so the
recorded values are exactly the forward pass the gradient under test was computed from (XLA may order
float32 partial sums differently in another computation, so a separate forward run would not do).

``replay_grad`` then runs the model in float64 with jax.numpy. Each op's float64 output is replaced
by the recorded value but keeps the float64 op's derivative (``y + stop_gradient(recorded - y)``), and
the cotangent reaching each op's output (the sum over all its uses) is rounded once to the op's
narrow dtype, which is what POLICY.md 7 specifies: float32 sums inside an op and across uses, one
rounding per op boundary, none at a parameter. Ops that only copy values (``max``, ``min``) round
nothing. ``jax.grad`` of the replay is then the policy's backward pass computed in float64.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

import heddle.numpy as hnp

COPYING = frozenset({"max", "min"})


class Recording:
    """An ``xp`` namespace: heddle.numpy, keeping every op's output in ``values``."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __getattr__(self, name: str):
        def op(*args, **kwargs):
            out = getattr(hnp, name)(*args, **kwargs)
            self.values.append(out)
            return out

        return op


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _round_cotangent(y, dtype):
    return y


def _round_fwd(y, dtype):
    return y, None


def _round_bwd(dtype, _, ct):
    return (ct.astype(jnp.float32).astype(dtype).astype(ct.dtype),)


_round_cotangent.defvjp(_round_fwd, _round_bwd)


class _Replay:
    def __init__(self, values, *, round_cotangents: bool) -> None:
        self.values = list(values)
        self.i = 0
        self.round = round_cotangents

    def __getattr__(self, name: str):
        def op(*args, **kwargs):
            y = getattr(jnp, name)(*args, **kwargs)
            rec = self.values[self.i]
            self.i += 1
            y = y + jax.lax.stop_gradient(jnp.asarray(rec, jnp.float64) - y)
            if self.round and name not in COPYING:
                y = _round_cotangent(y, rec.dtype)
            return y

        return op


def replay_grad(model_loss, recorded, params, x):
    """``jax.grad`` (float64) of ``model_loss(xp, params, x)`` replayed on the recorded forward."""
    with jax.enable_x64(True):
        p64 = {k: jnp.asarray(v).astype(jnp.float64) for k, v in params.items()}
        x64 = jnp.asarray(x).astype(jnp.float64)
        replay = lambda p, rec: model_loss(_Replay(rec, round_cotangents=True), p, x64)
        return jax.device_get(jax.jit(jax.grad(replay))(p64, list(recorded)))
