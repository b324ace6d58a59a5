"""Gradients of a bfloat16 MLP and a one-block transformer against a float64 reference.

The models run through heddle.numpy. The reference (``_ad_reference``) is computed in float64 from
the same bfloat16 parameters and the same rounded forward pass, with no cotangent rounded: POLICY.md 7
keeps every cotangent of a narrow value in float32. heddle's
backward pass must be within a float32 accumulation bound of it; plain ``jax.grad`` on the same
forward pass (which also rounds every gradient to the parameter's dtype and adds the contributions of
several uses in that dtype) is shown beside it, outside that bound. The jitted comparisons run in a
subprocess with XLA's CPU YNN fusion off (see ``_ad_model_errors``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import _ad_model_errors as E
import _ad_reference as R
import jax.numpy as jnp
import pytest

import heddle.numpy as hnp
from heddle import autodiff

HERE = pathlib.Path(__file__).resolve().parent
BF16 = jnp.bfloat16
# Longest float32 sum in these models: 256 rows; measured 2.6e-7 in all three cases. A cotangent rounded
# to the narrow dtype anywhere shows as ~1e-4 (float16) to ~4e-3 (bfloat16).
BOUND = 2.0**-18
CASES = ["mlp-bfloat16", "mlp-float16", "transformer-bfloat16"]


@pytest.fixture(scope="module")
def errors(request):
    """The cases of ``test_gradients_against_float64_reference`` this run selected, computed in one
    subprocess (the default run leaves the longer ones to ``-m slow``)."""
    chosen = {item.name for item in request.session.items}
    cases = [c for c in CASES if f"test_gradients_against_float64_reference[{c}]" in chosen]
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE), str(HERE.parents[1]), env.get("PYTHONPATH")])
    )
    r = subprocess.run(
        [sys.executable, str(HERE / "_ad_model_errors.py"), *cases],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_gradients_against_float64_reference(errors, case):
    ours, plain = errors[case]["heddle"], errors[case]["jax"]
    dtype = case.split("-")[1]
    assert ours["dtypes"] == ["float32"] and plain["dtypes"] == [dtype]
    assert ours["value_is_last_op"] and plain["value_is_last_op"]
    assert ours["err"] <= BOUND, ours
    assert plain["err"] > 30 * BOUND, plain  # measured: bfloat16 ~2e-3 to 5e-3, float16 ~4e-4


def test_eager_gradients_against_float64_reference():
    """Eagerly (op by op, no fusion) in this process, with XLA's default flags."""
    params, x, loss, recorded = E.setup("mlp", BF16)
    (_, values), grads = autodiff.value_and_grad(recorded, has_aux=True)(params)
    assert E.rel_err(grads, R.replay_grad(loss, values, params, x)) <= BOUND


def test_value_matches_the_plain_forward_pass(transform):
    params, x, loss, _ = E.setup("mlp", BF16)
    value = transform(autodiff.value_and_grad(lambda p: loss(hnp, p, x)))(params)[0]
    assert value.tobytes() == transform(lambda p: loss(hnp, p, x))(params).tobytes()
