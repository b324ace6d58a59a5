"""heddle.scipy as a whole: every module and name of the installed jax.scipy, and the policy's shape.

Coverage: every module of ``jax.scipy`` (as ``pkgutil.walk_packages`` finds it) has a heddle.scipy
module, and every public name of it a counterpart classified exactly once (heddle/scipy/_table.py,
heddle/ops/_special.py), so a name a new JAX adds fails here until it is classified. ``Pass`` names
are JAX's own objects, every other one heddle's; every parameter of JAX's signature is accepted.

The policy, for every classified function (no compilation: ``jax.make_jaxpr`` only): on bfloat16 and
float16 inputs no arithmetic runs in the narrow dtype (every narrow value is only converted, copied,
compared or sorted), and the results have the dtypes POLICY.md 4 gives. The values are checked in
the other tests/scipy/test_ns_*.py files.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import types

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import jax.scipy
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy
import heddle.scipy.stats as hstats
from heddle.ops import _special
from heddle.scipy import _table
from heddle.scipy._table import Compute, Own, Pass

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
NARROW = {BF16, F16, np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)}
P = inspect.Parameter


def _public(mod: object) -> set[str]:
    return {n for n in dir(mod) if not n.startswith("_")}


def _jax_modules() -> list[str]:
    """The paths below jax.scipy of every public module of the installed JAX."""
    found = pkgutil.walk_packages(jax.scipy.__path__, "jax.scipy.")
    names = [m.name for m in found if not any(p.startswith("_") for p in m.name.split("."))]
    return sorted(n.removeprefix("jax.scipy.") for n in names)


MODULES = _jax_modules()


def _tables(path: str) -> list[dict | tuple]:
    """The classification tables of ``jax.scipy.<path>``'s names."""
    if path == "special":
        return [_special.SPECIAL, _special.CREATION, _special.PASS]
    if path.startswith("stats."):
        return []  # a distribution: every function (test_every_distribution_function_...)
    return [_table.TABLES.get(path, {})]


# --- names -----------------------------------------------------------------------------------------


def test_the_walk_finds_the_modules_jax_documents():
    assert {"linalg", "signal", "fft", "ndimage", "stats", "special", "stats.norm"} <= set(MODULES)


@pytest.mark.parametrize("path", MODULES)
def test_every_jax_scipy_module_has_a_heddle_module(path):
    ours = importlib.import_module(f"heddle.scipy.{path}")
    assert ours.__name__ == f"heddle.scipy.{path}"
    theirs = importlib.import_module(f"jax.scipy.{path}")
    for name in sorted(_public(theirs)):
        obj = getattr(theirs, name)
        if isinstance(obj, types.ModuleType):  # a submodule: heddle's, of the same name
            mine = getattr(ours, name, None)
            assert isinstance(mine, types.ModuleType), f"heddle.scipy.{path}.{name}"
            assert mine.__name__ == f"heddle.scipy.{path}.{name}"


def test_heddle_scipy_has_every_submodule_of_jax_scipy():
    top = {m.split(".")[0] for m in MODULES}
    assert top <= set(heddle.scipy.__all__)
    assert all(isinstance(getattr(heddle.scipy, n), types.ModuleType) for n in top)


@pytest.mark.parametrize("path", [m for m in MODULES if not m.startswith("stats.")])
def test_every_name_is_classified_once(path):
    theirs = importlib.import_module(f"jax.scipy.{path}")
    names = {n for n in _public(theirs) if not isinstance(getattr(theirs, n), types.ModuleType)}
    classified = [n for t in _tables(path) for n in t]
    assert len(classified) == len(set(classified)), "a name is classified twice"
    missing = sorted(names - set(classified))
    assert not missing, f"jax.scipy.{path} names with no classification: {missing}"
    stale = sorted(set(classified) - names)
    assert not stale, f"classified names jax.scipy.{path} lacks: {stale}"


@pytest.mark.parametrize("path", sorted(_table.TABLES))
def test_pass_names_are_jax_objects_and_the_others_heddle_versions(path):
    theirs = importlib.import_module(f"jax.scipy.{path}")
    ours = importlib.import_module(f"heddle.scipy.{path}")
    for name, rule in _table.TABLES[path].items():
        mine, jobj = getattr(ours, name), getattr(theirs, name)
        if isinstance(rule, Pass):
            assert mine is jobj, name
        else:
            assert mine is not jobj, name
            assert mine.__doc__ and f"jax.scipy.{path}.{name}" in mine.__doc__, name
    functions = {n for n in ours.__all__ if not isinstance(getattr(ours, n), types.ModuleType)}
    assert functions == set(_table.TABLES[path]), path


