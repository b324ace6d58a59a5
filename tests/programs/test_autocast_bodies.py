"""autocast inside the bodies JAX's library builds: generic ``reduce`` bodies, attention's dot
algorithm, a library call's ``scan`` carry. References are float64 NumPy or exact arithmetic, eager
and under ``jax.jit``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import heddle
import heddle.numpy as hnp
import heddle.scipy.special
import heddle.scipy.stats

E8M0 = jnp.float8_e8m0fnu


def _both(fn):
    f = heddle.autocast(fn)
    return [f, jax.jit(f)]


# -- 1. float8_e8m0fnu reductions: JAX builds a generic ``reduce`` with a NaN identity ----------


POWERS = np.array([2.0**k for k in range(-1, 11)])  # 0.5 ... 1024, all exact in e8m0


@pytest.mark.parametrize(
    "fn, exact",
    [
        (jnp.sum, POWERS.sum()),  # 2047.5, rounded once: 2048
        (jnp.max, POWERS.max()),
        (jnp.min, POWERS.min()),
    ],
    ids=["sum", "max", "min"],
)
def test_e8m0_reductions(fn, exact):
    x = jnp.asarray(POWERS, E8M0)
    want = np.float64(np.float64(exact).astype(ml_dtypes.float8_e8m0fnu))
    for f in _both(fn):
        out = f(x)
        assert out.dtype == E8M0
        assert float(out) == want, (fn.__name__, float(out), want)


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("ddof", [0, 1])
def test_e8m0_var_and_std(name, ddof):
    # JAX builds ddof and its N - ddof > 0 test from 0 in the input dtype, which e8m0 cannot hold
    # (NaN): every result was NaN; jnp.var and jnp.std are known calls now, computed as heddle's
    x = jnp.asarray(POWERS, E8M0)
    exact = getattr(np, name)(POWERS, ddof=ddof)  # float64
    want = np.float64(np.float64(exact).astype(ml_dtypes.float8_e8m0fnu))
    namespace = getattr(hnp, name)(x, ddof=ddof)
    assert float(namespace) == want
    for f in _both(lambda x: getattr(jnp, name)(x, ddof=ddof)):
        out = f(x)
        assert out.dtype == E8M0
        assert float(out) == want, (name, ddof, float(out), want)


@pytest.mark.parametrize("fn, pick", [(jnp.argmax, np.argmax), (jnp.argmin, np.argmin)])
def test_e8m0_argmax_and_argmin(fn, pick):
    # XLA's argmax of float8_e8m0fnu starts from -inf, which it holds as NaN: argmax was 0
    x = jnp.asarray(np.random.default_rng(0).permutation(POWERS), E8M0)
    for f in _both(fn):
        assert int(f(x)) == int(pick(np.asarray(x, np.float64)))


# The float8 formats: e8m0 has no zero and no infinity, e4m3fn / e4m3fnuz / e4m3b11fnuz none of the
# latter, so JAX's ``max(-inf, x)`` guard in softmax and logsumexp is ``max(NaN, x)`` there.
FLOAT8 = [
    jnp.float8_e4m3fn,
    jnp.float8_e4m3fnuz,
    jnp.float8_e4m3b11fnuz,
    jnp.float8_e5m2,
    jnp.float8_e8m0fnu,
]


def _bracket(ref: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The two finite values of ``dtype`` around each of ``ref`` (every bit pattern, as float64)."""
    bits = np.arange(256, dtype=np.uint8).view(np.dtype(dtype)).astype(np.float64)
    held = np.unique(bits[np.isfinite(bits)])
    hi = np.clip(np.searchsorted(held, ref), 0, len(held) - 1)
    lo = np.clip(np.searchsorted(held, ref, side="right") - 1, 0, len(held) - 1)
    return held[lo], held[hi]


