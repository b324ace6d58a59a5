"""Every policy error: its types, a message that names the operands and the fix, and the fix working.

Where a message suggests ``heddle.astype(x, D)`` and ``heddle.astype`` is not public yet, the test
checks what the cast would produce (an array of dtype ``D``) with the same call that failed.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

import heddle
from heddle import policy
from heddle.policy._dtypes import require_available
from heddle.policy._errors import message

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASTYPE = re.compile(r"heddle\.astype\(x, '([a-z0-9_]+)'\)")
WIDE = ("int64", "uint64", "float64", "complex128")


def suggested_casts(msg: str) -> list[str]:
    found = ASTYPE.findall(msg)
    assert found, f"no heddle.astype fix in: {msg}"
    return found


def convert(x: np.ndarray, target: str):
    """Runs the suggested ``heddle.astype(x, target)`` (or, until it is public, its result's dtype)."""
    astype = getattr(heddle, "astype", None)
    with jax.enable_x64(True) if target in WIDE else jax.enable_x64(jax.config.jax_enable_x64):
        if astype is None:
            return np.zeros(x.shape, policy.dtype(target))
        out = astype(x, target)
        assert out.dtype == policy.dtype(target)
        return out


def test_every_error_is_a_policy_error_and_its_builtin():
    pairs = {
        policy.PromotionError: TypeError,
        policy.ScalarRangeError: OverflowError,
        policy.PrecisionError: TypeError,
        policy.UnknownDTypeError: ValueError,
    }
    for cls, builtin in pairs.items():
        assert issubclass(cls, policy.PolicyError) and issubclass(cls, builtin)
    assert issubclass(policy.PolicyError, Exception)
    assert message("f(x)", "it is refused", "Call g(x).") == "f(x): it is refused. Call g(x)."


# ---- PromotionError -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "a", "b"),
    [
        (policy.HEDDLE, "uint64", "int8"),
        (policy.HEDDLE, "int64", "uint64"),
        (policy.HEDDLE, "float8_e4m3fn", "float8_e5m2"),
        (policy.HEDDLE, "float8_e4m3fnuz", "float8_e5m2fnuz"),
        (policy.JAX, "float8_e4m3fn", "bfloat16"),
        (policy.JAX, "float8_e4m3fn", "float8_e5m2"),  # refused by both lattices
        (policy.JAX, "int4", "float8_e5m2"),
        (
            policy.Policy.from_table({("float16", "bfloat16"): "float16"}, name="mine"),
            "int8",
            "f16",
        ),
    ],
)
def test_promotion_error(p, a, b):
    with policy.use(p), pytest.raises(policy.PromotionError) as e:
        policy.promote_types(a, b)
    assert isinstance(e.value, TypeError) and isinstance(e.value, policy.PolicyError)
    msg = str(e.value)
    da, db = policy.dtype(a), policy.dtype(b)
    assert da.name in msg and db.name in msg and f"policy {p.name!r}" in msg
    # the fix: convert the operand the message names as suggested; the promotion then goes through
    operand = re.search(r"Convert the (\w+) operand", msg).group(1)
    assert operand in (da.name, db.name)
    other = db if operand == da.name else da
    for target in suggested_casts(msg):
        x = convert(np.zeros(2, policy.dtype(operand)), target)
        with policy.use(p), jax.enable_x64(True):
            r = policy.result_type(x, np.zeros(2, other))
        assert r in p.table.dtypes


def test_promotion_error_through_result_type_names_the_operands():
    with pytest.raises(policy.PromotionError, match="uint64 with int8"):
        policy.result_type(np.zeros(2, np.uint64), np.zeros(2, np.int8), 1)


# ---- ScalarRangeError ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("uint8", -2),
        ("int8", 1000),
        ("int8", -129),
        ("uint64", 2**64),
        ("bfloat16", 1e39),
        ("float16", 70000),
        ("float16", -65520.0),
        ("float8_e4m3fn", 464),
        ("int8", 1e39),  # a float meeting an integer takes float32, which 1e39 overflows
        ("complex64", 1e39j),
        ("float16", 1e39j),  # -> complex64
    ],
)
def test_scalar_range_error(name, value):
    x = np.zeros(2, policy.dtype(name))
    with pytest.raises(policy.ScalarRangeError) as e:
        policy.result_type(x, value)
    assert isinstance(e.value, OverflowError) and isinstance(e.value, policy.PolicyError)
    msg = str(e.value)
    assert name in msg and "policy 'heddle'" in msg
    shown = repr(value)
    assert shown in msg, (shown, msg)
    for target in suggested_casts(msg):
        with jax.enable_x64(True):
            r = policy.result_type(convert(x, target), value)
        assert r == policy.result_type(policy.dtype(target), np.zeros(1, policy.dtype(name)))
    wrap = re.search(r"np\.array\((-?\d+)\)\.astype\('([a-z0-9]+)'\)", msg)
    if wrap:  # the second fix for integers: a typed scalar, which wraps as NumPy does
        typed = np.array(int(wrap.group(1))).astype(wrap.group(2))
        assert policy.result_type(x, typed) == x.dtype
        bits = 8 * x.dtype.itemsize
        assert int(typed) % 2**bits == value % 2**bits  # two's complement wrap


def test_scalar_range_error_without_a_typed_operand():
    for value, kind, wider in ((2**40, "int", "int64"), (1e39, "float", "float64")):
        with pytest.raises(policy.ScalarRangeError) as e:
            policy.result_type(value)
        msg = str(e.value)
        assert f"no typed operand and takes the default {kind}32" in msg
        assert f"np.{wider}({value!r})" in msg
        assert f"heddle.policy.default_dtypes({kind}='{wider}')" in msg
        # both fixes
        assert policy.result_type(getattr(np, wider)(value)) == np.dtype(wider)
        with policy.default_dtypes(**{kind: wider}):
            assert policy.result_type(value) == np.dtype(wider)


