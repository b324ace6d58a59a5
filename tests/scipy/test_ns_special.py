"""heddle.scipy.special: integer orders as Python ints (polygamma), spence past 8.6e37, and expi /
exp1 over every bfloat16 and float16 pattern, eagerly in seconds, against scipy.special in float64."""

from __future__ import annotations

import time

import jax
import ml_dtypes
import numpy as np
import pytest
import scipy.special as sps

import heddle.scipy.special as hs

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
EPS = {BF16: 2.0**-8, F16: 2.0**-11, F32: 2.0**-24}  # unit roundoff of the result dtype


def _close(got, ref, d, ulps: float) -> np.ndarray:
    """Where ``got`` (dtype ``d``) is within ``ulps`` units in the last place of ``d`` of the float64
    reference; NaN and infinities must match exactly."""
    with np.errstate(invalid="ignore"):  # NaN patterns of bfloat16 warn in NumPy's casts
        got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
        top = float(ml_dtypes.finfo(d).max) * (1 + EPS[d])  # past it, round to nearest is inf
        ref = np.where(np.abs(ref) >= top, np.copysign(np.inf, ref), ref)
        ok = np.abs(got - ref) <= ulps * 2 * EPS[d] * np.abs(ref)
    return ok | (got == ref) | (np.isnan(got) & np.isnan(ref))


def _all_patterns(d: np.dtype) -> np.ndarray:
    return np.arange(65536, dtype=np.uint16).view(d)


def _normal(x: np.ndarray, d: np.dtype) -> np.ndarray:
    """Inputs that are not subnormal in ``d``: XLA:CPU flushes float32 subnormals (every subnormal
    bfloat16), so these are left out, as in tests/ops/test_unary_rounding.py."""
    tiny = float(ml_dtypes.finfo(d).smallest_normal)
    with np.errstate(invalid="ignore"):
        xf = x.astype(np.float64)
    return ~((xf != 0) & (np.abs(xf) < tiny))


@pytest.mark.parametrize("d", [BF16, F16, F32], ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_polygamma_takes_a_python_int_order(n, d, transform):
    x = np.linspace(0.25, 12, 97).astype(d)
    out = transform(lambda v: hs.polygamma(n, v))(x)
    assert out.dtype == d
    ref = sps.polygamma(n, x.astype(np.float64))
    if d == F32:  # JAX's own float32 accuracy, absolute near digamma's zero at 1.46
        np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-6, atol=2e-6)
    else:
        ok = _close(out, ref, d, 1)
        assert ok.all(), (x[~ok], np.asarray(out)[~ok], ref[~ok])


def test_polygamma_integer_array_order_and_float_order(transform):
    n = np.array([0, 1, 2, 3, 4], np.int32)
    x = np.array([0.5, 1.5, 2.5, 3.5, 7.0], BF16)
    out = transform(hs.polygamma)(n, x)
    assert out.dtype == BF16
    assert _close(out, sps.polygamma(n, x.astype(np.float64)), BF16, 1).all()
    with pytest.raises(ValueError, match="integer"):
        hs.polygamma(1.5, x)


@pytest.mark.parametrize(
    "call,ref",
    [
        (lambda v: hs.expn(2, v), lambda v: sps.expn(2, v)),
        (lambda v: hs.multigammaln(v + 2, 2), lambda v: sps.multigammaln(v + 2, 2)),
        (lambda v: hs.log_ndtr(v, series_order=2), lambda v: sps.log_ndtr(v)),
        (lambda v: hs.zeta(v + 2, 1), lambda v: sps.zeta(v + 2, 1)),
        (lambda v: hs.poch(v, 2), lambda v: sps.poch(v, 2)),
    ],
    ids=["expn", "multigammaln", "log_ndtr", "zeta", "poch"],
)
def test_python_int_static_and_order_arguments(call, ref, transform):
    x = np.linspace(0.5, 4, 15).astype(F16)
    out = transform(call)(x)
    assert out.dtype == F16
    assert _close(out, ref(x.astype(np.float64)), F16, 1).all()


def test_spence_of_the_largest_bfloat16_values(transform):
    x = _all_patterns(BF16)
    x = x[np.isfinite(x.astype(np.float32)) & (x.astype(np.float32) >= 8.0e37)]
    out = transform(hs.spence)(x)
    ref = sps.spence(x.astype(np.float64))
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert _close(out, ref, BF16, 1).all()


