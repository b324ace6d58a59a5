"""heddle.lax: contractions, reductions and scans accumulate in acc_dtype and round once (POLICY.md 5).

References are exact: inputs are chosen so that every float32 partial sum (or product) is exact in any
order, so the float32 result is the exact value and heddle's answer must be that value rounded once,
bit for bit; the float64 reference is exact too and is rounded once with an exact rounding function
(no ml_dtypes double rounding). Where that is not possible (random matrices), the bound is stated.
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
from _common import BF16, F16, F32, U32, round_once  # tests/ops is on sys.path
from jax import lax

import heddle.lax as hlax
from heddle import policy


def _exact_sum_inputs(n, dtype, seed):
    """Multiples of 1/16 in [-8, 8]: partial sums of up to 2**16 of them are exact in float32."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 129, n) / 16).astype(dtype)


# --- reductions and scans ------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "n"), [(BF16, 50_000), (F16, 4000)], ids=["bfloat16", "float16"])
def test_reduce_sum_rounds_the_exact_sum_once(transform, dtype, n):
    x = _exact_sum_inputs(n, dtype, 0) + dtype(8)  # all positive: the sum grows large
    exact = x.astype(np.float64).sum()
    got = transform(lambda v: hlax.reduce_sum(v, (0,)))(x)
    assert got.dtype == dtype
    assert float(got) == float(round_once(exact, dtype))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_cumsum_rounds_every_exact_prefix_once(transform, dtype):
    x = _exact_sum_inputs(20_000, dtype, 1)
    exact = np.cumsum(x.astype(np.float64))
    for reverse in (False, True):
        got = transform(lambda v: hlax.cumsum(v, 0, reverse))(x)
        want = round_once(
            exact if not reverse else np.cumsum(x.astype(np.float64)[::-1])[::-1], dtype
        )
        assert got.dtype == dtype
        assert np.array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))
    theirs = transform(lambda v: lax.cumsum(v, 0))(x)
    assert not np.array_equal(np.asarray(theirs), round_once(exact, dtype))


def test_cumprod_rounds_every_exact_prefix_once(transform):
    # factors 1.5 (at most 15 of them: 3**15 < 2**24), 2, 0.5 and 1: every prefix product is
    # exact in float32; bfloat16 holds only 8 bits of 3**k
    rng = np.random.default_rng(2)
    f = np.array([1.5] * 15 + [2.0] * 10 + [0.5] * 10 + [1.0] * 5)
    x = rng.permutation(f).astype(BF16)
    exact = np.cumprod(x.astype(np.float64))
    got = transform(lambda v: hlax.cumprod(v))(x)
    assert np.array_equal(np.asarray(got).view(np.uint16), round_once(exact, BF16).view(np.uint16))
    theirs = transform(lambda v: lax.cumprod(v))(x)
    assert not np.array_equal(np.asarray(theirs), round_once(exact, BF16))


def test_reduce_prod(transform):
    x = np.array([1.5] * 12 + [0.5] * 4, BF16)
    got = transform(lambda v: hlax.reduce_prod(v, (0,)))(x)
    assert got.dtype == BF16 and float(got) == float(round_once(1.5**12 / 16, BF16))


def test_cumlogsumexp_in_float32(transform):
    x = (np.random.default_rng(3).standard_normal(4096) * 4).astype(BF16)
    got = np.asarray(transform(lambda v: hlax.cumlogsumexp(v))(x), np.float64)
    x64 = x.astype(np.float64)
    ref = np.logaddexp.accumulate(x64)
    # float32 running log-sum-exp: each step a few ulps, n steps
    tol = 4 * np.arange(1, 4097) * U32 * (np.abs(ref) + 1)
    lo, hi = round_once(ref - tol, BF16), round_once(ref + tol, BF16)
    assert ((lo.astype(np.float64) <= got) & (got <= hi.astype(np.float64))).all()
    assert transform(lambda v: hlax.cumlogsumexp(v))(np.arange(3, dtype=np.int8)).dtype == F32


