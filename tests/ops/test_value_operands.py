"""Value operands wherever they are passed, and the values heddle.numpy makes: no silent wrap,
overflow or double rounding (POLICY.md 3-6).

References: Python ints and Fractions, float64 and NumPy (where NumPy rounds once).
"""

from __future__ import annotations

import inspect
import math
import random
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle.ops import _linalg, _table
from heddle.policy import PrecisionError, ScalarRangeError

E4M3, E8M0, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, ml_dtypes.bfloat16
_P = inspect.Parameter


def _takes_arrays(q: inspect.Parameter) -> bool:
    return "Array" in str(q.annotation) and q.kind is not _P.VAR_POSITIONAL


def _declared(values, positional: list[str]) -> set[str]:
    if values == "all":
        return set(positional)
    if values == "seq":
        return set(positional[:1])
    return {positional[i] for i in values if i < len(positional)}


def _unclassified(qual: str, fn, declared: set[str]) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    short = qual.rsplit(".", 1)[-1]
    return [
        f"{qual}.{q.name}"
        for q in params
        if _takes_arrays(q)
        and q.name not in declared
        and q.name not in _table.NOT_VALUES
        and f"{short}.{q.name}" not in _table.NOT_VALUES
        and f"{qual}.{q.name}" not in _table.NOT_VALUES
    ]


def test_every_array_parameter_is_a_value_operand_or_has_a_reason():
    """Each parameter of jax.numpy's signatures that takes arrays is declared a value operand
    (by position or in VALUE_KWARGS) or listed in NOT_VALUES with the reason."""
    missing = []
    for name, (_, _, values) in _table.OPS.items():
        fn = getattr(jnp, name, None)
        if fn is None:
            continue
        params = inspect.signature(fn).parameters.values()
        positional = [
            q.name for q in params if q.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
        ]
        declared = _declared(values, positional) | set(_table.VALUE_KWARGS.get(name, ()))
        if name in _table.SEQUENCES:
            declared.add(positional[_table.SEQUENCES[name]])
        missing += _unclassified(name, fn, declared)
    for name, (_, values, params) in _linalg.LINALG_FLOAT.items():
        missing += _unclassified(f"linalg.{name}", getattr(jnp.linalg, name), {*values, *params})
    for name, (_, _, values) in _linalg.LINALG_OPS.items():
        fn = getattr(jnp.linalg, name)
        positional = list(inspect.signature(fn).parameters)
        missing += _unclassified(f"linalg.{name}", fn, _declared(values, positional))
    assert not missing, f"classify these parameters (VALUE_KWARGS or NOT_VALUES): {missing}"
    assert all(reason for reason in _table.NOT_VALUES.values())


def test_keyword_operands_are_range_checked_like_positional_ones():
    x = hnp.asarray([1, 2, 3], dtype="uint8")
    for call in (lambda: hnp.clip(x, -5), lambda: hnp.clip(x, min=-5), lambda: hnp.clip(x, max=-5)):
        with pytest.raises(ScalarRangeError, match=r"-5 meets an operand of dtype uint8"):
            call()
    ok = hnp.clip(hnp.astype(x, "int16"), min=-5)  # the message's fix
    assert ok.dtype == np.int16 and np.asarray(ok).tolist() == [1, 2, 3]
    with pytest.raises(ScalarRangeError, match="float16"):
        hnp.nan_to_num(hnp.asarray([np.inf], dtype="float16"), posinf=1e6)
    out = hnp.nan_to_num(hnp.asarray([np.inf, np.nan], dtype="float16"), nan=-1.0, posinf=6e4)
    assert out.dtype == np.float16 and np.asarray(out, np.float64).tolist() == [60000.0, -1.0]


def test_keyword_operands_promote():
    b = hnp.asarray([0.5, 2.0, 3.0], dtype="bfloat16")
    lo = hnp.asarray(1.0, dtype="float16")
    for out in (
        hnp.clip(b, lo),
        hnp.clip(b, min=lo),
        jax.jit(lambda b, lo: hnp.clip(b, min=lo))(b, lo),
    ):
        assert out.dtype == np.float32  # bfloat16 with float16: float32
        assert np.asarray(out).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("jit", [False, True])