def test_every_distribution_has_a_module_with_every_function():
    dists = {m.removeprefix("stats.") for m in MODULES if m.startswith("stats.")}
    classified = [*_table.DISTRIBUTIONS, *_special.STATS]
    assert len(classified) == len(set(classified)), "a distribution is classified twice"
    assert sorted(dists - set(classified)) == [], "unclassified distributions"
    assert sorted(set(classified) - dists) == [], "classified distributions JAX lacks"
    for dist in sorted(dists):
        theirs, ours = getattr(jax.scipy.stats, dist), getattr(hstats, dist)
        names = {n for n in _public(theirs) if callable(getattr(theirs, n))}
        assert names and names == set(ours.__all__), dist
        for name in names:
            assert getattr(ours, name) is not getattr(theirs, name), f"{dist}.{name}"


def test_every_distribution_parameter_is_a_value_or_static():
    for dist, values in _table.DISTRIBUTIONS.items():
        src = getattr(jax.scipy.stats, dist)
        seen: set[str] = set()
        for name in _public(src):
            for p in inspect.signature(getattr(src, name)).parameters:
                seen.add(p)
                if dist == "multinomial" and p in ("x", "n"):
                    continue  # integer counts, as JAX requires (heddle/scipy/_table.py)
                assert p in values or p in _table.DISTRIBUTION_STATIC, f"{dist}.{name}: {p}"
        assert set(values) <= seen, f"{dist}: {set(values) - seen} is no parameter"


def _problems(own: inspect.Signature, theirs: inspect.Signature) -> list[str]:
    """Ways a call that JAX accepts could fail to bind to ``own``."""
    ps = list(own.parameters.values())
    if any(p.kind is P.VAR_POSITIONAL for p in ps) and any(p.kind is P.VAR_KEYWORD for p in ps):
        return []
    problems = []
    positional = [p.name for p in ps if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    for i, t in enumerate(theirs.parameters.values()):
        if t.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) and (
            i >= len(positional) or positional[i] != t.name
        ):
            problems.append(f"{t.name!r} is not at position {i}")
        if t.kind is P.KEYWORD_ONLY and t.name not in own.parameters:
            problems.append(f"keyword {t.name!r} not accepted")
        if t.kind is P.VAR_POSITIONAL and not any(p.kind is P.VAR_POSITIONAL for p in ps):
            problems.append("*args not accepted")
        mine = own.parameters.get(t.name)
        if t.default is not P.empty and mine is not None and mine.default is P.empty:
            problems.append(f"{t.name!r} has a default in JAX but is required here")
    return problems


def _own_pairs():
    for path, table in sorted(_table.TABLES.items()):
        theirs = importlib.import_module(f"jax.scipy.{path}")
        ours = importlib.import_module(f"heddle.scipy.{path}")
        for name, rule in table.items():
            if isinstance(rule, Own):
                yield pytest.param(getattr(ours, name), getattr(theirs, name), id=f"{path}.{name}")


@pytest.mark.parametrize(("mine", "theirs"), list(_own_pairs()))
def test_own_versions_accept_every_jax_parameter(mine, theirs):
    target = theirs.__init__ if inspect.isclass(theirs) else theirs
    own = mine.__init__ if inspect.isclass(mine) else mine
    theirs_sig, own_sig = inspect.signature(target), inspect.signature(own, follow_wrapped=False)
    assert _problems(own_sig, theirs_sig) == [], (own_sig, theirs_sig)


def _heddle_modules() -> list[str]:
    found = pkgutil.walk_packages(heddle.scipy.__path__, "heddle.scipy.")
    names = [m.name for m in found if not any(p.startswith("_") for p in m.name.split("."))]
    return ["heddle.scipy", *sorted(names)]