@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ["logsumexp", "softmax"])
def test_float8_softmax_and_logsumexp_round_the_exact_value(name, dtype):
    # before: logsumexp of float8_e8m0fnu was NaN, softmax of float8_e4m3fn NaN in some rows,
    # changing from run to run under jax.jit
    rng = np.random.default_rng(0)
    x = np.asarray(jnp.asarray(np.abs(rng.standard_normal((64, 16))) + 0.5, dtype))
    x64 = x.astype(np.float64)  # the values the format holds
    m = x64.max(axis=-1, keepdims=True)
    e = np.exp(x64 - m)
    if name == "softmax":
        fn, ref = jax.nn.softmax, e / e.sum(axis=-1, keepdims=True)
    else:
        fn, ref = lambda x: jax.nn.logsumexp(x, axis=-1), np.log(e.sum(axis=-1)) + m[:, 0]
    lo, hi = _bracket(ref, dtype)
    for f in _both(fn):
        out = np.asarray(f(x))
        assert out.dtype == np.dtype(dtype)
        got = out.astype(np.float64)
        # float32 arithmetic rounded once: one of the two values around the exact one
        assert np.all((got == lo) | (got == hi)), f


@pytest.mark.parametrize(
    "dtype", [jnp.float8_e4m3fn, jnp.float8_e8m0fnu], ids=["e4m3fn", "e8m0fnu"]
)
@pytest.mark.parametrize(
    "fn",
    [lambda x: jnp.maximum(x, jnp.nan), lambda x: lax.min(x, jnp.asarray(jnp.nan, x.dtype))],
    ids=["maximum", "lax.min"],
)
def test_a_nan_the_code_writes_stays_nan_in_float8(fn, dtype):
    # only JAX's max(-inf, reduce_max(x)) guard takes the reduction: a NaN operand the code wrote
    # propagates, as NumPy's maximum does and POLICY.md's "NaN stays NaN" (it was dropped)
    x = jnp.asarray([0.5, 1.0, 2.0, 4.0], dtype)
    for f in _both(fn):
        assert np.isnan(np.asarray(f(x), np.float32)).all()


def test_generic_reduce_keeps_an_init_value_that_is_not_the_identity():
    x = jnp.full((1000,), 0.1, jnp.bfloat16)
    init = np.asarray(1.0, jnp.bfloat16)

    def f(x):
        return lax.reduce(x, init, lax.add, (0,))

    want = 1.0 + 1000 * float(np.float64(np.asarray(x[0], np.float64)))
    for g in _both(f):
        out = g(x)
        assert out.dtype == jnp.bfloat16
        assert float(out) == float(np.float64(want).astype(jnp.bfloat16))


# -- 2. float16 attention: JAX asks for the F16_F16_F32 algorithm, which XLA:CPU lacks -------------


def _attention64(q, k, v):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    logits -= logits.max(-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


@pytest.fixture
def standard():
    """JAX's standard promotion (the suite runs strict): jax.nn's attention promotes with float32."""
    with jax.numpy_dtype_promotion("standard"):
        yield


@pytest.mark.parametrize("length", [1, 7, 64])
def test_float16_attention(standard, length):
    rng = np.random.default_rng(length)
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, 4, 16)), jnp.float16) for _ in range(3))
    ref = _attention64(q, k, v)
    # float32 accumulation: the output rounded once to float16, and the probabilities, which the
    # library rounds to float16 before the second product, each off by half a float16 ulp
    bound = 2.0**-11 * (np.abs(ref) + np.abs(np.asarray(v, np.float64)).max()) + 1e-6
    for f in _both(jax.nn.dot_product_attention):
        out = f(q, k, v)
        assert out.dtype == jnp.float16
        err = np.abs(np.asarray(out, np.float64) - ref)
        assert (err <= bound).all(), err.max()


# -- 3. a library call's scan carries float32 between steps ---------------------------------------