def test_keyword_operands_of_8_bit_floats_convert(jit):
    """average(weights=), interp(left=), cov(aweights=), sum(initial=) with float8: each operand
    converted (no TypePromotionError), computed in float32, rounded once (float64 reference)."""
    x = hnp.asarray([1, 2, 3], dtype="float8_e4m3fn")
    w = hnp.asarray([1, 2, 4], dtype="float8_e4m3fn")
    f = jax.jit if jit else (lambda g: g)
    xs, ws = np.array([1.0, 2, 3]), np.array([1.0, 2, 4])
    out = f(lambda x, w: hnp.average(x, weights=w))(x, w)
    assert out.dtype == E4M3 and float(out) == float(np.float64(17 / 7).astype(E4M3))
    out = f(
        lambda x, w: hnp.interp(
            hnp.asarray([0.0, 5.0], "float8_e4m3fn"), x, w, left=w[2], right=w[0]
        )
    )(x, w)
    assert out.dtype == E4M3 and np.asarray(out, np.float64).tolist() == [4.0, 1.0]
    out = f(lambda x, w: hnp.cov(x, aweights=w))(x, w)
    mean = (xs * ws).sum() / ws.sum()
    ref = ((xs - mean) ** 2 * ws).sum() / (ws.sum() - (ws * ws).sum() / ws.sum())
    assert out.dtype == E4M3 and float(out) == float(np.float64(ref).astype(E4M3))
    out = f(lambda x, w: hnp.sum(x, initial=w[2]))(x, w)
    assert out.dtype == E4M3 and float(out) == 10.0


def test_integer_polynomials_accumulate_in_int32():
    a = hnp.asarray([100, 100], dtype="int8")
    for out in (hnp.polymul(a, a), jax.jit(hnp.polymul)(a, a)):
        assert out.dtype == np.int32 and np.asarray(out).tolist() == [10000, 20000, 10000]
    p = hnp.ones(300, dtype="int8")
    for out in (hnp.polyval(p, 1), jax.jit(hnp.polyval)(p, hnp.asarray(1, dtype="int8"))):
        assert out.dtype == np.int32 and int(out) == 300
    c = [3, -7, 100, 90]  # Horner in Python ints
    out = hnp.polyval(hnp.asarray(c, dtype="int8"), hnp.asarray(5, dtype="int8"))
    assert int(out) == sum(v * 5 ** (len(c) - 1 - i) for i, v in enumerate(c))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "complex64"])
def test_matrix_rank_computes_on_float_values(dtype):
    m = hnp.asarray(np.array([[0.5, 0], [0, 0.25]]), dtype=dtype)
    assert int(hnp.linalg.matrix_rank(m)) == 2
    assert hnp.linalg.matrix_rank(m).dtype == np.int32
    assert (
        int(jax.jit(hnp.linalg.matrix_rank)(hnp.asarray([[0.5, 1.0], [1.0, 2.0]], dtype=dtype)))
        == 1
    )


@pytest.mark.parametrize("name", ["concatenate", "stack", "hstack", "vstack", "dstack"])
def test_joining_honours_dtype(name):
    fn = getattr(hnp, name)
    out = fn([hnp.ones(2), hnp.ones(2)], dtype="bfloat16")
    assert out.dtype == BF16
    out = fn([hnp.asarray([1.5, -2.5]), hnp.asarray([3.0, 4.0])], dtype="int8")
    assert out.dtype == np.int8 and sorted(np.asarray(out).ravel().tolist()) == [-2, 1, 3, 4]
    out = jax.jit(lambda a, b: fn([a, b], dtype="bfloat16"))(hnp.ones(2), hnp.ones(2, "int8"))
    assert out.dtype == BF16 and np.asarray(out, np.float64).ravel().tolist() == [1.0] * 4


def test_joining_with_dtype_rounds_once_under_x64():
    v = 1 + 2**-8 + 2**-30  # just above a bfloat16 halfway point: rounds up once, ties down twice
    with jax.enable_x64(True):
        x = jnp.asarray([v], dtype=jnp.float64)
        for fn in (hnp.concatenate, hnp.stack, hnp.hstack):
            out = fn([x, x], dtype="bfloat16")
            assert out.dtype == BF16 and float(np.asarray(out).ravel()[0]) == 1.0078125


