"""Coverage of JAX's namespaces and the op-class contract, driven by the classification tables.

Every public name of the installed ``jax.numpy`` (with ``linalg`` and ``fft``), ``jax.nn`` (with
``initializers``) and ``jax.lax`` exists in heddle's namespace, is classified in a table, and accepts
every parameter of JAX's signature. A name a new JAX adds fails here until it is classified.
Then every classified jax.numpy op is called on bfloat16, float16, float8_e4m3fn, int8, uint8 and bool
inputs, eagerly, under ``jax.jit`` and under ``jax.jit`` with ``jax_enable_x64``, and its result dtype
is checked against POLICY.md 4, written out below independently of heddle's own rules.
"""

from __future__ import annotations

import inspect
import types

import jax
import jax.numpy as jnp
import jax.scipy.special
import jax.scipy.stats
import ml_dtypes
import numpy as np
import pytest

import heddle.lax
import heddle.nn
import heddle.numpy as hnp
import heddle.scipy
from heddle.ops import _counting, _creation, _lax, _linalg, _nn, _special, _table

P = inspect.Parameter
_POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)


def _public(mod: object) -> set[str]:
    return {n for n in dir(mod) if not n.startswith("_")}


# --- names -----------------------------------------------------------------------------------------

# jax.numpy names that are neither ops nor pass-throughs of _table, each with where it lives.
NUMPY_OTHER = {
    "astype": "heddle.numpy.astype: the correctly rounded cast",
    "promote_types": "heddle.policy.promote_types",
    "result_type": "heddle.policy.result_type",
    "linalg": "the heddle.numpy.linalg namespace",
    "fft": "the heddle.numpy.fft namespace",
    "array_repr": "heddle/ops/_printing.py: narrow floats as shortest round-trip decimals",
    "array_str": "heddle/ops/_printing.py: narrow floats as shortest round-trip decimals",
}


def test_every_jax_numpy_name_is_classified_once():
    classified = [*_table.OPS, *_table.PASS, *_creation.CREATION, *_counting.COUNTING, *NUMPY_OTHER]
    assert len(classified) == len(set(classified)), "a name is classified twice"
    classes = {n for n in _public(jnp) if inspect.isclass(getattr(jnp, n))}
    missing = sorted(_public(jnp) - set(classified) - classes)
    assert not missing, f"jax.numpy names with no classification in heddle/ops/_table.py: {missing}"


def test_table_has_no_names_jax_numpy_lacks():
    stale = sorted((set(_table.OPS) | set(_table.PASS) | set(_creation.CREATION)) - _public(jnp))
    assert not stale, f"heddle/ops/_table.py classifies names jax.numpy does not have: {stale}"


def test_every_jax_numpy_name_exists_in_heddle_numpy():
    missing = sorted(n for n in _public(jnp) if not hasattr(hnp, n))
    assert not missing, f"heddle.numpy lacks: {missing}"


def test_heddle_numpy_exposes_the_policy_linalg_and_fft():
    # heddle/numpy.py must bind these two names to heddle.ops._linalg's namespaces
    assert hnp.linalg is _linalg.linalg
    assert hnp.fft is _linalg.fft


@pytest.mark.parametrize(
    ("src", "tables"),
    [
        (
            jnp.linalg,
            (
                _linalg.LINALG_FLOAT,
                _linalg.LINALG_OPS,
                _linalg.LINALG_SPECIAL,
                _linalg.LINALG_PASS,
            ),
        ),
        (jnp.fft, (_linalg.FFT_TRANSFORMS, _linalg.FFT_FREQ, _linalg.FFT_PASS)),
        (jax.nn, (_nn.FLOAT_OPS, _nn.CLIP_OPS, _nn.SPECIAL, _nn.PASS)),
        (jax.nn.initializers, (_nn.INIT_DIRECT, _nn.INIT_FACTORIES, _nn.INIT_PASS)),
    ],
    ids=["linalg", "fft", "nn", "initializers"],
)
def test_submodule_tables_match_jax(src, tables):
    classified = [n for t in tables for n in t]
    assert len(classified) == len(set(classified)), "a name is classified twice"
    assert sorted(_public(src) - set(classified)) == [], "unclassified names"
    assert sorted(set(classified) - _public(src)) == [], "stale names"


