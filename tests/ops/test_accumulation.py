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
    from heddle.ops import lowering

    monkeypatch.setattr(lowering, "widens_narrow_contractions", lambda name=None: widen)
    monkeypatch.setattr(lowering, "narrow_dot_needs_widening", lambda *_: widen)
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


# --- selections whose backward pass sums, under plain jax.grad -------------------------------------

BF16, F16 = ml_dtypes.bfloat16, np.float16


@pytest.mark.parametrize(
    "lookup",
    [
        lambda np_, t, i: np_.take(t, i, axis=0),
        lambda np_, t, i: np_.take_along_axis(t, i[:, None] * 0 + i[:, None], axis=0),
    ],
    ids=["take", "take_along_axis"],
)
def test_repeated_lookups_sum_their_cotangents_in_float32_under_jax_grad(transform, lookup):
    """10,000 lookups of one row, cotangent 1/16 each (every float32 partial sum exact: 625); JAX
    scatter-adds the cotangents in bfloat16 and stops growing at 16."""
    import jax

    table = np.zeros((3, 4), BF16)
    idx = np.zeros(10_000, np.int32)

    def grad(np_):
        loss = lambda t: (lookup(np_, t, idx).astype(np.float32) * 0.0625).sum()
        return transform(jax.grad(loss))(table)

    got = grad(hnp)
    assert got.dtype == BF16
    assert float(got[0, 0]) == _round_once(Fraction(10_000, 16), BF16) == 624.0
    assert float(grad(jnp)[0, 0]) == 16.0  # 16 + 1/16 rounds back to 16 in bfloat16
    # the forward values are jax.numpy's, bit for bit
    t = np.arange(12).reshape(3, 4).astype(BF16) / BF16(3)
    i = np.array([2, 0, 2, 1], np.int32)
    assert lookup(hnp, t, i).tobytes() == lookup(jnp, t, i).tobytes()


@pytest.mark.parametrize("name", ["max", "min", "amax", "nanmax", "nanmin"])
def test_max_and_min_count_their_ties_in_float32_under_jax_grad(transform, name):
    """257 tied maxima share the cotangent by a count: JAX counts in bfloat16 (256)."""
    import jax

    n = 257
    x = np.full(n, 1.0, BF16)
    g = transform(jax.grad(lambda v: getattr(hnp, name)(v).astype(np.float32)))(x)
    assert g.dtype == BF16 and float(g[0]) == _round_once(Fraction(1, n), BF16)
    theirs = transform(jax.grad(lambda v: getattr(jnp, name)(v).astype(np.float32)))(x)
    assert float(theirs[0]) != _round_once(Fraction(1, n), BF16)


@pytest.mark.parametrize("np_name", ["nanquantile", "quantile", "nanpercentile", "percentile"])
def test_quantile_with_a_narrow_q_counts_in_float32(transform, np_name):
    """jax.numpy's quantiles count the values in q's dtype: 257 values counted in bfloat16 are 256,
    and the maximum (q = 1) becomes the value before it."""
    x = np.r_[np.zeros(256), [1.0]].astype(BF16)
    q = BF16(100 if "percentile" in np_name else 1.0)
    got = transform(lambda v, q: getattr(hnp, np_name)(v, q))(x, q)
    assert float(getattr(np, np_name)(x.astype(np.float64), float(q))) == 1.0  # float64: the max
    assert got.dtype == BF16 and float(got) == 1.0
    assert float(transform(lambda v, q: getattr(jnp, np_name)(v, q))(x, q)) == 0.0