def _nearest_float32(n: int) -> float:
    """n rounded once to float32 (ties to even), from Fractions."""
    lo = np.float32(float(n))
    cands = [lo, np.nextafter(lo, np.float32(-np.inf)), np.nextafter(lo, np.float32(np.inf))]
    return float(
        min(cands, key=lambda c: (abs(Fraction(float(c)) - n), int(c.view(np.uint32)) & 1))
    )


def test_python_ints_round_once_to_float32():
    rng = random.Random(0)
    ints = [2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**100 + 2**76 + 1, 2**53 + 1]
    ints += [rng.randrange(2**54, 2**120) for _ in range(40)]
    ints += [(2**24 + 1) * 2**k + 1 for k in range(30, 90, 7)]  # just above a float32 halfway point
    z = hnp.zeros(1)
    for n in ints:
        want = _nearest_float32(n)
        assert float(hnp.add(z, n)[0]) == want, n
        assert float(hnp.full(1, n, dtype="float32")[0]) == want, n
        assert float(hnp.asarray(n, dtype="float32")) == want, n
        assert complex(hnp.add(hnp.zeros(1, "complex64"), n)[0]).real == want, n


def test_arange_does_not_wrap():
    with pytest.raises(ScalarRangeError, match=r"130.*dtype='int16'"):
        hnp.arange(126, 131, dtype="int8")
    assert np.asarray(hnp.arange(126, 131, dtype="int16")).tolist() == list(range(126, 131))
    assert np.asarray(hnp.arange(126, 128, dtype="int8")).tolist() == [126, 127]
    assert np.asarray(hnp.arange(10, -1, -5, dtype="uint8")).tolist() == [10, 5, 0]
    with pytest.raises(ScalarRangeError):
        hnp.arange(3, -2, -1, dtype="uint8")
    assert np.asarray(hnp.arange(5)).tolist() == list(range(5))


def test_select_is_wrapped():
    c = [hnp.asarray([True, False])]
    u8 = [hnp.asarray([1, 2], dtype="uint8")]
    with pytest.raises(ScalarRangeError, match="-1 meets an operand of dtype uint8"):
        hnp.select(c, u8, -1)
    out = hnp.select(c, [hnp.astype(u8[0], "int16")], -1)  # the message's fix
    assert out.dtype == np.int16 and np.asarray(out).tolist() == [1, -1]
    b = [hnp.asarray([1.0, 2.0], dtype="bfloat16")]
    out = jax.jit(lambda c, b: hnp.select(c, b, hnp.asarray(0.5, dtype="float16")))(c, b)
    assert out.dtype == np.float32 and np.asarray(out).tolist() == [1.0, 0.5]


def test_python_data_does_not_overflow_silently():
    with pytest.raises(ScalarRangeError, match="1e"):
        hnp.array(1e39)
    with pytest.raises(ScalarRangeError):
        hnp.asarray([1.0, -1e39])
    with pytest.raises(ScalarRangeError):
        hnp.asarray([1.0, 70000.0], dtype="float16")
    assert float(hnp.array(float("inf"))) == math.inf  # infinity asked for is infinity
    assert np.isnan(float(hnp.array(float("nan"))))


def test_float8_e8m0_with_python_scalars():
    x = hnp.asarray([1.0, 1024.0, 0.5], dtype="float8_e8m0fnu")
    for out in (
        hnp.multiply(x, 2.0),
        hnp.multiply(x, 2),
        jax.jit(lambda x: hnp.multiply(x, 2.0))(x),
    ):
        assert out.dtype == E8M0 and np.asarray(out, np.float64).tolist() == [2.0, 2048.0, 1.0]
    with pytest.raises(ScalarRangeError, match="no zero"):
        hnp.add(x, 0.0)  # a zero the user did pass
    out = hnp.full(2, 1e-40, dtype="float8_e8m0fnu")  # below the smallest value: the smallest
    assert np.asarray(out, np.float64).tolist() == [2.0**-127] * 2


