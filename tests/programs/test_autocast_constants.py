"""autocast of a JAX function whose constants JAX builds in the input dtype, or whose float32 formula
heddle replaces, gives heddle's namespace bit for bit (docs/autocast.md, "Known library calls").

``jnp.log10`` of bfloat16 multiplies by ``1/ln 10`` as the bfloat16 0.43359375, ``jax.nn.selu`` by its
scale as 1.046875, ``jax.nn.leaky_relu`` by 0.01 as 0.010009765625; ``jnp.sinc``, ``jax.nn.squareplus``
and the subnormal tails of ``gelu``, ``arcsin``, ``silu``, ... are heddle's own formulas. Each such
call is recognised by what it traces to and evaluated as heddle's function: every bfloat16 and
float16 bit pattern (one array per dtype) under ``jax.jit``, and eagerly in one of the two. A call that
traces to anything else (another keyword, an array hyper-parameter, float32) is evaluated primitive
by primitive as before, and a program without such calls is rewritten as before.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import heddle
import heddle.lax
import heddle.nn
import heddle.numpy as hnp
import heddle.scipy.special
import heddle.scipy.stats

# JAX's own sici compares a float16 input with 1e9 (NumPy warns of the overflow while it traces)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
F32 = jnp.float32

# The class, with the inputs where autocast differed from heddle before they were recognised
# (bfloat16, float16; of 65,536 each; benchmarks/autocast_unary.py --primitive-by-primitive).
BEFORE = {
    "numpy.log10": (9678, 3391),
    "numpy.deg2rad": (1988, 12170),
    "numpy.radians": (1988, 12170),
    "numpy.rad2deg": (9926, 19506),
    "numpy.degrees": (9926, 19506),
    "numpy.unwrap": (2807, 3588),
    "numpy.sinc": (32357, 33800),
    "numpy.i0": (12, 0),
    "numpy.arcsin": (256, 0),
    "numpy.asin": (256, 0),
    "numpy.exp2": (1, 0),
    "numpy.cosh": (0, 2),
    "numpy.sinh": (0, 2),
    "numpy.frexp": (254, 0),
    "nn.gelu": (450, 1413),
    "nn.gelu_exact": (215, 2007),
    "nn.selu": (52358, 8224),
    "nn.leaky_relu": (5689, 7745),
    "nn.hard_sigmoid": (617, 6487),
    "nn.hard_silu": (587, 7410),
    "nn.squareplus": (23402, 8858),
    "nn.mish": (10142, 7370),
    "nn.silu": (11, 0),
    "scipy.special.i0": (12, 0),
    "scipy.special.i1": (12, 0),
    "scipy.special.erfcx": (3, 29),
    "scipy.special.erfinv": (2, 0),
    "scipy.special.sici": (3898, 37548),
    "scipy.special.gammaln": (3, 60),
    "scipy.special.loggamma": (3, 44),
    "scipy.special.digamma": (1, 17),
    "scipy.special.gamma": (1, 29),
    "lax.lgamma": (3, 60),
    "lax.digamma": (1, 17),
    "lax.asin": (256, 0),
    "lax.exp2": (1, 0),
    "lax.sinh": (0, 2),
    "lax.cosh": (0, 2),
    "lax.erf_inv": (2, 0),
    "scipy.stats.norm.pdf": (54, 3960),
    "scipy.stats.norm.logpdf": (188, 4012),
    "scipy.stats.logistic.pdf": (1104, 29194),
    "scipy.stats.cauchy.pdf": (1058, 11718),
    "scipy.stats.cauchy.logpdf": (30902, 6062),
    "scipy.stats.cauchy.cdf": (16138, 20368),
    "scipy.stats.cauchy.logcdf": (31969, 33064),
    "scipy.stats.cauchy.sf": (16138, 20368),
    "scipy.stats.cauchy.logsf": (31969, 33064),
    "scipy.stats.cauchy.ppf": (63965, 62634),
    "scipy.stats.cauchy.isf": (63965, 62634),
    "scipy.stats.gumbel_l.pdf": (743, 8037),
    "scipy.stats.gumbel_l.cdf": (472, 7383),
    "scipy.stats.gumbel_l.sf": (979, 9427),
    "scipy.stats.gumbel_l.ppf": (227, 1772),
    "scipy.stats.gumbel_r.pdf": (743, 8037),
    "scipy.stats.gumbel_r.cdf": (979, 9427),
    "scipy.stats.gumbel_r.logsf": (1260, 15763),
    "scipy.stats.gumbel_r.ppf": (1359, 3640),
    "scipy.stats.poisson.entropy": (16391, 15956),
}
NAMES = list(BEFORE)


def _attr(root, path):
    for part in path.split("."):
        root = getattr(root, part)
    return root


def functions(name):
    """(JAX's function, heddle's) for a name of the class."""
    if name == "nn.gelu_exact":
        return (
            functools.partial(jax.nn.gelu, approximate=False),
            functools.partial(heddle.nn.gelu, approximate=False),
        )
    return _attr(jax, name), _attr(heddle, name)


def patterns(dtype):
    """All 65,536 values of a 16-bit float format."""
    return np.arange(2**16, dtype=np.uint16).view(dtype)


def assert_same_bits(got, want, x=None):
    """Every output equal in its bits (any NaN matches any NaN); ``x``, the input, for messages."""
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        bits = np.dtype(f"u{g.dtype.itemsize}")
        bad = np.ravel(g.view(bits) != w.view(bits))
        if g.dtype.kind == "f" or g.dtype in (BF16,):
            with np.errstate(invalid="ignore"):
                bad &= ~np.ravel(np.isnan(g.astype(np.float32)) & np.isnan(w.astype(np.float32)))
        where = np.flatnonzero(bad)
        flat = np.arange(g.size) if x is None else np.ravel(x)
        examples = [(float(flat[i]), float(g.flat[i]), float(w.flat[i])) for i in where[:4]]
        assert where.size == 0, f"{where.size} inputs differ, (x, autocast, heddle): {examples}"


@pytest.fixture(scope="module")
def heddle_jit():
    """``jax.jit(heddle_fn)`` of each name, on every pattern of each dtype (computed once)."""
    cache = {}

    def get(name, dtype):
        if (name, dtype) not in cache:
            cache[name, dtype] = jax.jit(functions(name)[1])(patterns(dtype))
        return cache[name, dtype]

    return get


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", NAMES)
def test_jitted_autocast_is_heddle_on_every_pattern(name, dtype, heddle_jit):
    x = patterns(dtype)
    jfn, _ = functions(name)
    assert_same_bits(jax.jit(heddle.autocast(jfn))(x), heddle_jit(name, dtype), x)


@pytest.mark.parametrize("name", NAMES)
def test_eager_autocast_is_heddle(name, heddle_jit):
    # in the dtype where it differed on more inputs before
    dtype = BF16 if BEFORE[name][0] >= BEFORE[name][1] else F16
    x = patterns(dtype)
    assert_same_bits(heddle.autocast(functions(name)[0])(x), heddle_jit(name, dtype), x)


def _lax_elementwise():
    from heddle.ops import _lax

    return sorted(n for n, (kind, _) in _lax.LAX.items() if kind == "elementwise")


def _operands(name, dtype):
    """Every pattern as the first operand; a second one (atan2's, igamma's x) a permutation."""
    from heddle.ops import _lax

    x = patterns(dtype)
    n = len(_lax._operands(getattr(lax, name)))
    rest = [np.random.default_rng(k).permutation(x) for k in range(n - 1)]
    return (x, *rest)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", _lax_elementwise())
def test_every_lax_elementwise_function_under_autocast_is_heddle_lax(name, dtype):
    # the class of jax.lax functions heddle.lax computes in float32 (heddle's formula where
    # heddle.numpy has one): autocast of jax.lax's gives heddle.lax's bits on every pattern
    args = _operands(name, dtype)
    got = jax.jit(heddle.autocast(getattr(lax, name)))(*args)
    assert_same_bits(got, jax.jit(getattr(heddle.lax, name))(*args), args[0])


def test_squareplus_of_a_large_negative_float16():
    x = np.asarray([-9136.0], F16)
    got = jax.jit(heddle.autocast(jax.nn.squareplus))(x)
    assert float(got[0]) == pytest.approx(1.0943e-4, rel=1e-3)  # JAX's own cancels to 0


def test_the_class_is_the_known_calls():
    from heddle.programs import _known

    listed = {k.name for k in _known.KNOWN_CALLS}
    # reductions, swept in tests/programs/test_autocast_long_sweep.py
    reducing = {"numpy.cov", "numpy.corrcoef", "nn.logmeanexp", "numpy.var", "numpy.std"}
    # heddle's bits at their defaults; known for other alphas (test_autocast_hyperparameters.py)
    given_only = {"nn.elu", "nn.celu"}
    # an order with no default (test_autocast_hyperparameters.py)
    ordered = {"scipy.special.expn"}
    # swept on every pattern with the other unary functions, or with shape parameters given
    # (tests/programs/test_autocast_unary_sweep.py)
    swept = {
        "scipy.special.exp1",
        "scipy.special.expi",
        "scipy.stats.expon.logcdf",
        "scipy.stats.gumbel_l.logcdf",
        "scipy.stats.gamma.logsf",
        "scipy.stats.gamma.logcdf",
        "scipy.stats.chi2.logsf",
        "scipy.stats.chi2.logcdf",
        "scipy.stats.beta.logcdf",
        "scipy.stats.t.logpdf",
        "scipy.special.hyp1f1",
        "scipy.stats.t.pdf",
        "scipy.stats.vonmises.pdf",
        "scipy.stats.vonmises.logpdf",
    }
    # several array inputs (tests/programs/test_autocast_several_inputs.py)
    several = {k.name for k in _known.KNOWN_CALLS if len(k.inputs) > 1 or k.inputs[0] > 1}
    assert several == {
        "numpy.logaddexp2",
        "numpy.linalg.pinv",
        "numpy.linalg.matrix_rank",
        "numpy.linalg.lstsq",
        "numpy.polyfit",
        "numpy.cov",  # cov(x, y): test_cov_of_two_arrays_is_heddles
    }
    assert listed - reducing - given_only - ordered - several - swept == set(NAMES) - {
        "nn.gelu_exact"
    }
    gelu = next(k for k in _known.KNOWN_CALLS if k.name == "nn.gelu")
    assert {dict(v)["approximate"] for v in gelu.variants} == {True, False}
    for k in _known.KNOWN_CALLS:  # every name is JAX's and heddle's
        k.functions()
    # other names of the same JAX functions, recognised as them (before: 587 / 7,410 and 11 / 0)
    assert jax.nn.hard_swish is jax.nn.hard_silu and jax.nn.swish is jax.nn.silu


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_the_first_look_at_each_call_is_what_it_traces_to(dtype):
    # told from the kind of function (see _known.first_look); a wrong one would never recognise it
    from heddle.programs import _known

    for c in _known._candidates():
        entry, look = _known.first_look(c)
        params = inspect.signature(c.jax_fn).parameters
        required = [s for s in c.scalars if params[s].default is inspect.Parameter.empty]
        if required:  # expn's order, gamma's a, t's df: no default
            c = c.given(dict.fromkeys(required, 2))
        with jax.numpy_dtype_promotion("standard"):  # JAX's hyp1f1 mixes dtypes inside
            t = _known._trace(c, c.sample(3, dtype))
        assert t is not None and t.entry is entry, c
        assert look is None or look == _known._look(t.jaxpr.jaxpr.eqns[0]), c


# --- where nothing is recognised, nothing changes ----------------------------------------------------


_X = np.linspace(-6, 6, 4097).astype(BF16)
_SCALE = jnp.asarray(2.0, jnp.bfloat16)

# (scalar hyper-parameters other than the defaults are recognised with their values:
# tests/programs/test_autocast_hyperparameters.py)
OTHER_CALLS = {
    "norm.pdf(x, scale=array)": lambda x: jax.scipy.stats.norm.pdf(x, 0.0, _SCALE),
    "gelu(float32)": lambda x: jax.nn.gelu(x.astype(F32)),
}


@pytest.mark.parametrize("name", sorted(OTHER_CALLS))
def test_a_call_that_traces_to_other_equations_is_evaluated_as_before(name, without_known_calls):
    fn = OTHER_CALLS[name]
    with without_known_calls():
        before = jax.jit(heddle.autocast(fn))(_X)
    assert_same_bits(jax.jit(heddle.autocast(fn))(_X), before, _X)


def _mlp(p, x):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return jnp.mean(jax.nn.log_softmax(h @ p["w2"]))


def test_a_program_without_known_calls_is_rewritten_as_before(without_known_calls):
    rng = np.random.default_rng(0)
    p = {
        "w1": jnp.asarray(rng.normal(size=(16, 8)), jnp.bfloat16),
        "b1": jnp.zeros(8, jnp.bfloat16),
        "w2": jnp.asarray(rng.normal(size=(8, 4)), jnp.bfloat16),
    }
    x = jnp.asarray(rng.normal(size=(4, 16)), jnp.bfloat16)
    now = str(jax.make_jaxpr(jax.grad(heddle.autocast(_mlp)))(p, x))
    with without_known_calls():
        before = str(jax.make_jaxpr(jax.grad(heddle.autocast(_mlp)))(p, x))
    assert now == before


# --- in programs --------------------------------------------------------------------------------------


def test_the_same_statement_in_a_loop_keeps_its_float32_value():
    # one call key for the three calls: the value flowing between them is the float32 one
    def f(x):
        for _ in range(3):
            x = jnp.sinc(x)
        return x

    x = patterns(BF16)[::16]
    want = hnp.sinc(hnp.sinc(hnp.sinc(x.astype(np.float32)))).astype(BF16)
    assert_same_bits(jax.jit(heddle.autocast(f))(x), want, x)


def test_in_a_model():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.normal(size=(32, 32)) / 4, jnp.bfloat16)
    x = jnp.asarray(rng.normal(size=(16, 32)), jnp.bfloat16)

    def loss(w, x, nn=jax.nn, np_=jnp):
        h = nn.selu(np_.matmul(nn.gelu(np_.matmul(x, w)), w))
        return np_.mean(np_.log10(np_.add(np_.abs(h), 1)).astype(F32))

    assert_same_bits(
        jax.jit(heddle.autocast(loss))(w, x), jax.jit(lambda w, x: loss(w, x, heddle.nn, hnp))(w, x)
    )


def test_the_gradient_is_heddles():
    x = jnp.asarray(np.linspace(-4, 4, 64), jnp.bfloat16)

    def total(gelu):
        return lambda x: jnp.sum(gelu(x).astype(F32))

    got = jax.jit(jax.grad(total(heddle.autocast(jax.nn.gelu))))(x)
    assert_same_bits(got, jax.jit(jax.grad(total(heddle.nn.gelu)))(x), x)


def test_in_a_scan_body_and_under_vmap():
    x = jnp.asarray(np.linspace(-4, 4, 256), jnp.bfloat16).reshape(8, 32)

    def steps(gelu, add):
        def f(x):
            return lax.scan(lambda c, _: (add(gelu(c), 1), None), x, None, length=3)[0]

        return f

    assert_same_bits(
        jax.jit(heddle.autocast(steps(jax.nn.gelu, jnp.add)))(x),
        jax.jit(steps(heddle.nn.gelu, hnp.add))(x),
    )
    assert_same_bits(jax.jit(jax.vmap(heddle.autocast(jax.nn.mish)))(x), jax.jit(heddle.nn.mish)(x))


# --- under jax.vmap inside the function (equinox's jax.vmap(model)) ------------------------------
# Before, a known call under a vmap was evaluated primitive by primitive: the counts of BEFORE
# (jax.vmap(jax.nn.selu) differed on 52,358 / 8,224 inputs; an equinox MLP with selu on 3,422 of
# 4,096 bfloat16 outputs).

_VMAP_QUICK = {"nn.selu", "nn.gelu", "nn.mish", "numpy.log10", "numpy.unwrap", "scipy.special.sici"}


@pytest.mark.parametrize(
    "name",
    [n if n in _VMAP_QUICK else pytest.param(n, marks=pytest.mark.slow) for n in NAMES],
)
def test_a_known_call_under_vmap_is_heddles(name):
    dtype = BF16 if BEFORE[name][0] >= BEFORE[name][1] else F16
    x = patterns(dtype).reshape(256, 256)
    jfn, hfn = functions(name)
    got = jax.jit(heddle.autocast(lambda a: jax.vmap(jfn)(a)))(x)
    assert_same_bits(got, jax.jit(jax.vmap(hfn))(x), x)


def test_a_model_under_vmap_calls_its_activations_as_heddle():
    rng = np.random.default_rng(3)
    ws = [jnp.asarray(rng.normal(size=(16, 16)) / 4, jnp.bfloat16) for _ in range(3)]
    x = jnp.asarray(rng.normal(size=(64, 16)), jnp.bfloat16)

    def mlp(row, nn=jax.nn, np_=jnp):  # one example, as an equinox module's __call__
        for w in ws:
            row = nn.mish(nn.selu(np_.matmul(row, w)))
        return row

    def mine(row):
        return mlp(row, heddle.nn, hnp)

    got = jax.jit(heddle.autocast(lambda x: jax.vmap(mlp)(x)))(x)
    assert_same_bits(got, jax.jit(jax.vmap(mine))(x))
    assert_same_bits(heddle.autocast(lambda x: jax.vmap(mlp)(x))(x), jax.vmap(mine)(x))


# --- cov's common arguments: its divisor N - ddof is built in the input dtype ------------------------
# bfloat16 holds neither 2999 nor 3000 (2992 and 3008 stand for them): for a (16, 3000) input,
# 139 (ddof=0, bias=True) of 256 outputs differed from heddle's, for (16, 3001) and ddof=2 118
# (jnp.cov was known with its defaults only). With 3000 columns ddof=2's 2998 is 2992 too, as the
# default's 2999: the program cannot tell them apart (test_a_call_two_variants_trace_alike_...).


@pytest.mark.parametrize(
    "kw, n",
    [({"ddof": 0}, 3000), ({"bias": True}, 3000), ({"ddof": 2}, 3001), ({"rowvar": False}, 3000)],
    ids=["ddof=0", "bias", "ddof=2", "rowvar=False"],
)
def test_cov_with_its_common_arguments_is_heddles(kw, n):
    rng = np.random.default_rng(5)
    shape = (n, 16) if kw.get("rowvar") is False else (16, n)
    x = jnp.asarray(rng.normal(size=shape), BF16)
    got = jax.jit(heddle.autocast(lambda x: jnp.cov(x, **kw)))(x)
    assert_same_bits(got, jax.jit(lambda x: hnp.cov(x, **kw))(x))


def _jitted_and_eager(f, *args):
    g = heddle.autocast(f)
    return jax.jit(g)(*args), g(*args)


@pytest.mark.parametrize("kw", [{"ddof": 0}, {"bias": True}], ids=["ddof=0", "bias"])
def test_cov_of_two_arrays_is_heddles(kw):
    # cov(x, y) was known with one array only: of 515 columns, bfloat16's 515 is 516. (The default
    # ddof=1 with such an N is ambiguous: bfloat16's 514 is 512, as 513 is for ddof=2.)
    rng = np.random.default_rng(5)
    x, y = (jnp.asarray(rng.normal(size=(8, 515)), BF16) for _ in range(2))
    want = jax.jit(lambda x, y: hnp.cov(x, y, **kw))(x, y)
    for got in _jitted_and_eager(lambda x, y: jnp.cov(x, y, **kw), x, y):
        assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_a_known_call_along_another_axis_is_heddles(dtype):
    # unwrap(axis=0) and logmeanexp(axis=...) were known at their default axis only: 226 / 1,276
    # of 3,200 unwrap outputs differed (2 pi as bfloat16 / float16), logmeanexp's N = 515 (514
    # in bfloat16) gave other bits
    rng = np.random.default_rng(6)
    x = jnp.asarray(4 * rng.normal(size=(200, 16)), dtype)
    want = jax.jit(lambda x: hnp.unwrap(x, axis=0))(x)
    for got in _jitted_and_eager(lambda x: jnp.unwrap(x, axis=0), x):
        assert_same_bits(got, want)
    x = jnp.asarray(rng.normal(size=(16, 515)), dtype)
    for kw in ({"axis": 1}, {"axis": -1}, {"axis": 0, "keepdims": True}):
        want = jax.jit(lambda x: heddle.nn.logmeanexp(x, **kw))(x)
        for got in _jitted_and_eager(lambda x: jax.nn.logmeanexp(x, **kw), x):
            assert_same_bits(got, want)


def test_a_call_the_program_cannot_tell_from_the_default_is_the_default():
    # float16 cannot hold 2999: cov of 3000 columns divides by 3000 for ddof=1 and ddof=0, so the
    # program does not say which was asked for. Evaluated primitive by primitive (with 3000 for
    # the default's 2999), 133 of 256 outputs of the default call differed from heddle's; it is
    # taken for the default now, and a ddof=0 call is within one ulp of heddle's ddof=0 (the
    # divisors differ by 1/2999, less than float16's half ulp).
    x = jnp.asarray(np.random.default_rng(5).normal(size=(16, 3000)), F16)
    got = jax.jit(heddle.autocast(lambda x: jnp.cov(x)))(x)
    assert_same_bits(got, jax.jit(lambda x: hnp.cov(x))(x))
    zero = np.asarray(jax.jit(heddle.autocast(lambda x: jnp.cov(x, ddof=0)))(x), np.float64)
    want = np.asarray(jax.jit(lambda x: hnp.cov(x, ddof=0))(x), np.float64)
    ulp = np.spacing(np.abs(want).astype(F16)).astype(np.float64)
    assert np.all(np.abs(zero - want) <= ulp)


@pytest.mark.parametrize("name", ["nn.gelu", "nn.selu", "numpy.log10"])
def test_a_known_call_under_vmap_over_another_axis_is_heddles(name):
    # jax.vmap(jax.nn.gelu, in_axes=1) was evaluated primitive by primitive (JAX's gelu cancels:
    # gelu(-5) was -0.0 where heddle's is -2.29e-7)
    x = patterns(BF16).reshape(256, 256)
    jfn, hfn = functions(name)
    got = jax.jit(heddle.autocast(lambda a: jax.vmap(jfn, in_axes=1)(a)))(x)
    assert_same_bits(got, jax.jit(jax.vmap(hfn, in_axes=1))(x), x)
