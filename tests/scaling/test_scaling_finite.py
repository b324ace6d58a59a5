"""grads_finite: exact for every float dtype of the policy, NaN-proof, one reduction per leaf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from heddle import scaling
from heddle.policy import _dtypes as D

FLOATS = [d for d in D.DTYPES if D.kind(d) == "f"]
NARROW = [d for d in FLOATS if d.itemsize == 1]  # every 8-bit format and float4_e2m1fn
WIDE16 = [np.dtype(jnp.float16), np.dtype(jnp.bfloat16)]


def every_bit_pattern(d: np.dtype) -> np.ndarray:
    n = 2 ** (4 if d == np.dtype(ml_dtypes.float4_e2m1fn) else 8 * d.itemsize)
    return np.arange(n, dtype=np.uint8 if d.itemsize == 1 else np.uint16).view(d)


def test_the_sweep_covers_the_formats_without_inf_or_nan():
    names = {d.name for d in NARROW}
    assert {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"} <= names
    assert "float4_e2m1fn" in names and len(NARROW) >= 9


@pytest.mark.parametrize("d", NARROW + WIDE16, ids=str)
def test_every_bit_pattern_against_numpy(d, transform):
    """Each element alone (vmap) and the whole array, against ml_dtypes/NumPy's isfinite."""
    x = every_bit_pattern(d)
    with np.errstate(invalid="ignore"):
        ref = np.isfinite(x)
    got = np.asarray(transform(jax.vmap(scaling.grads_finite))(jnp.asarray(x)))
    np.testing.assert_array_equal(got, ref)
    assert bool(transform(scaling.grads_finite)(jnp.asarray(x))) == bool(ref.all())
    assert bool(transform(scaling.grads_finite)(jnp.asarray(x[ref]))) is True


def test_a_finite_e8m0_leaf_is_finite():
    x = jnp.asarray(np.array([1.0, 2.0**-127, 2.0**127], ml_dtypes.float8_e8m0fnu))
    assert bool(scaling.grads_finite({"w": x})) is True
    assert bool(scaling.grads_finite({"w": x.at[1].set(jnp.nan)})) is False


SPECIAL = [np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("d", ["float32", "float64"])
def test_float32_and_float64_special_values(d, transform):
    dt = np.dtype(d)
    fi = np.finfo(dt)
    finite = np.array([0.0, -0.0, fi.max, -fi.max, fi.tiny, fi.smallest_subnormal, 1.0], dt)
    with jax.enable_x64(d == "float64"):
        assert bool(transform(scaling.grads_finite)(jnp.asarray(finite))) is True
        for bad in SPECIAL:
            for i in range(len(finite)):
                x = finite.copy()
                x[i] = bad
                assert bool(transform(scaling.grads_finite)(jnp.asarray(x))) is False, (bad, i)


@pytest.mark.parametrize("d", ["complex64", "complex128"])
def test_complex_leaves_are_finite_when_both_parts_are(d, transform):
    """abs(3e38+3e38j) overflows float32; the parts are finite, so the leaf is."""
    big = float(np.finfo(np.float32).max) * 0.9
    with jax.enable_x64(d == "complex128"):
        z = np.array([complex(big, big), complex(-big, big), 1j], d)
        assert bool(transform(scaling.grads_finite)(jnp.asarray(z))) is True
        for bad in SPECIAL:
            for part in (complex(bad, 0.0), complex(0.0, bad)):
                w = z.copy()
                w[1] = part
                ref = bool(np.isfinite(w).all())
                assert ref is False
                assert bool(transform(scaling.grads_finite)(jnp.asarray(w))) is ref


def test_python_leaves_and_ignored_leaves():
    assert bool(scaling.grads_finite([1.0, 3e38 + 3e38j, 7, True, jnp.int8(3)])) is True
    assert bool(scaling.grads_finite([1.0, float("nan")])) is False
    assert bool(scaling.grads_finite([complex(1.0, float("inf"))])) is False
    assert bool(scaling.grads_finite({})) is True


def test_one_reduction_per_leaf_and_no_host_sync():
    tree = {
        "a": jnp.ones((4, 3), jnp.float16),
        "b": jnp.ones(5, jnp.bfloat16),
        "c": jnp.ones(2, jnp.complex64),
        "n": jnp.arange(3),
    }
    prims = [e.primitive.name for e in jax.make_jaxpr(scaling.grads_finite)(tree).jaxpr.eqns]
    assert (
        prims.count("reduce_and") == 4
    )  # one per floating leaf (none for the int), one over the flags
    assert not [p for p in prims if "callback" in p or p in ("device_put", "io_callback")]
    hlo = jax.jit(scaling.grads_finite).lower(tree).compile().as_text()
    for op in ("outfeed(", "infeed(", " send(", " recv(", "custom-call("):  # transfers, callbacks
        assert op not in hlo, op
