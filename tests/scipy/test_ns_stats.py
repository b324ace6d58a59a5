"""heddle.scipy.stats: the distributions, sem, mode, rankdata and gaussian_kde, by value.

Reference: each function's formula in NumPy / ``math`` float64 on the same narrow inputs, rounded
once to the narrow dtype by NumPy / ml_dtypes (float64 -> float16 and -> bfloat16 are single
roundings there). Elementwise functions match it bit for bit, except where the float64 value lies
within ``BAND`` (relative) of a midpoint between two neighbours of the narrow format: float32, the
compute dtype, cannot decide the rounding there, and either neighbour passes. Sums (``sem``, the
kernel density, ``multivariate_normal``) are bounded by what float32 partial sums and one final
rounding allow. Eager and under ``jax.jit``, bfloat16 and float16. Every function of every
distribution is checked for float32 computation in tests/scipy/test_ns_scipy.py (by its jaxpr:
compiling them all takes minutes); a sample runs here.
"""

from __future__ import annotations

import inspect
import math

import jax
import jax.scipy.stats as jst
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.stats as hs

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
DTYPES = [BF16, F16]
BAND = 2.0**-20  # 16 float32 ulps: JAX's float32 formulas here are within a few


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


def rounded_once(got, ref, d: np.dtype, band: float = BAND) -> np.ndarray:
    """Where ``got`` (of dtype ``d``) is the float64 ``ref`` rounded once to ``d`` (either
    neighbour within ``band`` of a midpoint); NaN matches NaN."""
    got = np.asarray(got)
    assert got.dtype == d, got.dtype
    ref = np.asarray(ref, np.float64)
    with np.errstate(all="ignore"):
        want = ref.astype(d)
        g, w = got.astype(np.float64), want.astype(np.float64)
        same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(g) & np.isnan(w))
        u = _ulp(w, d)
        tie = np.abs(np.abs(ref - w) - u / 2) <= band * np.abs(ref)
        return same | (tie & (np.abs(g - ref) <= u))


N = 24
U = np.linspace(0.05, 0.95, N)
R = np.linspace(-3.0, 3.0, N)
POS = np.linspace(0.1, 6.0, N)
K = np.arange(N) % 8.0
_lgamma = np.vectorize(math.lgamma)


def _z(x, loc, scale):
    return (x - loc) / scale


# (distribution, function, first argument, parameters, float64 formula): the sample that runs
SAMPLE = [
    ("cauchy", "logpdf", R, (0.5, 2.0), lambda x, loc, s: -np.log(np.pi * s) - np.log1p(_z(x, loc, s) ** 2)),
    ("cauchy", "isf", U, (0.5, 2.0), lambda q, loc, s: loc + s * np.tan(np.pi * (0.5 - q))),
    ("expon", "logsf", POS, (0.0, 1.5), lambda x, loc, s: -_z(x, loc, s)),
    ("gumbel_r", "logcdf", R, (0.5, 2.0), lambda x, loc, s: -np.exp(-_z(x, loc, s))),
    ("gumbel_l", "ppf", U, (0.5, 2.0), lambda p, loc, s: loc + s * np.log(-np.log1p(-p))),
    ("wrapcauchy", "pdf", POS, (0.5,), lambda x, c: (1 - c * c) / (2 * np.pi * (1 + c * c - 2 * c * np.cos(x)))),
    ("poisson", "logpmf", K, (2.5, 0.0), lambda k, mu, loc: k * np.log(mu) - mu - _lgamma(k + 1)),
    ("t", "logpdf", R, (3.0, 0.5, 2.0), lambda x, df, loc, s: (
        _lgamma((df + 1) / 2) - _lgamma(df / 2) - 0.5 * np.log(df * np.pi) - np.log(s)
        - (df + 1) / 2 * np.log1p(_z(x, loc, s) ** 2 / df)
    )),
]  # fmt: skip
EAGER = {("cauchy", "logpdf"), ("t", "logpdf")}


def _inputs(d: np.dtype) -> list[tuple[str, str, dict, np.ndarray]]:
    """(distribution, function, its arguments in ``d``, the float64 reference) for the sample."""
    out = []
    for dist, name, first, params, formula in SAMPLE:
        names = list(inspect.signature(getattr(getattr(jst, dist), name)).parameters)
        args = [first.astype(d), *(np.asarray(v).astype(d) for v in params)]
        ref = formula(*(a.astype(np.float64) for a in args))
        out.append((dist, name, dict(zip(names, args, strict=False)), ref))
    return out