@pytest.mark.parametrize(
    ("src", "ours"),
    [
        (jnp.linalg, _linalg.linalg),
        (jnp.fft, _linalg.fft),
        (jax.nn, heddle.nn),
        (jax.nn.initializers, heddle.nn.initializers),
        (jax.lax, heddle.lax),
    ],
    ids=["linalg", "fft", "nn", "initializers", "lax"],
)
def test_every_name_exists(src, ours):
    missing = sorted(n for n in _public(src) if not hasattr(ours, n))
    assert not missing, f"missing from {ours.__name__}: {missing}"


def test_every_jax_scipy_special_name_is_classified_once():
    classified = [*_special.SPECIAL, *_special.CREATION, *_special.PASS]
    assert len(classified) == len(set(classified)), "a name is classified twice"
    src = _public(jax.scipy.special)
    missing = sorted(src - set(classified))
    assert not missing, f"jax.scipy.special names with no classification in _special.py: {missing}"
    assert sorted(set(classified) - src) == [], "classified names jax.scipy.special lacks"
    assert sorted(n for n in src if not hasattr(heddle.scipy.special, n)) == []
    for name in _special.SPECIAL:  # every one is a policy version, none is JAX's own object
        assert getattr(heddle.scipy.special, name) is not getattr(jax.scipy.special, name), name


@pytest.mark.parametrize("dist", sorted(_special.STATS))
def test_scipy_stats_distributions_have_every_function(dist):
    theirs, ours = getattr(jax.scipy.stats, dist), getattr(heddle.scipy.stats, dist)
    names = {n for n in _public(theirs) if callable(getattr(theirs, n))}
    assert names and names <= _public(ours)
    for name in names:
        assert getattr(ours, name) is not getattr(theirs, name), name


def test_lax_classification():
    assert not set(_lax.LAX) & set(_lax.LAX_PASS)
    assert set(_lax.LAX) | set(_lax.LAX_PASS) <= _public(jax.lax)
    # every name that accumulates or takes preferred_element_type is classified, so a new one fails
    accumulating = set()
    for name in _public(jax.lax):
        obj = getattr(jax.lax, name)
        if name.startswith(("reduce", "cum", "arg")) and not name.endswith("_p") and callable(obj):
            accumulating.add(name)
        try:
            if "preferred_element_type" in inspect.signature(obj).parameters:
                accumulating.add(name)
        except (TypeError, ValueError):
            continue
    accumulating.discard("reduce_window_shape_tuple")
    assert sorted(accumulating - set(_lax.LAX) - set(_lax.LAX_PASS)) == []
    # everything else is jax.lax's own object
    for name in _public(jax.lax) - set(_lax.LAX):
        assert getattr(heddle.lax, name) is getattr(jax.lax, name), name


def test_pass_throughs_are_jax_objects():
    for name in _table.PASS:
        if hasattr(jnp, name):
            assert getattr(hnp, name) is getattr(jnp, name), name
    for name in _nn.PASS:
        assert getattr(heddle.nn, name) is getattr(jax.nn, name), name
    for name in _linalg.LINALG_PASS:
        assert getattr(_linalg.linalg, name) is getattr(jnp.linalg, name), name
    for name in _linalg.FFT_PASS:
        assert getattr(_linalg.fft, name) is getattr(jnp.fft, name), name


# --- signatures ------------------------------------------------------------------------------------


def incompatibilities(own: inspect.Signature, theirs: inspect.Signature) -> list[str]:
    """Ways in which a call valid for ``theirs`` would not bind to ``own`` (empty: compatible)."""
    ps = list(own.parameters.values())
    var_pos = any(p.kind is P.VAR_POSITIONAL for p in ps)
    var_kw = any(p.kind is P.VAR_KEYWORD for p in ps)
    own_pos = [p for p in ps if p.kind in _POSITIONAL]
    by_name = {p.name: p for p in ps if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    problems = []
    their_pos = [p for p in theirs.parameters.values() if p.kind in _POSITIONAL]
    for i, tp in enumerate(their_pos):
        if i >= len(own_pos) and not var_pos:
            problems.append(f"positional parameter {i} ({tp.name}) not accepted")
    for tp in theirs.parameters.values():
        if tp.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY):
            if tp.name not in by_name and not var_kw:
                problems.append(f"keyword {tp.name!r} not accepted")
            elif tp.name in by_name and tp.kind is P.POSITIONAL_OR_KEYWORD:
                j = their_pos.index(tp)
                op = by_name[tp.name]
                if op.kind is P.POSITIONAL_OR_KEYWORD and own_pos.index(op) != j:
                    problems.append(f"{tp.name!r} is at a different position")
            if (
                tp.default is not P.empty
                and tp.name in by_name
                and by_name[tp.name].default is P.empty
            ):
                problems.append(f"{tp.name!r} has a default in JAX but is required here")
        if tp.kind is P.VAR_POSITIONAL and not var_pos:
            problems.append("*args not accepted")
        if tp.kind is P.VAR_KEYWORD and not var_kw:
            problems.append("**kwargs not accepted")
    for p in ps:
        if (
            p.default is P.empty
            and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)
            and p.name not in theirs.parameters
            and p.kind is not P.POSITIONAL_ONLY
        ):
            problems.append(f"{p.name!r} is required here but not in JAX")
    return problems