@pytest.mark.parametrize(
    ("fn", "want"),
    [
        (lambda v: hlax.reduce_sum(v, (0,)), np.int32),
        (lambda v: hlax.cumsum(v), np.int32),
        (lambda v: hlax.reduce_prod(v, (0,)), np.int32),
    ],
    ids=["reduce_sum", "cumsum", "reduce_prod"],
)
def test_integer_sums_return_the_accumulation_dtype(transform, fn, want):
    x = np.full(300, 100, np.int8)
    got = transform(fn)(x)
    assert got.dtype == want
    assert transform(fn)(np.full(4, 200, np.uint8)).dtype == np.uint32
    assert transform(fn)(np.ones(4, np.bool_)).dtype == np.int32


def test_integer_sums_do_not_wrap(transform):
    x = np.full(300, 100, np.int8)
    assert int(transform(lambda v: hlax.reduce_sum(v, (0,)))(x)) == 30_000
    assert int(transform(lambda v: hlax.cumsum(v))(x)[-1]) == 30_000
    assert int(transform(lambda v: lax.cumsum(v))(x)[-1]) != 30_000  # JAX wraps in int8


def test_integer_sums_stay_int32_under_x64():
    with jax.enable_x64(True):
        x = np.full(300, 100, np.int8)
        assert jax.jit(lambda v: hlax.reduce_sum(v, (0,)))(x).dtype == np.int32
        assert jax.jit(lambda v: hlax.cumsum(v))(x).dtype == np.int32


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_selections_are_jax_own(name):
    assert getattr(hlax, name) is getattr(lax, name)


@pytest.mark.parametrize(("dtype", "n"), [(BF16, 257), (F16, 2049)], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["reduce_max", "reduce_min"])
def test_reduce_max_and_min_count_ties_in_float32(transform, dtype, n, name):
    """The values are JAX's, bit for bit; the backward pass shares the cotangent among the n tied
    maxima by a count that JAX keeps in the input dtype (n is not a bfloat16/float16 value)."""
    rng = np.random.default_rng(3)
    x = _exact_sum_inputs(1000, dtype, 2)
    ours = transform(lambda v: getattr(hlax, name)(v, (0,)))(x)
    theirs = transform(lambda v: getattr(lax, name)(v, (0,)))(x)
    assert ours.dtype == dtype and ours.tobytes() == theirs.tobytes()
    ties = np.full(n, rng.choice([-1.0, 1.0]), dtype)

    def grad(fn):
        return transform(jax.grad(lambda v: fn(v, (0,)).astype(F32)))(ties)

    want = round_once(1.0 / n, dtype)  # each tie gets 1/n of the cotangent, rounded once
    got = grad(getattr(hlax, name))
    assert got.dtype == dtype and np.array_equal(np.asarray(got), np.full(n, want))
    assert not np.array_equal(np.asarray(grad(getattr(lax, name))), np.full(n, want))


# --- the generic reduce ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "computation",
    [lax.add, lambda a, b: a + b, lambda a, b: b + a],
    ids=["lax.add", "a+b", "b+a"],
)
def test_reduce_with_an_add_accumulates_in_float32(transform, computation):
    x = _exact_sum_inputs(50_000, BF16, 4) + BF16(8)
    exact = x.astype(np.float64).sum()
    got = transform(lambda v: hlax.reduce(v, BF16(0), computation, (0,)))(x)
    assert got.dtype == BF16
    assert float(got) == float(round_once(exact, BF16))
    got = transform(lambda v: hlax.reduce(v, 0.0, computation, (0,)))(x)  # a Python init value
    assert float(got) == float(round_once(exact, BF16))


def test_reduce_with_a_multiply(transform):
    x = np.array([1.5] * 12 + [0.5] * 4, BF16)
    got = transform(lambda v: hlax.reduce(v, BF16(1), lax.mul, (0,)))(x)
    assert float(got) == float(round_once(1.5**12 / 16, BF16))


def test_reduce_of_int8_with_add_returns_int32(transform):
    x = np.full(300, 100, np.int8)
    got = transform(lambda v: hlax.reduce(v, np.int8(0), lax.add, (0,)))(x)
    assert got.dtype == np.int32 and int(got) == 30_000