def test_sample_of_distribution_functions_rounds_float64_values_once():
    calls = {d.name: _inputs(d) for d in DTYPES}

    def ours(kws):
        return {
            k: [
                getattr(getattr(hs, dist), name)(**kw)
                for (dist, name, _, _), kw in zip(calls[k], v, strict=True)
            ]
            for k, v in kws.items()
        }

    kws = {k: [kw for _, _, kw, _ in v] for k, v in calls.items()}
    jitted = jax.jit(ours)(kws)
    for d in DTYPES:
        for (dist, name, kw, ref), got in zip(calls[d.name], jitted[d.name], strict=True):
            ok = rounded_once(got, ref, d)
            assert ok.all(), (d, dist, name, np.asarray(got)[~ok], ref[~ok])
            if (dist, name) in EAGER:
                eager = np.asarray(getattr(getattr(hs, dist), name)(**kw))
                np.testing.assert_array_equal(
                    eager.view(np.uint16), np.asarray(got).view(np.uint16)
                )


def test_integer_counts_and_python_numbers():
    k = np.arange(6, dtype=np.int32)
    # integers and Python numbers: the default float
    assert jax.eval_shape(lambda k: hs.binom.pmf(k, 5, 0.5), k).dtype == F32
    p = np.full(6, 0.5, BF16)
    out = hs.binom.pmf(k, 5, p)
    assert out.dtype == BF16  # an integer count meeting a bfloat16 p: bfloat16
    assert rounded_once(out, [math.comb(5, i) / 32 for i in k], BF16).all()
    # multinomial's counts stay integers (JAX requires it), the probabilities set the dtype
    pm = np.array([0.25, 0.75], F16)
    got = hs.multinomial.logpmf(np.array([2, 3], np.int32), 5, pm)
    assert got.dtype == F16
    assert rounded_once(got, math.log(math.comb(5, 2) * 0.25**2 * 0.75**3), F16).all()


@pytest.mark.parametrize(
    ("d", "transform"), [(BF16, lambda f: f), (F16, jax.jit)], ids=["bfloat16-eager", "float16-jit"]
)
def test_multivariate_normal_and_dirichlet(d, transform):
    x = np.array([[0.25, -0.5, 1.0], [1.5, 0.75, -0.25]], d)
    mean = np.array([0.125, 0.0, -0.25], d)
    cov = np.array([[2.0, 0.5, 0.25], [0.5, 1.5, 0.0], [0.25, 0.0, 1.0]], d)
    got = transform(hs.multivariate_normal.logpdf)(x, mean, cov)
    x64, m64, c64 = (a.astype(np.float64) for a in (x, mean, cov))
    r = x64 - m64
    maha = np.einsum("ni,ij,nj->n", r, np.linalg.inv(c64), r)
    ref = -0.5 * (3 * np.log(2 * np.pi) + np.log(np.linalg.det(c64)) + maha)
    assert got.dtype == d
    assert rounded_once(got, ref, d, band=2.0**-18).all(), (np.asarray(got), ref)
    xs = np.array([0.125, 0.375, 0.5], d)
    alpha = np.array([1.5, 2.0, 3.5], d)
    got = transform(hs.dirichlet.logpdf)(xs, alpha)
    a64, x64 = alpha.astype(np.float64), xs.astype(np.float64)
    ref = math.lgamma(a64.sum()) - sum(map(math.lgamma, a64)) + np.sum((a64 - 1) * np.log(x64))
    assert got.dtype == d
    assert rounded_once(got, ref, d, band=2.0**-18).all()


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_sem_sums_in_float32(transform):
    rng = np.random.default_rng(0)
    a = (1000 + rng.standard_normal((2, 20_000))).astype(F16)
    got = transform(lambda v: hs.sem(v, axis=1))(a)
    assert got.dtype == F16
    a64 = a.astype(np.float64)
    ref = a64.std(axis=1, ddof=1) / math.sqrt(a.shape[1])
    # float32 partial sums of 20,000 terms: far below a float16 ulp of the result
    assert rounded_once(got, ref, F16, band=2.0**-12).all(), (np.asarray(got), ref)
    assert hs.sem(np.arange(10, dtype=np.int8)).dtype == F32


def _dtype(fn, *args):
    """The result dtype of ``fn(*args)``, traced only."""
    return np.dtype(jax.eval_shape(fn, *args).dtype)


