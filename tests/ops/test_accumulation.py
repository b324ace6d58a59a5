"""The classic accumulations, with plain jax.numpy beside heddle as the contrast (POLICY.md 5)."""

from __future__ import annotations

from fractions import Fraction

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp

N = 100_000


def _round_once(value: Fraction | float, dtype) -> float:
    """``value`` rounded once to ``dtype``: exact neighbours from the format's own values."""
    with np.errstate(invalid="ignore"):
        values = np.arange(2**16, dtype=np.uint16).view(dtype).astype(np.float64)
    values = np.unique(values[np.isfinite(values)])
    i = np.searchsorted(values, float(value))
    lo, hi = values[i - 1], values[i]
    dlo, dhi = abs(Fraction(value) - Fraction(lo)), abs(Fraction(hi) - Fraction(value))
    if dlo != dhi:
        return lo if dlo < dhi else hi
    lo_bits = np.asarray(lo, dtype).view(np.uint16)
    return lo if int(lo_bits) % 2 == 0 else hi


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_sum_and_cumsum_of_100000_tenths(transform, dtype):
    x = np.full(N, 0.1, dtype)
    exact = Fraction(float(x[0])) * N  # the exact sum of the stored values
    if dtype is np.float16:
        assert exact == Fraction("9997.55859375")
    want = _round_once(exact, dtype)
    got_sum = transform(hnp.sum)(x)
    got_cum = transform(hnp.cumsum)(x)
    assert got_sum.dtype == dtype and got_cum.dtype == dtype
    assert float(got_sum) == want
    assert float(got_cum[-1]) == want
    # plain jax.numpy's cumsum accumulates in the narrow dtype and drifts away
    assert float(transform(jnp.cumsum)(x)[-1]) != want


def test_matmul_bfloat16_inner_4096(transform):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 4096)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((4096, 8)).astype(ml_dtypes.bfloat16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = transform(hnp.matmul)(a, b)
    assert got.dtype == ml_dtypes.bfloat16
    # float32 partial sums: error <= n * 2**-24 * sum|a||b|, plus one bfloat16 rounding of the result
    bound = (
        4096 * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        + np.abs(exact) * 2.0**-8
    )
    assert (np.abs(np.asarray(got, np.float64) - exact) <= bound).all()


def test_integer_sums_scans_and_contractions_widen(transform):
    x = np.full(300, 100, np.int8)
    assert transform(hnp.sum)(x).dtype == np.int32 and int(transform(hnp.sum)(x)) == 30_000
    assert int(transform(hnp.cumsum)(x)[-1]) == 30_000
    m = np.full((4, 300), 100, np.int8)
    got = transform(hnp.matmul)(m, m.T)
    assert got.dtype == np.int32 and int(got[0, 0]) == 300 * 100 * 100


@pytest.mark.parametrize("widen", [True, False], ids=["widened", "narrow operands"])
def test_both_contraction_paths_accumulate_in_float32(monkeypatch, widen):
    """Narrow contraction operands go to the dot as they are, with preferred_element_type=float32,
    or widened exactly to float32 first (tensordot and convolutions on CPU, and the dots XLA:CPU has
    no narrow kernel for). Both paths, forced here under jit (a trace never reuses an eager kernel),
    feed the dot what they say and meet the same bound."""
    import jax

    import heddle.lax as hlax
    from heddle.ops import _core

    monkeypatch.setattr(_core, "widens_narrow_contractions", lambda name=None: widen)
    monkeypatch.setattr(_core, "narrow_dot_needs_widening", lambda *_: widen)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 4096)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((4096, 8)).astype(ml_dtypes.bfloat16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = (
        4096 * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        + np.abs(exact) * 2.0**-8
    )
    operand = np.float32 if widen else ml_dtypes.bfloat16
    # fresh functions: JAX's trace caches must not hand back the other parameter's trace
    for f in (
        lambda x, y: hnp.matmul(x, y),
        lambda x, y: hlax.dot(x, y),
        lambda x, y: hnp.einsum("ij,jk->ik", x, y),
    ):
        dots = [e for e in jax.make_jaxpr(f)(a, b).jaxpr.eqns if e.primitive.name == "dot_general"]
        assert len(dots) == 1
        assert [v.aval.dtype for v in dots[0].invars] == [operand, operand]
        assert dots[0].outvars[0].aval.dtype == np.float32
        got = jax.jit(f)(a, b)
        assert got.dtype == ml_dtypes.bfloat16
        assert (np.abs(np.asarray(got, np.float64) - exact) <= bound).all()


def test_a_narrower_preferred_element_type_still_accumulates_at_the_inputs_acc_dtype():
    """POLICY.md 4: an explicit result dtype narrower than the input's accumulates in the wider of
    the two accumulation dtypes. 1 + 2**-11 + 2**-40 is just above a float16 tie: summed in float64
    it rounds up to 1 + 2**-10; summed in float32 the 2**-40 is lost and the tie rounds to 1."""
    import jax

    a = np.array([1 + 2.0**-11, 2.0**-40])
    ones = np.ones(2)
    exact = Fraction(1) + Fraction(1, 2**11) + Fraction(1, 2**40)
    want = _round_once(exact, np.float16)
    assert want == 1 + 2.0**-10
    with jax.enable_x64(True):
        a64, o64 = jnp.asarray(a), jnp.asarray(ones)
        for f in (
            lambda: hnp.dot(a64, o64, preferred_element_type=jnp.float16),
            lambda: hnp.matmul(a64, o64, preferred_element_type=jnp.float16),
            lambda: hnp.einsum("i,i", a64, o64, preferred_element_type=jnp.float16),
        ):
            got = f()
            assert got.dtype == np.float16 and float(got) == want
        i = jnp.asarray([100, 100], jnp.int64)  # 20000 in int64, then wrapped to int8
        got = hnp.dot(i, i, preferred_element_type=jnp.int8)
        assert got.dtype == np.int8 and int(got) == 20000 - 78 * 256