@pytest.mark.parametrize("modname", _heddle_modules())
def test_every_public_name_has_a_docstring(modname):
    """As tests/test_docstrings.py, for every module of heddle.scipy (the distributions included):
    heddle's functions and classes have their own docstring, a heddle class's public methods too;
    JAX's objects passed through keep JAX's."""
    module = importlib.import_module(modname)
    assert (module.__doc__ or "").strip(), modname
    theirs = importlib.import_module(modname.replace("heddle.", "jax.", 1))
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if obj is getattr(theirs, name, None) or isinstance(obj, types.ModuleType):
            continue
        doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        if not (doc or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if isinstance(value, classmethod | staticmethod):
                    value = value.__func__
                public = not attr.startswith("_")
                if public and (inspect.isfunction(value) or isinstance(value, property)):
                    if not (value.__doc__ or "").strip():
                        missing.append(f"{name}.{attr}")
    assert not missing, f"{modname}: no docstring for {missing}"


# --- the policy's shape: no narrow arithmetic, the result dtypes ---------------------------------

# data movement, comparisons and sorting: exact in any dtype
EXACT = frozenset(
    "convert_element_type bitcast_convert_type reshape broadcast_in_dim squeeze expand_dims "
    "transpose rev slice dynamic_slice dynamic_update_slice gather concatenate pad select_n copy "
    "copy_p iota eq ne lt le gt ge sort is_finite pjit jit closed_call custom_jvp_call "
    "custom_vjp_call cond while scan".split()
)


def narrow_arithmetic(jaxpr: jex.Jaxpr) -> list[str]:
    """The primitives of ``jaxpr`` (and of every jaxpr inside it) that read or write a narrow
    float and are not exact data movement, comparison or sorting."""
    found = []
    for eqn in jaxpr.eqns:
        touched = [v.aval for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")]
        narrow = any(np.dtype(getattr(a, "dtype", np.float32)) in NARROW for a in touched)
        if narrow and eqn.primitive.name not in EXACT:
            found.append(eqn.primitive.name)
        for sub in jex.jaxprs_in_params(eqn.params):
            found += narrow_arithmetic(sub)
    return found


def test_the_check_finds_narrow_arithmetic():
    x = np.ones(3, BF16)
    assert narrow_arithmetic(jax.make_jaxpr(lambda v: v * v)(x).jaxpr) == ["mul"]
    assert narrow_arithmetic(jax.make_jaxpr(jax.scipy.linalg.block_diag)(x, x).jaxpr) == []
    inner = jax.make_jaxpr(lambda v: jax.jit(jnp.exp)(v))(x).jaxpr
    assert narrow_arithmetic(inner) == ["exp"]


def _m(d):
    return np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]]).astype(d)


def _v(d, n=3):
    return (np.arange(1, n + 1) / 2).astype(d)


def _sig(d):
    return np.sin(np.arange(64) / 3.0).astype(d)


@functools.cache
def _factors() -> dict[str, tuple[np.ndarray, ...]]:
    """Float32 factorisations of ``_m`` (computed once), whose solvers take them as inputs."""
    a = _m(np.float32)
    return {
        "schur": tuple(map(np.asarray, jax.scipy.linalg.schur(a))),
        "cho": (np.asarray(jax.scipy.linalg.cho_factor(a)[0]),),
        "lu": tuple(map(np.asarray, jax.scipy.linalg.lu_factor(a))),
    }


def _schur(d):
    t, z = _factors()["schur"]
    return t.astype(d), z.astype(d)


def _cho(d):
    return _factors()["cho"][0].astype(d), False


def _lu(d):
    lu, piv = _factors()["lu"]
    return lu.astype(d), piv


