"""The lattice against the golden table, and its algebra as properties."""

from __future__ import annotations

import csv
import pathlib

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from heddle import policy
from heddle.policy import _lattice

GOLDEN = pathlib.Path(__file__).with_name("promotion.csv")


def _golden():
    with GOLDEN.open() as f:
        rows = list(csv.reader(f))
    return [(a, b, v) for a, *cells in rows[1:] for b, v in zip(rows[0][1:], cells, strict=True)]


CELLS = _golden()
DT = st.sampled_from(policy.DTYPES)


def test_golden_table_has_784_cells():
    assert len(CELLS) == 28 * 28 == len(policy.DTYPES) ** 2


@pytest.mark.parametrize(("a", "b", "want"), CELLS, ids=[f"{a}-{b}" for a, b, _ in CELLS])
def test_promote_types_matches_golden_cell(a, b, want):
    if want == "error":
        with pytest.raises(policy.PromotionError) as e:
            policy.promote_types(a, b)
        assert a in str(e.value) and b in str(e.value)
        assert "heddle.astype" in str(e.value)
    else:
        assert policy.promote_types(a, b) == policy.dtype(want)


def _promote(a, b):
    try:
        return policy.promote_types(a, b)
    except policy.PromotionError:
        return None


@given(DT, DT)
def test_symmetric(a, b):
    assert _promote(a, b) == _promote(b, a)


@given(DT)
def test_idempotent(a):
    assert policy.promote_types(a, a) == a


@given(DT, DT, DT)
def test_associative_where_defined(a, b, c):
    ab, bc = _promote(a, b), _promote(b, c)
    if ab is None or bc is None:
        return
    left, right = _promote(ab, c), _promote(a, bc)
    if left is not None and right is not None:
        assert left == right


@given(DT, DT)
def test_never_narrows(a, b):
    r = _promote(a, b)
    if r is None:
        return
    for x in (a, b):
        if policy.dtype(x) == np.bool_:
            continue  # bool gives way to every dtype, e8m0 (which has no zero) included: rule 2
        if _is_int(x) and not _is_int(r):
            continue  # rule 4: a narrow float is never widened to fit an integer operand
        assert policy.can_lossless_cast(x, r), (x, r)


def _is_int(d):
    return policy.dtype(d).kind in "iub" or "int" in policy.dtype(d).name


def test_float_containment_comes_from_enumeration():
    # e4m3 (IEEE-like, max 240) sits inside e4m3fn (max 448) and e4m3fnuz (min subnormal 2**-10)
    assert _lattice.holds(policy.dtype("e4m3fn"), policy.dtype("e4m3"))
    assert _lattice.holds(policy.dtype("e4m3fnuz"), policy.dtype("e4m3"))
    assert not _lattice.holds(policy.dtype("e4m3"), policy.dtype("e4m3fn"))
    # every value of each enumerated format, checked independently with float64 arithmetic
    values = _lattice.finite_values(policy.dtype("float16"))
    assert len(values) == 2 * (2**15 - 2**10) - 1  # 63487: no inf/nan, one zero
    assert values.max() == 65504.0 and values[values > 0].min() == 2.0**-24


@pytest.mark.parametrize(
    ("src", "dst", "want"),
    [
        ("int32", "float32", False),
        ("int16", "float32", True),
        ("float8_e4m3fn", "bfloat16", True),
        ("int8", "bfloat16", True),
        ("uint8", "bfloat16", True),
        ("int16", "bfloat16", False),
        ("int32", "float64", True),
        ("int64", "float64", False),
        ("float32", "float64", True),
        ("float64", "float32", False),
        ("bfloat16", "float16", False),
        ("float16", "bfloat16", False),
        ("float32", "complex64", True),
        ("complex64", "float32", False),
        ("float4_e2m1fn", "float8_e4m3fn", True),
        ("bool", "float8_e8m0fnu", False),  # e8m0 has no zero
        ("uint32", "int64", True),
        ("int8", "uint64", False),
    ],
)
def test_can_lossless_cast(src, dst, want):
    assert policy.can_lossless_cast(src, dst) is want


def test_can_lossless_cast_against_exhaustive_reference():
    # independent of the lattice: round-trip every value through the target with NumPy/ml_dtypes
    for src in policy.DTYPES:
        values = _lattice.finite_values(src)
        if values is None:
            continue
        for dst in policy.DTYPES:
            if policy.dtype(dst).kind == "c" or values.size == 0:
                continue
            with np.errstate(all="ignore"):
                back = values.astype(dst).astype(np.float64)
            assert policy.can_lossless_cast(src, dst) == bool((back == values).all()), (src, dst)


@pytest.mark.parametrize(
    ("d", "want"),
    [("int8", "float32"), ("uint8", "float32"), ("int16", "float32"), ("int32", "float64"),
     ("bfloat16", "bfloat16"), ("complex64", "complex64"), ("bool", "float4_e2m1fn")],
)  # fmt: skip
def test_least_upper_float(d, want):
    assert policy.least_upper_float(d) == policy.dtype(want)


def test_least_upper_float_int64_has_none():
    for d in ("int64", "uint64"):
        with pytest.raises(policy.PromotionError, match=d):
            policy.least_upper_float(d)
    assert policy.can_lossless_cast("int64", policy.least_upper_float("int32")) is False