def test_polyval_scan_carry_stays_float32():
    rng = np.random.default_rng(0)
    c = jnp.asarray(rng.normal(size=12), jnp.bfloat16)
    x = jnp.asarray(rng.uniform(-1.5, 1.5, size=256), jnp.bfloat16)
    ref = np.polyval(np.asarray(c, np.float64), np.asarray(x, np.float64))
    for f in _both(jnp.polyval):
        out = f(c, x)
        assert out.dtype == jnp.bfloat16
        rel = np.abs(np.asarray(out, np.float64) - ref) / np.abs(ref)
        assert rel.max() <= 0.0051, rel.max()
        assert (np.asarray(out) == ref.astype(jnp.bfloat16)).mean() == 1.0


def test_polyval_gradient_runs_with_float32_carry():
    c = jnp.asarray([0.5, -1.25, 2.0, 0.75], jnp.bfloat16)
    x = jnp.asarray(np.linspace(-1, 1, 9), jnp.bfloat16)

    def loss(x):
        return jnp.polyval(c, x).astype(jnp.float32).sum()

    der = np.polyval(np.polyder(np.asarray(c, np.float64)), np.asarray(x, np.float64))
    for g in (jax.grad(heddle.autocast(loss)), jax.jit(jax.grad(heddle.autocast(loss)))):
        out = g(x)
        assert out.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(out, np.float64), der, rtol=2**-7, atol=2**-7)


def test_a_users_scan_keeps_its_narrow_carry():
    # the program's own loop: each step computed in float32, the carry stored in bfloat16
    def f(x):
        return lax.scan(lambda s, _: (s + x, None), jnp.zeros((), jnp.bfloat16), None, length=1000)[
            0
        ]

    x = jnp.asarray(0.1, jnp.bfloat16)
    s = np.float32(0)
    for _ in range(1000):
        s = np.float32(np.float32(s) + np.float32(np.asarray(x, np.float32))).astype(jnp.bfloat16)
    for g in _both(f):
        assert float(g(x)) == float(s)


# -- 4. custom_linear_solve: its bodies under the rules, the LU factors' float32 values inside ------


def _system():
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(64, 64)) + 8 * np.eye(64), jnp.bfloat16)
    b = jnp.asarray(rng.normal(size=(64,)), jnp.bfloat16)
    return a, b


def test_bfloat16_solve_is_correctly_rounded():
    a, b = _system()
    ref = np.linalg.solve(np.asarray(a, np.float64), np.asarray(b, np.float64))
    for f in _both(jnp.linalg.solve):
        out = f(a, b)
        assert out.dtype == jnp.bfloat16
        assert (np.asarray(out) == ref.astype(jnp.bfloat16)).mean() == 1.0


def test_bfloat16_inv_is_rounded_once():
    a, _ = _system()
    ref = np.linalg.inv(np.asarray(a, np.float64))
    for f in _both(jnp.linalg.inv):
        out = f(a)
        assert out.dtype == jnp.bfloat16
        assert (np.asarray(out) == ref.astype(jnp.bfloat16)).mean() >= 0.999


def _tensor_system():
    a, _ = _system()
    return a.reshape(8, 8, 8, 8), jnp.asarray(np.random.default_rng(3).normal(size=(8, 8)), a.dtype)


LINALG = {  # the other linalg functions built on custom_linear_solve (jax.numpy, heddle.numpy)
    "cond": (lambda xp, a, t, b: xp.linalg.cond(a), lambda a: np.linalg.cond(a)),
    "matrix_power(-3)": (
        lambda xp, a, t, b: xp.linalg.matrix_power(a, -3),
        lambda a: np.linalg.matrix_power(a, -3),
    ),
    "tensorinv": (
        lambda xp, a, t, b: xp.linalg.tensorinv(t, ind=2),
        lambda a: np.linalg.tensorinv(a.reshape(8, 8, 8, 8), ind=2),
    ),
    "tensorsolve": (
        lambda xp, a, t, b: xp.linalg.tensorsolve(t, b),
        lambda a: np.linalg.tensorsolve(a.reshape(8, 8, 8, 8), _tensor_system()[1].astype(float)),
    ),
    "slogdet": (lambda xp, a, t, b: xp.linalg.slogdet(a)[1], lambda a: np.linalg.slogdet(a)[1]),
}