def test_reduce_with_other_computations_is_jax_own(transform):
    x = _exact_sum_inputs(100, BF16, 5)
    got = transform(lambda v: hlax.reduce(v, BF16(-np.inf), lax.max, (0,)))(x)
    assert got.dtype == BF16 and float(got) == float(x.astype(np.float64).max())

    # a computation that is not a bare add: JAX's own reduction, in the input dtype
    def fn(a, b):
        return a + b * BF16(2)

    ours = transform(lambda v: hlax.reduce(v, BF16(0), fn, (0,)))(x)
    theirs = transform(lambda v: lax.reduce(v, BF16(0), fn, (0,)))(x)
    assert ours.dtype == BF16 and float(ours) == float(theirs)
    # variadic reductions too
    pair = transform(lambda v: hlax.reduce((v, v), (BF16(0), BF16(0)), _pairwise_add, (0,)))(x)
    assert [p.dtype for p in pair] == [BF16, BF16]


def _pairwise_add(a, b):
    return (a[0] + b[0], a[1] + b[1])


def test_reduce_window_sum_pooling(transform):
    x = (_exact_sum_inputs(64 * 64, BF16, 6) + BF16(8)).reshape(64, 64)
    got = transform(lambda v: hlax.reduce_window(v, 0.0, lax.add, (16, 16), (16, 16), "VALID"))(x)
    exact = x.astype(np.float64).reshape(4, 16, 4, 16).sum(axis=(1, 3))
    assert got.dtype == BF16
    assert np.array_equal(np.asarray(got).view(np.uint16), round_once(exact, BF16).view(np.uint16))


def test_max_pooling_backward_sums_in_float32(transform):
    """One maximum selected by 2049 overlapping windows: select_and_scatter_add adds the 2049
    cotangents (0.0625 each, every float32 partial sum exact) and rounds once."""
    x = np.zeros(4097, BF16)
    x[2048] = 1

    def grad(reduce_window):
        pool = lambda v: reduce_window(v, -np.inf, lax.max, (2049,), (1,), "VALID")
        return transform(jax.grad(lambda v: (pool(v).astype(F32) * 0.0625).sum()))(x)

    got = grad(hlax.reduce_window)
    assert got.dtype == BF16
    assert float(got[2048]) == float(round_once(2049 * 0.0625, BF16)) == 128.0
    assert np.count_nonzero(np.asarray(got)) == 1
    assert float(grad(lax.reduce_window)[2048]) != 128.0  # JAX's sum in bfloat16
    # the forward values are JAX's, bit for bit
    v = _exact_sum_inputs(300, BF16, 8)
    ours = transform(lambda t: hlax.reduce_window(t, -np.inf, lax.max, (7,), (2,), "VALID"))(v)
    theirs = transform(lambda t: lax.reduce_window(t, -np.inf, lax.max, (7,), (2,), "VALID"))(v)
    assert ours.dtype == BF16 and ours.tobytes() == theirs.tobytes()


def test_heddle_autodiff_through_reduce_window():
    """heddle.autodiff.grad through a sum-pool (it traces the init value, which made reduce_window
    JAX's generic primitive, which has no reverse-mode derivative): the exact window counts."""
    from heddle import autodiff

    x = np.full((1, 1, 8, 8), 1.0, BF16)

    def pool(comp, init):
        return lambda v: hlax.reduce_window(v, init, comp, (1, 1, 3, 3), (1, 1, 1, 1), "VALID")

    def f(v):
        return pool(lax.add, 0.0)(v).astype(F32).sum()

    for transform in (lambda g: g, jax.jit):
        got = transform(autodiff.grad(f))(x)
        # each element's gradient: the number of 3x3 windows (of a 6x6 grid) covering it
        cover = np.array([min(i, 2, 7 - i, 5) + 1 for i in range(8)], np.float64)
        assert got.dtype == F32
        assert np.array_equal(np.asarray(got)[0, 0], np.outer(cover, cover))
        assert np.array_equal(np.asarray(transform(jax.grad(f))(x), F32), np.asarray(got))
    # a product-pool is JAX's generic reduce_window, which JAX cannot differentiate in reverse
    # mode; heddle.autodiff raises JAX's own error
    prod = pool(lax.mul, 1.0)
    for grad in (jax.grad, autodiff.grad):
        with pytest.raises(ValueError, match="Linearization failed"):
            grad(lambda v: prod(v).astype(F32).sum())(x)