# deliberate differences: (namespace, name) -> reason
SIGNATURE_ALLOWED: dict[tuple[str, str], str] = {
    ("numpy", "array"): "JAX's *args only takes copy, order and ndmin positionally; heddle names "
    "them as positional parameters, so every call JAX accepts binds",
}


def _pairs():
    spaces = [
        ("numpy", jnp, hnp),
        ("linalg", jnp.linalg, _linalg.linalg),
        ("fft", jnp.fft, _linalg.fft),
        ("nn", jax.nn, heddle.nn),
        ("initializers", jax.nn.initializers, heddle.nn.initializers),
        ("lax", jax.lax, heddle.lax),
        ("scipy.special", jax.scipy.special, heddle.scipy.special),
        *(
            (f"scipy.stats.{d}", getattr(jax.scipy.stats, d), getattr(heddle.scipy.stats, d))
            for d in sorted(_special.STATS)
        ),
    ]
    for space, src, ours in spaces:
        for name in sorted(_public(src)):
            theirs, mine = getattr(src, name), getattr(ours, name, None)
            if mine is None or mine is theirs or inspect.isclass(theirs):
                continue
            if isinstance(theirs, types.ModuleType) or not callable(theirs):
                continue
            yield space, name, theirs, mine


@pytest.mark.parametrize(
    ("space", "name", "theirs", "mine"),
    list(_pairs()),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_signature_accepts_every_jax_parameter(space, name, theirs, mine):
    try:
        theirs_sig = inspect.signature(theirs)
    except ValueError:
        pytest.skip(f"jax's {space}.{name} has no introspectable signature")
    own = inspect.signature(mine, follow_wrapped=False)
    problems = incompatibilities(own, theirs_sig)
    if (space, name) in SIGNATURE_ALLOWED:
        return
    assert not problems, f"{space}.{name}{own} vs jax{theirs_sig}: {problems}"
    assert mine.__doc__, f"{space}.{name} has no docstring"


def test_incompatibilities_detects_what_it_claims():
    def jaxfn(a, b=1, *, c=2): ...

    def good(*args, **kwargs): ...

    def missing_kw(a, b=1): ...

    def moved(b, a=0, *, c=2): ...

    def required(a, b, *, c=2): ...

    sig = inspect.signature
    assert incompatibilities(sig(good), sig(jaxfn)) == []
    assert incompatibilities(sig(missing_kw), sig(jaxfn)) == ["keyword 'c' not accepted"]
    assert "'a' is at a different position" in incompatibilities(sig(moved), sig(jaxfn))
    assert incompatibilities(sig(required), sig(jaxfn)) == [
        "'b' has a default in JAX but is required here"
    ]


# --- the op-class contract, for every classified jax.numpy op --------------------------------------

BF16, F16, FP8 = ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn
INPUTS = {
    "bfloat16": BF16,
    "float16": F16,
    "float8_e4m3fn": FP8,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
F32, I32, U32, BOOL = np.float32, np.int32, np.uint32, np.bool_

# POLICY.md 4 written out per class and input dtype, independently of heddle.policy's rules.
SAME = {n: d for n, d in INPUTS.items()}
EXPECTED = {
    "arithmetic": SAME,
    "integral": SAME,
    "selection": SAME,
    "comparison": dict.fromkeys(INPUTS, BOOL),
    "index": dict.fromkeys(INPUTS, I32),
    "float_only": {**SAME, "int8": F32, "uint8": F32, "bool": F32},
    "reduction": {**SAME, "int8": I32, "uint8": U32, "bool": I32},
}


def _class_of(name: str) -> str:
    if name in _table.OPS:
        return _table.OPS[name][0].value
    return "selection"  # the pass-throughs of the "selection" group


CONTRACT_NAMES = sorted(
    [n for n in _table.OPS if hasattr(jnp, n)]
    + [n for n, why in _table.PASS.items() if why.startswith("selection") and hasattr(jnp, n)]
)

IDX = np.array([0, 2, 1], np.int32)


def _m(d):
    """A 3x3 array whose values (0..3) exist in every input dtype."""
    return np.array([[1, 2, 3], [2, 1, 0], [3, 0, 1]]).astype(d)


# name -> (args, kwargs) built from the 3x3 input ``x``; absent names get as many copies of x as
# jax.numpy's signature has required positional parameters.
RECIPES = {
    **dict.fromkeys(
        "bitwise_and bitwise_or bitwise_xor logical_and logical_or logical_xor logaddexp "
        "logaddexp2 divmod".split(),
        lambda x: ((x, x), {}),
    ),
    **dict.fromkeys(
        "polyadd polysub polymul polydiv convolve correlate meshgrid ix_ union1d intersect1d "
        "setdiff1d setxor1d".split(),
        lambda x: ((x[0], x[0]), {}),
    ),
    **dict.fromkeys("vander polyder polyint roots trim_zeros".split(), lambda x: ((x[0],), {})),
    "polyval": lambda x: ((x[0], x), {}),
    "polyfit": lambda x: ((x[0], x[1]), {"deg": 1}),
    "clip": lambda x: ((x, x.min(), x.max()), {}),
    "interp": lambda x: ((x[1], x[0], x[2]), {}),
    **dict.fromkeys(
        "percentile nanpercentile quantile nanquantile".split(), lambda x: ((x, x[2]), {})
    ),
    **dict.fromkeys("cumulative_sum cumulative_prod".split(), lambda x: ((x,), {"axis": 0})),
    "einsum": lambda x: (("ij,jk->ik", x, x), {}),
    **dict.fromkeys("argpartition partition".split(), lambda x: ((x, 1), {})),
    "searchsorted": lambda x: ((x[0], x), {}),
    "digitize": lambda x: ((x, x[0]), {}),
    "isin": lambda x: ((x, x[0]), {}),
    "where": lambda x: ((x > x.min(), x, x), {}),
    "select": lambda x: (([x > x.min()], [x]), {}),
    "extract": lambda x: ((x > x.min(), x), {}),
    "compress": lambda x: ((np.array([True, False, True]), x), {"axis": 0}),
    "take": lambda x: ((x, IDX), {}),
    "take_along_axis": lambda x: ((x, np.zeros((3, 1), np.int32)), {"axis": 1}),
    "choose": lambda x: ((np.zeros((3,), np.int32), [x[0], x[1]]), {}),
    "piecewise": lambda x: ((x[0], [x[0] > x[0].min()], [lambda t: t, lambda t: t]), {}),
    "reshape": lambda x: ((x, (9,)), {}),
    "roll": lambda x: ((x, 1), {}),
    "tile": lambda x: ((x, (2,)), {}),
    "repeat": lambda x: ((x, 2), {}),
    "expand_dims": lambda x: ((x, 0), {}),
    "moveaxis": lambda x: ((x, 0, 1), {}),
    "swapaxes": lambda x: ((x, 0, 1), {}),
    "rollaxis": lambda x: ((x, 1), {}),
    "permute_dims": lambda x: ((x, (1, 0)), {}),
    "broadcast_to": lambda x: ((x, (2, 3, 3)), {}),
    **dict.fromkeys("split array_split hsplit vsplit".split(), lambda x: ((x, 3), {})),
    "dsplit": lambda x: ((x[:, :, None], 1), {}),
    "unstack": lambda x: ((x,), {}),
    "pad": lambda x: ((x, 1), {}),
    "resize": lambda x: ((x, (2, 2)), {}),
    "delete": lambda x: ((x, 1), {}),
    "insert": lambda x: ((x, 1, x[0]), {"axis": 0}),
    "put": lambda x: ((x, IDX, x[0]), {"inplace": False}),
    "put_along_axis": lambda x: (
        (x, np.zeros((3, 1), np.int32), x[:, :1]),
        {"axis": 1, "inplace": False},
    ),
    "place": lambda x: ((x, x > x.min(), x[0]), {"inplace": False}),
    "fill_diagonal": lambda x: ((x, x[0, 0]), {"inplace": False}),
    "ldexp": lambda x: ((x, np.ones((3, 3), np.int32)), {}),
    "block": lambda x: (([[x, x]],), {}),
    **dict.fromkeys(
        "concatenate concat stack hstack vstack dstack column_stack".split(),
        lambda x: (([x, x],), {}),
    ),
    "append": lambda x: ((x, x), {}),
    "cross": lambda x: ((x, x), {}),
    **dict.fromkeys("atleast_1d atleast_2d atleast_3d".split(), lambda x: ((x,), {})),
    "broadcast_arrays": lambda x: ((x, x), {}),
}

# Names whose results do not follow the class heddle/ops/_table.py gives them, with the right class.
# Each runs as a strict xfail: when the table is corrected, remove the name from here.
MISCLASSIFIED: dict[str, str] = {
    "sort_complex": "always complex (the complex counterpart of the float-only result)",
    "poly": "complex output, as jax.numpy.poly gives for roots that may be complex",
    "packbits": "always uint8 (a bit-packing cast), not selection",
    "bitwise_count": "always uint8 (a count, like an index result), not selection",
}
# Names that do not run at all for some inputs, with the reproducer's gist.
BROKEN: dict[str, str] = {}
# Names whose output shape depends on the values: they cannot run inside one jitted kernel
EAGER_BROKEN: dict[str, str] = {
    "roots": "its shape depends on the values (under jit it refuses, as jax.numpy.roots does); "
    "eagerly it is always complex, the companion matrix's eigenvalues, as jax.numpy.roots gives",
}


def _call_args(name: str, d) -> tuple[tuple, dict]:
    x = _m(d)
    if name in RECIPES:
        return RECIPES[name](x)
    sig = inspect.signature(getattr(jnp, name))
    k = sum(1 for p in sig.parameters.values() if p.kind in _POSITIONAL and p.default is P.empty)
    return (x,) * k, {}


def _run(fn, args, kwargs, mode):
    if mode == "eager":
        return fn(*args, **kwargs)
    leaves, tree = jax.tree.flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, np.ndarray)]

    def closed(*arrays):
        full = list(leaves)
        for i, a in zip(where, arrays, strict=True):
            full[i] = a
        a, k = jax.tree.unflatten(tree, full)
        return fn(*a, **k)

    arrays = [leaves[i] for i in where]
    if mode == "jit":
        return jax.jit(closed).eval_shape(*arrays)
    with jax.enable_x64(True):
        return jax.jit(closed).eval_shape(*arrays)