@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_spence_every_pattern(d, transform):
    x = _all_patterns(d)
    out = transform(hs.spence)(x)
    with np.errstate(all="ignore"):
        ref = sps.spence(x.astype(np.float64))
    keep = _normal(x, d)
    ok = _close(out, ref, d, 1)
    assert ok[keep].all(), x[keep & ~ok][:10]


@pytest.mark.parametrize("name", ["expi", "exp1"])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_expi_and_exp1_every_pattern_eagerly_in_seconds(name, d):
    """Eagerly over all 65,536 patterns (JAX's loops took minutes per call on a float32 array
    reaching 1e-5, and did not end on bfloat16's smallest values)."""
    x = _all_patterns(d)
    fn = getattr(hs, name)
    fn(x).block_until_ready()  # compiles
    start = time.perf_counter()
    out = fn(x).block_until_ready()
    assert time.perf_counter() - start < 30
    with np.errstate(all="ignore"):
        ref = getattr(sps, name)(x.astype(np.float64))
    tiny = float(ml_dtypes.finfo(d).smallest_normal)
    keep = _normal(x, d) & ~((ref != 0) & (np.abs(ref) < tiny))  # subnormal results flush too
    ok = _close(out, ref, d, 1)
    assert ok[keep].all(), (x[keep & ~ok][:10], np.asarray(out)[keep & ~ok][:10])
    jitted = jax.jit(fn)(x)
    np.testing.assert_array_equal(
        np.asarray(jitted).view(np.uint16), np.asarray(out).view(np.uint16)
    )


@pytest.mark.parametrize("name", ["expi", "exp1"])
def test_expi_and_exp1_float32_edges_and_gradient(name):
    x = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 1e-30, 0.5, 1, 1.5, -0.5, -3, 50, 80], F32)
    if name == "expi":
        x = np.concatenate([x, np.array([65, 89, 93, 200], F32)])  # Ei(89) is finite in float32
    with np.errstate(all="ignore"):
        ref = getattr(sps, name)(x.astype(np.float64))
    out = getattr(hs, name)(x)
    assert _close(out, ref, F32, 64).all(), (np.asarray(out), ref)
    v = np.array([0.25, 0.75, 1.5, 70.0], F32)
    g = jax.grad(lambda t: getattr(hs, name)(t).sum())(v)
    want = (
        np.exp(v.astype(np.float64)) / v if name == "expi" else -np.exp(-v.astype(np.float64)) / v
    )
    assert _close(g, want, F32, 64).all()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 5000])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_expn_every_pattern_eagerly_in_seconds(n, d):
    """JAX's expn runs its continued fraction on every element (minutes on the small ones, without
    end on bfloat16's smallest); its E_n(0) for n >= 2 was 1/n and E_n(inf) NaN."""
    x = _all_patterns(d)
    hs.expn(n, x).block_until_ready()  # compiles
    start = time.perf_counter()
    out = hs.expn(n, x).block_until_ready()
    assert time.perf_counter() - start < 30
    assert out.dtype == d
    with np.errstate(all="ignore"):
        ref = sps.expn(n, x.astype(np.float64))
    tiny = float(ml_dtypes.finfo(d).smallest_normal)
    keep = _normal(x, d) & ~((ref != 0) & (np.abs(ref) < tiny))  # subnormal results flush too
    ok = _close(out, ref, d, 1)
    assert ok[keep].all(), (x[keep & ~ok][:10], np.asarray(out)[keep & ~ok][:10])


def test_expn_float32_edges_and_gradient():
    x = np.array([0.0, np.inf, -1.0, np.nan, 1e-30, 0.5, 1.0, 1.5, 20.0, 80.0], F32)
    for n in (0, 1, 2, 3, 7, 60, 5000, 2.7):
        with np.errstate(all="ignore"):
            ref = sps.expn(int(n), x.astype(np.float64))  # scipy truncates a non-integer order
        out = hs.expn(n, x)
        flushed = (ref != 0) & (np.abs(ref) < np.finfo(F32).tiny)  # a subnormal result: XLA's 0
        assert (_close(out, ref, F32, 64) | flushed).all(), (n, np.asarray(out), ref)
    assert np.isnan(np.asarray(hs.expn(-1, np.float32(1.0))))
    v = np.array([0.25, 0.75, 1.5, 30.0], F32)
    for n in (0, 1, 3):
        g = jax.grad(lambda t, n=n: hs.expn(n, t).sum())(v)
        x64 = v.astype(np.float64)
        want = -np.exp(-x64) * (x64 + 1) / x64**2 if n == 0 else -sps.expn(n - 1, x64)
        assert _close(g, want, F32, 64).all(), (n, np.asarray(g), want)