# "module.name" -> arguments built from the float dtype d (narrow arguments where JAX takes floats)
RECIPES = {
    **{
        f"linalg.{n}": lambda d: ((_m(d),), {})
        for n in "cholesky det hessenberg inv lu lu_factor polar qr schur svd sqrtm eigh".split()
    },
    "linalg.expm": lambda d: ((_m(d) / 4,), {}),
    "linalg.funm": lambda d: ((_m(d), jnp.exp), {}),
    "linalg.expm_frechet": lambda d: ((_m(d) / 4, _m(d)), {}),
    "linalg.eigh_tridiagonal": lambda d: ((_v(d), _v(d, 2)), {"eigvals_only": True}),
    "linalg.qr_multiply": lambda d: ((_m(d), _m(d)), {}),
    "linalg.rsf2csf": lambda d: (_schur(d), {}),
    **{f"linalg.{n}": lambda d: ((_m(d), _v(d)), {}) for n in ("solve", "solve_triangular")},
    "linalg.solve_sylvester": lambda d: ((_m(d), _m(d), _m(d)), {}),
    "linalg.cho_factor": lambda d: ((_m(d),), {}),
    "linalg.cho_solve": lambda d: ((_cho(d), _v(d)), {}),
    "linalg.lu_solve": lambda d: ((_lu(d), _v(d)), {}),
    **{
        f"linalg.{n}": lambda d: ((_v(d),), {})
        for n in "companion fiedler_companion fiedler circulant".split()
    },
    "linalg.convolution_matrix": lambda d: ((_v(d), 4), {}),
    **{f"linalg.{n}": lambda d: ((_v(d), _v(d)), {}) for n in ("hankel", "toeplitz")},
    "linalg.leslie": lambda d: ((_v(d), _v(d, 2)), {}),
    "linalg.block_diag": lambda d: ((_m(d), _v(d)), {}),
    **{f"signal.{n}": lambda d: ((_v(d, 8), _v(d)), {}) for n in ("convolve", "correlate")},
    **{
        f"signal.{n}": lambda d: ((_m(d), _m(d)[:2]), {})
        for n in ("convolve2d", "correlate2d", "fftconvolve")
    },
    "signal.csd": lambda d: ((_sig(d), _sig(d)), {"nperseg": 16}),
    **{f"signal.{n}": lambda d: ((_sig(d),), {"nperseg": 16}) for n in ("stft", "welch")},
    "signal.detrend": lambda d: ((_v(d, 8),), {}),
    **{f"fft.{n}": lambda d: ((_v(d, 4),), {}) for n in ("dct", "idct")},
    **{f"fft.{n}": lambda d: ((_m(d),), {}) for n in ("dctn", "idctn")},
    "ndimage.map_coordinates": lambda d: ((_m(d), [_v(d, 2), _v(d, 2)], 1), {}),
    "integrate.trapezoid": lambda d: ((_v(d, 8),), {"dx": 0.5}),
    "optimize.minimize": lambda d: ((lambda x: jnp.sum((x - 1.0) ** 2), _v(d)), {"method": "BFGS"}),
    **{f"sparse.linalg.{n}": lambda d: ((_m(d), _v(d)), {}) for n in ("cg", "bicgstab", "gmres")},
    "cluster.vq.vq": lambda d: ((_m(d), _m(d)[:2]), {}),
    **{f"stats.{n}": lambda d: ((_v(d, 8),), {}) for n in ("sem", "mode", "rankdata")},
}

# names with no narrow input to check: creation functions, complex-only inputs, classes (their
# methods are checked in the module's own test file)
NO_NARROW_INPUT = {
    **dict.fromkeys(
        [f"linalg.{n}" for n in "helmert hilbert invhilbert invpascal pascal dft hadamard".split()],
        "creation: no input array (tests/scipy/test_ns_linalg.py checks the dtypes)",
    ),
    "signal.istft": "takes a complex spectrum: there is no narrow complex dtype",
    "stats.gaussian_kde": "a class: tests/scipy/test_ns_stats.py",
    "interpolate.RegularGridInterpolator": "a class: tests/scipy/test_ns_interpolate.py",
}


def test_every_function_has_a_recipe_or_a_reason():
    rules = {f"{p}.{n}": r for p, t in _table.TABLES.items() for n, r in t.items()}
    needed = {k for k, r in rules.items() if not isinstance(r, Pass)}
    assert sorted(needed - set(RECIPES) - set(NO_NARROW_INPUT)) == []
    assert sorted((set(RECIPES) | set(NO_NARROW_INPUT)) - needed) == []


def _call(qual: str):
    path, name = qual.rsplit(".", 1)
    return getattr(importlib.import_module(f"heddle.scipy.{path}"), name)


