"""Round trips: every format and layout, against float64, with the bound stated per format.

The bound. With ``s`` the stored scale of an element's block and ``t = x / s``, the element code is
``t`` rounded to the element grid, so ``|x - dequantize(q)| <= s * h(t)`` with ``h`` half the grid
step at ``|t|``: 1/2 for integers, half the binade spacing of the float formats, half the gap between
the two NF4 levels around ``t``. MX elements past the largest value saturate (OCP MX), so there
``h = max(h, |t| - qmax)``. The quotient and the product are float32 operations, each one rounding:
``2**-24 * (|x| + |dequantize(q)|)`` is added for them (the MX scales are powers of two, so for MX
both are exact and the check is exact).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.quant as hq
from heddle.quant._quantize import codes as unpacked_codes

from . import _reference as ref

ELEMENT = {
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float6_e2m3fn": "float6_e2m3fn",
    "float6_e3m2fn": "float6_e3m2fn",
    "float4_e2m1fn": "float4_e2m1fn",
    "mxfp8_e4m3": "float8_e4m3fn",
    "mxfp8_e5m2": "float8_e5m2",
    "mxfp6_e2m3": "float6_e2m3fn",
    "mxfp6_e3m2": "float6_e3m2fn",
    "mxfp4": "float4_e2m1fn",
}
QMAX = {"int8": 127, "int4": 7, "nf4": 1.0} | {k: ref.MINIFLOATS[v][2] for k, v in ELEMENT.items()}
EAGER = ("int4", "mxfp4", "float6_e2m3fn")
LAYOUTS = [{}, {"axis": 0}, {"block_size": 32}, {"axis": 0, "block_size": 32}]


def half_step(t: np.ndarray, fmt: str) -> np.ndarray:
    a = np.abs(t) * (1 + 2.0**-22)  # the binade of t or of its float32 neighbour, the wider
    if fmt.startswith("int"):
        h = np.full(t.shape, 0.5)
    elif fmt == "nf4":
        lv = np.array(ref.NF4_PAPER)
        hi = np.clip(np.searchsorted(lv, t), 1, 15)
        h = (lv[hi] - lv[hi - 1]) / 2
    else:
        h = ref.spacing(a, ELEMENT[fmt]) / 2
    if fmt.startswith("mx"):
        h = np.maximum(h, np.abs(t) - QMAX[fmt])
    return h


def _expand(q: hq.QArray) -> np.ndarray:
    s = np.asarray(jnp.asarray(q.scales).astype(jnp.float32), np.float64)
    s = np.repeat(s, q.shape[q.axis] // s.shape[q.axis], axis=q.axis)
    return np.broadcast_to(s, q.shape)


def check_bound(x: np.ndarray, q: hq.QArray, deq: np.ndarray) -> None:
    x64 = np.asarray(x, np.float64)
    s = _expand(q)
    safe = np.where(s == 0, 1.0, s)
    t = np.where(s == 0, 0.0, x64 / safe)
    slack = 0.0 if q.format.startswith("mx") else 2.0**-24 * (np.abs(x64) + np.abs(deq))
    bound = s * half_step(t, q.format) + slack
    err = np.abs(x64 - deq)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (q.format, x64[worst], deq[worst], s[worst], bound[worst])


@pytest.mark.parametrize("fmt", hq.FORMATS)
def test_round_trip_error_is_within_half_a_step(fmt):
    layouts = LAYOUTS if fmt.startswith("int") else LAYOUTS[1:3]
    if fmt.startswith("mx"):
        layouts = [LAYOUTS[2], LAYOUTS[3]]
    rng = np.random.default_rng(sum(map(ord, fmt)))
    x = (rng.standard_normal((64, 128)) * np.exp(rng.uniform(-3, 3, (64, 1)))).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1e-20, -1e-20]

    def run(a):
        qs = [hq.quantize(a, fmt, **layout) for layout in layouts]
        return qs, [hq.dequantize(q) for q in qs]

    qs, deqs = jax.jit(run)(jnp.asarray(x))  # every layout under one jax.jit
    for q, deq in zip(qs, deqs, strict=True):
        deq = np.asarray(deq, np.float64)
        assert deq.shape == x.shape and q.shape == x.shape
        check_bound(x, q, deq)
        assert np.max(np.abs(x - deq)) > 0  # lossy formats really do lose something here
    if fmt not in EAGER:
        return
    # eagerly: the same bits
    q = hq.quantize(jnp.asarray(x), fmt, **layouts[-1])
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(qs[-1].data))
    np.testing.assert_array_equal(np.asarray(hq.dequantize(q)), np.asarray(deqs[-1]))


@pytest.mark.parametrize("fmt", [f for f in ELEMENT if not f.startswith("mx")])
def test_float_codes_are_the_correctly_rounded_quotient(fmt):
    """Exact: each element is fl32(x / s) rounded once to the element format (saturating)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 256)) * 3).astype(np.float32)
    x[0, :8] = [0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, 1.0, 0.5]
    q = hq.quantize(jnp.asarray(x), fmt, block_size=64)
    s = np.repeat(np.asarray(q.scales, np.float32), 64, axis=-1)
    t = (x / s).astype(np.float32)
    expected = ref.round_minifloat(t, ELEMENT[fmt])
    if q.fmt.packed:  # decode the codes with ml_dtypes: one code per byte, low bits
        got = np.asarray(unpacked_codes(q)).view(getattr(ml_dtypes, fmt)).astype(np.float64)
    else:
        got = np.asarray(q.data.astype(jnp.float32), np.float64)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_integer_codes_round_half_to_even(fmt):
    qmax = QMAX[fmt]
    # x / s lands exactly on k + 1/2 for a power-of-two scale: absmax = qmax * 2**-3
    x = np.array([qmax, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.25], np.float32) * np.float32(2**-3)
    q = hq.quantize(jnp.asarray(x), fmt)
    assert float(q.scales.reshape(())) == 2**-3
    got = np.asarray(hq.dequantize(q), np.float64) * 8
    np.testing.assert_array_equal(got, [qmax, 0, 2, 2, -0, -2, -2, 0])