def _leaves(out):
    return [leaf for leaf in jax.tree.leaves(out) if hasattr(leaf, "dtype")]


# Outputs after the first that are index arrays (int32 by POLICY.md 4), by name.
INDEX_OUTPUTS = {"frexp", "unique_all", "unique_counts", "unique_inverse"}


def _check(name: str, dname: str, mode: str) -> str | None:
    """None when the result dtype follows the class, else what went wrong."""
    args, kwargs = _call_args(name, INPUTS[dname])
    try:
        out = _run(getattr(hnp, name), args, kwargs, mode)
    except Exception as ours:
        # refusing is fine only where jax.numpy itself refuses (bitwise ops on floats, gcd on
        # floats, subtract on bool, nonzero without size= under jit, ...)
        try:
            _run(getattr(jnp, name), args, kwargs, mode)
        except Exception:
            return None
        return f"{dname}/{mode}: raised where jax.numpy did not: {ours!r}"[:300]
    want = np.dtype(EXPECTED[_class_of(name)][dname])
    got = [np.dtype(leaf.dtype) for leaf in _leaves(out)]
    if not got:
        return f"{dname}/{mode}: returned no array"
    ok = (
        got[0] == want and all(g == I32 for g in got[1:])
        if name in INDEX_OUTPUTS
        else all(g == want for g in got)
    )
    return None if ok else f"{dname}/{mode}: {[g.name for g in got]}, want {want.name}"


