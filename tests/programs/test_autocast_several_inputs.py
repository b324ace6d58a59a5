"""autocast of known library calls with several array inputs (docs/autocast.md, "Known library calls").

``jnp.logaddexp2`` multiplies by ``1/ln 2`` built in the inputs' dtype; ``jnp.linalg.lstsq``,
``pinv``, ``matrix_rank`` and ``jnp.polyfit`` cut singular values below a default tolerance built
from the input dtype's eps (bfloat16's 2**-7 times the matrix size: most of them). Each call is
recognised with all of its array inputs and evaluated as heddle's function, so autocast gives
heddle's bits; the references are float64 NumPy on the same narrow inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.numpy as hnp

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)


def _every_pattern(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    return x, np.random.default_rng(7).permutation(x)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_logaddexp2_is_heddles_on_every_pattern_jitted_and_eagerly(dtype):
    # before: 988 bfloat16 / 5,547 float16 pairs differed (1/ln 2 rounded to the input dtype)
    x, y = _every_pattern(dtype)
    want = np.asarray(jax.jit(hnp.logaddexp2)(x, y)).view(np.uint16)
    jitted = np.asarray(jax.jit(heddle.autocast(jnp.logaddexp2))(x, y)).view(np.uint16)
    eager = np.asarray(heddle.autocast(jnp.logaddexp2)(x, y)).view(np.uint16)
    assert np.count_nonzero(jitted != want) == 0
    assert np.count_nonzero(eager != want) == 0
    # and heddle's is within one ulp of float64 wherever the result is finite and normal
    with np.errstate(all="ignore"):  # NaN patterns
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        ref = np.logaddexp2(x64, y64)
    got = want.view(dtype).astype(np.float64)
    big = float(np.finfo(dtype).max)
    ok = (np.abs(ref) >= float(np.finfo(dtype).tiny)) & (np.abs(ref) < big) & np.isfinite(got)
    ulp = np.spacing(np.abs(ref[ok]).astype(dtype)).astype(np.float64)
    assert np.all(np.abs(got[ok] - ref[ok]) <= ulp)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_logaddexp2_with_a_python_scalar_input_is_heddles(dtype):
    # before: logaddexp2(x, 1.0) differed from heddle's on 318 bfloat16 / 3,267 float16 patterns
    # (the scalar is a literal of the program, not a variable: the call was not recognised)
    x, _ = _every_pattern(dtype)
    with np.errstate(all="ignore"):  # NaN patterns
        finite = np.isfinite(x.astype(np.float64))
    for s, f in [
        (1.0, lambda x: jnp.logaddexp2(x, 1.0)),
        (0.3, lambda x: jnp.logaddexp2(x, 0.3)),
        (-2.5, lambda x: jnp.logaddexp2(-2.5, x)),
    ]:
        want = np.asarray(jax.jit(lambda x, s=s: hnp.logaddexp2(x, s))(x)).view(np.uint16)
        for run in (jax.jit(heddle.autocast(f)), heddle.autocast(f)):
            got = np.asarray(run(x)).view(np.uint16)
            assert np.count_nonzero((got != want) & finite) == 0, s
        # heddle's: the scalar as the input dtype (as JAX rounds it), then within one ulp
        with np.errstate(all="ignore"):
            ref = np.logaddexp2(x.astype(np.float64), float(np.asarray(s, dtype)))
        got64 = want.view(dtype).astype(np.float64)
        tiny, big = float(np.finfo(dtype).tiny), float(np.finfo(dtype).max)
        ok = finite & (np.abs(ref) >= tiny) & (np.abs(ref) < big) & np.isfinite(got64)
        ulp = np.spacing(np.abs(ref[ok]).astype(dtype)).astype(np.float64)
        assert np.all(np.abs(got64[ok] - ref[ok]) <= ulp), s


def _well_conditioned(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    return rng.standard_normal((m, n)).astype(BF16)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_lstsq_with_its_default_cutoff_solves(jit):
    # before: a well-conditioned 64x16 bfloat16 least-squares solution was 49% off
    rng = np.random.default_rng(0)
    a, b = _well_conditioned(rng, 64, 16), rng.standard_normal(64).astype(BF16)
    f = heddle.autocast(lambda a, b: jnp.linalg.lstsq(a, b)[0])
    got = np.asarray((jax.jit(f) if jit else f)(a, b))
    want = np.asarray(hnp.linalg.lstsq(a, b)[0])
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    ref = np.linalg.lstsq(a.astype(np.float64), b.astype(np.float64), rcond=None)[0]
    # float32 arithmetic, rounded once: within one bfloat16 ulp of the exact solution
    ulp = np.spacing(np.abs(ref).astype(BF16)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= ulp)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_pinv_and_matrix_rank_with_their_default_tolerances(jit):
    # before: no pinv output of a 32x32 bfloat16 matrix was correctly rounded; rank 23 of 32
    rng = np.random.default_rng(0)
    m = _well_conditioned(rng, 32, 32)
    wrap = (lambda f: jax.jit(heddle.autocast(f))) if jit else heddle.autocast
    got = np.asarray(wrap(jnp.linalg.pinv)(m))
    np.testing.assert_array_equal(
        got.view(np.uint16), np.asarray(hnp.linalg.pinv(m)).view(np.uint16)
    )
    ref = np.linalg.pinv(m.astype(np.float64)).astype(BF16)
    assert np.mean(got == ref) > 0.95
    assert int(wrap(jnp.linalg.matrix_rank)(m)) == 32
    # an exactly rank-20 matrix (small integers: every product and sum exact in bfloat16)
    low = (rng.integers(-1, 2, (32, 20)) @ rng.integers(-1, 2, (20, 32))).astype(BF16)
    assert np.linalg.matrix_rank(low.astype(np.float64)) == 20
    assert int(wrap(jnp.linalg.matrix_rank)(low)) == 20


@pytest.mark.parametrize("deg", [1, 3, 7])
def test_polyfit_with_its_default_cutoff_fits(deg):
    # before: a cubic through 200 bfloat16 points was fitted as 0 (deg 3 and above)
    x = np.linspace(-1, 1, 200).astype(BF16)
    x64 = x.astype(np.float64)
    y = (x64**3 - 0.5 * x64 + 0.25).astype(BF16)
    f = heddle.autocast(lambda x, y: jnp.polyfit(x, y, deg))
    jitted, eager = np.asarray(jax.jit(f)(x, y)), np.asarray(f(x, y))
    want = np.asarray(hnp.polyfit(x, y, deg)).view(np.uint16)
    np.testing.assert_array_equal(jitted.view(np.uint16), want)
    np.testing.assert_array_equal(eager.view(np.uint16), want)
    fitted = np.polyval(jitted.astype(np.float64), x64)
    exact = np.polyval(np.polyfit(x64, y.astype(np.float64), deg), x64)
    assert np.max(np.abs(fitted - exact)) < (0.3 if deg == 1 else 0.02)


def test_a_call_with_an_explicit_cutoff_is_not_taken_for_the_default():
    # lstsq(rcond=0.5) traces to other equations: evaluated primitive by primitive, with 0.5
    rng = np.random.default_rng(1)
    a, b = _well_conditioned(rng, 16, 4), rng.standard_normal(16).astype(BF16)
    f = heddle.autocast(lambda a, b: jnp.linalg.lstsq(a, b, rcond=0.9)[0])
    got = np.asarray(jax.jit(f)(a, b)).astype(np.float64)
    default = np.asarray(hnp.linalg.lstsq(a, b)[0]).astype(np.float64)
    assert not np.allclose(got, default)  # singular values under 0.9 * the largest are cut


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_logaddexp2_of_one_array_twice_and_of_broadcast_arrays(dtype):
    # before: logaddexp2(x, x) 1,182 / 12,612 patterns and (64, 1) with (50,) 143 / 239 of 3,200
    # outputs differed from heddle's (not recognised: one variable twice; a broadcast first)
    x, _ = _every_pattern(dtype)
    f = jax.jit(heddle.autocast(lambda x: jnp.logaddexp2(x, x)))
    want = jax.jit(lambda x: hnp.logaddexp2(x, x))(x)
    np.testing.assert_array_equal(
        np.asarray(f(x)).view(np.uint16), np.asarray(want).view(np.uint16)
    )
    rng = np.random.default_rng(3)
    a = (4 * rng.standard_normal((64, 1))).astype(dtype)
    b = (4 * rng.standard_normal(50)).astype(dtype)
    got = jax.jit(heddle.autocast(jnp.logaddexp2))(a, b)
    want = jax.jit(hnp.logaddexp2)(a, b)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))


def test_hermitian_pinv_and_rank_and_higher_degree_polyfit():
    # before: pinv(hermitian=True) of a well-conditioned bfloat16 matrix was all zeros, and
    # polyfit of degree 11 returned zeros (bfloat16's cut-off)
    rng = np.random.default_rng(1)
    s = rng.standard_normal((32, 32))
    h = (s @ s.T / 32 + 0.05 * np.eye(32)).astype(BF16)
    got = jax.jit(heddle.autocast(lambda a: jnp.linalg.pinv(a, hermitian=True)))(h)
    want = hnp.linalg.pinv(h, hermitian=True)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    rank = jax.jit(heddle.autocast(lambda a: jnp.linalg.matrix_rank(a, hermitian=True)))(h)
    assert int(rank) == np.linalg.matrix_rank(h.astype(np.float64)) == 32
    x = np.linspace(-1, 1, 200).astype(BF16)
    y = np.polyval([0.5, -1, 2, 0.3], x.astype(np.float64)).astype(BF16)
    got = jax.jit(heddle.autocast(lambda x, y: jnp.polyfit(x, y, 11)))(x, y)
    want = hnp.polyfit(x, y, 11)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    assert np.any(np.asarray(got) != 0)


def test_heddles_lstsq_with_numpy_resid_runs_eagerly():
    # JAX's numpy_resid=True branches on the rank in Python: heddle's kernel raised
    # TracerBoolConversionError; it now runs op by op, as jax.numpy's does
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 3)).astype(BF16), rng.standard_normal(8).astype(BF16)
    resid = hnp.linalg.lstsq(a, b, numpy_resid=True)[1]
    ref = np.linalg.lstsq(a.astype(np.float64), b.astype(np.float64), rcond=None)[1]
    np.testing.assert_allclose(np.asarray(resid, np.float64), ref, rtol=2**-7)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (1, None)], ids=str)
def test_a_vmap_of_some_inputs_is_heddles(in_axes):
    # before: jax.vmap(jnp.logaddexp2, in_axes=(0, None)) of 256 x 256 bfloat16 patterns against
    # 256 others differed from heddle's on 1,499 outputs ((None, 0): 1,499; (1, None): 1,611)
    x = np.arange(1 << 16, dtype=np.uint16).view(BF16).reshape(256, 256)
    other = np.random.default_rng(0).permutation(x.ravel())
    a = x if in_axes[0] is not None else other[:256]
    b = other[:256] if in_axes[1] is None else x
    with np.errstate(all="ignore"):  # NaN patterns
        finite = np.isfinite(x.astype(np.float64))
    f = jax.vmap(jnp.logaddexp2, in_axes=in_axes)
    want = np.asarray(jax.jit(jax.vmap(hnp.logaddexp2, in_axes=in_axes))(a, b)).view(np.uint16)
    for run in (jax.jit(heddle.autocast(f)), heddle.autocast(f)):
        got = np.asarray(run(a, b)).view(np.uint16)
        assert np.count_nonzero((got != want) & finite) == 0
    # lstsq of five systems with one right-hand side: before, every output differed, up to 62%
    # of the largest (bfloat16's default cut-off dropped singular values)
    rng = np.random.default_rng(3)
    m, rhs = rng.standard_normal((5, 64, 16)).astype(BF16), rng.standard_normal(64).astype(BF16)
    solve = jax.vmap(lambda a, b: jnp.linalg.lstsq(a, b)[0], in_axes=(0, None))
    got = np.asarray(jax.jit(heddle.autocast(solve))(m, rhs))
    want = np.asarray(jax.vmap(lambda a, b: hnp.linalg.lstsq(a, b)[0], in_axes=(0, None))(m, rhs))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_several_input_calls_and_calls_along_an_axis_under_vmap():
    # before: autocast(jax.vmap(lstsq)) was 30-69% off per system (bfloat16's cut-off), vmap of
    # polyfit and logaddexp2 and vmap(in_axes=2) of unwrap(axis=0) were not heddle's
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((5, 64, 16)).astype(BF16), rng.standard_normal((5, 64)).astype(BF16)
    solve = lambda a, b: jnp.linalg.lstsq(a, b)[0]
    got = np.asarray(jax.jit(heddle.autocast(jax.vmap(solve)))(a, b))
    want = np.asarray(jax.vmap(lambda a, b: hnp.linalg.lstsq(a, b)[0])(a, b))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    x = np.tile(np.linspace(-1, 1, 100), (4, 1)).astype(BF16)
    y = np.polyval([0.5, -1, 2, 0.3], x.astype(np.float64)).astype(BF16)
    got = jax.jit(heddle.autocast(jax.vmap(lambda x, y: jnp.polyfit(x, y, 3))))(x, y)
    want = jax.vmap(lambda x, y: hnp.polyfit(x, y, 3))(x, y)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    u, v = (
        (4 * rng.standard_normal((5, 32))).astype(F16),
        (4 * rng.standard_normal((5, 32))).astype(F16),
    )
    got = jax.jit(heddle.autocast(jax.vmap(jnp.logaddexp2)))(u, v)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(hnp.logaddexp2(u, v)))
    p = np.angle(np.exp(1j * np.cumsum(1.5 * rng.standard_normal((40, 16, 3)), axis=0))).astype(F16)
    unwrap = lambda f: jax.vmap(lambda w: f(w, axis=0), in_axes=2, out_axes=2)
    got = jax.jit(heddle.autocast(unwrap(jnp.unwrap)))(p)
    want = jax.jit(unwrap(hnp.unwrap))(p)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
