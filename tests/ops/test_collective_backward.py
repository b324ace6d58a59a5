"""The backward passes of heddle.lax's collective sums add cotangents in float32 (POLICY.md 5, 7).

Under ``jax.vmap`` with an ``axis_name``, ``psum``/``pmean`` over that axis is a sum over the batch:
its backward pass adds every example's cotangent, and that sum must be a float32 one, rounded once
(JAX's batching rule returns the sum unbatched and broadcasts it only after heddle's rounding, so the
transposed broadcast used to add in bfloat16: 100352 for 100000 halves, inf in float16). References
are exact: every cotangent is 1 and every count below 2**24.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _common import BF16, F16, F32, round_once  # tests/ops is on sys.path

import heddle.lax as hlax
import heddle.numpy as hnp
from heddle import autodiff

ROWS = 100_000


def _batched_loss(fn, **kwargs):
    def loss(x):
        return hnp.sum(jax.vmap(lambda r: fn(r, "i", **kwargs), axis_name="i")(x), dtype=F32)

    return loss


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize(("name", "per_row"), [("psum", ROWS), ("pmean", 1.0)])
def test_vmapped_collective_sums_its_cotangents_in_float32(transform, name, per_row, dtype):
    x = jnp.full((ROWS, 1), 0.5, dtype)
    g = transform(autodiff.grad(_batched_loss(getattr(hlax, name))))(x)
    assert g.dtype == F32
    # d/dx_k of sum_j psum(x)_j is the number of rows (pmean: 1), exactly
    assert np.array_equal(np.asarray(g), np.full((ROWS, 1), per_row, F32))


@pytest.mark.parametrize("name", ["psum", "pmean"])
def test_vmapped_collective_plain_grad_rounds_once(name):
    """Under plain jax.grad a bfloat16 leaf's cotangent is bfloat16: the float32 sum rounded once."""
    x = jnp.full((ROWS, 1), 0.5, BF16)
    g = jax.grad(_batched_loss(getattr(hlax, name)))(x)
    want = round_once(np.float64(ROWS if name == "psum" else 1.0), BF16)
    assert g.dtype == BF16
    assert np.array_equal(np.asarray(g, np.float64), np.full((ROWS, 1), want, np.float64))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_vmapped_psum_forward_is_unchanged_bit_for_bit(transform, dtype):
    """The forward value is the float32 sum rounded once, bit for bit; NaN and inf propagate."""
    rows = np.array([[0.0, 1.0, np.inf, -np.inf]] * 3 + [[np.nan, 2.0**-10, 1.0, 1.0]], np.float64)
    x = jnp.asarray(rows.astype(dtype))
    got = np.asarray(transform(jax.vmap(lambda r: hlax.psum(r, "i"), axis_name="i"))(x))
    sums = rows.sum(0)
    assert got.dtype == dtype
    assert np.isnan(got[:, 0].astype(np.float64)).all()
    want = np.broadcast_to(round_once(sums[1:], dtype), (4, 3))
    assert np.array_equal(got[:, 1:].view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("tiled", [False, True])
def test_vmapped_psum_scatter_sums_its_cotangents_in_float32(transform, tiled):
    x = jnp.full((8, 8, 2), 0.5, BF16)
    g = transform(autodiff.grad(_batched_loss(hlax.psum_scatter, tiled=tiled)))(x)
    assert g.dtype == F32
    assert np.array_equal(np.asarray(g), np.ones((8, 8, 2), F32))


@pytest.mark.slow
def test_collective_backward_on_8_devices(on_8_devices):
    """vmap inside shard_map and inside pmap: 8 devices x 12500 rows, every gradient the sum of
    100000 cotangents in float32 (pmean: of 100000 cotangents 1/100000). The shard_map and pmap
    bodies see no twins, so a narrow leaf's cotangent is rounded once to its dtype at the boundary
    (100000 -> 99840 in bfloat16, inf in float16; a narrow sum gave a float16 pmean 0.99951)."""
    r = on_8_devices(pathlib.Path(__file__).with_name("_collective_devices.py"))
    assert r.pop("devices") == [8]
    total = 8 * 12500
    for key, (dtype, value, uniform) in r.items():
        name, _, narrow = key.split("/")
        exact = np.float64(total if name == "psum" else 1.0)
        assert (dtype, uniform) == ("float32", True), key
        assert value == float(round_once(exact, BF16 if narrow == "bfloat16" else F16)), key
    assert len(r) == 8