@pytest.mark.parametrize(
    "name", "max min amax amin nanmax nanmin argmax argmin nanargmax nanargmin".split()
)
def test_float8_e8m0_orders(name):
    v = np.array([1.0, 1024.0, 0.5, 8.0])
    x = hnp.asarray(v, dtype="float8_e8m0fnu")
    want = getattr(np, name)(v)
    for out in (getattr(hnp, name)(x), jax.jit(getattr(hnp, name))(x)):
        assert float(out) == float(want)
        assert out.dtype == (np.int32 if "arg" in name else E8M0)


@pytest.mark.parametrize("name", ["sum", "prod", "cumsum", "cumulative_sum", "cumulative_prod"])
@pytest.mark.parametrize("x64", [False, True])
def test_integer_reduction_with_dtype_int32(name, x64):
    with jax.enable_x64(x64):
        _integer_reduction_with_dtype_int32(name)


def _integer_reduction_with_dtype_int32(name):
    v = [255, 3, 2, 1]
    out = getattr(hnp, name)(hnp.asarray(v, dtype="uint8"), dtype="int32")
    assert out.dtype == np.int32
    ref = {"sum": sum(v), "prod": math.prod(v)}.get(name)
    got = np.asarray(out).ravel().tolist()
    assert (got[-1] if ref is None else int(out)) == (
        ref or (sum(v) if "sum" in name else math.prod(v))
    )


@pytest.mark.parametrize(
    "src,dst", [("float64", "float32"), ("float64", "float16"), ("float64", "bfloat16"),
                ("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32")]
)  # fmt: skip
@pytest.mark.parametrize("jit", [False, True])
def test_casts_keep_the_sign_of_nan(src, dst, jit):
    """A NaN keeps its sign in every target with signed NaNs (NumPy, XLA's convert: the same);
    where heddle computes the cast from bits (the float64 sources) it also keeps the leading
    payload bits, quiet, as the x86 float64 -> float32 conversion NumPy uses does (checked against
    NumPy there, and against the same rule written with Python ints for the other targets)."""
    nbits, mant = {"float64": (64, 52), "float32": (32, 23), "float16": (16, 10)}[src]
    u = np.dtype(f"u{nbits // 8}").type
    rng = np.random.default_rng(0)
    payload = [int(v) for v in rng.integers(1, 2**mant - 1, 300, dtype=np.uint64)]
    signs = [int(v) for v in rng.integers(0, 2, 300)]
    bits = [
        (s << (nbits - 1)) | (((1 << (nbits - 1 - mant)) - 1) << mant) | p
        for s, p in zip(signs, payload, strict=True)
    ]
    x = np.array(bits, dtype=np.uint64).astype(u).view(src)
    cast = (
        jax.jit(lambda v: hnp.astype(v, dst))
        if jit and src != "float64"
        else (lambda v: hnp.astype(v, dst))
    )
    got = np.asarray(cast(x if src == "float64" else jnp.asarray(x)))
    assert np.isnan(got.astype(np.float32)).all()
    assert np.signbit(got.astype(np.float32)).tolist() == [bool(s) for s in signs]
    if src == "float64":
        dt = np.dtype(BF16 if dst == "bfloat16" else dst)
        t, tb = ml_dtypes.finfo(dt).nmant, 8 * dt.itemsize
        want = [(s << (tb - 1)) | (((1 << (tb - 1 - t)) - 1) << t) | (1 << (t - 1)) | (p >> (mant - t))
                for s, p in zip(signs, payload, strict=True)]  # fmt: skip
        assert got.view(f"u{dt.itemsize}").tolist() == want
        if dst == "float32":
            with np.errstate(invalid="ignore"):
                numpy = x.astype(np.float32)
            assert got.view(np.uint32).tolist() == numpy.view(np.uint32).tolist()
    assert hnp.signbit(hnp.asarray(-np.nan, dtype=dst))
    assert not hnp.signbit(hnp.asarray(np.nan, dtype=dst))


