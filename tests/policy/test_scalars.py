"""Python scalars have no dtype (POLICY.md 3): every cell of the scalar table and every range check.

Expected dtypes are written here from the spec's table, keyed on the dtype's name; overflow thresholds
are computed with ``Fraction`` from each format's definition (largest finite value plus half an ulp),
not read off the code.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
from fractions import Fraction as F

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

from heddle import policy

NAMES = [d.name for d in policy.DTYPES]
WIDE = {"int64", "uint64", "float64", "complex128"}


def kind_of(name: str) -> str:
    """The kind of a dtype, read off its name (independent of heddle's own classification)."""
    if name == "bool":
        return "b"
    if name.startswith("uint"):
        return "u"
    if name.startswith("int"):
        return "i"
    if name.startswith("complex"):
        return "c"
    return "f"


def int_range(name: str) -> tuple[int, int]:
    bits = int(name.removeprefix("u").removeprefix("int"))
    return (0, 2**bits - 1) if name.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def expected(scalar: str, name: str) -> str:
    """POLICY.md 3's table: the dtype a Python scalar of kind ``scalar`` takes next to ``name``."""
    k = kind_of(name)
    if scalar == "bool":
        return name
    if scalar == "int":
        return "int32" if k == "b" else name
    if scalar == "float":
        return "float32" if k in "biu" else name
    # complex
    if k in "biu":
        return "complex64"
    if k == "f":
        return "complex128" if name == "float64" else "complex64"
    return name


# (largest finite value, ulp at the largest value), from each format's definition
FORMATS: dict[str, tuple[F, F]] = {
    "float4_e2m1fn": (F(6), F(2)),  # bias 1, 1.1b * 2**2
    "float8_e3m4": (F(31, 2), F(1, 2)),  # bias 3, top exponent reserved: 1.1111b * 2**3
    "float8_e4m3": (F(240), F(16)),  # bias 7, top exponent reserved: 1.111b * 2**7
    "float8_e4m3fn": (F(448), F(32)),  # bias 7, only S.1111.111 is NaN: 1.110b * 2**8
    "float8_e4m3fnuz": (F(240), F(16)),  # bias 8, no inf, one NaN: 1.111b * 2**7
    "float8_e4m3b11fnuz": (F(30), F(2)),  # bias 11: 1.111b * 2**4
    "float8_e5m2": (F(57344), F(8192)),  # bias 15, IEEE: 1.11b * 2**15
    "float8_e5m2fnuz": (F(57344), F(8192)),  # bias 16, no inf: 1.11b * 2**15
    "float8_e8m0fnu": (F(2**127), F(2**126)),  # powers of two 2**-127 .. 2**127
    "float16": (F(65504), F(32)),
    "bfloat16": (F(2**128 - 2**120), F(2**120)),
    "float32": (F(2**128 - 2**104), F(2**104)),
    "float64": (F(2**1024 - 2**971), F(2**971)),
}
FLOATS = [n for n in NAMES if kind_of(n) == "f"]


def threshold(name: str) -> F:
    top, ulp = FORMATS[name]
    return top + ulp / 2


def x64_for(*names: str):
    return jax.enable_x64(True) if WIDE & set(names) else contextlib.nullcontext()


def resolve_under(transform, name: str, *scalars):
    """``result_type(array of dtype name, *scalars)`` computed inside ``transform``.

    The array is a NumPy array eagerly and a traced argument under ``jax.jit``; the scalars are
    closed over (so they stay Python scalars and are range-checked in both cases). Returns the dtype
    seen while tracing, after checking the traced output carries it.
    """
    seen = []

    def f(x):
        seen.append(policy.result_type(x, *scalars))
        return jnp.zeros((), seen[-1])

    with x64_for(name):
        out = transform(f)(np.zeros(2, policy.dtype(name)))
    assert out.dtype == seen[-1]
    return seen[-1]


SCALARS = {"bool": True, "int": 1, "float": 0.5, "complex": 1 + 0.5j}


@pytest.mark.parametrize("scalar", list(SCALARS))
@pytest.mark.parametrize("name", NAMES)
def test_scalar_table_cell(transform, scalar, name):
    want = expected(scalar, name)
    assert resolve_under(transform, name, SCALARS[scalar]) == policy.dtype(want)


@pytest.mark.parametrize("scalar", ["int", "float", "complex"])
@pytest.mark.parametrize("name", NAMES)
def test_weak_jax_values_follow_the_scalar_table(transform, scalar, name):
    """A weakly typed JAX value (``jnp.asarray(1)``; a Python scalar argument of ``jax.jit``)."""
    seen = []

    def f(x, s):
        assert s.aval.weak_type
        seen.append(policy.result_type(x, s))
        return jnp.zeros((), seen[-1])

    with x64_for(name):
        transform(f)(np.zeros(2, policy.dtype(name)), jnp.asarray(SCALARS[scalar]))
    assert seen[-1] == policy.dtype(expected(scalar, name))


def test_no_typed_operand_uses_the_defaults():
    assert policy.result_type(True) == np.dtype("bool")
    assert policy.result_type(7) == np.dtype("int32")
    assert policy.result_type(0.5) == np.dtype("float32")
    assert policy.result_type(1j) == np.dtype("complex64")
    # several scalars: the widest kind decides
    assert policy.result_type(True, 1) == np.dtype("int32")
    assert policy.result_type(1, 2.0) == np.dtype("float32")
    assert policy.result_type(1, 2.0, 3j) == np.dtype("complex64")
    assert policy.result_type(True, False) == np.dtype("bool")


def test_no_typed_operand_range_is_the_defaults():
    assert policy.result_type(2**31 - 1, -(2**31)) == np.dtype("int32")
    with pytest.raises(policy.ScalarRangeError, match="2147483648"):
        policy.result_type(2**31)
    with pytest.raises(policy.ScalarRangeError, match="default int32"):
        policy.result_type(-(2**31) - 1)
    assert policy.result_type(3.4e38) == np.dtype("float32")
    with pytest.raises(policy.ScalarRangeError, match="default float32"):
        policy.result_type(1e39)
    with pytest.raises(policy.ScalarRangeError, match="complex64"):
        policy.result_type(1e39j)
    # the widest kind decides, then every scalar is checked against the result: 2**40 fits float32
    assert policy.result_type(2**40, 0.5) == np.dtype("float32")


@pytest.mark.parametrize("name", [n for n in NAMES if kind_of(n) in "iu"])
def test_int_scalar_range_for_every_integer_dtype(transform, name):
    lo, hi = int_range(name)
    assert resolve_under(transform, name, lo) == policy.dtype(name)
    assert resolve_under(transform, name, hi) == policy.dtype(name)
    for bad in (lo - 1, hi + 1):
        with pytest.raises(policy.ScalarRangeError, match=f"{bad}.*{name}"):
            resolve_under(transform, name, bad)


def test_issue_examples(transform):
    with pytest.raises(policy.ScalarRangeError):
        resolve_under(transform, "uint8", -2)
    with pytest.raises(policy.ScalarRangeError):
        resolve_under(transform, "int8", 1000)
    with pytest.raises(policy.ScalarRangeError):
        resolve_under(transform, "bfloat16", 1e39)
    assert resolve_under(transform, "bfloat16", 0.1) == policy.dtype("bfloat16")


def test_thresholds_agree_with_ml_dtypes_largest_values():
    """The hand-written format table above is the formats' own (a check on the test's reference)."""
    for name, (top, ulp) in FORMATS.items():
        info = ml_dtypes.finfo(policy.dtype(name))
        assert F(float(info.max)) == top, name
        below = (
            np.nextafter(info.max, np.zeros((), info.dtype)) if name != "float8_e8m0fnu" else None
        )
        if below is not None:
            assert top - F(float(below)) == ulp, name


@pytest.mark.parametrize("name", FLOATS)
def test_float_scalar_overflow_threshold_is_max_plus_half_ulp(transform, name):
    t = threshold(name)
    d = policy.dtype(name)
    if name == "float64":  # no Python float reaches the threshold; Python ints do
        assert resolve_under(transform, name, math.ceil(t) - 1) == d
        assert resolve_under(transform, name, float(FORMATS[name][0])) == d
        for bad in (math.ceil(t), -math.ceil(t), 10**400):
            with pytest.raises(policy.ScalarRangeError, match="largest finite"):
                resolve_under(transform, name, bad)
        return
    at = float(t)
    assert F(at) == t  # every threshold is a short dyadic number, exact as a float
    just_below = math.nextafter(at, 0.0)
    assert resolve_under(transform, name, just_below) == d
    with pytest.raises(policy.ScalarRangeError, match=f"{name}.*largest finite"):
        resolve_under(transform, name, at)
    with pytest.raises(policy.ScalarRangeError):
        resolve_under(transform, name, at * 4)
    # ints: the same threshold
    assert resolve_under(transform, name, math.ceil(t) - 1) == d
    with pytest.raises(policy.ScalarRangeError):
        resolve_under(transform, name, math.ceil(t))
    if name != "float8_e8m0fnu":  # symmetric for every signed format
        assert resolve_under(transform, name, -just_below) == d
        assert resolve_under(transform, name, -(math.ceil(t) - 1)) == d
        with pytest.raises(policy.ScalarRangeError):
            resolve_under(transform, name, -at)
        with pytest.raises(policy.ScalarRangeError):
            resolve_under(transform, name, -math.ceil(t))
        with pytest.raises(policy.ScalarRangeError):
            resolve_under(transform, name, -(10**400))


@pytest.mark.parametrize("name", FLOATS)
def test_inf_and_nan_pass(transform, name):
    d = policy.dtype(name)
    for v in (math.inf, -math.inf, math.nan):
        assert resolve_under(transform, name, v) == d
    with x64_for(name):
        # complex scalars with infinite parts take the complex counterpart, unchecked parts
        assert policy.result_type(np.zeros(1, d), complex(math.inf, 1)) == policy.dtype(
            expected("complex", name)
        )


def test_e8m0_scalars():
    d = np.zeros(2, ml_dtypes.float8_e8m0fnu)
    # no zero and no negatives: an error (JAX/ml_dtypes would give NaN)
    for v in (0, 0.0, -0.0, -1, -0.5, -(2**127)):
        with pytest.raises(policy.ScalarRangeError, match="no zero and no negative"):
            policy.result_type(d, v)
    # positive values round to a power of two, even below 2**-127 (there is no zero to flush to)
    for v in (1, 0.5, 3, 1e-40, 2.0**-127, 2.0**127):
        assert policy.result_type(d, v) == policy.dtype("float8_e8m0fnu")


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("float16", 65519, True),
        ("float16", 65520, False),
        ("float16", 70000, False),
        ("bfloat16", 2**127, True),
        ("bfloat16", 2**128, False),
        ("float8_e4m3fn", 463, True),
        ("float8_e4m3fn", 464, False),
        ("float4_e2m1fn", 6, True),
        ("float4_e2m1fn", 7, False),
        ("complex64", 2**200, False),
        ("complex128", 2**200, True),
        ("complex64", 1e39j, False),
        ("complex64", 1e38 + 1e38j, True),
        ("complex128", 1e300 + 1e300j, True),
        ("bfloat16", 1e39 + 0j, False),  # -> complex64, whose real part overflows
        ("float64", 1e39j, True),  # -> complex128
        ("int8", 1e39, False),  # a float meeting an integer takes the default float32
        ("int8", 1e38, True),
        ("uint8", 255, True),
        ("uint8", 256, False),
    ],
)
def test_range_checks_by_kind(transform, name, value, ok):
    if ok:
        assert resolve_under(transform, name, value) == policy.dtype(
            expected(type(value).__name__, name)
        )
    else:
        with pytest.raises(policy.ScalarRangeError):
            resolve_under(transform, name, value)