def _by_name(names, known):
    for name in names:
        marks = [pytest.mark.xfail(strict=True, reason=known[name])] if name in known else []
        yield pytest.param(name, marks=marks, id=name)


# Traced: every dtype; under x64 the dtypes where JAX's own answer changes (integers, bool) and one
# narrow float.
TRACED = [(d, "jit") for d in INPUTS] + [(d, "jit_x64") for d in ("int8", "bool", "bfloat16")]


@pytest.mark.parametrize("name", list(_by_name(CONTRACT_NAMES, {**MISCLASSIFIED, **BROKEN})))
def test_result_dtype_follows_the_op_class_under_jit(name):
    problems = [p for d, mode in TRACED if (p := _check(name, d, mode))]
    assert not problems, f"heddle.numpy.{name} ({_class_of(name)}): {problems}"


# Eagerly each op is compiled anew for every dtype (~0.3 s a call): one name per op class here, the
# full sweep behind the slow marker.
EAGER_SAMPLE = ["add", "negative", "sort", "less", "argmax", "sin", "sum", "matmul"]


@pytest.mark.parametrize("name", list(_by_name(EAGER_SAMPLE, {**MISCLASSIFIED, **BROKEN})))
def test_result_dtype_follows_the_op_class_eagerly(name):
    problems = [p for d in INPUTS if (p := _check(name, d, "eager"))]
    assert not problems, f"heddle.numpy.{name} ({_class_of(name)}): {problems}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", list(_by_name(CONTRACT_NAMES, {**MISCLASSIFIED, **BROKEN, **EAGER_BROKEN}))
)
def test_result_dtype_follows_the_op_class_eagerly_every_op(name):
    problems = [p for d in INPUTS if (p := _check(name, d, "eager"))]
    assert not problems, f"heddle.numpy.{name} ({_class_of(name)}): {problems}"