def _traced(fn, args: tuple, kwargs: dict):
    """``fn(*args, **kwargs)`` as a function of the NumPy arrays among the arguments only (the rest,
    axes, orders, flags, functions, stay static), with those arrays."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, np.ndarray)]

    def closed(*arrays):
        full = list(leaves)
        for i, a in zip(where, arrays, strict=True):
            full[i] = a
        a, k = jax.tree.unflatten(tree, full)
        return fn(*a, **k)

    return closed, [leaves[i] for i in where]


@pytest.mark.parametrize("d", [BF16, F16], ids=str)
@pytest.mark.parametrize("qual", sorted(RECIPES))
def test_no_narrow_arithmetic_and_the_result_dtypes(qual, d):
    args, kwargs = RECIPES[qual](d)
    fn, arrays = _traced(_call(qual), args, kwargs)
    closed = jax.make_jaxpr(fn)(*arrays)
    assert narrow_arithmetic(closed.jaxpr) == [], qual
    outs = {np.dtype(a.dtype) for a in closed.out_avals}
    if qual == "stats.rankdata":  # ranks: the policy's float for integer inputs
        assert outs == {F32}
        return
    allowed = {d, np.dtype(np.complex64), np.dtype(np.int32), np.dtype(np.bool_)}
    assert outs <= allowed, (qual, outs)
    assert d in outs or np.dtype(np.complex64) in outs, outs


@pytest.mark.parametrize("qual", sorted(RECIPES))
def test_integer_inputs_give_the_default_float_or_keep_integers(qual):
    """float-only and reductions of int8: float32 / int32; copies and arithmetic: int8."""
    path, name = qual.rsplit(".", 1)
    rule = _table.TABLES[path][name]
    if qual in ("linalg.rsf2csf", "linalg.cho_solve", "linalg.lu_solve", "optimize.minimize"):
        pytest.skip("takes the outputs of a float function")
    fn, arrays = _traced(_call(qual), *RECIPES[qual](np.int8))
    try:
        outs = jax.eval_shape(fn, *arrays)
    except (TypeError, ValueError, NotImplementedError) as e:  # JAX refuses integers itself
        pytest.skip(f"JAX refuses integer input: {e}"[:200])
    got = {np.dtype(a.dtype) for a in jax.tree.leaves(outs)}
    if isinstance(rule, Compute) and rule.op_class.value in ("arithmetic", "selection"):
        want = {np.dtype(np.int8)}
    elif isinstance(rule, Compute) and rule.op_class.value == "reduction":
        want = {np.dtype(np.int32)}
    elif qual in ("stats.mode", "ndimage.map_coordinates", "linalg.block_diag"):
        want = {np.dtype(np.int8), np.dtype(np.int32)}
    else:
        want = {F32, np.dtype(np.complex64), np.dtype(np.int32), np.dtype(np.bool_)}
    assert got <= want, (qual, got)


def _dist_calls(dist: str, d: np.dtype):
    src = getattr(hstats, dist)
    values = (_table.DISTRIBUTIONS | {k: ("x", "q", *v) for k, v in _special.STATS.items()})[dist]
    for name in src.__all__:
        params = inspect.signature(getattr(src, name)).parameters
        if dist == "multinomial":
            kw = {"x": np.array([2, 3], np.int32), "n": 5, "p": np.array([0.25, 0.75], d)}
        elif dist in ("dirichlet", "multivariate_normal"):
            kw = {"x": np.array([0.25, 0.75], d), "alpha": np.array([1.5, 2.0], d)}
            kw |= {"mean": np.zeros(2, d), "cov": np.eye(2, dtype=d)}
            kw = {k: v for k, v in kw.items() if k in params}
        else:
            kw = {p: np.full(4, 0.5, d) for p in params if p in values}
        yield name, getattr(src, name), kw


@pytest.mark.parametrize("dist", sorted([*_table.DISTRIBUTIONS, *_special.STATS]))
def test_every_distribution_function_computes_in_float32_and_rounds_once(dist):
    for d in (BF16, F16):
        for name, fn, kw in _dist_calls(dist, d):
            closed = jax.make_jaxpr(lambda k, fn=fn: fn(**k))(kw)
            assert narrow_arithmetic(closed.jaxpr) == [], f"{dist}.{name}"
            assert [np.dtype(a.dtype) for a in closed.out_avals] == [d], f"{dist}.{name}"
        # an integer point with Python-number parameters: the default float
        for name, fn, kw in _dist_calls(dist, np.dtype(np.int32)):
            if dist == "multinomial":
                kw["p"] = [0.25, 0.75]
            out = jax.eval_shape(lambda k, fn=fn: fn(**k), kw)
            assert np.dtype(out.dtype) == F32, f"{dist}.{name}"
