"""heddle.nn against float64 references computed on the exact narrow input values (POLICY.md 4-5).

A float-only function promises: JAX's formula evaluated in float32, then one rounding to the narrow
dtype. Against the float64 value ``ref`` of the formula on the same inputs that means: the result is
``ref`` rounded once (ties to even), except where ``ref`` lies within the float32 evaluation error of a
rounding tie, where either neighbour of ``ref`` is allowed. The float32 error is stated per function
as ``K`` float32 ulps of the magnitude ``S`` of its largest intermediate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.special
from _common import BF16, F16, F32, U32, finite_values, round_once  # tests/ops is on sys.path

import heddle.nn as hnn
from heddle import policy

FLUSH = 2.0**-126  # float32's smallest normal: XLA flushes float32 subnormals to zero


def rounding_failures(got, ref, dtype, tol=0.0, flush_scale=1.0) -> np.ndarray:
    """Mask of the elements of ``got`` that are not ``r`` rounded once for any ``|r - ref| <= tol``.

    Rounding is monotonic, so that set is every value between ``round_once(ref - tol)`` and
    ``round_once(ref + tol)``; with ``tol`` below half an ulp it is the correctly rounded value, or
    either neighbour where ``ref`` is within ``tol`` of a tie. Where ``|ref|`` is below float32's
    smallest normal times ``flush_scale`` (the ratio of ``ref`` to its smallest intermediate), a
    float32 computation may also have flushed it to zero.
    """
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got).astype(np.float64)
    tol = np.asarray(tol, np.float64)
    lo = round_once(ref - tol, dtype).astype(np.float64)
    hi = round_once(ref + tol, dtype).astype(np.float64)
    ok = (lo <= got) & (got <= hi)
    return ~(ok | ((np.abs(ref) < FLUSH * np.asarray(flush_scale)) & (got == 0)))


def test_reference_rounding_is_single_rounding():
    # 1 + 2**-8 + 2**-30 is just above a bfloat16 tie: one rounding goes up; a rounding through
    # float32 lands on the tie and goes to even, down
    x = np.array([1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-8, 1 + 3 * 2.0**-8])
    assert round_once(x, BF16).astype(np.float64).tolist() == [1 + 2.0**-7, 1.0, 1 + 2.0**-6]
    assert float(x[:1].astype(np.float32).astype(BF16)[0]) == 1.0  # the double rounding it avoids
    assert not rounding_failures(round_once(x, BF16), x, BF16, 0).any()
    assert rounding_failures(np.array([1.0], BF16), x[:1], BF16).all()
    # within tol of the tie either neighbour passes, and nothing further away
    tie = np.array([1 + 2.0**-8])
    assert not rounding_failures(np.array([1.0, 1 + 2.0**-7]), tie, BF16, 2.0**-30).any()
    assert rounding_failures(np.array([1 + 2.0**-6]), tie, BF16, 2.0**-30).all()


# --- POLICY.md 5's examples ------------------------------------------------------------------------


def test_float16_softmax_of_100000_zeros(transform):
    x = np.zeros(100_000, F16)
    got = transform(hnn.softmax)(x)
    assert got.dtype == F16
    want = round_once(np.array([1e-5]), F16)[0]
    assert float(want) == pytest.approx(1.0014e-05, rel=1e-4)
    assert (np.asarray(got) == want).all()
    # jax.nn.softmax stores its float32 denominator as float16 inf and returns zeros
    assert (np.asarray(transform(jax.nn.softmax)(x)) == 0).all()


def test_float16_logsumexp_of_100000_zeros(transform):
    x = np.zeros(100_000, F16)
    got = transform(hnn.logsumexp)(x)
    assert got.dtype == F16
    assert float(got) == float(round_once(np.log(100_000.0), F16)) == 11.515625
    assert np.isinf(float(transform(jax.nn.logsumexp)(x)))


def _random_bf16(n, seed, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(BF16)


def test_softmax_of_10000_bfloat16_values(transform):
    x = _random_bf16(10_000, 0)
    got = transform(hnn.softmax)(x)
    assert got.dtype == BF16
    e = np.exp(x.astype(np.float64) - x.astype(np.float64).max())
    ref = e / e.sum()
    # float32: exp (a few ulps), a sum of n terms (n ulps of the sum), a division: (n + 8) ulps
    tol = (10_000 + 8) * U32 * ref
    assert not rounding_failures(got, ref, BF16, tol).any()


def test_logsumexp_of_10000_bfloat16_values(transform):
    x = _random_bf16(10_000, 1)
    got = transform(hnn.logsumexp)(x)
    assert got.dtype == BF16
    x64 = x.astype(np.float64)
    ref = x64.max() + np.log(np.exp(x64 - x64.max()).sum())
    # the float32 sum carries n ulps of relative error; log turns it into an absolute n * 2**-24
    tol = (10_000 + 8) * U32 * (1 + abs(ref))
    assert not rounding_failures(got, ref, BF16, tol).any()


def test_log_softmax_and_logmeanexp(transform):
    x = _random_bf16(4096, 2)
    x64 = x.astype(np.float64)
    lse = x64.max() + np.log(np.exp(x64 - x64.max()).sum())
    got = transform(hnn.log_softmax)(x)
    assert got.dtype == BF16
    ref = x64 - lse
    tol = (4096 + 8) * U32 * (np.abs(x64) + abs(lse))
    assert not rounding_failures(got, ref, BF16, tol).any()
    got = transform(hnn.logmeanexp)(x)
    ref = np.array([lse - np.log(4096.0)])
    assert not rounding_failures(got, ref, BF16, (4096 + 8) * U32 * 10).any()


# --- activations on every value of the narrow formats ----------------------------------------------


def _sig(x):
    return scipy.special.expit(x)


def _softplus(x):
    return np.logaddexp(x, 0.0)


SELU_A, SELU_L = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
C = np.sqrt(2 / np.pi)

# name -> (float64 formula, magnitude S of the largest intermediate, K)
ACTIVATIONS = {
    "sigmoid": (_sig, lambda x, r: np.abs(r), 8),
    "silu": (lambda x: x * _sig(x), lambda x, r: np.abs(r), 8),
    "swish": (lambda x: x * _sig(x), lambda x, r: np.abs(r), 8),
    "gelu": (
        lambda x: x * 0.5 * (1 + np.tanh(C * (x + 0.044715 * x**3))),
        lambda x, r: np.abs(x) + np.abs(r),
        16,
    ),
    "hard_sigmoid": (lambda x: np.clip(x + 3, 0, 6) / 6, lambda x, r: 1 + np.abs(x), 4),
    "hard_silu": (lambda x: x * np.clip(x + 3, 0, 6) / 6, lambda x, r: np.abs(x) * 2, 4),
    "hard_swish": (lambda x: x * np.clip(x + 3, 0, 6) / 6, lambda x, r: np.abs(x) * 2, 4),
    "log_sigmoid": (lambda x: -_softplus(-x), lambda x, r: np.abs(r), 8),
    "mish": (lambda x: x * np.tanh(_softplus(x)), lambda x, r: np.abs(r), 16),
    "selu": (
        lambda x: SELU_L * np.where(x > 0, x, SELU_A * np.expm1(np.minimum(x, 0))),
        lambda x, r: np.abs(r),
        8,
    ),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), lambda x, r: np.abs(r), 8),
    "celu": (
        lambda x: np.maximum(x, 0) + np.expm1(np.minimum(x, 0)),
        lambda x, r: np.abs(r) + 1,
        8,
    ),
    "leaky_relu": (lambda x: np.where(x >= 0, x, 0.01 * x), lambda x, r: np.abs(r), 4),
    "soft_sign": (lambda x: x / (np.abs(x) + 1), lambda x, r: np.abs(r), 4),
    "softplus": (_softplus, lambda x, r: np.abs(r), 8),
    "sparse_plus": (
        lambda x: np.where(x <= -1, 0, np.where(x >= 1, x, (x + 1) ** 2 / 4)),
        lambda x, r: np.abs(r) + 1,
        4,
    ),
    "sparse_sigmoid": (lambda x: 0.5 * np.clip(x + 1, 0, 2), lambda x, r: 1.0, 4),
    "squareplus": (
        lambda x: (x + np.sqrt(x * x + 4)) / 2,
        lambda x, r: np.abs(x) + np.sqrt(x * x + 4),
        8,
    ),
    "tanh": (np.tanh, lambda x, r: np.abs(r), 8),
    "log1mexp": (
        lambda x: np.where(x < np.log(2), np.log(-np.expm1(-x)), np.log1p(-np.exp(-x))),
        lambda x, r: np.abs(r),
        16,
    ),
}


def _inputs(dtype, name):
    v = finite_values(dtype)
    if dtype == BF16:
        v = v[np.abs(v) <= 1024]  # keeps x**3 and x*x inside float32's range
    if name == "log1mexp":
        v = v[v > 0]
    v = v[(v == 0) | (np.abs(v) >= FLUSH)]  # XLA flushes float32-subnormal inputs to zero
    return v.astype(dtype)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_is_float32_rounded_once(transform, name, dtype):
    formula, scale, k = ACTIVATIONS[name]
    x = _inputs(dtype, name)
    got = np.asarray(transform(getattr(hnn, name))(x))
    assert got.dtype == dtype
    x64 = x.astype(np.float64)
    with np.errstate(divide="ignore"):  # np.where evaluates both branches
        ref = formula(x64)
    # float32 results below float32's normal range may be flushed to zero by the backend
    tol = k * U32 * scale(x64, ref)
    bad = rounding_failures(got, ref, dtype, tol, flush_scale=1 + np.abs(x64))
    assert not bad.any(), f"{name}: x={x64[bad][:5]}, got={got[bad][:5]}, ref={ref[bad][:5]}"


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_both_forms(transform, approximate):
    x = _inputs(BF16, "gelu")
    got = np.asarray(transform(lambda v: hnn.gelu(v, approximate=approximate))(x))
    x64 = x.astype(np.float64)
    if approximate:
        ref = x64 * 0.5 * (1 + np.tanh(C * (x64 + 0.044715 * x64**3)))
    else:
        ref = 0.5 * x64 * scipy.special.erfc(-x64 / np.sqrt(2))
    tol = 16 * U32 * (np.abs(x64) + np.abs(ref))
    assert not rounding_failures(got, ref, BF16, tol).any()


def test_glu(transform):
    x = _random_bf16((64, 8), 3)
    got = transform(hnn.glu)(x)
    x64 = x.astype(np.float64)
    ref = x64[:, :4] * _sig(x64[:, 4:])
    assert got.dtype == BF16
    assert not rounding_failures(got, ref, BF16, 8 * U32 * np.abs(ref)).any()


def test_parameters_are_not_rounded_to_the_input_dtype(transform):
    # negative_slope=0.01 is used at float32, not as bfloat16(0.01) = 0.010009765625
    x = np.array([-1.015625], BF16)
    got = transform(lambda v: hnn.leaky_relu(v, 0.01))(x)
    want = float(round_once(np.array([-0.01015625]), BF16)[0])
    assert float(got[0]) == want
    assert float(transform(lambda v: jax.nn.leaky_relu(v, 0.01))(x)[0]) != want  # JAX
    got = transform(lambda v: hnn.celu(v, alpha=np.float32(2.0)))(np.array([-1.0], BF16))
    assert float(got[0]) == float(round_once(2 * np.expm1(np.array([-0.5])), BF16)[0])


# --- dtypes ----------------------------------------------------------------------------------------

FLOAT_ONLY = [*sorted(ACTIVATIONS), "gelu", "softmax", "log_softmax", "logsumexp", "logmeanexp"]


@pytest.mark.parametrize("name", sorted(set(FLOAT_ONLY) | {"standardize", "glu"}))
def test_integer_input_gives_the_default_float(name):
    fn = getattr(hnn, name)
    for dtype in (np.int8, np.uint8, np.bool_, np.int32):
        x = np.array([[1, 0], [0, 1]], dtype)
        assert jax.jit(fn).eval_shape(x).dtype == np.float32, dtype
    assert fn(np.array([[1, 0], [0, 1]], np.int8)).dtype == np.float32  # eagerly


def test_integer_input_gives_float32_under_x64():
    with jax.enable_x64(True):
        x = np.arange(4, dtype=np.int64)
        assert jax.jit(hnn.sigmoid)(x).dtype == np.float32
        assert jax.nn.softplus(x).dtype == np.float64  # JAX's own rule, the contrast
        assert jax.jit(hnn.softmax)(x).dtype == np.float32
        assert jax.jit(hnn.one_hot, static_argnums=1)(x, 4).dtype == np.float32


@pytest.mark.parametrize(
    ("name", "lo", "hi"), [("relu", 0, None), ("relu6", 0, 6), ("hard_tanh", -1, 1)]
)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, BF16, F16])
def test_clipping_activations_keep_the_dtype(transform, name, lo, hi, dtype):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    vals = np.arange(-8, 9) if info is None or info.min < 0 else np.arange(0, 17)
    x = vals.astype(dtype)
    got = transform(getattr(hnn, name))(x)
    assert got.dtype == dtype
    want = np.clip(vals, lo, hi if hi is not None else vals.max())
    assert np.asarray(got).astype(np.int64).tolist() == want.tolist()


def test_relu_of_bool_is_bool(transform):
    x = np.array([True, False])
    got = transform(hnn.relu)(x)
    assert got.dtype == np.bool_ and np.asarray(got).tolist() == [True, False]


def test_float_operand_promotion(transform):
    a = np.zeros(4, BF16)
    b = np.full(4, 0.5, F16)
    out = transform(lambda a, b: hnn.logsumexp(a, b=b))(a, b)
    assert out.dtype == np.float32  # bfloat16 with float16 is float32 (POLICY.md 2)
    assert float(out) == pytest.approx(np.log(2.0), abs=1e-7)


def test_logsumexp_return_sign_and_where(transform):
    a = np.array([0.0, 1.0, 2.0, 3.0], BF16)
    b = np.array([1.0, -1.0, 1.0, -1.0], BF16)
    where = np.array([True, True, True, False])
    lse, sign = transform(lambda a, b: hnn.logsumexp(a, b=b, return_sign=True, where=where))(a, b)
    ref = 1 - np.e + np.e**2
    assert lse.dtype == sign.dtype == BF16
    assert float(sign) == 1.0
    assert not rounding_failures(lse, np.log(ref), BF16, 1e-6).any()


def test_standardize_keeps_the_mean_in_float32(transform):
    # values near 256 with spread 1: a bfloat16 mean would be off by up to 1, i.e. one standard
    # deviation; JAX's standardize computes that mean in bfloat16
    rng = np.random.default_rng(4)
    x = (256 + rng.integers(-8, 9, 4096) / 8).astype(BF16)
    got = transform(hnn.standardize)(x)
    assert got.dtype == BF16
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5)
    tol = 4096 * U32 * 256 * 4 + 1e-4  # float32 sums of n terms of size 256, over a spread of 1
    assert not rounding_failures(got, ref, BF16, tol).any()
    jax_err = np.abs(np.asarray(transform(jax.nn.standardize)(x), np.float64) - ref).max()
    ours_err = np.abs(np.asarray(got, np.float64) - ref).max()
    assert ours_err < jax_err


def test_standardize_with_given_mean_and_variance(transform):
    x = np.array([1.0, 2.0, 3.0], BF16)
    out = transform(lambda x: hnn.standardize(x, mean=np.float32(2.0), variance=np.float32(1.0)))(x)
    assert out.dtype == np.float32  # mean and variance are value operands: bf16 with f32 -> f32
    ref = (np.array([-1.0, 0.0, 1.0])) / np.sqrt(1 + 1e-5)
    assert np.allclose(np.asarray(out), ref, rtol=1e-6)


# --- one_hot and the initializers ------------------------------------------------------------------


def test_one_hot_dtype(transform):
    idx = np.array([0, 2, 1])
    out = transform(lambda i: hnn.one_hot(i, 3))(idx)
    assert out.dtype == np.float32
    assert np.asarray(out).tolist() == np.eye(3)[idx].tolist()
    out = transform(lambda i: hnn.one_hot(i, 3, dtype="bfloat16"))(idx)
    assert out.dtype == BF16
    with policy.default_dtypes(float="float16"):
        assert hnn.one_hot(idx, 3).dtype == F16


def test_one_hot_float64_needs_x64():
    with pytest.raises(policy.PrecisionError, match="jax_enable_x64"):
        hnn.one_hot(np.array([0]), 2, dtype="float64")
    with jax.enable_x64(True):
        assert hnn.one_hot(np.array([0]), 2, dtype="float64").dtype == np.float64


@pytest.mark.parametrize(
    "make",
    [
        lambda inits: inits.normal(1.0),
        lambda inits: inits.variance_scaling(1.0, "fan_avg", "truncated_normal"),
        lambda inits: inits.orthogonal(),
    ],
    ids=["normal", "variance_scaling", "orthogonal"],
)
def test_initializers_sample_in_float32_and_round_once(make):
    key = jax.random.key(7)
    shape = (8, 8)
    ours = make(hnn.initializers)(key, shape, BF16)
    assert ours.dtype == BF16
    reference = jax.jit(make(jax.nn.initializers), static_argnums=(1, 2))
    ref = np.asarray(reference(key, shape, F32), np.float64)
    assert np.asarray(ours).tolist() == round_once(ref, BF16).tolist()


def test_initializers_default_to_the_policy_float():
    key = jax.random.key(0)
    assert hnn.initializers.lecun_normal()(key, (2, 2)).dtype == np.float32
    assert hnn.initializers.zeros(key, (3,)).dtype == np.float32
    with jax.enable_x64(True):
        assert hnn.initializers.ones(key, (2,)).dtype == np.float32
        assert jax.nn.initializers.ones(key, (2,)).dtype == np.float64  # JAX's rule, the contrast
    with policy.default_dtypes(float="bfloat16"):
        assert hnn.initializers.zeros(key, (4,)).dtype == BF16
    # a dtype given to the factory is kept
    assert (
        hnn.initializers.constant(0.1, dtype="bfloat16")(key, (2,)).tolist()
        == [float(round_once(np.array([0.1]), BF16)[0])] * 2
    )


# --- attention -------------------------------------------------------------------------------------


def _attention_ref(q, k, v, bias=None, causal=False):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias.astype(np.float64)
    if causal:
        t, s = logits.shape[-2:]
        logits = np.where(np.tril(np.ones((t, s), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


@pytest.mark.parametrize("causal", [False, True])
def test_dot_product_attention_against_float64(causal):
    transform = jax.jit  # eagerly: test_dot_product_attention_residual_and_gqa
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 32, 2, 16)).astype(BF16) for _ in range(3))
    bias = rng.standard_normal((1, 2, 32, 32)).astype(BF16)
    got = transform(lambda q, k, v, b: hnn.dot_product_attention(q, k, v, b, is_causal=causal))(
        q, k, v, bias
    )
    assert got.dtype == BF16
    ref = _attention_ref(q, k, v, bias, causal)
    # float32 logits (H products, exact), softmax over S, then S products with |v|
    vmax = np.abs(v.astype(np.float64)).max()
    tol = (16 + 32 + 16) * U32 * 4 * vmax
    assert not rounding_failures(got, ref, BF16, tol).any()
    # jax.nn rounds the probabilities to bfloat16 before they meet value (and needs standard
    # promotion for its own float32 logits + bfloat16 bias)
    with jax.numpy_dtype_promotion("standard"):
        theirs = transform(
            lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, b, is_causal=causal)
        )(q, k, v, bias)
    assert rounding_failures(theirs, ref, BF16, tol).any()


def test_dot_product_attention_residual_and_gqa(transform):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 8, 4, 8)).astype(F16)
    k, v = (rng.standard_normal((1, 8, 2, 8)).astype(F16) for _ in range(2))
    out, lse = transform(lambda q, k, v: hnn.dot_product_attention(q, k, v, return_residual=True))(
        q, k, v
    )
    assert out.dtype == lse.dtype == F16 and out.shape == (1, 8, 4, 8) and lse.shape == (1, 8, 4)
    kk, vv = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    ref = _attention_ref(q, kk, vv)
    assert not rounding_failures(out, ref, F16, 64 * U32 * 4).any()


def test_dot_product_attention_promotes_and_refuses():
    q = np.ones((1, 2, 1, 4), BF16)
    k = np.ones((1, 2, 1, 4), F16)
    assert hnn.dot_product_attention(q, k, k).dtype == np.float32
    e4 = np.ones((1, 2, 1, 4), ml_dtypes.float8_e4m3fn)
    e5 = np.ones((1, 2, 1, 4), ml_dtypes.float8_e5m2)
    with pytest.raises(policy.PromotionError, match="float8_e4m3fn with float8_e5m2") as e:
        hnn.dot_product_attention(e4, e5, e5)
    assert "heddle.astype(x, 'float16')" in str(e.value)
    fixed = hnn.dot_product_attention(e4.astype(F16), e5.astype(F16), e5.astype(F16))
    assert fixed.dtype == F16


def test_gradient_through_bfloat16_softmax():
    x = _random_bf16(64, 8)
    w = np.arange(64, dtype=np.float32).astype(BF16)
    g = jax.grad(lambda x: jnp.sum(hnn.softmax(x).astype(F32) * w.astype(F32)))(x)
    assert g.dtype == BF16
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    p = np.exp(x64 - x64.max())
    p /= p.sum()
    ref = p * (w64 - (p * w64).sum())
    assert np.abs(np.asarray(g, np.float64) - ref).max() <= 2.0**-8 * np.abs(ref).max() * 2


# --- errors ----------------------------------------------------------------------------------------


def test_scalar_out_of_range_is_refused():
    with pytest.raises(policy.ScalarRangeError, match="1e\\+39") as e:
        hnn.logsumexp(np.zeros(3, BF16), b=1e39)
    assert "float('inf')" in str(e.value)
    assert np.isinf(float(hnn.logsumexp(np.zeros(3, BF16), b=float("inf"))))


def test_promotion_error_through_standardize():
    x = np.ones(3, ml_dtypes.float8_e4m3fn)
    mean = np.ones((), ml_dtypes.float8_e5m2)
    with pytest.raises(policy.PromotionError, match="float8_e4m3fn with float8_e5m2") as e:
        hnn.standardize(x, mean=mean)
    assert "heddle.astype(x, 'float16')" in str(e.value)
    assert hnn.standardize(x.astype(F16), mean=mean.astype(F16)).dtype == F16


# --- the float32 formulas of heddle/ops/_formulas.py: values and gradients -------------------------


def _squareplus64(x, b=4.0):
    h = np.hypot(x, np.sqrt(b))
    return np.where(x >= 0, (x + h) / 2, b / (2 * (h - x)))


def test_squareplus_negative_tail_and_parameter(transform):
    x = np.array([-9136.0, -300.0, -1.5, 0.0, 2.0, 6e4], F16)
    for b in (4.0, 0.25):
        got = np.asarray(transform(lambda v, b=b: hnn.squareplus(v, b))(x))
        want = round_once(_squareplus64(x.astype(np.float64), b), F16)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    # JAX's own formula cancels: squareplus(-9136) is 0 in float32 and float16
    assert float(jax.nn.squareplus(np.float32(-9136))) == 0.0


def test_formula_gradients_are_the_derivatives(transform):
    # d/dx squareplus = (1 + x / sqrt(x^2 + b)) / 2; d/dx gelu_tanh = s + x s (1 - s) y'(x) with
    # s = sigmoid(2y), y = c (x + 0.044715 x^3), written out in float64
    x = np.array([-9136.0, -20.0, -4.64, -1.0, 0.0, 0.5, 3.0, 1e6], F32)
    x64 = x.astype(np.float64)
    g = np.asarray(transform(jax.vmap(jax.grad(lambda v: hnn.squareplus(v))))(x), np.float64)
    want = (1 + x64 / np.sqrt(x64 * x64 + 4)) / 2
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-12)
    c = np.sqrt(2 / np.pi)
    y = c * (x64 + 0.044715 * x64**3)
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-2 * y))
    dy = c * (1 + 3 * 0.044715 * x64**2)
    want = s + x64 * s * (1 - s) * 2 * dy
    g = np.asarray(transform(jax.vmap(jax.grad(lambda v: hnn.gelu(v))))(x), np.float64)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-12)
    assert np.isfinite(g).all()