def test_contract_covers_every_op_class():
    classes = {_class_of(n) for n in CONTRACT_NAMES}
    assert classes == set(EXPECTED)
    assert {_class_of(n) for n in EAGER_SAMPLE} == set(EXPECTED)


# --- docs/ops.md ----------------------------------------------------------------------------------


def test_docs_ops_page_examples_run():
    import doctest
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "ops.md").read_text()
    parser, globs = doctest.DocTestParser(), {}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
        test = parser.get_doctest(block, globs, f"ops.md[{i}]", "docs/ops.md", 0)
        runner.run(test, clear_globs=False, out=lambda s: None)
        globs.update(test.globs)
    result = runner.summarize(verbose=False)
    assert result.attempted > 20 and result.failed == 0, result


# --- static positional arguments ------------------------------------------------------------------

_V = np.arange(1, 7).astype(BF16)
_M = _V.reshape(2, 3)

# calls that pass a static argument (an axis, an order, a flag) positionally, as NumPy users write
# them; value positions "all" in heddle/ops/_table.py would make that argument a value operand
STATIC_POSITIONAL = {
    "diff(v, 2)": lambda np_: np_.diff(_V, 2),
    "vander(v, 3)": lambda np_: np_.vander(_V, 3),
    "median(m, 0)": lambda np_: np_.median(_M, 0),
    "average(m, 0)": lambda np_: np_.average(_M, 0),
    "percentile(m, 50, 0)": lambda np_: np_.percentile(_M, 50, 0),
    "quantile(m, 0.5, 1)": lambda np_: np_.quantile(_M, 0.5, 1),
    # polyfit is left out: jax.numpy.polyfit itself has no bfloat16 path (LAPACK)
    "polyder(v, 2)": lambda np_: np_.polyder(_V, 2),
    "polyint(v, 2)": lambda np_: np_.polyint(_V, 2),
    "unwrap(v, 3.0, 0)": lambda np_: np_.unwrap(_V, 3.0, 0),
    "cov(m, None, False)": lambda np_: np_.cov(_M, None, False),
    "nan_to_num(v, True, 0.0)": lambda np_: np_.nan_to_num(_V, True, 0.0),
    "gradient(v, 2.0)": lambda np_: np_.gradient(_V, 2.0),
    "trapezoid(v, None, 0.5)": lambda np_: np_.trapezoid(_V, None, 0.5),
}
STATIC_BROKEN: dict[str, str] = {}


@pytest.mark.parametrize("call", list(_by_name(STATIC_POSITIONAL, STATIC_BROKEN)))
def test_static_positional_arguments_are_not_operands(call):
    theirs = STATIC_POSITIONAL[call](jnp)  # valid for jax.numpy
    ours = STATIC_POSITIONAL[call](hnp)
    assert np.dtype(ours.dtype) == BF16
    assert ours.shape == theirs.shape
