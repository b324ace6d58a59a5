"""The float32 formulas of heddle/ops/_formulas.py where a float32 intermediate would be subnormal.

XLA:CPU flushes float32 subnormals to zero; bfloat16 has float32's exponent range, so a bfloat16
result near ``2**-126`` (or an ``x exp(x)`` tail) computed through a subnormal float32 intermediate
was 0 although it rounds to a normal bfloat16. And ``x**2`` overflows float32 for bfloat16
``|x| >= 1.8e19`` in log_ndtr and norm.logpdf, whose values are finite.

Every function is swept over all 65,536 bfloat16 and float16 bit patterns (finite ones) under
``jax.jit`` and compared bit for bit with the float64 value rounded once (``tests/ops/_round.py``);
where the float64 value lies within 1e-3 of a narrow ulp of a rounding boundary either neighbour is
accepted. bfloat16 subnormal inputs and results are float32 subnormals, which XLA:CPU cannot hold:
they are not compared.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.special as sp
from _round import round_once  # tests/ops is on sys.path

import heddle.nn as hnn
import heddle.numpy as hnp
import heddle.scipy.special as hss
import heddle.scipy.stats.norm as hnorm
from heddle.ops import _formulas
from heddle.ops._float_op import float_op

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
TINY = float(np.finfo(np.float32).tiny)
_C = math.sqrt(2 / math.pi)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)

# the formula of norm.logpdf, through the same float_op as heddle.scipy.stats.norm's functions
_norm_logpdf = float_op(
    _formulas.STATS["norm"]["logpdf"], "scipy.stats.norm.logpdf", values=("x", "loc", "scale")
)

REFERENCE = {
    "arcsin": np.arcsin,
    "asin": np.arcsin,
    "exp2": np.exp2,
    "deg2rad": np.deg2rad,
    "radians": np.deg2rad,
    "nn.silu": lambda x: x * sp.expit(x),
    "nn.swish": lambda x: x * sp.expit(x),
    "nn.mish": lambda x: x * np.tanh(np.logaddexp(0, x)),
    "nn.gelu": lambda x: x * sp.expit(2 * _C * (x + 0.044715 * x**3)),
    "nn.gelu_exact": lambda x: 0.5 * x * sp.erfc(-x / math.sqrt(2)),
    "special.erfinv": lambda x: np.copysign(sp.erfinv(x), x),  # odd: erfinv(-0) = -0
    "special.log_ndtr": sp.log_ndtr,
    "stats.norm.logpdf": lambda x: -(x * x) / 2 - _LOG_SQRT_2PI,
}

FUNCTION = {
    "arcsin": hnp.arcsin,
    "asin": hnp.asin,
    "exp2": hnp.exp2,
    "deg2rad": hnp.deg2rad,
    "radians": hnp.radians,
    "nn.silu": hnn.silu,
    "nn.swish": hnn.swish,
    "nn.mish": hnn.mish,
    "nn.gelu": hnn.gelu,
    "nn.gelu_exact": lambda x: hnn.gelu(x, approximate=False),
    "special.erfinv": hss.erfinv,
    "special.log_ndtr": hss.log_ndtr,
    "stats.norm.logpdf": _norm_logpdf,
}


def _finite_patterns(dtype):
    x = np.arange(2**16, dtype=np.uint16).view(dtype)
    with np.errstate(invalid="ignore"):
        return x[np.isfinite(x.astype(np.float64))]


def _values(dtype):
    return np.unique(_finite_patterns(dtype).astype(np.float64))


def mismatches(fn, ref_fn, x, dtype):
    """The inputs of ``x`` (narrow) where ``fn`` under jit is not the float64 value rounded once
    (either neighbour within 1e-3 ulp of a boundary; bfloat16 subnormals not compared)."""
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = np.asarray(ref_fn(x64), np.float64)
    want = round_once(ref, dtype)
    got = np.asarray(jax.jit(fn)(x))
    assert got.dtype == dtype
    with np.errstate(invalid="ignore"):
        g, w = got.astype(np.float64), want.astype(np.float64)
    wrong = (got.view(np.uint16) != want.view(np.uint16)) & ~(np.isnan(g) & np.isnan(w))
    if dtype == BF16:
        wrong &= ~(((np.abs(x64) < TINY) & (x64 != 0)) | ((np.abs(w) < TINY) & (w != 0)))
    v = _values(dtype)
    i = np.clip(np.searchsorted(v, ref), 1, len(v) - 1)
    lo, hi = v[i - 1], v[i]
    with np.errstate(invalid="ignore"):
        tie = np.isfinite(ref) & (np.abs(ref - (lo + hi) / 2) <= 1e-3 * (hi - lo))
    wrong &= ~(tie & ((g == lo) | (g == hi)))
    return [
        (float(a), float(b), float(c))
        for a, b, c in zip(x64[wrong], g[wrong], w[wrong], strict=True)
    ]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(FUNCTION))
def test_correctly_rounded_on_every_finite_input(name, dtype):
    bad = mismatches(FUNCTION[name], REFERENCE[name], _finite_patterns(dtype), dtype)
    assert not bad, f"{name}({dtype}): {len(bad)} wrong, (x, got, want) {bad[:6]}"


# --- the reported inputs, eagerly and under jit ------------------------------------------------------


def _bf16_smallest_normals():
    bits = np.arange(0x0080, 0x0100, dtype=np.uint16)  # [2**-126, 2**-125)
    return np.concatenate([bits, bits | 0x8000]).view(BF16)


def _bits(a):
    return np.asarray(a).view(np.uint16)


def test_arcsin_of_the_smallest_normals_is_x(transform):
    x = _bf16_smallest_normals()
    for fn in (hnp.arcsin, hnp.asin):
        np.testing.assert_array_equal(_bits(transform(fn)(x)), _bits(x))


@pytest.mark.parametrize("name", ["nn.silu", "nn.swish", "nn.mish"])
def test_x_exp_x_tail_is_not_flushed(name, transform):
    x = np.arange(-91.5, -87.4, 0.5).astype(BF16)
    got = np.asarray(transform(FUNCTION[name])(x))
    want = round_once(REFERENCE[name](x.astype(np.float64)), BF16)
    normal = np.abs(want.astype(np.float64)) >= TINY
    assert normal.sum() >= 8
    np.testing.assert_array_equal(_bits(got)[normal], _bits(want)[normal])


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_tails_are_not_flushed(approximate, transform):
    x = np.array([-13.0625, -13.125, -10.0625, 2.341805152028776e-38, -2.341805152028776e-38], BF16)
    name = "nn.gelu" if approximate else "nn.gelu_exact"
    got = np.asarray(transform(lambda v: hnn.gelu(v, approximate=approximate))(x))
    want = round_once(REFERENCE[name](x.astype(np.float64)), BF16)
    normal = np.abs(want.astype(np.float64)) >= TINY
    np.testing.assert_array_equal(_bits(got)[normal], _bits(want)[normal])
    assert normal.sum() >= 3


def test_exp2_of_minus_126_is_the_smallest_normal(transform):
    got = transform(hnp.exp2)(np.array([-126, -125, 127, -149, 128, -np.inf, np.inf, np.nan], BF16))
    got = np.asarray(got).astype(np.float64)
    np.testing.assert_array_equal(got[:6], [2.0**-126, 2.0**-125, 2.0**127, 0, np.inf, 0])
    assert got[6] == np.inf and np.isnan(got[7])
    # float32 itself: exact powers of two, and far more accurate than exp(x ln 2) at large |x|
    x = np.linspace(-125, 127, 100_001, dtype=np.float32)
    g = np.asarray(transform(hnp.exp2)(x)).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    ulps = np.abs(g - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 2, ulps.max()  # jax.numpy.exp2: 68 ulps


@pytest.mark.parametrize("name", ["special.erfinv", "deg2rad", "radians"])
def test_smallest_normal_boundary(name, transform):
    # c x just below 2**-126, rounding up to the normal 2**-126 in bfloat16
    x = np.array({"special.erfinv": [1.3224311446750734e-38], "deg2rad": [6.729705158457596e-37]}
                 .get(name, [6.729705158457596e-37]), BF16)  # fmt: skip
    x = np.concatenate([x, -x])
    got = np.asarray(transform(FUNCTION[name])(x))
    np.testing.assert_array_equal(got.astype(np.float64), [TINY, -TINY])


def test_log_ndtr_and_norm_logpdf_do_not_overflow(transform):
    x = np.array([-1.8446744073709552e19, -2.4e19, -3e19, 1.9e19, 3e38, -3e38], BF16)
    got = np.asarray(transform(hss.log_ndtr)(x)).astype(np.float64)
    want = round_once(sp.log_ndtr(x.astype(np.float64)), BF16).astype(np.float64)
    assert np.isfinite(got[:2]).all() and (got[2], got[-1]) == (-np.inf, -np.inf)
    np.testing.assert_array_equal(got[[0, 3, 4]], want[[0, 3, 4]])
    np.testing.assert_allclose(got, want, rtol=2**-8)
    x = np.array([1.8446744073709552e19, -2e19, 2.5e19, 3e19], BF16)
    got = np.asarray(transform(_norm_logpdf)(x)).astype(np.float64)
    want = round_once(REFERENCE["stats.norm.logpdf"](x.astype(np.float64)), BF16)
    np.testing.assert_array_equal(got, want.astype(np.float64))
    assert np.isfinite(got[:3]).all()
    # loc and scale: z = (x - loc) / scale
    got = transform(_norm_logpdf)(np.array(4e19, BF16), np.array(1e19, BF16), np.array(2, BF16))
    z = (float(np.array(4e19, BF16)) - float(np.array(1e19, BF16))) / 2
    assert float(got) == float(
        round_once(np.float64(-z * z / 2 - math.log(2) - _LOG_SQRT_2PI), BF16)
    )


def test_public_norm_logpdf_does_not_overflow():
    got = hnorm.logpdf(np.array([1.8446744073709552e19, -2e19], BF16))
    assert np.isfinite(np.asarray(got).astype(np.float64)).all()


# --- the formulas keep JAX's results elsewhere, its float64, and sensible gradients -----------------


@pytest.mark.parametrize("name", sorted(FUNCTION))
def test_float64_is_jaxs_own(name):
    own = {
        "arcsin": jnp.arcsin, "asin": jnp.asin, "exp2": jnp.exp2, "deg2rad": jnp.deg2rad,
        "radians": jnp.radians, "nn.silu": jax.nn.silu, "nn.swish": jax.nn.swish,
        "nn.mish": jax.nn.mish, "nn.gelu": None, "nn.gelu_exact": None,
        "special.erfinv": jax.scipy.special.erfinv, "special.log_ndtr": None,
        "stats.norm.logpdf": jax.scipy.stats.norm.logpdf,
    }[name]  # fmt: skip
    x = np.array([-1e30, -95.0, -88.0, -13.5, -2.0, -1e-300, 0.0, 1e-300, 0.3, 5.0, 1e30])
    if name in ("arcsin", "asin", "special.erfinv"):
        x = np.clip(x, -0.999, 0.999)
    with jax.enable_x64(True):
        got = np.asarray(FUNCTION[name](x))
        assert got.dtype == np.float64
        with np.errstate(all="ignore"):
            ref = REFERENCE[name](x)
        finite = np.isfinite(ref) & (np.abs(ref) > 1e-290)
        np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-12)
        if own is not None:
            np.testing.assert_array_equal(got, np.asarray(own(x)))


_DERIVATIVE = {
    "arcsin": lambda x: 1 / np.sqrt(1 - x * x),
    "exp2": lambda x: math.log(2) * np.exp2(x),
    "deg2rad": lambda x: np.full_like(x, math.pi / 180),
    "nn.silu": lambda x: sp.expit(x) * (1 + x * (1 - sp.expit(x))),
    "nn.mish": lambda x: (
        np.tanh(np.logaddexp(0, x)) + x * (1 - np.tanh(np.logaddexp(0, x)) ** 2) * sp.expit(x)
    ),
    "nn.gelu_exact": lambda x: (
        0.5 * sp.erfc(-x / math.sqrt(2)) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    ),
    "special.erfinv": lambda x: math.sqrt(math.pi) / 2 * np.exp(sp.erfinv(x) ** 2),
    "special.log_ndtr": lambda x: np.where(
        x < -1e10, -x - 1 / x, np.exp(-x * x / 2 - _LOG_SQRT_2PI - sp.log_ndtr(x))
    ),
}


@pytest.mark.parametrize("name", sorted(_DERIVATIVE))
def test_gradients_are_finite_and_right(name, transform):
    # ordinary inputs and the points where a formula switches branch
    x = np.array([-300.0, -90.0, -87.5, -80.0, -13.5, -12.9, -3.0, -0.5, -1e-30, 0.0, 1e-30, 0.4,
                  2.0, 50.0], np.float32)  # fmt: skip
    if name in ("arcsin", "special.erfinv"):
        x = np.array([-0.9, -0.5, -1e-5, -1e-35, 0.0, 1e-35, 3e-31, 0.25, 0.75], np.float32)
    if name == "special.log_ndtr":
        # -x**2/2 + its asymptotic terms past -2**60; JAX's own jvp elsewhere (it cancels below -10)
        x = np.array([-(2.0**70), -(2.0**61), -5.0, -3.0, 0.0, 2.0, 8.0], np.float32)
    g = np.asarray(transform(jax.vmap(jax.grad(FUNCTION[name])))(x), np.float64)
    assert np.isfinite(g).all(), (name, g)
    with np.errstate(all="ignore"):
        want = _DERIVATIVE[name](x.astype(np.float64))
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-30, err_msg=name)


def test_gelu_tanh_gradient_is_finite_in_its_tail():
    x = np.array([-1e4, -12.0, -10.0625, -9.0, -1e-38, 0.0, 3.0], np.float32)
    g = np.asarray(jax.vmap(jax.grad(hnn.gelu))(x))
    assert np.isfinite(g).all(), g
    gs = np.asarray(
        jax.vmap(jax.grad(lambda v: hnn.swish(v) + hnp.radians(v) + hnp.asin(v / 1e5)))(x)
    )
    assert np.isfinite(gs).all(), gs
    gl = jax.grad(lambda v: _norm_logpdf(v, 1.0, 2.0))(np.float32(3.0))
    assert abs(float(gl) + 0.5) < 1e-6  # -(x - loc) / scale**2
