"""Complex input to every formula of heddle/ops/_formulas.py is JAX's own function's.

The formulas are for real arguments; for a complex one each defers to JAX's function. The sweep goes
through every entry of ``_formulas.NUMPY``, ``NN``, ``SPECIAL`` and ``STATS`` (so a new formula is
covered without editing this file; ``logaddexp`` on the grid and the grid reversed) through the
public names, eagerly and under ``jax.jit``, on a grid of complex64 values with the special cases
(0, +-inf real and imaginary parts, NaN, large values):
the result must be bit for bit JAX's own, and on well-conditioned values numpy's/SciPy's complex128
value within a few complex64 ulps. Names for which JAX rejects complex are skipped with that reason,
after checking that heddle rejects them too.

JAX's complex64 functions do not follow numpy (C99) on every special value: ``cosh(inf j)`` is
``nan+nanj`` (numpy ``nan+0j``), ``arcsin(inf-0j)`` has ``+inf`` imaginary part (numpy ``-inf``),
``exp2(inf+0j)`` is ``nan+nanj`` (numpy ``inf+0j``), and squareplus, gelu and erfcx overflow in
intermediates at large parts. There heddle gives JAX's value, which the first test pins down.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import jax.scipy.stats as jst
import numpy as np
import pytest
import scipy.special as sp

import heddle.nn as hnn
import heddle.numpy as hnp
import heddle.scipy.special as hss
import heddle.scipy.stats as hst
from heddle.ops import _formulas
from heddle.policy import PromotionError

_C = math.sqrt(2 / math.pi)
_SPACES = {"numpy": (hnp, jnp), "nn": (hnn, jax.nn), "special": (hss, jss)}
_BINARY = {"numpy.logaddexp"}  # called here on (z, z reversed)


def _unary(name, fn):
    return (lambda z: fn(z, z[::-1])) if name in _BINARY else fn


def _entries():
    out = []
    for space, table in (
        ("numpy", _formulas.NUMPY),
        ("nn", _formulas.NN),
        ("special", _formulas.SPECIAL),
    ):
        public, own = _SPACES[space]
        for n in sorted(table):
            name = f"{space}.{n}"
            out.append((name, _unary(name, getattr(public, n)), _unary(name, getattr(own, n))))
    for dist, names in _formulas.STATS.items():
        public, own = getattr(hst, dist), getattr(jst, dist)
        out += [(f"stats.{dist}.{n}", getattr(public, n), getattr(own, n)) for n in sorted(names)]
    return out


ENTRIES = _entries()
IDS = [e[0] for e in ENTRIES]

# complex128 references (numpy/SciPy where they have the function, the defining formula otherwise)
REFERENCE = {
    "numpy.sinc": np.sinc,
    "numpy.sinh": np.sinh,
    "numpy.cosh": np.cosh,
    "numpy.exp2": np.exp2,
    "numpy.arcsin": np.arcsin,
    "numpy.asin": np.arcsin,
    "numpy.deg2rad": lambda z: z * (np.pi / 180),  # numpy's deg2rad has no complex loop
    "numpy.radians": lambda z: z * (np.pi / 180),
    "nn.squareplus": lambda z: (z + np.sqrt(z * z + 4)) / 2,
    "nn.gelu": lambda z: 0.5 * z * (1 + np.tanh(_C * (z + 0.044715 * z**3))),
    "nn.silu": lambda z: z / (1 + np.exp(-z)),
    "nn.swish": lambda z: z / (1 + np.exp(-z)),
    "nn.mish": lambda z: z * np.tanh(np.log1p(np.exp(z))),
    "special.erfcx": sp.erfcx,
    "special.gamma": sp.gamma,
    "numpy.logaddexp": lambda z: np.log(np.exp(z) + np.exp(z[::-1])),
    "stats.norm.logpdf": lambda z: -(z * z) / 2 - 0.5 * math.log(2 * math.pi),
}

# JAX's own complex64 function is less accurate than a few ulps on the moderate grid; heddle gives
# JAX's value (a formula of its own would be needed): strict, so that a fix shows up here.
JAX_INACCURATE = {
    "numpy.sinc": "jax.numpy.sinc rounds pi z: sinc(2+0j) = 4.3e-8, not 0",
    "nn.gelu": "jax.nn.gelu's 1 + tanh(y) cancels for Re z < 0 (4,000 ulps at -3.5)",
    "nn.mish": "jax.nn.mish's tanh(softplus(z)): 64 ulps at -3.5+1.5j",
    "special.gamma": "jax.scipy.special.gamma's complex Lanczos sum: 38 ulps at -0.75+3.5j",
    "numpy.logaddexp": "jax.numpy.logaddexp's complex log1p(exp(d)): 39 ulps at (0, -3.5-3.5j)",
}

_PARTS = [0.0, -0.0, 0.5, -0.5, 1.0, -2.5, 10.0, -30.0, 100.0, 1e10, -1e30, np.inf, -np.inf, np.nan]
_MODERATE = [0.0, 0.25, -0.25, 0.75, -0.75, 1.5, -1.5, 2.0, -2.0, 3.5, -3.5]


def _grid(parts, dtype=np.complex64):
    re, im = np.meshgrid(parts, parts)
    z = np.empty(re.size, dtype)
    z.real, z.imag = re.ravel(), im.ravel()  # keeps -0.0, inf and NaN parts as given
    return z


def _same(a, b):
    """Bit equality of complex arrays, every NaN part equal to every NaN part."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    ok = np.ones(a.shape, bool)
    for part in (np.real, np.imag):
        pa, pb = part(a), part(b)
        ok &= (
            pa.view(np.uint32 if pa.itemsize == 4 else np.uint64)
            == pb.view(pb.dtype.str.replace("f", "u"))
        ) | (np.isnan(pa) & np.isnan(pb))
    return ok