def test_lexsort_under_jit():
    a = np.array([3, 1, 2, 1], np.int32)
    b = np.array([0, 1, 1, 0], np.int32)
    want = np.lexsort((a, b)).tolist()
    keys = (hnp.asarray(a), hnp.asarray(b))
    assert np.asarray(hnp.lexsort(keys)).tolist() == want
    assert np.asarray(jax.jit(hnp.lexsort)(keys)).tolist() == want


def test_message_for_huge_python_int():
    with pytest.raises(
        ScalarRangeError, match=r"outside the range of every integer dtype.*float\("
    ) as e:
        hnp.array(2**70)
    assert "dtype('O')" not in str(e.value)
    assert float(hnp.asarray(float(2**70))) == 2.0**70  # the fix


def test_message_for_non_numbers():
    with pytest.raises(TypeError, match=r"None is not a number.*float\('nan'\)"):
        hnp.asarray([1, None])
    with pytest.raises(TypeError, match=r"asarray\('abc'\).*not a number"):
        hnp.asarray("abc")
    fixed = hnp.asarray([1, float("nan")])  # the fix
    assert fixed.dtype == np.float32 and np.isnan(np.asarray(fixed)[1])


def test_full_of_a_numpy_float64_rounds_once_without_x64():
    v = np.float64(1 + 2**-8 + 2**-30)
    assert float(hnp.full(3, v, dtype="bfloat16")[0]) == 1.0078125
    assert float(hnp.asarray(v, dtype="bfloat16")) == 1.0078125
    with pytest.raises(PrecisionError, match=r"asarray\(x, dtype='float32'\)"):
        hnp.asarray(v)
    assert float(hnp.asarray(v, dtype="float32")) == float(np.float32(v))  # the fix


CREATIONS = {  # name -> call(value or dtype) making an array that holds the value
    "full": lambda v, d: hnp.full(2, v, dtype=d),
    "full_like": lambda v, d: hnp.full_like(hnp.zeros(2, "int8"), v, dtype=d),
    "asarray": lambda v, d: hnp.asarray([1, v], dtype=d),
    "array": lambda v, d: hnp.array(v, dtype=d),
    "arange": lambda v, d: hnp.arange(v - 4, v + 1, dtype=d),
    "linspace": lambda v, d: hnp.linspace(0, v, 3, dtype=d),
    "geomspace": lambda v, d: hnp.geomspace(1, v, 3, dtype=d),
    "logspace": lambda v, d: hnp.logspace(0, math.log10(v), 3, dtype=d),
}


@pytest.mark.parametrize(
    "name,value,dtype,wider",
    [(n, 130, "int8", "int16") for n in sorted(CREATIONS) if "space" not in n]
    + [(n, 1e5, "float16", "float32") for n in sorted(CREATIONS)],
)
def test_creation_does_not_wrap_or_overflow(name, value, dtype, wider):
    make = CREATIONS[name]
    with pytest.raises(
        ScalarRangeError, match=f"dtype={dtype}.*Ask for a dtype that holds it: dtype='{wider}'"
    ):
        make(value, dtype)
    out = make(value, wider)  # the message's fix
    assert out.dtype == np.dtype(wider)
    assert math.isclose(float(np.asarray(out, np.float64).max()), value, rel_tol=1e-6)


FILLS = {  # name -> call writing the Python value v into (or next to) the uint8 array x
    "pad": lambda x, v: hnp.pad(x, 1, constant_values=v),
    "insert": lambda x, v: hnp.insert(x, 0, v),
    "fill_diagonal": lambda x, v: hnp.fill_diagonal(
        hnp.reshape(hnp.tile(x, 2), (2, 2)), v, inplace=False
    ),
    "put": lambda x, v: hnp.put(x, 0, v, inplace=False),
    "place": lambda x, v: hnp.place(x, x > 1, v, inplace=False),
    "put_along_axis": lambda x, v: hnp.put_along_axis(x, hnp.asarray([0]), v, 0, inplace=False),
    "select": lambda x, v: hnp.select([x > 1], [x], v),
    "where": lambda x, v: hnp.where(x > 1, x, v),
    "clip": lambda x, v: hnp.clip(x, max=v),
    "nan_to_num": lambda x, v: hnp.nan_to_num(hnp.astype(x, "float16"), nan=v * 1000),
    "full_like": lambda x, v: hnp.full_like(x, v),
}