def test_mode_copies_values_and_counts_in_int32():
    a = np.array([[0.1, 0.1, 0.3], [0.2, 0.3, 0.3]], BF16).T
    out = hs.mode(a, axis=0)
    assert out.mode.dtype == BF16 and out.count.dtype == np.int32
    want = a[[0, 1], [0, 1]]
    np.testing.assert_array_equal(np.asarray(out.mode).view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(out.count, [2, 2])
    traced = jax.eval_shape(jax.jit(lambda v: hs.mode(v, axis=0)), a)
    assert traced.mode.dtype == BF16 and traced.count.dtype == np.int32
    with jax.enable_x64(True):
        out = jax.eval_shape(hs.mode, np.array([1, 1, 2], np.int8))
        assert out.count.dtype == np.int32 and out.mode.dtype == np.int8  # JAX: an int64 count


def test_rankdata_is_float32_ranks():
    a = np.array([3.0, 1.0, 3.0, 2.0], BF16)
    got = hs.rankdata(a)
    np.testing.assert_array_equal(got, [3.5, 1.0, 3.5, 2.0])
    assert got.dtype == F32
    assert _dtype(jax.jit(lambda v: hs.rankdata(v, method="min")), a) == F32
    with jax.enable_x64(True):
        assert _dtype(jst.rankdata, a) == np.float64
        assert _dtype(hs.rankdata, a) == F32  # the policy's float, not float64


def _kde64(data: np.ndarray, pts: np.ndarray, low: float, high: float) -> dict[str, np.ndarray]:
    """Scott's rule Gaussian kernel density of one-dimensional ``data``, in float64."""
    d = data.astype(np.float64)
    var = d.var(ddof=1) * len(d) ** (-2 / 5)
    kernel = np.exp(-((pts.astype(np.float64)[:, None] - d) ** 2) / (2 * var))
    density = kernel.mean(axis=1) / math.sqrt(2 * math.pi * var)
    cdf = np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2)))
    sigma = math.sqrt(var)
    box = np.mean(cdf((high - d) / sigma) - cdf((low - d) / sigma))
    return {"evaluate": density, "logpdf": np.log(density), "integrate_box_1d": box}


def test_gaussian_kde_holds_float32_state_and_rounds_each_output_once():
    rng = np.random.default_rng(1)
    data = rng.standard_normal(400).astype(BF16)
    kde = hs.gaussian_kde(data)
    assert kde.dataset.dtype == F32 and kde.result_dtype == BF16
    pts = np.linspace(-2, 2, 9).astype(BF16)
    want = _kde64(data, pts, -1.0, 0.5)
    got = {
        "evaluate": kde.evaluate(pts),
        "logpdf": kde.logpdf(pts),
        "integrate_box_1d": kde.integrate_box_1d(-1.0, 0.5),
    }
    for name, value in got.items():
        assert value.dtype == BF16, name
        # 400 float32 terms: well inside a bfloat16 rounding
        assert rounded_once(value, want[name], BF16, band=2.0**-14).all(), name
    np.testing.assert_array_equal(kde.pdf(pts), got["evaluate"])
    np.testing.assert_array_equal(kde(pts), got["evaluate"])
    # a pytree: an argument of a traced function, with its result dtype
    assert _dtype(jax.jit(lambda k, p: k.evaluate(p)), kde, pts) == BF16
    sample = jax.eval_shape(lambda k: k.resample(jax.random.key(0), shape=(5,)), kde)
    assert sample.shape == (1, 5) and sample.dtype == BF16
    assert _dtype(lambda k: k.integrate_kde(k), kde) == BF16
    g = lambda k: k.integrate_gaussian(np.array([0.0], F32), np.array([[1.0]], F32))
    assert _dtype(g, kde) == F32  # a float32 operand: the promotion, float32
    with pytest.raises(NotImplementedError):
        kde.integrate_box(0.0, 1.0)


def test_gaussian_kde_promotes_its_dataset_and_weights():
    data = np.linspace(-1, 1, 50).astype(F16)
    x = np.array([0.0], F16)
    w = np.linspace(1, 2, 50).astype(np.float32)
    assert _dtype(lambda d, w: hs.gaussian_kde(d, weights=w).evaluate(x), data, w) == F32
    assert _dtype(lambda d: hs.gaussian_kde(d, bw_method=0.5).logpdf(x), data) == F16
    assert _dtype(lambda d: hs.gaussian_kde(d).evaluate(x), data.astype(np.int32)) == F32