def test_several_scalars_with_a_typed_operand():
    u8 = np.zeros(2, np.uint8)
    # the widest scalar kind decides (float: the default float32), then each scalar is checked
    assert policy.result_type(u8, -2, 0.5) == np.dtype("float32")
    with pytest.raises(policy.ScalarRangeError, match="-2"):
        policy.result_type(u8, 3, -2)
    with pytest.raises(policy.ScalarRangeError, match="1000"):
        policy.result_type(np.zeros(2, np.int8), True, 1000)
    assert policy.result_type(np.zeros(2, np.int8), 1, 1j) == np.dtype("complex64")
    bf16 = np.zeros(2, ml_dtypes.bfloat16)
    assert policy.result_type(bf16, 1, 0.5) == policy.dtype("bfloat16")
    with pytest.raises(policy.ScalarRangeError):
        policy.result_type(bf16, 0.5, 2**200)


def test_numpy_scalars_are_typed():
    bf16 = np.zeros(2, ml_dtypes.bfloat16)
    # np.float64 subclasses Python float, yet it is typed
    assert policy.result_type(bf16, np.float64(0.1)) == np.dtype("float64")
    assert policy.result_type(bf16, np.float32(0.1)) == np.dtype("float32")
    assert policy.result_type(bf16, np.int64(3)) == policy.dtype("bfloat16")  # rule 4
    assert policy.result_type(np.uint8(1), np.int8(1)) == np.dtype("int16")
    assert policy.result_type(np.bool_(True), 1) == np.dtype("int32")
    assert policy.result_type(np.zeros(2, np.uint8), np.array(-2).astype(np.uint8)) == np.dtype(
        "uint8"
    )
    assert policy.result_type(np.complex128(1j), np.zeros(2, np.float16)) == np.dtype("complex128")
    # a NumPy scalar is never range-checked: it already has its dtype
    assert policy.result_type(np.zeros(2, np.uint8), np.uint8(255)) == np.dtype("uint8")