@pytest.mark.parametrize("name", list(LINALG))
def test_bfloat16_linalg_through_custom_linear_solve(name):
    """Under autocast these are heddle.numpy.linalg's bits, eagerly and jitted, and as correctly
    rounded (before: their solves ran bf16 x bf16 -> bf16 inside custom_linear_solve)."""
    f, ref = LINALG[name]
    a, _ = _system()
    t, b = _tensor_system()
    want = np.asarray(f(hnp, a, t, b))
    exact = np.asarray(ref(np.asarray(a, np.float64))).astype(jnp.bfloat16)
    assert (want == exact).mean() >= 0.99, (name, (want == exact).mean())
    for g in _both(lambda a, t, b: f(jnp, a, t, b)):
        got = np.asarray(g(a, t, b))
        assert got.dtype == want.dtype == jnp.bfloat16
        np.testing.assert_array_equal(got, want)


def test_bfloat16_solve_gradient():
    a, b = _system()
    loss = heddle.autocast(lambda a, b: jnp.linalg.solve(a, b).astype(jnp.float32).sum())
    ga, gb = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b)
    a64 = np.asarray(a, np.float64)
    gb64 = np.linalg.solve(a64.T, np.ones(64))
    ga64 = -np.outer(gb64, np.linalg.solve(a64, np.asarray(b, np.float64)))
    assert ga.dtype == gb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(gb, np.float64), gb64, rtol=2**-7, atol=1e-4)
    np.testing.assert_allclose(np.asarray(ga, np.float64), ga64, rtol=2**-7, atol=1e-4)


# -- 5. a library call's helpers: a nested jitted body, a cond, a scan's constants -------------


def _bits(x):
    return np.asarray(x, np.float32)


def _cases(rng, dt):
    X = jnp.asarray(rng.standard_normal((80, 25)), dt)
    mask = jnp.asarray(rng.random((80, 25)) > 0.3)
    x, y = (jnp.asarray(rng.standard_normal((4, 50)), dt) for _ in range(2))
    xp = jnp.asarray(np.sort(rng.random(50) * 2), dt)
    fp = jnp.asarray(rng.standard_normal(50), dt)
    xq = jnp.asarray(rng.random(500) * 6 - 3, dt)
    hnp, hnn = heddle.numpy, heddle.nn
    return {
        # jnp.where's jitted _where inside softmax: its body has no caller of its own
        "softmax(where=)": (
            lambda X, m: jax.nn.softmax(X, axis=1, where=m),
            lambda X, m: hnn.softmax(X, axis=1, where=m),
            (X, mask),
        ),
        # jnp.diagonal's cond per platform, then the division by the standard deviations
        "corrcoef(x, y)": (jnp.corrcoef, hnp.corrcoef, (x, y)),
        "corrcoef(rowvar=False)": (
            lambda x: jnp.corrcoef(x, rowvar=False),
            lambda x: hnp.corrcoef(x, rowvar=False),
            (x,),
        ),
        # searchsorted's scan over the periodic sample points
        "interp(period=)": (
            lambda q, p, f: jnp.interp(q, p, f, period=2.0),
            lambda q, p, f: hnp.interp(q, p, f, period=2.0),
            (xq, xp, fp),
        ),
    }


CASES = ["softmax(where=)", "corrcoef(x, y)", "corrcoef(rowvar=False)", "interp(period=)"]