def test_float6_codes_match_ml_dtypes_for_every_value():
    """Every float6 value and every midpoint between neighbours, against ml_dtypes' own rounding."""
    for name in ("float6_e2m3fn", "float6_e3m2fn"):
        d = np.dtype(getattr(ml_dtypes, name))
        vals = np.unique(np.arange(64, dtype=np.uint8).view(d).astype(np.float32))
        mids = (vals[:-1] + vals[1:]) / 2
        t = np.concatenate([vals, mids, np.nextafter(mids, np.float32(0)), [7.49, 27.9]])
        t = t[np.abs(t) <= float(ml_dtypes.finfo(d).max)].astype(np.float32)
        x = np.concatenate([t, [float(ml_dtypes.finfo(d).max)]]).astype(np.float32)  # scale 1
        x = np.pad(x, (0, -x.size % 4))
        q = hq.quantize(jnp.asarray(x), name)
        assert float(q.scales.reshape(())) == 1.0
        got = np.asarray(unpacked_codes(q))
        want = x.astype(d).view(np.uint8)
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("fmt", ["int8", "int4", "float8_e4m3fn", "float6_e3m2fn", "nf4", "mxfp4"])
def test_zero_and_non_finite_blocks(fmt):
    x = np.zeros((4, 32), np.float32)
    x[1, 3] = np.inf
    x[2, 5] = np.nan
    x[3] = np.linspace(-1, 1, 32)
    q, deq = jax.jit(lambda a: (q := hq.quantize(a, fmt, block_size=32), hq.dequantize(q)))(x)
    deq = np.asarray(deq)
    np.testing.assert_array_equal(deq[0], 0.0)  # an all-zero block is exactly zero
    assert np.isnan(deq[1]).all() and np.isnan(deq[2]).all()  # inf or NaN: NaN scale, all NaN
    assert np.isnan(np.asarray(q.scales.astype(jnp.float32))[1:3]).all()
    assert np.isfinite(deq[3]).all()


@pytest.mark.parametrize("src", ["bfloat16", "float16", "float32"])
def test_dtype_is_kept_and_dequantize_casts(src):
    x = jnp.linspace(-2, 2, 128, dtype=jnp.float32).astype(src)
    q = hq.quantize(x, "int8")
    assert q.dtype == np.dtype(src)
    assert hq.dequantize(q).dtype == np.dtype(src)
    assert hq.dequantize(q, "float32").dtype == np.float32
    # the narrow result is the float32 result rounded once
    wide = hq.dequantize(q, "float32")
    np.testing.assert_array_equal(
        np.asarray(hq.dequantize(q, "bfloat16")), np.asarray(wide.astype(jnp.bfloat16))
    )


def test_float64_input_under_x64_computes_in_float64():
    with jax.enable_x64(True):
        x = np.linspace(-1, 1, 64) + 1e-12
        q = hq.quantize(jnp.asarray(x), "int8", block_size=32)
        assert q.dtype == np.float64
        deq = np.asarray(hq.dequantize(q))
        assert deq.dtype == np.float64
        s = np.repeat(np.asarray(q.scales, np.float64), 32)
        np.testing.assert_array_equal(np.round(x / s) * s, deq)


@pytest.mark.parametrize("fmt", ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"])
def test_every_code_decodes_to_the_ml_dtypes_value(fmt):
    from heddle.quant._formats import decode, parse_format

    n = 16 if fmt.startswith("float4") else 64
    c = np.arange(n, dtype=np.uint8)
    got = np.asarray(jax.jit(decode, static_argnums=1)(jnp.asarray(c), parse_format(fmt)))
    want = c.view(getattr(ml_dtypes, fmt)).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 included