def test_python_scalar_subclasses_are_scalars():
    class Level(enum.IntEnum):
        HIGH = 1000

    assert policy.result_type(np.zeros(2, np.int16), Level.HIGH) == np.dtype("int16")
    with pytest.raises(policy.ScalarRangeError):
        policy.result_type(np.zeros(2, np.int8), Level.HIGH)


def test_typed_jax_arrays_are_typed(transform):
    def f(x, y):
        return jnp.zeros((), policy.result_type(x, y))

    out = transform(f)(jnp.zeros(2, jnp.uint8), jnp.asarray(-2, jnp.int32))  # not weak
    assert out.dtype == np.dtype("int32")


def test_weak_jax_values_range_checked_only_when_concrete():
    u8 = jnp.zeros(2, jnp.uint8)
    weak = jnp.asarray(-2)
    assert weak.aval.weak_type
    with pytest.raises(policy.ScalarRangeError, match="-2"):
        policy.result_type(u8, weak)  # eager: concrete, checked
    with pytest.raises(policy.ScalarRangeError, match="1000"):
        policy.result_type(jnp.zeros(2, jnp.int8), jnp.asarray(1000))
    seen = []

    @jax.jit
    def f(x, s):  # under jit a Python scalar argument is a weakly typed tracer: no value, no check
        seen.append(policy.result_type(x, s))
        return x

    f(u8, -2)
    assert seen == [np.dtype("uint8")]


