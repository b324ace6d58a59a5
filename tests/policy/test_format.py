"""Shortest round-trip printing (POLICY.md 9), checked against the exact reference.

A printed decimal is read back with exact ``Fraction`` arithmetic and rounded once by the reference
encoder (never through float64): it must give the same bits. No decimal with fewer significant
digits may do so: since the decimals that round to a value form an interval around it, checking the
two nearest shorter ones (one each side, on the value's own decimal grid) is enough.
"""

from __future__ import annotations

import re
from fractions import Fraction

import _reference as ref  # tests/policy is on sys.path (pytest rootdir-less import)
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from heddle.policy import format, format_values
from heddle.policy._errors import UnknownDTypeError


def reads_back(text: str, bits: int, fmt: ref.Format) -> bool:
    value = ref.parse_decimal(text)
    got = ref.round_scalar(value, fmt, negative_zero=text.startswith("-"))
    return got == bits or (ref.is_nan_scalar(got, fmt) and ref.is_nan_scalar(bits, fmt))


def shortest(text: str, bits: int, fmt: ref.Format) -> bool:
    """No decimal with fewer significant digits rounds to ``bits``."""
    value = ref.value_scalar(bits, fmt)
    if not isinstance(value, Fraction) or value == 0:
        return True
    n = ref.significant_digits(text)
    if n == 1:
        return True
    for candidate in ref.decimal_neighbours(abs(value), n - 1):
        if candidate > 0 and ref.round_scalar(candidate if value > 0 else -candidate, fmt) == bits:
            return False
    return True


@pytest.mark.parametrize("name", ref.SMALL)
def test_every_value_prints_the_shortest_decimal_that_reads_back(name):
    fmt = ref.FORMATS[name]
    x = ref.all_patterns(fmt)
    texts = format_values(x)
    assert texts.shape == x.shape and texts.dtype == object
    patterns = ref.bits_of(x)
    bad_read = [
        (t, int(b)) for t, b in zip(texts, patterns, strict=True) if not reads_back(t, int(b), fmt)
    ]
    assert not bad_read, bad_read[:5]
    bad_short = [
        (t, int(b)) for t, b in zip(texts, patterns, strict=True) if not shortest(t, int(b), fmt)
    ]
    assert not bad_short, bad_short[:5]


def test_float32_sample_reads_back_and_matches_numpy_digits():
    fmt = ref.FORMATS["float32"]
    x = np.concatenate([ref.float32_cases(0)[::97], ref.special_floats(np.float32)])
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [x, rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    )
    texts = format_values(x)
    for t, v, b in zip(texts, x, ref.bits_of(x), strict=True):
        assert reads_back(t, int(b), fmt), (t, v)
        assert shortest(t, int(b), fmt), (t, v)
        if np.isfinite(v):  # NumPy's shortest repr (Dragon4) has the same digits
            mine = ref.significant_digits(t), Fraction(t)
            theirs = ref.significant_digits(str(v)), Fraction(str(v))
            assert mine == theirs, (t, str(v))


def test_float64_is_python_repr():
    rng = np.random.default_rng(6)
    x = np.concatenate(
        [
            rng.integers(0, 2**64, 3000, dtype=np.uint64).view(np.float64),
            ref.special_floats(np.float64),
        ]
    )
    for t, v in zip(format_values(x), x, strict=True):
        assert t == repr(float(v))


@pytest.mark.parametrize(
    ("value", "dtype", "text"),
    [
        (0.1, "bfloat16", "0.1"),  # stores 0.10009765625
        (0.1, "float16", "0.1"),
        (65504, "float16", "65500.0"),
        (448, "float8_e4m3fn", "450.0"),  # 448 is the only value within [432, 464]
        (1e-5, "float32", "1e-05"),
        (1e16, "float32", "1e+16"),
        (3.0e38, "bfloat16", "3e+38"),
        (-0.0, "bfloat16", "-0.0"),
        (float("inf"), "float16", "inf"),
        (float("-inf"), "bfloat16", "-inf"),
        (float("nan"), "float8_e4m3fn", "nan"),
        (2.0**-127, "float8_e8m0fnu", "6e-39"),
        (6.0, "float4_e2m1fn", "6.0"),
        (0.1, "float64", "0.1"),
    ],
)
def test_examples(value, dtype, text):
    d = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    assert format(np.asarray(value).astype(d)[()]) == text
    if d.itemsize < 8:
        assert format(jnp.asarray(np.asarray(value).astype(d))) == text