@pytest.mark.parametrize("name", sorted(FILLS))
def test_fill_values_do_not_wrap_or_overflow(name):
    x = hnp.asarray([1, 2], dtype="uint8")
    with pytest.raises(ScalarRangeError, match=r"uint8|float16"):
        FILLS[name](x, -1 if name != "nan_to_num" else 70)
    if name not in ("nan_to_num", "full_like"):  # the message's fix: a dtype that holds it
        out = FILLS[name](hnp.astype(x, "int16"), -1)
        assert out.dtype == np.int16 and -1 in np.asarray(out).ravel().tolist()


def test_fill_values_keep_the_dtype_and_the_values():
    x = hnp.asarray([1, 2], dtype="uint8")
    assert np.asarray(hnp.pad(x, 1, constant_values=255)).tolist() == [255, 1, 2, 255]
    assert hnp.pad(x, 1, constant_values=255).dtype == np.uint8
    assert np.asarray(hnp.insert(x, 1, 200)).tolist() == [1, 200, 2]
    out = hnp.fill_diagonal(hnp.zeros((2, 2), "bfloat16"), 3.0, inplace=False)
    assert out.dtype == BF16 and np.asarray(out, np.float64).tolist() == [[3.0, 0.0], [0.0, 3.0]]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_sequences_of_python_fill_values_take_the_arrays_dtype(jit):
    """pad's per-edge constant_values written as Python numbers: no dtype of their own (as NumPy's and
    JAX's pad), each rounded once and range-checked like a Python scalar."""
    run = jax.jit if jit else (lambda f: f)
    u8 = hnp.asarray([1, 2], dtype="uint8")
    out = run(lambda x: hnp.pad(x, 1, constant_values=(0, 255)))(u8)
    assert out.dtype == np.uint8 and np.asarray(out).tolist() == [0, 1, 2, 255]
    out = run(lambda x: hnp.pad(x, 1, constant_values=((3, 4),)))(u8)
    assert np.asarray(out).tolist() == [3, 1, 2, 4]
    bf = hnp.asarray([1.0, 2.0], dtype="bfloat16")
    out = run(lambda x: hnp.pad(x, 1, constant_values=(0.1, 1 + 2**-8 + 2**-30)))(bf)
    assert out.dtype == BF16
    # Fraction reference: 0.1 rounds to 0.10009765625; 1 + 2**-8 + 2**-30 (past the tie) to 1 + 2**-7
    edges = [Fraction(float(v)) for v in np.asarray(out, np.float64)[[0, -1]]]
    assert edges == [Fraction(205, 2048), 1 + Fraction(1, 128)]
    with pytest.raises(ScalarRangeError, match="uint8"):
        hnp.pad(u8, 1, constant_values=(0, 256))
    fixed = hnp.pad(hnp.astype(u8, "int16"), 1, constant_values=(0, 256))  # the message's fix
    assert fixed.dtype == np.int16 and np.asarray(fixed).tolist() == [0, 1, 2, 256]


@pytest.mark.parametrize("src", ["float32", "bfloat16"])
def test_widening_to_float64_keeps_the_nan_payload(src):
    """float32/bfloat16 -> float64 (computed from bits): sign and payload kept, quiet, as NumPy."""
    rng = np.random.default_rng(1)
    payload = rng.integers(1, 2**23 - 1, 300, dtype=np.uint64).astype(np.uint32)
    if src == "bfloat16":
        payload = (payload << np.uint32(16)) & np.uint32(0x7FFFFF) | np.uint32(1 << 16)
    sign = rng.integers(0, 2, 300, dtype=np.uint64).astype(np.uint32) << np.uint32(31)
    x32 = (sign | np.uint32(0xFF << 23) | payload | np.uint32(1 << 22)).view(np.float32)
    x = x32 if src == "float32" else x32.astype(BF16)
    want = x.astype(np.float64).view(np.uint64)
    with jax.enable_x64(True):
        for cast in (hnp.astype, jax.jit(hnp.astype, static_argnums=1)):
            got = np.asarray(cast(jnp.asarray(x), "float64")).view(np.uint64)
            assert got.tolist() == want.tolist()