def test_range_checks_follow_the_policy():
    """The JAX preset does not check scalar ranges (JAX wraps and overflows silently)."""
    with policy.use(policy.JAX):
        assert policy.result_type(np.zeros(2, np.uint8), -2) == np.dtype("uint8")
        assert policy.result_type(np.zeros(2, ml_dtypes.bfloat16), 1e39) == policy.dtype("bf16")
    with pytest.raises(policy.ScalarRangeError, match="policy 'heddle'"):
        policy.result_type(np.zeros(2, np.uint8), -2)


def test_result_type_needs_an_operand():
    with pytest.raises(policy.UnknownDTypeError, match="at least one operand"):
        policy.result_type()
    with pytest.raises(policy.UnknownDTypeError, match="not a dtype"):
        policy.result_type(np.zeros(2, np.uint8), "float33")


# ---- properties ---------------------------------------------------------------------------------

TYPED = st.sampled_from(NAMES)
SCALAR = st.one_of(
    st.booleans(),
    st.integers(-300, 300),
    st.floats(-1e5, 1e5, allow_nan=False),
    st.complex_numbers(max_magnitude=1e3, allow_nan=False, allow_infinity=False),
)


def _resolve(ops):
    try:
        return policy.result_type(*ops)
    except (policy.PromotionError, policy.ScalarRangeError) as e:
        return type(e)


