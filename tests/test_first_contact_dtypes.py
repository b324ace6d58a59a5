"""Dtype names users bring from other libraries, and dtypes passed where a Precision is asked for."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle
from heddle import policy
from heddle.policy import Precision


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("fp16", "float16"),
        ("fp32", "float32"),
        ("fp64", "float64"),
        ("FP16", "float16"),
        (" fp32 ", "float32"),
        ("half", "float16"),  # NumPy, torch.half
        ("single", "float32"),  # NumPy
        ("double", "float64"),  # NumPy, torch.double
        ("bf16", "bfloat16"),
        ("fp8", "float8_e4m3fn"),
        ("fp4", "float4_e2m1fn"),
        ("bf8", "float8_e5m2"),
    ],
)
def test_dtype_reads_the_names_of_numpy_torch_and_the_fp_family(name, want):
    assert policy.dtype(name) == np.dtype(getattr(ml_dtypes, want, None) or want)


def test_fp_aliases_do_not_change_the_short_names_reports_print():
    # ALIASES maps short names to dtypes; reading it backwards (as reports and the notebooks do)
    # still gives f16/f32/f64, not the fp spellings
    short = {v: k for k, v in policy.ALIASES.items()}
    assert short["float16"] == "f16" and short["float32"] == "f32" and short["float64"] == "f64"
    assert policy.ALIASES["fp16"] == "float16" and policy.ALIASES["fp32"] == "float32"


@pytest.mark.parametrize(
    ("word", "widths"),
    [
        ("float", ("float32", "float64")),
        ("int", ("int32", "int64")),
        ("long", ("int32", "int64")),
        ("byte", ("int8", "uint8")),
        ("complex", ("complex64", "complex128")),
        ("cfloat", ("complex64", "complex128")),
    ],
)
def test_words_whose_width_depends_on_the_library_are_refused_with_both_widths(word, widths):
    with pytest.raises(policy.UnknownDTypeError) as e:
        policy.dtype(word)
    msg = str(e.value)
    assert msg.startswith(f"dtype('{word}'): that is not a dtype of heddle's policy")
    assert "depends on the library" in msg
    for w in widths:  # the fix names each width, and each parses
        assert f"heddle.policy.dtype('{w}')" in msg
        assert policy.dtype(w) == np.dtype(w)


@pytest.mark.parametrize("preset", ["mixed_bfloat16", "mixed_float16", "Mixed_BF16"])
def test_a_precision_preset_given_as_a_dtype_points_to_precision(preset):
    with pytest.raises(policy.UnknownDTypeError) as e:
        policy.dtype(preset)
    msg = str(e.value)
    assert "a Precision preset" in msg
    compute = Precision.parse(preset).compute_dtype.name
    assert f"heddle.policy.Precision.parse('{preset}')" in msg
    assert f"heddle.policy.dtype('{compute}')" in msg
    assert policy.dtype(compute) == Precision.parse(preset).compute_dtype


def test_precision_fields_take_the_new_names_and_scalar_types():
    p = Precision("fp32", "fp16", "fp32")
    assert p == Precision.parse("mixed_float16")
    assert Precision.parse("params=fp32,compute=fp16,output=fp32") == p
    assert Precision.parse("mixed_fp16") == p
    assert Precision(jnp.float32, jnp.bfloat16, np.float32) == Precision.parse("mixed_bfloat16")
    assert Precision(np.dtype("float32"), ml_dtypes.bfloat16) == Precision.parse("mixed_bfloat16")


def test_jmp_half_stays_refused_in_a_precision_whichever_way_it_is_given():
    # policy.dtype('half') is NumPy's float16, but in a precision 'half' is jmp's platform word
    with pytest.raises(policy.UnknownDTypeError, match="platform-dependent in jmp"):
        Precision.parse("compute=half")
    with pytest.raises(policy.UnknownDTypeError, match="platform-dependent in jmp") as e:
        Precision("float32", "half", "float32")
    msg = str(e.value)
    assert msg.startswith("Precision(compute_dtype='half'): 'half' is platform-dependent in jmp")
    assert "Precision(compute_dtype='bfloat16') or Precision(compute_dtype='float16')" in msg
    assert Precision(compute_dtype="bfloat16") == Precision.parse("mixed_bfloat16")
    assert Precision(compute_dtype="float16") == Precision.parse("mixed_float16")
    with pytest.raises(policy.UnknownDTypeError, match=r"Precision\(output_dtype='float32'\)"):
        Precision(output_dtype="full")


@pytest.mark.parametrize(
    "d", [jnp.bfloat16, np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16, jnp.dtype("bfloat16")]
)
def test_precision_parse_of_one_dtype_names_both_readings(d):
    with pytest.raises(policy.UnknownDTypeError) as e:
        Precision.parse(d)
    msg = str(e.value)
    assert "a precision names three dtypes" in msg
    assert "Precision.parse('mixed_bfloat16')" in msg and "Precision.parse('bfloat16')" in msg
    assert (
        str(Precision.parse("mixed_bfloat16")) == "params=float32,compute=bfloat16,output=float32"
    )
    assert str(Precision.parse("bfloat16")) == "params=bfloat16,compute=bfloat16,output=bfloat16"


def test_autocast_precision_of_one_dtype_is_refused_with_the_call_that_works():
    x = jnp.ones(8, jnp.float32)

    def loss(x):
        return (x * x).sum()

    with pytest.raises(policy.UnknownDTypeError) as e:
        heddle.autocast(loss, precision=jnp.bfloat16)
    msg = str(e.value)
    assert msg.startswith("heddle.autocast(fn, precision=")
    assert "heddle.autocast(fn, precision='mixed_bfloat16')" in msg
    assert "heddle.autocast(fn, precision='bfloat16')" in msg
    out = heddle.autocast(loss, precision="mixed_bfloat16")(x)  # the fix
    assert out.dtype == jnp.float32 and float(out) == 8.0
    with pytest.raises(policy.UnknownDTypeError, match="precision='mixed_float16'"):
        heddle.autocast(loss, precision=np.float16)
    with pytest.raises(policy.UnknownDTypeError, match=r"precision='float32'\)"):
        heddle.autocast(loss, precision=jnp.float32)
    assert heddle.autocast(loss, precision="float32")(x).dtype == jnp.float32