# --- scatter accumulations -------------------------------------------------------------------------

SCATTER_DN = lax.ScatterDimensionNumbers((), (0,), (0,))
N_UPDATES = 4000


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["scatter_add", "scatter_sub"])
def test_scatter_add_and_sub_round_the_exact_sum_once(transform, dtype, name):
    """4000 updates of 1/16 into one slot: every float32 partial sum is exact (250)."""
    idx = np.zeros((N_UPDATES, 1), np.int32)
    upd = np.full(N_UPDATES, 0.0625, dtype)
    base = np.array([0.5, 3.0], dtype)
    sign = 1 if name == "scatter_add" else -1
    got = transform(lambda b, u: getattr(hlax, name)(b, idx, u, SCATTER_DN))(base, upd)
    assert got.dtype == dtype
    assert float(got[0]) == float(round_once(0.5 + sign * N_UPDATES * 0.0625, dtype))
    assert float(got[1]) == 3.0
    theirs = transform(lambda b, u: getattr(lax, name)(b, idx, u, SCATTER_DN))(base, upd)
    assert float(theirs[0]) != float(got[0])


def test_scatter_mul_rounds_the_product_once(transform):
    """200 factors 1 + 2**-7 into one slot: the float32 product is within 200 * 2**-24 (relative)
    of the exact one, far from a bfloat16 rounding boundary, so it rounds to the exact product's
    bfloat16 neighbour."""
    from fractions import Fraction

    n, f = 200, 1 + 2.0**-7
    exact = Fraction(f) ** n
    want = round_once(float(exact), BF16)
    vals = np.sort(np.unique(np.asarray([want], np.float64)))
    assert abs(float(exact) - float(vals[0])) > 0  # the reference is not itself a bfloat16 value
    idx = np.zeros((n, 1), np.int32)
    upd = np.full(n, f, BF16)
    got = transform(lambda u: hlax.scatter_mul(np.ones(1, BF16), idx, u, SCATTER_DN))(upd)
    assert got.dtype == BF16 and float(got[0]) == float(want)
    theirs = transform(lambda u: lax.scatter_mul(np.ones(1, BF16), idx, u, SCATTER_DN))(upd)
    assert float(theirs[0]) != float(want)


def test_integer_scatter_add_returns_int32(transform):
    idx = np.zeros((1000, 1), np.int32)
    got = transform(lambda u: hlax.scatter_add(np.zeros(1, np.int8), idx, u, SCATTER_DN))(
        np.ones(1000, np.int8)
    )
    assert got.dtype == np.int32 and int(got[0]) == 1000
    theirs = lax.scatter_add(np.zeros(1, np.int8), idx, np.ones(1000, np.int8), SCATTER_DN)
    assert int(theirs[0]) == 1000 - 1024  # JAX wraps in int8


# --- contractions ----------------------------------------------------------------------------------

DN = (((1,), (0,)), ((), ()))