def test_other_kinds():
    assert format(np.int8(-5)) == "-5"
    assert format(np.uint64(2**64 - 1)) == str(2**64 - 1)
    assert format(np.asarray(-3, ml_dtypes.int4)) == "-3"
    assert format(True) == "True"
    assert format(7) == "7"
    assert format(0.1) == "0.1"
    assert format(np.complex64(1 + 2j)) == "(1+2j)" == repr(complex(1, 2))
    assert format(np.complex128(complex(0.1, -0.25))) == repr(complex(0.1, -0.25))
    assert format(np.complex64(3j)) == "3j"
    assert format_values(np.array([[True, False]])).tolist() == [["True", "False"]]


def test_one_value_only_and_the_suggested_fix_works():
    x = jnp.array([0.1, 0.2], jnp.bfloat16)
    with pytest.raises(
        ValueError, match=r"format\(<array of shape \(2,\)>\): format prints one"
    ) as e:
        format(x)
    fix = re.search(r"Use (heddle\.policy\._format\.format_values)\(x\)", str(e.value))
    assert fix is not None
    assert format_values(x).tolist() == ["0.1", "0.2"]


def test_unknown_dtype():
    with pytest.raises(UnknownDTypeError):
        format(np.asarray("a"))


# ---- heddle.numpy's array printing ---------------------------------------------------------------


def test_array_repr_of_narrow_floats_hand_checked():
    import heddle.numpy as hnp

    # bfloat16(1/3) = 0.333984375, spacing 2**-9: the reals rounding to it span [0.33301, 0.33496],
    # so "0.33" is outside and "0.334" the shortest; bfloat16(0.1) = 0.10009765625 prints "0.1"
    x = hnp.asarray([0.1, 1 / 3], dtype="bfloat16")
    assert hnp.array_repr(x) == "Array([0.1, 0.334], dtype=bfloat16)"
    assert hnp.array_str(x) == "[0.1 0.334]"
    assert hnp.array_str(hnp.asarray([65504, -0.0], dtype="float16")) == "[65500.0 -0.0]"


@pytest.mark.parametrize("name", [n for n in ref.SMALL if ref.FORMATS[n].nbits <= 8])
def test_array_str_prints_every_8_bit_value_so_that_it_reads_back(name):
    import heddle.numpy as hnp

    fmt = ref.FORMATS[name]
    x = ref.all_patterns(fmt)
    with np.printoptions(threshold=10**6, linewidth=10**6):
        tokens = hnp.array_str(x)[1:-1].split()
    assert len(tokens) == x.size
    for t, b in zip(tokens, ref.bits_of(x), strict=True):
        assert reads_back(t, int(b), fmt) and shortest(t, int(b), fmt), (t, int(b))


@pytest.mark.parametrize(
    "x",
    [
        jnp.asarray([1.5, 2.25, 1e-8], jnp.float32),
        jnp.asarray([[1, -2], [3, 4]], jnp.int8),
        jnp.asarray(0.5),  # weakly typed
        jnp.asarray([True, False]),
        jnp.asarray([1 + 2j], jnp.complex64),
    ],
    ids=["float32", "int8", "weak", "bool", "complex64"],
)
def test_array_repr_of_other_dtypes_is_jax_repr(x):
    import heddle.numpy as hnp

    assert hnp.array_repr(x) == repr(x)
    assert hnp.array_str(x) == str(x)
