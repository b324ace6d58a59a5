"""Every elementwise unary float function both namespaces have, on every bfloat16 and float16
pattern: ``jax.jit(heddle.autocast(jax_fn))`` gives ``jax.jit(heddle_fn)``'s bits (any NaN matches
any NaN). The functions are enumerated from heddle's op tables by ``benchmarks/autocast_unary.py``
(jax.numpy, jax.nn, jax.scipy.special and every jax.scipy.stats distribution with its default
parameters), which prints the same comparison as a table; this test is the sweep's contract, so a
change to one namespace that the other does not follow fails here (before: ``stats.expon.logcdf``
12,929 / 0 and ``stats.gumbel_l.logcdf`` 15,569 / 9,866 bfloat16 / float16 inputs differed after
heddle's log tails changed; ``special.exp1`` 704 / 5,084 and ``special.expi`` 1,717 / 22,719 were
not swept at all)."""

from __future__ import annotations

import functools
import inspect
import pathlib
import runpy

import jax
import pytest

import heddle.nn

SWEEP = runpy.run_path(
    str(pathlib.Path(__file__).parents[2] / "benchmarks" / "autocast_unary.py"),
    run_name="autocast_unary",
)
CASES = {
    name: (jfn, hfn)
    for name, jfn, hfn in SWEEP["functions"]()
    if name not in SWEEP["SLOW"] | SWEEP["NOT_ELEMENTWISE"] and SWEEP["_elementwise"](jfn)
}
PATTERNS = {d.name: SWEEP["patterns"](d) for d in SWEEP["DTYPES"]}


def test_the_sweep_covers_the_namespaces():
    assert len(CASES) >= 145
    for name in ("log10", "nn.gelu", "special.expi", "stats.expon.logcdf", "stats.norm.pdf"):
        assert name in CASES, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_autocast_is_heddle_on_every_pattern(name):
    jfn, hfn = CASES[name]
    with jax.numpy_dtype_promotion("standard"):  # JAX's own functions, as users call them
        found = {d: SWEEP["count"](jfn, hfn, x) for d, x in PATTERNS.items()}
    assert all(n == 0 for n, _ in found.values()), (name, found)


def _parametrised():
    """Every function of every distribution of heddle.scipy.stats whose parameters have no default
    (``t``'s ``df``, ``vonmises``' ``kappa``, ``gamma``'s ``a``, ...), each given as 2.5: before,
    autocast computed JAX's float32 formulas (``t.pdf`` 332 / 4,972, ``vonmises.logpdf`` 1,206 /
    32,570, ``vonmises.pdf`` 1,760 / 19,296 inputs differed). ``dirichlet`` and ``multinomial``
    take vectors; JAX refuses ``truncnorm`` of bfloat16 and float16."""
    import jax.scipy.stats as js

    import heddle.scipy.stats as hs

    for dist in hs._DISTRIBUTIONS:
        if dist in {"dirichlet", "multinomial", "truncnorm"}:
            continue
        for name in sorted(getattr(hs, dist).__all__):
            jfn = getattr(getattr(js, dist), name, None)
            params = list(inspect.signature(jfn).parameters.values())[1:] if jfn else []
            needed = {p.name: 2.5 for p in params if p.default is inspect.Parameter.empty}
            if needed:
                hfn = getattr(getattr(hs, dist), name)
                quick = f"{dist}.{name}" in {"t.pdf", "vonmises.pdf", "vonmises.logpdf"}
                yield pytest.param(
                    functools.partial(jfn, **needed),
                    functools.partial(hfn, **needed),
                    id=f"{dist}.{name}",
                    marks=() if quick else pytest.mark.slow,  # the rest: about 80 s
                )


@pytest.mark.parametrize("jfn,hfn", list(_parametrised()))
def test_every_distribution_with_parameters(jfn, hfn):
    with jax.numpy_dtype_promotion("standard"):
        found = {d: SWEEP["count"](jfn, hfn, x) for d, x in PATTERNS.items()}
    assert all(n == 0 for n, _ in found.values()), found