def _bound(a, b, n):
    """float32 accumulation of n exact products, then one bfloat16 rounding."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64
    return exact, n * U32 * (np.abs(a64) @ np.abs(b64))


def _within(got, exact, tol, dtype):
    lo, hi = round_once(exact - tol, dtype), round_once(exact + tol, dtype)
    g = np.asarray(got).astype(np.float64)
    return ((lo.astype(np.float64) <= g) & (g <= hi.astype(np.float64))).all()


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b: hlax.dot_general(a, b, DN),
        lambda a, b: hlax.dot(a, b),
        lambda a, b: hlax.batch_matmul(a[None], b[None])[0],
    ],
    ids=["dot_general", "dot", "batch_matmul"],
)
def test_bfloat16_contraction_inner_4096(transform, call):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((8, 4096)).astype(BF16)
    b = rng.standard_normal((4096, 8)).astype(BF16)
    got = transform(call)(a, b)
    assert got.dtype == BF16
    exact, tol = _bound(a, b, 4096)
    assert _within(got, exact, tol, BF16)


def test_contraction_with_exact_partial_sums_is_bit_exact(transform):
    a = _exact_sum_inputs(4 * 1024, BF16, 8).reshape(4, 1024)
    b = np.ones((1024, 3), BF16)
    got = transform(lambda a, b: hlax.dot_general(a, b, DN))(a, b)
    want = round_once(a.astype(np.float64) @ b.astype(np.float64), BF16)
    assert np.array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_preferred_element_type_sets_the_result(transform):
    a = np.ones((2, 3), BF16)
    assert transform(lambda a: hlax.dot(a, a.T, preferred_element_type=F32))(a).dtype == F32
    f = transform(lambda a: hlax.dot_general(a, a.T, DN, preferred_element_type=BF16))
    assert f(np.ones((2, 3), F32)).dtype == BF16


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, ml_dtypes.int4, np.bool_])
def test_integer_contractions_return_the_accumulation_dtype(transform, dtype):
    hi = {np.int8: 100, np.uint8: 200, ml_dtypes.int4: 7, np.bool_: 1}[dtype]
    a = np.full((2, 300), hi, dtype)
    got = transform(lambda a: hlax.dot_general(a, a.T, (((1,), (0,)), ((), ()))))(a)
    want = np.uint32 if dtype is np.uint8 else np.int32
    assert got.dtype == want
    assert int(got[0, 0]) == 300 * int(hi) * int(hi)


def test_mixed_operands_promote(transform):
    a, b = np.ones((2, 3), BF16), np.ones((3, 2), F16)
    assert transform(lambda a, b: hlax.dot(a, b))(a, b).dtype == F32
    with pytest.raises(policy.PromotionError, match="float8_e4m3fn with float8_e5m2") as e:
        hlax.dot(np.ones((2, 2), ml_dtypes.float8_e4m3fn), np.ones((2, 2), ml_dtypes.float8_e5m2))
    assert "heddle.astype(x, 'float16')" in str(e.value)
    ok = hlax.dot(np.ones((2, 2), F16), np.ones((2, 2), ml_dtypes.float8_e5m2).astype(F16))
    assert ok.dtype == F16


def test_float64_preferred_type_needs_x64():
    a = np.ones((2, 2), F32)
    with pytest.raises(policy.PrecisionError, match="jax_enable_x64"):
        hlax.dot(a, a, preferred_element_type="float64")
    with jax.enable_x64(True):
        assert hlax.dot(a, a, preferred_element_type="float64").dtype == np.float64


def test_batch_matmul_shape_errors():
    with pytest.raises(ValueError, match="same rank >= 2") as e:
        hlax.batch_matmul(np.ones((2, 3, 4), F32), np.ones((3, 4, 5), F32))
    assert "heddle.numpy.matmul" in str(e.value)


def _precisions(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [
        e.params.get("precision")
        for e in jaxpr.eqns
        if e.primitive.name in ("dot_general", "conv_general_dilated")
    ]


def test_float32_contractions_run_at_highest_precision():
    a = np.ones((2, 2), F32)
    x = np.ones((1, 1, 8), F32)
    k = np.ones((1, 1, 3), F32)
    highest = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    assert _precisions(lambda a: hlax.dot(a, a), a) == [highest]
    assert _precisions(lambda x: hlax.conv(x, k, (1,), "VALID"), x) == [highest]
    # an explicit precision is the user's
    assert _precisions(lambda a: hlax.dot(a, a, precision=lax.Precision.DEFAULT), a) == [
        (lax.Precision.DEFAULT, lax.Precision.DEFAULT)
    ]
    # the policy can opt into reduced-precision passes (TF32 on NVIDIA GPUs)
    import dataclasses

    with policy.use(dataclasses.replace(policy.current(), float32_matmul_precision="default")):
        assert _precisions(lambda a: hlax.dot(a, a), a) == [None]


def test_heddle_tf32_environment_variable():
    code = (
        "import numpy as np, jax; import heddle.lax as h; from heddle import policy;"
        "print(policy.current().float32_matmul_precision);"
        "j = jax.make_jaxpr(lambda a: h.dot(a, a))(np.ones((2, 2), np.float32));"
        "print(j.eqns[0].params['precision'])"
    )
    env = {**os.environ, "HEDDLE_TF32": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["default", "None"]


# --- convolutions ----------------------------------------------------------------------------------


def _conv1d_ref(x, k):
    """Cross-correlation (lax.conv's convention) of [N, C, W] with [O, C, K], VALID, stride 1."""
    x64, k64 = x.astype(np.float64), k.astype(np.float64)
    n, _, w = x64.shape
    o, _, kw = k64.shape
    out = np.zeros((n, o, w - kw + 1))
    for j in range(w - kw + 1):
        out[:, :, j] = np.einsum("ncw,ocw->no", x64[:, :, j : j + kw], k64)
    abs_out = np.zeros_like(out)
    for j in range(w - kw + 1):
        abs_out[:, :, j] = np.einsum("ncw,ocw->no", np.abs(x64[:, :, j : j + kw]), np.abs(k64))
    return out, abs_out


@pytest.mark.parametrize(
    "call",
    [
        lambda x, k: hlax.conv(x, k, (1,), "VALID"),
        lambda x, k: hlax.conv_general_dilated(x, k, (1,), "VALID"),
        lambda x, k: hlax.conv_with_general_padding(x, k, (1,), [(0, 0)], None, None),
    ],
    ids=["conv", "conv_general_dilated", "conv_with_general_padding"],
)
def test_bfloat16_convolution_against_float64(transform, call):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 64, 32)).astype(BF16)
    k = rng.standard_normal((4, 64, 5)).astype(BF16)
    got = transform(call)(x, k)
    assert got.dtype == BF16
    exact, mag = _conv1d_ref(x, k)
    assert _within(got, exact, 64 * 5 * U32 * mag, BF16)


