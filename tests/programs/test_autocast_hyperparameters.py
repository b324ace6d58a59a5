"""autocast of a known library call given scalar hyper-parameters other than its defaults gives
heddle's namespace with the same values, bit for bit (docs/autocast.md, "Known library calls").

``jax.nn.leaky_relu(x, 0.2)`` passes 0.2 into its jit as a weak float32 operand and rounds it to
bfloat16 (0.2001953125) inside; ``jax.scipy.stats.norm.pdf(x, 1.0, 2.0)`` inlines ``loc`` and
``scale`` as bfloat16 literals beside its bfloat16 ``log(2 pi)``. Each such call is recognised with
the scalars read back from the program where they can be read exactly (the weak operand is the
float32 that heddle's float32 computation sees too; a distribution's ``loc`` and ``scale`` are
rounded to the input's dtype by heddle as by JAX), and evaluated as heddle's function of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle
import heddle.nn
import heddle.numpy as hnp
import heddle.scipy.stats

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)


def _attr(root, path):
    for part in path.split("."):
        root = getattr(root, part)
    return root


def patterns(dtype):
    """All 65,536 values of a 16-bit float format."""
    return np.arange(2**16, dtype=np.uint16).view(dtype)


def differing(got, want):
    """How many elements differ in their bits (any NaN matches any NaN); -1 for another dtype."""
    n = 0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype != w.dtype or g.shape != w.shape:
            return -1
        bits = np.dtype(f"u{g.dtype.itemsize}")
        bad = np.ravel(g.view(bits) != w.view(bits))
        with np.errstate(invalid="ignore"):
            bad &= ~np.ravel(np.isnan(g.astype(np.float32)) & np.isnan(w.astype(np.float32)))
        n += int(bad.sum())
    return n


def both(name, *args, **kwargs):
    """JAX's function and heddle's of ``name``, each given ``args`` and ``kwargs``."""
    jfn, hfn = _attr(jax, name), _attr(heddle, name)
    return (lambda x: jfn(x, *args, **kwargs)), (lambda x: hfn(x, *args, **kwargs))


def autocast_vs_heddle(name, dtype, *args, **kwargs):
    x = patterns(dtype)
    jfn, hfn = both(name, *args, **kwargs)
    return differing(jax.jit(heddle.autocast(jfn))(x), jax.jit(hfn)(x))


# The known calls with scalar hyper-parameters; (bfloat16, float16) inputs of 65,536 where autocast
# differed from heddle before they were recognised, measured with the first value set.
_STATS = (
    "norm.pdf norm.logpdf logistic.pdf cauchy.pdf cauchy.logpdf cauchy.cdf cauchy.logcdf cauchy.sf "
    "cauchy.logsf cauchy.ppf cauchy.isf gumbel_l.pdf gumbel_l.cdf gumbel_l.sf gumbel_l.ppf "
    "gumbel_r.pdf gumbel_r.cdf gumbel_r.logsf gumbel_r.ppf"
).split()
CLASS = {
    "nn.leaky_relu": [((0.2,), {}), ((0.3,), {}), ((), {"negative_slope": 0.2})],
    "nn.squareplus": [((2.0,), {}), ((), {"b": 0.3}), ((4,), {})],
    "nn.elu": [((0.3,), {}), ((), {"alpha": 2.5})],
    "nn.celu": [((0.3,), {}), ((), {"alpha": 0.7})],
    "numpy.unwrap": [((), {"discont": 1.0}), ((), {"period": 3.0})],
    "scipy.stats.poisson.entropy": [((1.0,), {})],
    **{f"scipy.stats.{s}": [((1.0, 2.0), {}), ((), {"loc": 0.3, "scale": 1.7})] for s in _STATS},
}


# --- a few of them in the default run (before: bfloat16 / float16 inputs that differed) ---------

QUICK = {
    "leaky_relu(x, 0.2)": ("nn.leaky_relu", BF16, (0.2,), {}),  # 6,545 / 10,205
    "leaky_relu(x, negative_slope=0.3)": ("nn.leaky_relu", BF16, (), {"negative_slope": 0.3}),
    "squareplus(x, 2.0)": ("nn.squareplus", BF16, (2.0,), {}),  # 23,499 / 9,023
    "squareplus(x, 4)": ("nn.squareplus", BF16, (4,), {}),  # the default, given: 23,402 / 8,858
    "elu(x, 0.3)": ("nn.elu", BF16, (0.3,), {}),  # 7,753 / 3,947
    "celu(x, alpha=0.3)": ("nn.celu", F16, (), {"alpha": 0.3}),  # 178 / 723
    "unwrap(x, discont=1.0)": ("numpy.unwrap", F16, (), {"discont": 1.0}),  # 2,807 / 3,588
    "norm.pdf(x, 1.0, 2.0)": ("scipy.stats.norm.pdf", F16, (1.0, 2.0), {}),  # 96 / 6,850
    "norm.pdf(x, loc=0.3, scale=1.7)": (
        "scipy.stats.norm.pdf",
        F16,
        (),
        {"loc": 0.3, "scale": 1.7},
    ),  # 125 / 11,084
    "cauchy.ppf(x, 1.0, 2.0)": ("scipy.stats.cauchy.ppf", BF16, (1.0, 2.0), {}),  # 63,930 / 62,726
    "logistic.pdf(x, 0.3, 1.7)": ("scipy.stats.logistic.pdf", BF16, (0.3, 1.7), {}),
    "gumbel_l.pdf(x, 1.0, 2.0)": ("scipy.stats.gumbel_l.pdf", BF16, (1.0, 2.0), {}),  # 32,419
    "poisson.entropy(x, 1.0)": ("scipy.stats.poisson.entropy", BF16, (1.0,), {}),  # 16,391
}


@pytest.mark.parametrize("case", sorted(QUICK))
def test_a_non_default_hyper_parameter_is_heddles_on_every_pattern(case):
    name, dtype, args, kwargs = QUICK[case]
    assert autocast_vs_heddle(name, dtype, *args, **kwargs) == 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize(
    "name,args,kwargs",
    [(n, a, k) for n, sets in CLASS.items() for a, k in sets],
    ids=[f"{n}{a}{k}" for n, sets in CLASS.items() for a, k in sets],
)
def test_every_hyper_parameter_of_the_class_on_every_pattern(name, args, kwargs, dtype):
    assert autocast_vs_heddle(name, dtype, *args, **kwargs) == 0


@pytest.mark.parametrize("case", sorted(QUICK))
def test_a_non_default_hyper_parameter_is_heddles_eagerly(case):
    # an eager call reads its scalars from the recorded equations and the recorder's constants
    # (it raised AttributeError: '_Batch' object has no attribute 'constvars')
    name, dtype, args, kwargs = QUICK[case]
    x = patterns(dtype)[::31]
    jfn, hfn = both(name, *args, **kwargs)
    assert differing(heddle.autocast(jfn)(x), hfn(x)) == 0


def test_a_scalar_constant_closed_over_eagerly():
    slope = jnp.asarray(0.3, jnp.bfloat16)
    x = patterns(BF16)[::7]
    got = heddle.autocast(lambda x: jax.nn.leaky_relu(x, slope))(x)
    assert differing(got, heddle.nn.leaky_relu(x, slope)) == 0


# expn's order comes first and is a literal in its custom_jvp's body; before it was known,
# (bfloat16 / float16) inputs of 65,536 that differed from heddle's: n=0 353 / 794, n=1 704 /
# 5,085, n=2 874 / 4,838, n=3 880 / 4,807, n=10 1,537 / 8,887.
EXPN_ORDERS = (0, 1, 2, 3, 10)


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_expn_of_every_order_is_heddles(dtype, mode):
    # every pattern jitted; eagerly against heddle's eager function (XLA fuses float32
    # multiply-adds under jit only), on every 5th pattern
    def orders(expn):
        return lambda x: [expn(n, x) for n in EXPN_ORDERS]

    fn = heddle.autocast(orders(jax.scipy.special.expn))
    mine = orders(heddle.scipy.special.expn)
    if mode == "jit":
        x = patterns(dtype)
        got, want = jax.jit(fn)(x), jax.jit(mine)(x)
    else:
        x = patterns(dtype)[::5]
        got, want = fn(x), mine(x)
    assert differing(got, want) == 0


def test_the_class_is_the_known_calls_with_scalars():
    from heddle.programs import _known

    # shape parameters, swept on every pattern in tests/programs/test_autocast_unary_sweep.py
    shaped = {
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
    swept = {"scipy.stats.expon.logcdf", "scipy.stats.gumbel_l.logcdf"}  # loc and scale
    with_scalars = {k.name for k in _known.KNOWN_CALLS if k.scalars}
    assert with_scalars == {*CLASS, *shaped, *swept, "scipy.special.expn"}
    rounded = {k.name for k in _known.KNOWN_CALLS if k.rounded}
    assert rounded == {n for n in {*CLASS, *shaped, *swept} if n.startswith("scipy.")}


def test_the_value_is_heddles_float32_not_the_bfloat16_jax_built():
    # heddle.nn.leaky_relu(x, 0.2) multiplies by float32's 0.2, not by 0.2001953125
    x = np.asarray([-1.0, -3.0, 2.0, -0.5], BF16)
    got = jax.jit(heddle.autocast(lambda x: jax.nn.leaky_relu(x, 0.2)))(x)
    want = np.where(x >= 0, x, (np.float32(0.2) * x.astype(np.float32)).astype(BF16))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_a_scalar_constant_closed_over():
    # a bfloat16 array the caller gave: a constant of the program, its value is exact
    slope = jnp.asarray(0.3, jnp.bfloat16)
    x = patterns(BF16)
    got = jax.jit(heddle.autocast(lambda x: jax.nn.leaky_relu(x, slope)))(x)
    assert differing(got, jax.jit(lambda x: heddle.nn.leaky_relu(x, slope))(x)) == 0


def test_in_a_model():
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(size=(16, 16)) / 4, jnp.bfloat16)
    x = jnp.asarray(rng.normal(size=(8, 16)), jnp.bfloat16)

    def loss(w, x, nn=jax.nn, np_=jnp, stats=jax.scipy.stats):
        h = nn.leaky_relu(np_.matmul(x, w), 0.2)
        h = nn.squareplus(np_.matmul(h, w), 2.0)
        return np_.mean(stats.norm.logpdf(h, 0.5, 1.5).astype(jnp.float32))

    def mine(w, x):
        return loss(w, x, heddle.nn, hnp, heddle.scipy.stats)

    assert differing(jax.jit(heddle.autocast(loss))(w, x), jax.jit(mine)(w, x)) == 0


@pytest.mark.parametrize(
    "name,args", [("nn.leaky_relu", (0.2,)), ("scipy.stats.norm.logpdf", (0.5, 1.5))]
)
def test_the_gradient_is_heddles(name, args):
    x = jnp.asarray(np.linspace(-4, 4, 64), jnp.bfloat16)
    jfn, hfn = both(name, *args)

    def total(fn):
        return lambda x: jnp.sum(fn(x).astype(jnp.float32))

    got = jax.jit(jax.grad(total(heddle.autocast(jfn))))(x)
    assert differing(got, jax.jit(jax.grad(total(hfn)))(x)) == 0


def test_the_same_statement_in_a_loop_keeps_its_float32_value():
    # one call key for the three calls: the value flowing between them is the float32 one
    def f(x, nn=jax.nn):
        for s in (0.2, 0.3, 0.2):
            x = nn.leaky_relu(x, s)
        return x

    x = patterns(BF16)[::16]
    want = f(x.astype(np.float32), heddle.nn).astype(BF16)
    assert differing(jax.jit(heddle.autocast(f))(x), want) == 0


# --- what is not read back is evaluated as before -----------------------------------------------


_X = np.linspace(-6, 6, 4097).astype(BF16)

UNREAD = {
    # an array hyper-parameter: no scalar
    "norm.pdf(x, 0, array)": lambda x: jax.scipy.stats.norm.pdf(
        x, 0.0, jnp.linspace(1, 2, x.size, dtype=jnp.bfloat16)
    ),
    "gelu(float32)": lambda x: jax.nn.gelu(x.astype(jnp.float32)),
}


@pytest.mark.parametrize("name", sorted(UNREAD))
def test_a_call_whose_scalars_are_not_read_is_evaluated_as_before(name, without_known_calls):
    fn = UNREAD[name]
    with without_known_calls():
        before = jax.jit(heddle.autocast(fn))(_X)
    assert differing(jax.jit(heddle.autocast(fn))(_X), before) == 0


def test_a_traced_hyper_parameter_is_not_read(without_known_calls):
    # an argument of the program has no value when it is jitted: evaluated as before
    def fn(x, s):
        return jax.nn.leaky_relu(x, s)

    s = 0.2
    with without_known_calls():
        before = jax.jit(heddle.autocast(fn))(_X, s)
    assert differing(jax.jit(heddle.autocast(fn))(_X, s), before) == 0


# --- the pieces -----------------------------------------------------------------------------------


def test_halfway_values_are_not_read_for_a_rounded_scalar():
    from heddle.programs._known import _halfway

    assert _halfway(1.00390625, BF16)  # halfway between bfloat16's 1 and 1.0078125
    assert not _halfway(1.0, BF16) and not _halfway(0.2, BF16) and not _halfway(1.001, BF16)
    assert _halfway(1.0 + 2.0**-11, F16) and not _halfway(1.0 + 2.0**-10, F16)
    assert _halfway(1e6, F16)  # a finite value float16 rounds to an infinity


def test_candidates_with_read_values_are_told_apart_by_their_bits():
    from heddle.programs import _known

    c = next(c for c in _known._candidates() if c.jax_fn is jax.scipy.stats.norm.pdf)
    assert c.given({"loc": 0.0}) != c.given({"loc": -0.0})
    assert c.given({"loc": 1.0}) != c.given({"loc": np.float32(1.0)})
    assert c.given({"loc": 1.0}) == c.given({"loc": 1.0})
    assert hash(c.given({"loc": 1.0})) == hash(c.given({"loc": 1.0}))