def _shaped():
    """Distributions and functions with shape parameters, given as Python scalars: recognised
    with the values read back from the program (before: autocast computed JAX's float32 log
    tails, -inf where heddle's are finite: gamma.logsf(x, 2.5) 15,556 / 9,761, chi2.logsf(x, 3)
    15,436 / 8,804, t.logpdf(x, 3) 16,428 / 2,658, hyp1f1(1, 2, x) 2,398 / 17,112, ...)."""
    import jax.scipy.special as jsp
    import jax.scipy.stats as js

    import heddle.scipy.special as hsp
    import heddle.scipy.stats as hs

    stats = {
        "gamma.logsf(x, 2.5)": lambda m, x: m.gamma.logsf(x, 2.5),
        "gamma.logsf(x, 2.7, 0.3, 1.9)": lambda m, x: m.gamma.logsf(x, 2.7, 0.3, 1.9),
        "gamma.logcdf(x, a=0.3)": lambda m, x: m.gamma.logcdf(x, a=0.3),
        "chi2.logsf(x, 3)": lambda m, x: m.chi2.logsf(x, 3),
        "chi2.logcdf(x, 7.3)": lambda m, x: m.chi2.logcdf(x, 7.3),
        "beta.logcdf(x, 2, 3)": lambda m, x: m.beta.logcdf(x, 2, 3),
        "t.logpdf(x, 2.7, scale=3.1)": lambda m, x: m.t.logpdf(x, 2.7, scale=3.1),
    }
    for name, call in stats.items():
        yield pytest.param(functools.partial(call, js), functools.partial(call, hs), id=name)
    hyp = lambda m, x: m.hyp1f1(1.0, 2.0, x)
    yield pytest.param(functools.partial(hyp, jsp), functools.partial(hyp, hsp), id="hyp1f1")


@pytest.mark.parametrize("jfn,hfn", list(_shaped()))
def test_shape_parameters_given_as_scalars(jfn, hfn):
    with jax.numpy_dtype_promotion("standard"):
        found = {d: SWEEP["count"](jfn, hfn, x) for d, x in PATTERNS.items()}
    assert all(n == 0 for n, _ in found.values()), found


def _inner_vmap():
    """Known calls whose scalars are read back from the program, under a ``jax.vmap`` inside the
    autocast function (before: not recognised there; bfloat16 / float16 inputs that differed:
    hyp1f1 2,398 / 17,112, expn 874 / 4,838, gamma.logsf 15,556 / 9,761, leaky_relu 6,545 /
    10,205)."""
    import jax.scipy.special as jsp
    import jax.scipy.stats as js

    import heddle.scipy.special as hsp
    import heddle.scipy.stats as hs

    calls = {
        "hyp1f1(1., 2., x)": lambda m, x: m.hyp1f1(1.0, 2.0, x),
        "expn(2, x)": lambda m, x: m.expn(2, x),
        "gamma.logsf(x, 2.5)": lambda m, x: m.gamma.logsf(x, 2.5),
        "leaky_relu(x, 0.2)": lambda m, x: m.leaky_relu(x, 0.2),
    }
    modules = {"gamma.logsf(x, 2.5)": (js, hs), "leaky_relu(x, 0.2)": (jax.nn, heddle.nn)}
    for name, call in calls.items():
        jm, hm = modules.get(name, (jsp, hsp))
        rows = lambda f: lambda x: jax.vmap(f)(x.reshape(256, 256)).reshape(-1)
        yield pytest.param(rows(functools.partial(call, jm)), functools.partial(call, hm), id=name)


@pytest.mark.parametrize("jfn,hfn", list(_inner_vmap()))
def test_scalars_read_back_under_an_inner_vmap(jfn, hfn):
    with jax.numpy_dtype_promotion("standard"):
        found = {d: SWEEP["count"](jfn, hfn, x) for d, x in PATTERNS.items()}
    assert all(n == 0 for n, _ in found.values()), found