def test_conv_transpose_dtype_and_integer_accumulation(transform):
    x = np.full((1, 8, 2), 100, np.int8)  # NWC
    k = np.full((3, 2, 2), 100, np.int8)  # WIO
    got = transform(
        lambda x, k: hlax.conv_transpose(
            x, k, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC")
        )
    )(x, k)
    assert got.dtype == np.int32
    assert int(np.asarray(got).max()) == 3 * 2 * 100 * 100


def test_ragged_dot(transform):
    rng = np.random.default_rng(12)
    lhs = rng.standard_normal((6, 512)).astype(BF16)
    rhs = rng.standard_normal((2, 512, 3)).astype(BF16)
    sizes = np.array([4, 2], np.int32)
    got = transform(lambda a, b, g: hlax.ragged_dot(a, b, g))(lhs, rhs, sizes)
    assert got.dtype == BF16
    a64, b64 = lhs.astype(np.float64), rhs.astype(np.float64)
    exact = np.concatenate([a64[:4] @ b64[0], a64[4:] @ b64[1]])
    mag = np.concatenate([np.abs(a64[:4]) @ np.abs(b64[0]), np.abs(a64[4:]) @ np.abs(b64[1])])
    assert _within(got, exact, 512 * U32 * mag, BF16)
    i8 = np.full((6, 300), 100, np.int8), np.full((2, 300, 3), 100, np.int8)
    out = transform(lambda a, b, g: hlax.ragged_dot(a, b, g))(*i8, sizes)
    assert out.dtype == np.int32 and int(out[0, 0]) == 3_000_000


# --- entry points without an accumulation dtype of their own ---------------------------------------


def _narrow(f, *args):
    from test_sweep import narrow_accumulations  # tests/ops is on sys.path

    return narrow_accumulations(jax.make_jaxpr(f)(*args).jaxpr)


def test_conv_general_dilated_local_accumulates_in_float32(transform):
    """A 32x32 local filter (1024 terms): every partial sum is exact in float32, so the result is
    the exact value rounded once; forward and backward contractions accumulate in float32."""
    rng = np.random.default_rng(13)
    lhs = (rng.integers(1, 16, (1, 1, 32, 32)) / 16).astype(BF16)
    rhs = (rng.integers(1, 16, (1, 1024, 1, 1)) / 16).astype(BF16)
    exact = (lhs.astype(np.float64).reshape(-1) * rhs.astype(np.float64).reshape(-1)).sum()

    def local(a, b, fn=hlax.conv_general_dilated_local):
        return fn(a, b, (1, 1), "VALID", (32, 32))

    got = transform(local)(lhs, rhs)
    assert got.dtype == BF16 and float(got.reshape(-1)[0]) == float(round_once(exact, BF16))
    loss = lambda fn: lambda a, b: local(a, b, fn).astype(F32).sum()
    backward = lambda fn: jax.grad(loss(fn), argnums=(0, 1))
    assert _narrow(backward(hlax.conv_general_dilated_local), lhs, rhs) == set()
    # JAX leaves the accumulation of bfloat16 operands to the backend, forward and backward
    assert _narrow(backward(lax.conv_general_dilated_local), lhs, rhs) == {
        "dot_general",
        "conv_general_dilated",
    }


