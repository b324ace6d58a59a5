"""A float64 reference for the backward pass of a narrow-float model.

The model (written against the jax.numpy API, see ``_ad_models``) runs once through ``Recording``,
which calls heddle.numpy and keeps every op's output, inside the differentiated function, so the
recorded values are exactly the forward pass the gradient under test was computed from (XLA may order
float32 partial sums differently in another computation, so a separate forward run would not do).

``replay_grad`` then runs the model in float64 with jax.numpy. Each op's float64 output is replaced
by the recorded value but keeps the float64 op's derivative (``y + stop_gradient(recorded - y)``), and
no cotangent is rounded: POLICY.md 7 keeps the cotangent of every narrow value at its gradient dtype
(float32), so the policy's backward pass differs from this float64 one only by float32 sums.
``jax.grad`` of the replay is then the policy's backward pass computed in float64.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import heddle.numpy as hnp


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


class _Replay:
    def __init__(self, values) -> None:
        self.values = list(values)
        self.i = 0

    def __getattr__(self, name: str):
        def op(*args, **kwargs):
            y = getattr(jnp, name)(*args, **kwargs)
            rec = self.values[self.i]
            self.i += 1
            return y + jax.lax.stop_gradient(jnp.asarray(rec, jnp.float64) - y)

        return op


def replay_grad(model_loss, recorded, params, x):
    """``jax.grad`` (float64) of ``model_loss(xp, params, x)`` replayed on the recorded forward."""
    with jax.enable_x64(True):
        p64 = {k: jnp.asarray(v).astype(jnp.float64) for k, v in params.items()}
        x64 = jnp.asarray(x).astype(jnp.float64)
        replay = lambda p, rec: model_loss(_Replay(rec), p, x64)
        return jax.device_get(jax.jit(jax.grad(replay))(p64, list(recorded)))