# --- counting ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_unweighted_histogram_counts_in_float32(transform, dtype):
    """12,000 values in 5 bins: every bin holds over 2048; JAX counts in the values' dtype and no
    bin passes 256 (bfloat16) or 2048 (float16)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 12_000).astype(dtype)
    counts, edges = transform(lambda v: hnp.histogram(v, 5))(x)
    assert counts.dtype == dtype and edges.dtype == dtype
    lo, hi = Fraction(float(x.min())), Fraction(float(x.max()))  # each edge rounded once
    assert [float(e) for e in edges] == [
        _round_once(lo + i * (hi - lo) / 5, dtype) for i in range(6)
    ]
    # float64 reference with the same edges (numpy's last bin is closed, as JAX's)
    exact, _ = np.histogram(x.astype(np.float64), np.asarray(edges, np.float64))
    assert exact.sum() == 12_000 and exact.min() > 2048
    assert [float(c) for c in counts] == [_round_once(int(e), dtype) for e in exact]
    assert set(np.asarray(jnp.histogram(x, 5)[0], np.float64)) <= {256.0, 2048.0}


WEIGHT = 0.0625  # every float32 partial sum of up to 2**24 / 16 of them is exact


@pytest.mark.parametrize(
    "call",
    [
        lambda np_, v, w: np_.histogram(v, 3, weights=w)[0][0],
        lambda np_, v, w: np_.histogram2d(v, v, 3, weights=w)[0][0, 0],
        lambda np_, v, w: np_.histogramdd(v[:, None], 3, weights=w)[0][0],
        lambda np_, v, w: np_.bincount(np.zeros(v.shape, np.int32), weights=w, length=1)[0],
    ],
    ids=["histogram", "histogram2d", "histogramdd", "bincount"],
)
def test_weighted_counts_accumulate_in_float32(transform, call):
    n = 4002
    x = np.r_[np.zeros(n - 2), [0.5, 1.0]].astype(BF16)
    w = np.full(n, WEIGHT, BF16)
    got = transform(lambda v, w: call(hnp, v, w))(x, w)
    assert got.dtype == BF16
    assert float(got) == _round_once(Fraction(n - 2, 16), BF16) == 250.0
    assert float(transform(lambda v, w: call(jnp, v, w))(x, w)) < 64  # JAX sums in bfloat16


def test_bincount_counts_and_integer_weights():
    x = np.zeros(1000, np.int32)
    got = hnp.bincount(x)
    assert got.dtype == np.int32 and int(got[0]) == 1000
    w8 = np.full(1000, 100, np.int8)
    got = hnp.bincount(x, weights=w8)
    assert got.dtype == np.int32 and int(got[0]) == 100_000  # int8 weights sum in int32


def test_index_outputs_are_int32_under_x64():
    """POLICY.md 4: index results are int32, also where JAX gives int64 under x64."""
    import jax

    with jax.enable_x64(True):
        a = jnp.asarray([3, 1, 3, 2], jnp.int64)
        values, index, inverse, counts = hnp.unique(
            a, return_index=True, return_inverse=True, return_counts=True
        )
        assert values.dtype == np.int64  # values keep their dtype
        assert [d.dtype for d in (index, inverse, counts)] == [np.int32] * 3
        assert np.array_equal(np.asarray(counts), [1, 1, 2])
        res = hnp.unique_all(a)
        assert res.values.dtype == np.int64
        assert [r.dtype for r in res[1:]] == [np.int32] * 3
        assert hnp.bincount(a).dtype == np.int32
        assert hnp.indices((2, 3)).dtype == np.int32
        assert hnp.indices((2, 3), dtype=jnp.int64).dtype == np.int64  # an explicit dtype stays
        assert [r.dtype for r in hnp.tril_indices(3)] == [np.int32] * 2
        assert [r.dtype for r in hnp.triu_indices_from(jnp.zeros((3, 3)))] == [np.int32] * 2
        assert [r.dtype for r in hnp.unravel_index(a, (4,))] == [np.int32]
        # JAX's own answers, for contrast
        assert jnp.bincount(a).dtype == np.int64 and jnp.indices((2, 3)).dtype == np.int64


@pytest.mark.parametrize("mode", ["edge", "maximum", "mean"])
def test_pad_modes_that_repeat_a_value_sum_its_cotangents_in_float32(transform, mode):
    """pad(x, 2048, mode) of one value repeats it 4097 times; its gradient (cotangent 1/16 each) is
    4097/16 = 256.0625, rounded once: 256. JAX's backward pass sums in a bfloat16 reduce (XLA:CPU
    happens to widen that reduce, so on CPU the difference shows in the program, not the value)."""
    import jax
    from test_sweep import narrow_accumulations  # tests/ops is on sys.path

    x = np.array([1.0], BF16)

    def grad(np_):
        loss = lambda v: (np_.pad(v, 2048, mode=mode).astype(np.float32) * 0.0625).sum()
        return jax.grad(loss)

    got = transform(grad(hnp))(x)
    assert got.dtype == BF16 and float(got[0]) == _round_once(Fraction(4097, 16), BF16) == 256.0
    assert narrow_accumulations(jax.make_jaxpr(grad(hnp))(x).jaxpr) == set()
    assert narrow_accumulations(jax.make_jaxpr(grad(jnp))(x).jaxpr) == {"reduce_sum"}
    v = np.arange(6).astype(BF16) / BF16(3)
    assert hnp.pad(v, 3, mode=mode).tobytes() == jnp.pad(v, 3, mode=mode).tobytes()


@pytest.mark.parametrize("method", ["nearest", "lower", "higher", "linear"])
def test_a_python_q_is_used_unrounded(transform, method):
    """q is a hyper-parameter, used at float32 as JAX uses it: rounded to bfloat16, 0.3 would be
    0.30078125, and ``method="nearest"`` picked another order statistic in 32 of 32 columns."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 32)).astype(BF16)
    got = transform(lambda v: hnp.quantile(v, 0.3, axis=0, method=method))(x)
    assert got.dtype == BF16
    exact = np.quantile(x.astype(np.float64), 0.3, axis=0, method=method)
    if method == "linear":  # one float32 interpolation, rounded once: within one bfloat16 ulp
        err = np.abs(np.asarray(got, np.float64) - exact)
        assert np.all(err <= 2.0**-7 * np.abs(exact) + 1e-30)
    else:  # an order statistic: one of the values, exactly
        np.testing.assert_array_equal(np.asarray(got, np.float64), exact)
    assert float(transform(lambda v: hnp.percentile(v, 30.0))(x.ravel())) == pytest.approx(
        float(np.percentile(x.astype(np.float64).ravel(), 30.0)), rel=2.0**-8
    )