@settings(max_examples=300, deadline=None)
@given(st.lists(TYPED, min_size=1, max_size=3), st.lists(SCALAR, min_size=1, max_size=3))
def test_result_with_scalars_never_narrower_than_the_typed_operands(typed, scalars):
    r = _resolve([policy.dtype(t) for t in typed] + scalars)
    if isinstance(r, type):
        return
    for t in typed:
        if kind_of(t) in "biu" and kind_of(r.name) in "fc":
            continue  # rule 4 and scalar table: an integer meeting a float takes the float
        if t == "bool":
            continue  # bool gives way to every dtype (e8m0 has no zero)
        assert policy.can_lossless_cast(t, r), (typed, scalars, r)
    if kind_of(r.name) in "iu":  # the value of every int scalar fits the result
        lo, hi = int_range(r.name)
        assert all(lo <= s <= hi for s in scalars if type(s) is int), (scalars, r)


@settings(max_examples=200, deadline=None)
@given(st.lists(TYPED, min_size=0, max_size=3), st.lists(SCALAR, min_size=0, max_size=3))
def test_nary_result_type_is_order_independent(typed, scalars):
    ops = [policy.dtype(t) for t in typed] + scalars
    if not ops:
        return
    first = _resolve(ops)
    for perm in itertools.islice(itertools.permutations(ops), 24):
        assert _resolve(list(perm)) == first, (perm, first)


def test_nary_promotion_settled_by_a_later_operand_in_every_order():
    """``e4m3fn + e5m2`` has no promotion, but with ``float32`` present every order gives float32."""
    ops = [policy.dtype("float8_e4m3fn"), policy.dtype("float8_e5m2"), np.dtype("float32")]
    for perm in itertools.permutations(ops):
        assert policy.result_type(*perm) == np.dtype("float32")
        assert policy.result_type(*perm, 0.5) == np.dtype("float32")
    with pytest.raises(policy.PromotionError, match="float8_e4m3fn"):
        policy.result_type(*ops[:2], 0.5)


def test_nary_result_type_order_independent_on_every_triple():
    for triple in itertools.combinations_with_replacement(policy.DTYPES, 3):
        results = {_resolve(list(perm)) for perm in itertools.permutations(triple)}
        assert len(results) == 1, (triple, results)


def test_weakly_typed_jax_arrays_are_checked_element_by_element():
    """``jnp.full(3, -2)`` is weakly typed: a scalar kind, every known element range-checked."""
    u8 = jnp.zeros(3, jnp.uint8)
    weak = jnp.full(3, -2)
    assert weak.aval.weak_type
    with pytest.raises(policy.ScalarRangeError, match="element -2 of a weakly typed JAX array"):
        policy.result_type(u8, weak)
    with pytest.raises(policy.ScalarRangeError, match="weakly typed JAX value 1000"):
        policy.result_type(jnp.zeros(2, jnp.int8), jnp.asarray(1000))
    mixed = jnp.asarray(np.array([0, 255, 3]))
    assert policy.result_type(u8, jax.lax.full((3,), 255)) == np.dtype("uint8")
    assert not mixed.aval.weak_type and policy.result_type(u8, mixed) == np.dtype("int32")  # typed
    f16 = jnp.zeros(2, jnp.float16)
    with pytest.raises(policy.ScalarRangeError, match="70000"):
        policy.result_type(f16, jnp.full(3, 7e4))
    assert policy.result_type(f16, jnp.full(3, jnp.nan)) == np.dtype("float16")
    assert policy.result_type(u8, jnp.full((0,), 5)) == np.dtype("uint8")  # nothing to check
    seen = []

    @jax.jit
    def f(x, s):
        seen.append(policy.result_type(x, s))
        return x

    f(u8, weak)  # traced: no values, no check
    assert seen == [np.dtype("uint8")]