def test_scalar_range_error_huge_ints_have_short_messages():
    with pytest.raises(policy.ScalarRangeError) as e:
        policy.result_type(np.zeros(2, np.float16), -(10**400))
    msg = str(e.value)
    assert "(401 digits)" in msg and len(msg) < 400
    assert "No float of the policy holds a value this large" in msg
    assert policy.result_type(np.zeros(2, np.float16), -math_inf()) == np.dtype("float16")


def math_inf() -> float:
    return float("inf")  # the fix the message names


def test_e8m0_scalar_error():
    x = np.zeros(2, ml_dtypes.float8_e8m0fnu)
    with pytest.raises(policy.ScalarRangeError, match="no zero and no negative") as e:
        policy.result_type(x, -1.0)
    (target,) = suggested_casts(str(e.value))
    assert policy.result_type(convert(x, target), -1.0) == policy.dtype(target)


# ---- PrecisionError -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "narrower"),
    [(w, n) for w, n in zip(WIDE, ("int32", "uint32", "float32", "complex64"), strict=True)],
)
def test_precision_error(name, narrower):
    d = policy.dtype(name)
    assert not jax.config.jax_enable_x64
    with pytest.raises(policy.PrecisionError) as e:
        require_available(d, "heddle.numpy.sum")
    assert isinstance(e.value, TypeError) and isinstance(e.value, policy.PolicyError)
    msg = str(e.value)
    assert f"heddle.numpy.sum asked for {name}" in msg
    assert "jax.config.update('jax_enable_x64', True)" in msg and "JAX_ENABLE_X64=1" in msg
    assert f"heddle.astype(x, '{narrower}')" in msg
    # fix 1: enable x64 (scoped here; the global update runs in a subprocess below)
    with jax.enable_x64(True):
        assert require_available(d) == d
    # fix 2: the narrower dtype, explicitly
    assert require_available(policy.dtype(narrower)) == policy.dtype(narrower)
    assert convert(np.zeros(2, np.float64 if name == "float64" else d), narrower).dtype == (
        policy.dtype(narrower)
    )


def test_precision_error_fix_as_written_in_a_fresh_interpreter():
    code = (
        "import jax, numpy as np\n"
        "from heddle.policy._dtypes import require_available\n"
        "from heddle.policy import PrecisionError\n"
        "try:\n    require_available(np.dtype('float64'))\nexcept PrecisionError: print('refused')\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "print(require_available(np.dtype('float64')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "refused\nfloat64\n"


def test_32_bit_dtypes_are_always_available():
    for d in policy.DTYPES:
        if d.name not in WIDE:
            assert require_available(d) == d


# ---- UnknownDTypeError --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["float33", "bf17", "", "int", "float", object(), np.dtype("O"), [1, 2], 3]
)
def test_unknown_dtype_lists_the_valid_names(bad):
    with pytest.raises(policy.UnknownDTypeError) as e:
        policy.dtype(bad)
    assert isinstance(e.value, ValueError) and isinstance(e.value, policy.PolicyError)
    msg = str(e.value)
    assert "not a dtype of heddle's policy" in msg
    for d in policy.DTYPES:  # every valid name, and the aliases
        assert d.name in msg
    assert "bf16" in msg and "fp8" in msg
    # the fix: any listed name parses
    listed = msg.split("Use one of: ")[1].split("; aliases ")[0].split(", ")
    assert [policy.dtype(n) for n in listed] == list(policy.DTYPES)


@pytest.mark.parametrize(("bad", "fix"), [(int, "int32"), (float, "float32"), (complex, "float32")])
def test_unknown_dtype_for_python_types(bad, fix):
    with pytest.raises(policy.UnknownDTypeError, match="no fixed width") as e:
        policy.dtype(bad)
    assert f"dtype('{fix}')" in str(e.value) or f"dtype('{fix}')" in str(e.value).replace('"', "'")
    assert policy.dtype(fix) == np.dtype(fix)
    assert policy.current().default_float == np.dtype("float32")  # the other suggestion
    assert policy.dtype(bool) == np.dtype("bool")  # bool has a width


def test_unknown_dtype_none_is_not_float64():
    with pytest.raises(policy.UnknownDTypeError, match="None names no dtype") as e:
        policy.dtype(None)
    assert "heddle.policy.current().default_float" in str(e.value)
    assert policy.dtype(policy.current().default_float) == np.dtype("float32")


def test_dtype_parses_every_documented_spelling():
    import jax.numpy as jnp

    for d in policy.DTYPES:
        assert policy.dtype(d.name) == d and policy.dtype(d) == d and policy.dtype(d.type) == d
        assert policy.dtype(np.zeros(1, d)) == d
        assert policy.dtype(d.name.upper()) == d and policy.dtype(f" {d.name} ") == d
        if d.name.startswith("float8_"):
            assert policy.dtype(d.name.removeprefix("float8_")) == d
    for alias, name in policy.ALIASES.items():
        assert policy.dtype(alias) == np.dtype(policy.dtype(name))
    assert policy.dtype(jnp.bfloat16) == policy.dtype("bfloat16")
    assert policy.dtype(jnp.float8_e4m3fn) == policy.dtype("fp8")
    assert policy.dtype(jnp.zeros(2, jnp.int4)) == policy.dtype("int4")
    assert policy.dtype("bool_") == np.dtype("bool")
