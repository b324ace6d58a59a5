"""``qmatmul`` against a float64 contraction of the exact dequantised weight."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.quant as hq
from heddle.quant._quantize import codes as unpacked_codes

from . import _reference as ref

K, N = 256, 48


def exact_weight(q: hq.QArray) -> np.ndarray:
    """code value * scale in float64 (exact), from the codes and scales only."""
    c = np.asarray(unpacked_codes(q))
    if q.format == "int8":
        v = c.astype(np.float64)
    elif q.format == "int4":
        v = np.where(c >= 8, c.astype(np.int64) - 16, c).astype(np.float64)
    elif q.format == "nf4":
        v = np.array(ref.NF4_PAPER, np.float32).astype(np.float64)[c]
    elif q.format == "mxfp4":
        v = c.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    elif q.format.startswith("float6"):
        v = c.view(getattr(ml_dtypes, q.format)).astype(np.float64)
    else:
        v = np.asarray(c).astype(np.float64)  # float8: the native values
    s = np.asarray(q.scales.astype(jnp.float32), np.float64)
    s = np.repeat(s, q.shape[q.axis] // s.shape[q.axis], axis=q.axis)  # one scale per element
    return v * s


CASES = [
    ("int8", {"axis": 0}, "float32"),  # scale constant along K: (x @ codes) * scale
    ("int8", {"axis": 0}, "bfloat16"),  # ... with the codes in bfloat16 (exact)
    ("int8", {}, "float32"),
    ("float8_e4m3fn", {"axis": 0}, "bfloat16"),
    ("int4", {"axis": 0, "block_size": 64}, "float32"),  # blocks along K: dequantise, contract
    ("nf4", {"axis": 0}, "bfloat16"),
    ("mxfp4", {"axis": 0}, "float32"),
    ("int8", {"axis": 1}, "float32"),  # scales along N
]


@pytest.mark.parametrize(("fmt", "kw", "xdtype"), CASES, ids=[f"{f}-{k}-{d}" for f, k, d in CASES])
def test_qmatmul_is_within_float32_accumulation_of_float64(fmt, kw, xdtype):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, N)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((3, 5, K)).astype(np.float32)).astype(xdtype)
    q = hq.quantize(jnp.asarray(w), fmt, **kw)
    out = jax.jit(hq.qmatmul)(x, q)
    assert out.dtype == np.float32 and out.shape == (3, 5, N)  # promote(xdtype, float32)
    wq = exact_weight(q)
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    want = x64 @ wq
    mag = np.abs(x64) @ np.abs(wq)
    err = np.abs(np.asarray(out, np.float64) - want)
    assert np.all(err <= (K + 2) * 2.0**-24 * mag), float(np.max(err / mag))


SLAB_CASES = [
    ("int8", {"axis": 0}),
    ("int4", {"axis": 0, "block_size": 128}),
    ("float6_e3m2fn", {"axis": 0, "block_size": 32}),
    ("mxfp4", {"axis": 0}),
    ("int8", {"axis": 1}),
    ("nf4", {"axis": 0, "block_size": 1024}),  # blocks wider than a slab: one contraction
]


@pytest.mark.parametrize(("fmt", "kw"), SLAB_CASES, ids=[f"{f}-{k}" for f, k in SLAB_CASES])
def test_large_weights_contract_in_slabs(fmt, kw):
    from heddle.quant._qmatmul import _chunks

    k = 2048
    rng = np.random.default_rng(4)
    q = hq.quantize(jnp.asarray(rng.standard_normal((k, 8)), jnp.float32), fmt, **kw)
    assert _chunks(q) == (1 if kw.get("block_size") == 1024 else 4)
    x = jnp.asarray(rng.standard_normal((2, k)), jnp.float32)
    out = np.asarray(jax.jit(hq.qmatmul)(x, q), np.float64)
    wq = exact_weight(q)
    x64 = np.asarray(x, np.float64)
    mag = np.abs(x64) @ np.abs(wq)
    assert np.all(np.abs(out - x64 @ wq) <= (k + 2) * 2.0**-24 * mag)


def test_result_dtype_and_preferred_element_type():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((K, N)), jnp.bfloat16)
    q = hq.quantize(w, "int8", axis=0)
    xb = jnp.ones((2, K), jnp.bfloat16)
    assert hq.qmatmul(xb, q).dtype == jnp.bfloat16
    assert hq.qmatmul(xb.astype(jnp.float16), q).dtype == jnp.float32  # f16 with bf16: f32
    assert hq.qmatmul(xb, q, preferred_element_type=jnp.float32).dtype == jnp.float32
    assert hq.qmatmul(xb[0], q).shape == (N,)  # a vector times the matrix


@pytest.mark.parametrize(
    ("fmt", "kw"), [("int8", {"axis": 0}), ("int4", {"axis": 0, "block_size": 32})]
)
def test_accumulates_in_float32_then_rounds_once(fmt, kw):
    # 4096 ones: a bfloat16 accumulator stalls at 256; float32 sums them exactly
    q = hq.quantize(jnp.ones((4096, 4), jnp.bfloat16), fmt, **kw)
    out = jax.jit(hq.qmatmul)(jnp.ones((1, 4096), jnp.bfloat16), q)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), 4096.0)
    # a float32 result keeps the exact float32 sum: 4088 + 8 * (1/8) = 4089
    x = jnp.concatenate([jnp.ones((1, 4088)), jnp.full((1, 8), 1 / 8)], axis=1).astype(jnp.bfloat16)
    out = hq.qmatmul(x, q, preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(out), 4089.0)


def test_under_vmap_and_jit():
    rng = np.random.default_rng(1)
    q = hq.quantize(jnp.asarray(rng.standard_normal((K, N)), jnp.float32), "nf4", axis=0)
    xs = jnp.asarray(rng.standard_normal((4, K)), jnp.float32)
    batched = jax.jit(jax.vmap(hq.qmatmul, in_axes=(0, None)))(xs, q)
    for i in range(4):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(hq.qmatmul(xs[i], q)),
                                   rtol=1e-6, atol=1e-5)  # fmt: skip


def test_errors():
    q = hq.quantize(jnp.ones((K, N)), "int8", axis=0)
    with pytest.raises(
        ValueError, match=r"last axis of x must have the size of the weight's first"
    ):
        hq.qmatmul(jnp.ones((2, K + 1)), q)
    with pytest.raises(TypeError, match=r"qmatmul\(<int32 array>, q\).*astype\(x, 'float32'\)"):
        hq.qmatmul(jnp.ones((2, K), jnp.int32), q)
    with pytest.raises(TypeError, match=r"2-D QArray of shape \(K, N\)"):
        hq.qmatmul(jnp.ones((2, K)), jnp.ones((K, N)))
    with pytest.raises(TypeError, match=r"<QArray of 3 dims>"):
        hq.qmatmul(jnp.ones((2, K)), hq.quantize(jnp.ones((2, K, N)), "int8"))
