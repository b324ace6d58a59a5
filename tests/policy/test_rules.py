"""Op-class results, accumulation and gradient dtypes (POLICY.md 4, 5, 7), for every dtype.

The expected values are written out here from the spec's text, dtype by dtype (by name), not derived
from heddle's lattice.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from heddle import policy
from heddle.policy import OpClass

NAMES = [d.name for d in policy.DTYPES]
GOLDEN = pathlib.Path(__file__).with_name("promotion.csv")
WIDE = {"int64", "uint64", "float64", "complex128"}

NARROW_FLOATS = [
    "float4_e2m1fn", "float8_e3m4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float16", "bfloat16",
]  # fmt: skip
INTS = ["bool", "int2", "int4", "int8", "int16", "int32", "int64"]
UINTS = ["uint2", "uint4", "uint8", "uint16", "uint32", "uint64"]
INEXACT = [*NARROW_FLOATS, "float32", "float64", "complex64", "complex128"]

# POLICY.md 5: floats narrower than float32 -> float32; float32/float64/complex -> themselves;
# bool and signed narrower than 32 bits -> int32; unsigned narrower than 32 bits -> uint32; 32/64-bit
# integers -> themselves.
ACC = {
    **dict.fromkeys(NARROW_FLOATS, "float32"),
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
    **dict.fromkeys(["bool", "int2", "int4", "int8", "int16", "int32"], "int32"),
    "int64": "int64",
    **dict.fromkeys(["uint2", "uint4", "uint8", "uint16", "uint32"], "uint32"),
    "uint64": "uint64",
}
# POLICY.md 7: float64 and the complex dtypes keep theirs; every other float, and integer/bool
# leaves (zero gradients), get float32.
GRAD = {n: "float32" for n in NAMES} | {
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
}
# POLICY.md 4 "wider of the accumulation dtypes": the join of two accumulation dtypes, by hand
ACC_JOIN = {
    frozenset({"int32", "int64"}): "int64",
    frozenset({"int32", "uint32"}): "int64",
    frozenset({"int64", "uint32"}): "int64",
    frozenset({"uint32", "uint64"}): "uint64",
    frozenset({"int32", "uint64"}): None,  # uint64 with a signed integer: PromotionError
    frozenset({"int64", "uint64"}): None,
    frozenset({"float32", "float64"}): "float64",
    frozenset({"float32", "complex64"}): "complex64",
    frozenset({"float32", "complex128"}): "complex128",
    frozenset({"float64", "complex64"}): "complex128",
    frozenset({"float64", "complex128"}): "complex128",
    frozenset({"complex64", "complex128"}): "complex128",
}


def acc_join(a: str, b: str) -> str | None:
    if a == b:
        return a
    if (a in INEXACT) != (b in INEXACT):  # an integer accumulator gives way to a float one
        return a if a in INEXACT else b
    return ACC_JOIN[frozenset({a, b})]


def golden() -> dict[tuple[str, str], str]:
    with GOLDEN.open() as f:
        rows = list(csv.reader(f))
    return {(r[0], b): v for r in rows[1:] for b, v in zip(rows[0][1:], r[1:], strict=True)}


def x64_for(*names):
    return jax.enable_x64(True) if WIDE & set(names) else contextlib.nullcontext()


def test_the_lists_above_cover_every_dtype():
    assert sorted(INTS + UINTS + INEXACT) == sorted(NAMES)
    assert set(ACC) == set(GRAD) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_acc_dtype(name):
    assert policy.acc_dtype(name) == policy.dtype(ACC[name])


@pytest.mark.parametrize("name", NAMES)
def test_acc_dtype_with_a_float64_floor(name):
    stats = dataclasses.replace(policy.HEDDLE, min_float_acc="float64")
    want = "float64" if name in [*NARROW_FLOATS, "float32", "float64"] else ACC[name]
    assert policy.acc_dtype(name, policy=stats) == policy.dtype(want)
    with policy.use(stats):  # the active policy's floor by default
        assert policy.acc_dtype(name) == policy.dtype(want)


@pytest.mark.parametrize("name", NAMES)
def test_grad_dtype(name):
    assert policy.grad_dtype(name) == policy.dtype(GRAD[name])


@pytest.mark.parametrize("name", NAMES)
def test_dtype_rules_under_jit_on_traced_arrays(transform, name):
    seen = {}

    def f(x):
        seen["acc"], seen["grad"] = policy.acc_dtype(x), policy.grad_dtype(x)
        seen["red"] = policy.reduction_dtypes(x)
        seen["fo"] = policy.result_dtype(OpClass.FLOAT_ONLY, x)
        return x

    with x64_for(name):
        transform(f)(jnp.zeros(2, policy.dtype(name)))
    assert seen["acc"] == policy.dtype(ACC[name]) and seen["grad"] == policy.dtype(GRAD[name])
    red = name if name in INEXACT else ACC[name]
    assert seen["red"] == (policy.dtype(red), policy.dtype(ACC[name]))
    assert seen["fo"] == policy.dtype(name if name in INEXACT else "float32")


@pytest.mark.parametrize("name", NAMES)
def test_result_dtype_single_operand_every_class(name):
    d = policy.dtype(name)
    want = {
        OpClass.ARITHMETIC: name,
        OpClass.COMPARISON: "bool",
        OpClass.INDEX: "int32",
        OpClass.FLOAT_ONLY: name if name in INEXACT else "float32",
        OpClass.INTEGRAL: name,
        OpClass.SELECTION: name,
        OpClass.REDUCTION: name if name in INEXACT else ACC[name],
        OpClass.CAST: name,
        OpClass.CREATION: name,
    }
    assert set(want) == set(OpClass)
    for op_class, w in want.items():
        assert policy.result_dtype(op_class, d) == policy.dtype(w), op_class
        assert policy.result_dtype(op_class.value, name) == policy.dtype(w), op_class


def test_index_results_are_int32_even_under_x64():
    with jax.enable_x64(True):
        assert policy.result_dtype(OpClass.INDEX, "int64") == np.dtype("int32")
        assert policy.result_dtype(OpClass.FLOAT_ONLY, "int64") == np.dtype("float32")


@pytest.mark.parametrize("name", NAMES)
def test_cast_and_creation_give_the_requested_dtype(name):
    for target in NAMES:
        assert policy.result_dtype(OpClass.CAST, name, target) == policy.dtype(target)
        assert policy.result_dtype(OpClass.CREATION, name, target) == policy.dtype(target)


def test_result_dtype_pairs_follow_the_golden_table():
    for (a, b), want in golden().items():
        if want == "error":
            for op_class in (OpClass.ARITHMETIC, OpClass.FLOAT_ONLY, OpClass.REDUCTION):
                with pytest.raises(policy.PromotionError):
                    policy.result_dtype(op_class, a, b)
            continue
        assert policy.result_dtype(OpClass.ARITHMETIC, a, b) == policy.dtype(want)
        float_only = want if want in INEXACT else "float32"
        assert policy.result_dtype(OpClass.FLOAT_ONLY, a, b) == policy.dtype(float_only)
        reduction = want if want in INEXACT else ACC[want]
        assert policy.result_dtype(OpClass.REDUCTION, a, b) == policy.dtype(reduction)
        assert policy.result_dtype(OpClass.COMPARISON, a, b) == np.dtype("bool")
        assert policy.result_dtype(OpClass.INDEX, a, b) == np.dtype("int32")


def test_float_only_follows_the_policy_defaults():
    with policy.default_dtypes(float="bfloat16"):
        assert policy.result_dtype(OpClass.FLOAT_ONLY, "int8") == policy.dtype("bfloat16")
        assert policy.result_dtype(OpClass.FLOAT_ONLY, "float16") == np.dtype("float16")
    p = dataclasses.replace(policy.HEDDLE, float_result_for_int="float64", index_dtype="int64")
    assert policy.result_dtype(OpClass.FLOAT_ONLY, "bool", policy=p) == np.dtype("float64")
    assert policy.result_dtype(OpClass.INDEX, "int8", policy=p) == np.dtype("int64")
    assert p.default_float == np.dtype("float32")  # only the integer case changed


def test_result_dtype_needs_a_dtype():
    with pytest.raises(ValueError, match="at least one operand") as e:
        policy.result_dtype(OpClass.ARITHMETIC)
    assert "result_dtype(OpClass.ARITHMETIC, x.dtype)" in str(e.value)
    x = np.zeros(2, np.int8)
    assert policy.result_dtype(OpClass.ARITHMETIC, x.dtype) == np.dtype("int8")  # the fix
    with pytest.raises(ValueError):
        policy.result_dtype("no-such-class", "int8")


@pytest.mark.parametrize("name", NAMES)
def test_reduction_dtypes_without_dtype_argument(name):
    red = name if name in INEXACT else ACC[name]
    assert policy.reduction_dtypes(name) == (policy.dtype(red), policy.dtype(ACC[name]))


# ... unless the result's accumulation dtype already holds every input value: uint8 summed with
# dtype=int32 accumulates in int32 (the join of uint32 and int32 would be int64). Integer ranges
# by hand; for floats the join is already the one that holds the input.
INT_RANGE = (
    {"bool": (0, 1)}
    | {n: (-(2 ** (int(n[3:]) - 1)), 2 ** (int(n[3:]) - 1) - 1) for n in INTS[1:]}
    | {n: (0, 2 ** int(n[4:]) - 1) for n in UINTS}
)


def holds_input(acc: str, name: str) -> bool:
    if acc not in INT_RANGE or name not in INT_RANGE:
        return False
    (lo, hi), (alo, ahi) = INT_RANGE[name], INT_RANGE[acc]
    return alo <= lo and hi <= ahi


@pytest.mark.parametrize("name", NAMES)
def test_reduction_dtypes_with_dtype_argument(name):
    for target in NAMES:
        joined = acc_join(ACC[name], ACC[target])
        want = ACC[target] if holds_input(ACC[target], name) else joined
        if want is None:
            with pytest.raises(policy.PromotionError):
                policy.reduction_dtypes(name, target)
            continue
        assert policy.reduction_dtypes(name, target) == (
            policy.dtype(target),
            policy.dtype(want),
        ), target


def test_reduction_dtypes_spec_examples():
    assert policy.reduction_dtypes("bfloat16") == (policy.dtype("bfloat16"), np.dtype("float32"))
    assert policy.reduction_dtypes("int8") == (np.dtype("int32"), np.dtype("int32"))
    assert policy.reduction_dtypes("bool") == (np.dtype("int32"), np.dtype("int32"))
    assert policy.reduction_dtypes("uint8") == (np.dtype("uint32"), np.dtype("uint32"))
    assert policy.reduction_dtypes("int8", "int16") == (np.dtype("int16"), np.dtype("int32"))
    assert policy.reduction_dtypes("bfloat16", "float64") == (
        np.dtype("float64"),
        np.dtype("float64"),
    )
    assert policy.reduction_dtypes("float64", "bfloat16") == (
        policy.dtype("bfloat16"),
        np.dtype("float64"),
    )


# least_upper_float: the narrowest float holding every value, with the tie rule (several incomparable
# minimal formats -> the narrowest container of all of them, found the same way)
LUF = {
    "bool": "float4_e2m1fn",  # {0, 1}
    "int2": "float4_e2m1fn",  # {-2..1}
    "uint2": "float4_e2m1fn",  # {0..3}
    "int4": "float32",  # -8..7 fits many float8s; their common minimal containers tie (f16, bf16)
    "uint4": "float32",  # 0..15 likewise
    "int8": "float32",  # fits float16 and bfloat16, neither holds the other
    "uint8": "float32",
    "int16": "float32",  # 16 significant bits: float32 and up
    "uint16": "float32",
    "int32": "float64",
    "uint32": "float64",
    **{n: n for n in INEXACT},
}


@pytest.mark.parametrize("name", NAMES)
def test_least_upper_float(name):
    if name in ("int64", "uint64"):
        with pytest.raises(policy.PromotionError, match=name) as e:
            policy.least_upper_float(name)
        assert "heddle.astype(x, 'float64')" in str(e.value)
        return
    assert policy.least_upper_float(name) == policy.dtype(LUF[name])


def _int_values(name):
    if name == "bool":
        return np.array([0, 1])
    bits = int(name.removeprefix("u").removeprefix("int"))
    lo, hi = (0, 2**bits - 1) if name.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if bits > 16:
        return np.array([lo, lo + 1, hi - 1, hi, 2**bits // 3])
    return np.arange(lo, hi + 1)


@pytest.mark.parametrize("name", [n for n in INTS + UINTS if n not in ("int64", "uint64")])
def test_least_upper_float_holds_every_value_and_ties_are_real(name):
    """Round trip through NumPy/ml_dtypes: every value survives in the answer."""
    values = _int_values(name)
    r = policy.least_upper_float(name)
    assert (values.astype(r).astype(np.int64) == values).all()
    if name in ("int4", "uint4", "int8", "uint8"):  # both 16-bit formats hold them: a tie
        for f in ("float16", "bfloat16"):
            assert (values.astype(policy.dtype(f)).astype(np.int64) == values).all()