@pytest.mark.parametrize("dt", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", CASES)
def test_a_calls_helper_bodies_keep_its_float32_intermediates(case, dt):
    """A library call whose intermediates cross a nested jitted helper, a cond or a scan is one op:
    autocast gives heddle's bits (before: softmax(where=) 340 of 2,000 bf16 outputs differed,
    corrcoef(x, y) 24 of 64, rowvar=False 802 of 2,500, interp(period=) 45 of 500)."""
    jax_fn, heddle_fn, args = _cases(np.random.default_rng(0), dt)[case]
    got = jax.jit(heddle.autocast(jax_fn))(*args)
    want = jax.jit(heddle_fn)(*args)
    np.testing.assert_array_equal(_bits(got), _bits(want))


# -- custom_jvp functions inside one library call ---------------------------------------------------
# ``xlogy`` inside ``rel_entr``, ``_xlogx`` around it, the custom_jvp pieces of scipy.stats' log
# densities: one op with the rest of the call, their results kept at float32 until the call's
# output. Before, each rounded its result first: bfloat16 / float16 inputs (of 65,536) that differed
# from heddle's namespace: rel_entr 6,511 / 6,002, kl_div 3,551 / 4,570, gamma.logpdf(x, 2.5)
# 5,362 / 5,835, poisson.logpmf 5,203 / 4,604; jax.grad of logaddexp 801 / 5,121.

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)


def _patterns(dtype):
    return np.arange(2**16, dtype=np.uint16).view(dtype)


def _differing(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    bad = got.view(np.uint16) != want.view(np.uint16)
    with np.errstate(invalid="ignore"):
        bad &= ~(np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
    return int(bad.sum())


_TWO = {
    "rel_entr": (jax.scipy.special.rel_entr, lambda: heddle.scipy.special.rel_entr),
    "kl_div": (jax.scipy.special.kl_div, lambda: heddle.scipy.special.kl_div),
}
_ONE = {
    "gamma.logpdf": (
        lambda v: jax.scipy.stats.gamma.logpdf(v, 2.5),
        lambda v: heddle.scipy.stats.gamma.logpdf(v, 2.5),
    ),
    "poisson.logpmf": (
        lambda v: jax.scipy.stats.poisson.logpmf(v, 3.0),
        lambda v: heddle.scipy.stats.poisson.logpmf(v, 3.0),
    ),
}


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(_TWO))
def test_custom_jvp_pieces_of_a_call_of_two_arrays_are_heddles(name, dtype):
    x = _patterns(dtype)
    y = np.random.default_rng(0).permutation(x)
    jfn, hfn = _TWO[name][0], _TWO[name][1]()
    assert _differing(jax.jit(heddle.autocast(jfn))(x, y), jax.jit(hfn)(x, y)) == 0


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(_ONE))
def test_custom_jvp_pieces_of_a_log_density_are_heddles(name, dtype):
    x = _patterns(dtype)
    jfn, hfn = _ONE[name]
    assert _differing(jax.jit(heddle.autocast(jfn))(x), jax.jit(hfn)(x)) == 0


def test_jax_grad_of_a_custom_jvp_call_is_heddles():
    x = _patterns(BF16)
    x = x[np.isfinite(x.astype(np.float32))]
    y = np.random.default_rng(1).permutation(x)
    got = jax.jit(jax.vmap(jax.grad(heddle.autocast(jnp.logaddexp))))(x, y)
    assert _differing(got, jax.jit(jax.vmap(jax.grad(hnp.logaddexp)))(x, y)) == 0


def test_bessel_jn_backward_has_no_narrow_loop_carried_sum():
    """jax.scipy.special.bessel_jn's backward pass sums a bfloat16 cotangent carried through a scan
    (``add_any`` in the loop): the audit finds it in the plain function (the check can fail) and
    nothing narrow under autocast, whose scan carries float32."""
    x = jnp.linspace(0.5, 8, 16).astype(jnp.bfloat16)
    f = lambda x: jnp.sum(jax.scipy.special.bessel_jn(x, v=3)[-1].astype(jnp.float32))
    with jax.numpy_dtype_promotion("standard"):  # JAX's bessel_jn mixes dtypes inside
        plain = heddle.audit(f, x, include_backward=True)
        ours = heddle.audit(heddle.autocast(f), x, include_backward=True)
    carried = [
        x for x in plain.findings if x.kind == "narrow_accumulation" and "scan" in x.primitive
    ]
    assert carried, plain
    assert ours.counts["narrow_accumulation"] == 0, ours