def test_conv_general_dilated_patches_copies_and_sums_its_backward_in_float32(transform):
    x = _exact_sum_inputs(2 * 24 * 24, BF16, 14).reshape(1, 2, 24, 24)

    def patches(v, fn=hlax.conv_general_dilated_patches):
        return fn(v, (9, 9), (1, 1), "VALID")

    ours = transform(patches)(x)
    theirs = transform(lambda v: patches(v, lax.conv_general_dilated_patches))(x)
    assert ours.dtype == BF16 and ours.tobytes() == theirs.tobytes()  # a copy, bit for bit

    def grad(fn):
        return jax.grad(lambda v: (patches(v, fn).astype(F32) * 0.0625).sum())

    g = transform(grad(hlax.conv_general_dilated_patches))(x)
    # an element at (i, j) is in (number of windows covering i) * (... j) patches
    cover = np.array([min(i, 8, 23 - i, 15) + 1 for i in range(24)], np.float64)
    want = round_once(np.outer(cover, cover) * 0.0625, BF16)
    assert g.dtype == BF16 and np.array_equal(np.asarray(g)[0, 0], want)
    assert _narrow(grad(hlax.conv_general_dilated_patches), x) == set()
    assert _narrow(grad(lax.conv_general_dilated_patches), x) == {"conv_general_dilated"}


def test_conv_general_dilated_patches_preferred_element_type(transform):
    x = _exact_sum_inputs(64, BF16, 15).reshape(1, 1, 8, 8)
    got = transform(
        lambda v: hlax.conv_general_dilated_patches(
            v, (2, 2), (1, 1), "VALID", preferred_element_type=np.float32
        )
    )(x)
    theirs = lax.conv_general_dilated_patches(x, (2, 2), (1, 1), "VALID")
    assert got.dtype == F32
    assert np.array_equal(np.asarray(got), np.asarray(theirs).astype(F32))


# --- collectives (8 host devices, in a subprocess) -------------------------------------------------


def test_collectives_sum_across_devices_in_float32_and_round_once(on_8_devices):
    """heddle.lax.psum/pmean/psum_scatter add a bfloat16 leaf across 8 devices in float32 and round
    once (POLICY.md 5; jax.lax.psum adds in bfloat16), leaf by leaf over a pytree; heddle.autodiff's
    float32 gradients all-reduce in float32."""
    import pathlib

    r = on_8_devices(pathlib.Path(__file__).with_name("_psum_devices.py"))
    assert r["devices"] == 8
    exact = 8 + 4 * 2.0**-7  # 8.03125: between the bfloat16 values 8 and 8.0625, nearer 8
    assert r["summed"] == ["bfloat16", 8.0]  # the exact sum rounded once
    # jax.lax.psum adds in bfloat16: which partial sums round depends on XLA's order
    assert r["narrow"][0] == "bfloat16" and r["narrow"][1] in (8.0, 8.0625)
    mean = 1.0  # exact / 8 = 1 + 2**-8, the tie between 1 and 1 + 2**-7: to even
    assert r["mean"] == ["bfloat16", mean]
    assert r["tree"] == [["bfloat16", 8.0], ["float32", exact], ["bfloat16", 16.0]]
    assert r["wide"] == ["float32", exact]
    assert r["scattered"] == ["bfloat16", 8.0]
    assert r["grad_sum"] == ["float32", exact]
    assert r["plain_grad_sum"][0] == "bfloat16" and r["plain_grad_sum"][1] in (8.0, 8.0625)