def _rejects(own, z):
    try:
        own(z)
    except (TypeError, ValueError) as e:
        return e
    return None


def test_every_formula_has_a_complex_reference():
    z = _grid([0.5])
    missing = [n for n, _, own in ENTRIES if n not in REFERENCE and _rejects(own, z) is None]
    assert not missing, f"add a complex128 reference for {missing}"


@pytest.mark.parametrize(("name", "public", "own"), ENTRIES, ids=IDS)
def test_complex_is_jaxs_own(name, public, own, transform):
    z = _grid(_PARTS)
    err = _rejects(own, z)
    if err is not None:
        with pytest.raises(type(err)):
            transform(public)(z)
        pytest.skip(f"JAX rejects complex input: {err}")
    with np.errstate(all="ignore"):
        want = np.asarray(jax.jit(own)(z))
        got = np.asarray(transform(public)(z))
    bad = ~_same(got, want)
    assert not bad.any(), (
        f"{name}: (z, got, JAX's) {list(zip(z[bad], got[bad], want[bad], strict=True))[:4]}"
    )


@pytest.mark.parametrize(
    ("name", "public"),
    [
        pytest.param(n, f, marks=pytest.mark.xfail(strict=True, reason=JAX_INACCURATE[n]))
        if n in JAX_INACCURATE
        else (n, f)
        for n, f, _ in ENTRIES
        if n in REFERENCE
    ],
)
def test_complex_matches_numpy(name, public, transform):
    z = _grid(_MODERATE)
    got = np.asarray(transform(public)(z))
    assert got.dtype == np.complex64
    ref = np.asarray(REFERENCE[name](z.astype(np.complex128)))
    err = np.abs(got.astype(np.complex128) - ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        ulps = err / (np.abs(ref) * 2.0**-24)
    assert np.all((ulps <= 8) | (err == 0)), (name, z[np.nanargmax(ulps)], np.nanmax(ulps))


@pytest.mark.parametrize("name", ["sinh", "cosh", "sinc"])
def test_the_reported_values(name, transform):
    z = np.complex64(2 + 3j)
    got = complex(transform(getattr(hnp, name))(z))
    want = complex(getattr(np, name)(np.complex128(2 + 3j)))
    assert abs(got - want) <= 4e-7 * abs(want), (name, got, want)  # cosh: -3.72+0.51j, not 18.41


def test_complex128_under_x64_is_jaxs_own():
    with jax.enable_x64(True):
        z = _grid(_PARTS, np.complex128)
        for name, public, own in ENTRIES:
            if name.startswith("stats.") or _rejects(own, z) is not None:  # stats: not wired yet
                continue
            with np.errstate(all="ignore"):
                got, want = np.asarray(public(z)), np.asarray(jax.jit(own)(z))
            assert got.dtype == np.complex128, name
            assert _same(got, want).all(), name
        got = complex(hnp.cosh(np.complex128(2 + 3j)))
        assert abs(got - complex(np.cosh(2 + 3j))) <= 1e-15 * abs(got)


@pytest.mark.parametrize(("name", "public", "own"), ENTRIES, ids=IDS)
def test_formula_itself_defers_for_complex(name, public, own):
    space, _, attr = name.partition(".")
    table = {"numpy": _formulas.NUMPY, "nn": _formulas.NN, "special": _formulas.SPECIAL}
    formula = _unary(
        name,
        table[space][attr]
        if space in table
        else _formulas.STATS[attr.split(".")[0]][attr.split(".")[1]],
    )
    z = jnp.asarray(_grid([0.5, -2.5, 1e10]))
    if _rejects(own, z) is not None:
        with pytest.raises((TypeError, ValueError)):
            formula(z)
        return
    assert _same(formula(z), own(z)).all(), name


def test_a_complex_hyper_parameter_is_refused_clearly(transform):
    # squareplus's b is a hyper-parameter, computed with at float32 (heddle/ops/_nn.py): a complex
    # one is refused, naming the part to take, where JAX computes a complex squareplus
    x, b = np.float32(-1.0), np.complex64(4 + 1j)
    with pytest.raises(PromotionError, match="imaginary part"):
        transform(hnn.squareplus)(x, b)
    with jax.numpy_dtype_promotion("standard"):
        assert np.iscomplexobj(np.asarray(jax.nn.squareplus(x, b)))
