"""heddle.numpy.linalg and heddle.numpy.fft: narrow floats computed in float32 and rounded once.

References are float64 NumPy on the exact narrow input values. A float32 decomposition of a
well-conditioned matrix (condition number below 10 here) is accurate to ``TOL`` relative to the largest
output, far below half a bfloat16 ulp, so the result must be one of the roundings of a value within
``TOL`` of the reference: the correctly rounded value except within ``TOL`` of a tie. Where partial
sums and products are exact in float32 (small integers), the result is checked bit for bit.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _common import BF16, F16, F32, U32, round_once  # tests/ops is on sys.path

from heddle import policy
from heddle.ops._linalg import fft as hfft
from heddle.ops._linalg import linalg as hla


def assert_rounded_once(got, ref, dtype, tol):
    """``got`` is ``r`` rounded once to ``dtype`` for some ``|r - ref| <= tol`` (elementwise)."""
    got = np.asarray(got)
    assert got.dtype == dtype, got.dtype
    ref = np.asarray(ref, np.float64)
    g = got.astype(np.float64)
    lo = round_once(ref - tol, dtype).astype(np.float64)
    hi = round_once(ref + tol, dtype).astype(np.float64)
    bad = ~((lo <= g) & (g <= hi))
    assert not bad.any(), f"got {g[bad][:4]}, reference {ref[bad][:4]}"


TOL = 1e-5  # float32 error of the decompositions below, relative to the largest output


def _spd(n, dtype, seed):
    """A symmetric positive definite matrix, exact in ``dtype``, condition number below 10."""
    rng = np.random.default_rng(seed)
    b = rng.integers(-4, 5, (n, n)) / 8
    return (np.eye(n) * 8 + (b + b.T) / 2).astype(dtype)


def _general(n, dtype, seed):
    rng = np.random.default_rng(seed)
    return (np.eye(n) * 8 + rng.integers(-8, 9, (n, n)) / 8).astype(dtype)


def _tol(ref):
    return TOL * np.abs(np.asarray(ref, np.float64)).max()


# name -> (heddle call, float64 NumPy reference) on the matrix a (and b)
VALUE_CASES = {
    "solve": (lambda a, b: hla.solve(a, b), lambda a, b: np.linalg.solve(a, b)),
    "inv": (lambda a, b: hla.inv(a), lambda a, b: np.linalg.inv(a)),
    "det": (lambda a, b: hla.det(a), lambda a, b: np.linalg.det(a)),
    "slogdet": (lambda a, b: hla.slogdet(a)[1], lambda a, b: np.linalg.slogdet(a)[1]),
    "cholesky": (lambda a, b: hla.cholesky(a @ a.T), lambda a, b: np.linalg.cholesky(a @ a.T)),
    "eigvalsh": (lambda a, b: hla.eigvalsh(a + a.T), lambda a, b: np.linalg.eigvalsh(a + a.T)),
    "eigh": (lambda a, b: hla.eigh(a + a.T)[0], lambda a, b: np.linalg.eigh(a + a.T)[0]),
    "svdvals": (lambda a, b: hla.svdvals(a), lambda a, b: np.linalg.svd(a, compute_uv=False)),
    "svd": (lambda a, b: hla.svd(a)[1], lambda a, b: np.linalg.svd(a)[1]),
    "pinv": (lambda a, b: hla.pinv(a), lambda a, b: np.linalg.pinv(a)),
    "lstsq": (lambda a, b: hla.lstsq(a, b)[0], lambda a, b: np.linalg.lstsq(a, b)[0]),
    "cond": (lambda a, b: hla.cond(a), lambda a, b: np.linalg.cond(a)),
    "norm": (lambda a, b: hla.norm(a), lambda a, b: np.linalg.norm(a)),
    "norm-2": (lambda a, b: hla.norm(a, 2), lambda a, b: np.linalg.norm(a, 2)),
    "norm-nuc": (lambda a, b: hla.norm(a, "nuc"), lambda a, b: np.linalg.norm(a, "nuc")),
    "matrix_norm": (lambda a, b: hla.matrix_norm(a), lambda a, b: np.linalg.norm(a)),
    "vector_norm": (lambda a, b: hla.vector_norm(b), lambda a, b: np.linalg.norm(b)),
    "tensorsolve": (lambda a, b: hla.tensorsolve(a, b), lambda a, b: np.linalg.tensorsolve(a, b)),
    "tensorinv": (lambda a, b: hla.tensorinv(a, 1), lambda a, b: np.linalg.tensorinv(a, 1)),
}


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(VALUE_CASES))
def test_float32_computation_rounded_once(name, dtype):
    ours, ref_fn = VALUE_CASES[name]
    a = _general(8, dtype, 0) if name != "cholesky" else _spd(8, dtype, 0) / 4
    b = np.random.default_rng(1).integers(-8, 9, 8).astype(dtype)
    got = jax.jit(ours)(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if name == "cholesky":  # a @ a.T is computed in the narrow dtype by the caller: use it
        ref = np.linalg.cholesky(np.asarray(a @ a.T).astype(np.float64))
    else:
        ref = ref_fn(a64, b64)
    assert_rounded_once(got, ref, dtype, _tol(ref))


@pytest.mark.parametrize("name", ["solve", "det", "svdvals", "norm-nuc"])
def test_eagerly(name):
    ours, ref_fn = VALUE_CASES[name]
    a = _general(8, BF16, 2)
    b = np.arange(8).astype(BF16)
    ref = ref_fn(a.astype(np.float64), b.astype(np.float64))
    assert_rounded_once(ours(a, b), ref, BF16, _tol(ref))


def test_decompositions_reconstruct(transform):
    a = _spd(8, BF16, 3)
    a64 = a.astype(np.float64)
    w, v = transform(hla.eigh)(a)
    assert w.dtype == v.dtype == BF16
    v64 = np.asarray(v, np.float64)
    # each output rounded once from float32: |error| <= 2**-8 relative per entry
    recon = v64 @ np.diag(np.asarray(w, np.float64)) @ v64.T
    assert np.abs(recon - a64).max() <= 8 * 2**-8 * np.abs(a64).max()
    q, r = transform(hla.qr)(a)
    assert q.dtype == r.dtype == BF16
    recon = np.asarray(q, np.float64) @ np.asarray(r, np.float64)
    assert np.abs(recon - a64).max() <= 8 * 2**-8 * np.abs(a64).max()
    u, s, vh = transform(hla.svd)(a)
    assert u.dtype == s.dtype == vh.dtype == BF16
    recon = np.asarray(u, np.float64) * np.asarray(s, np.float64) @ np.asarray(vh, np.float64)
    assert np.abs(recon - a64).max() <= 8 * 2**-8 * np.abs(a64).max()


def test_eig_of_a_narrow_float_is_complex64(transform):
    a = _general(4, BF16, 4)
    w, v = transform(hla.eig)(a)
    assert w.dtype == v.dtype == np.complex64
    ref = np.sort_complex(np.linalg.eigvals(a.astype(np.float64)))
    assert np.allclose(np.sort_complex(np.asarray(w)), ref, rtol=1e-5, atol=1e-5)
    assert transform(hla.eigvals)(a).dtype == np.complex64


# --- dtypes ----------------------------------------------------------------------------------------

FLOAT_NAMES = ["det", "inv", "solve", "norm", "svdvals", "pinv", "cond", "eigvalsh", "slogdet"]


def _call(name, a):
    fn = getattr(hla, name)
    if name == "solve":
        return fn(a, a[:, 0])
    if name == "eigvalsh":
        return fn(a + a.T)
    return fn(a)


@pytest.mark.parametrize("name", FLOAT_NAMES)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.bool_])
def test_integer_input_gives_the_default_float(name, dtype):
    a = (np.eye(3) * 2 + 1).astype(dtype)
    out = jax.jit(lambda a: _call(name, a)).eval_shape(a)
    assert {leaf.dtype for leaf in jax.tree.leaves(out)} == {np.dtype(F32)}


def test_integer_input_gives_float32_under_x64(transform):
    with jax.enable_x64(True):
        a = (np.eye(3) * 2 + 1).astype(np.int64)
        assert transform(hla.det)(a).dtype == F32
        assert jnp.linalg.det(a).dtype == np.float64  # JAX's own rule, the contrast
        assert transform(hla.matrix_rank)(a).dtype == np.int32
        assert transform(lambda a: hla.lstsq(a, a)[2])(a).dtype == np.int32
        assert transform(hla.inv)(a.astype(F16)).dtype == F16


def test_float_dtypes_are_kept(transform):
    a = _general(3, F16, 5)
    assert transform(hla.inv)(a).dtype == F16
    assert transform(hla.inv)(a.astype(F32)).dtype == F32
    c = (a.astype(F32) + 1j * a.astype(F32)).astype(np.complex64)
    assert transform(hla.inv)(c).dtype == np.complex64
    assert transform(hla.norm)(c).dtype == F32  # a norm is real
    assert transform(hla.matrix_rank)(a).dtype == np.int32


# --- contractions ----------------------------------------------------------------------------------


def test_matmul_bfloat16_inner_4096(transform):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((4, 4096)).astype(BF16)
    b = rng.standard_normal((4096, 4)).astype(BF16)
    got = transform(hla.matmul)(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_rounded_once(got, a64 @ b64, BF16, 4096 * U32 * (np.abs(a64) @ np.abs(b64)))


def test_integer_contractions_widen(transform):
    a = np.full((2, 300), 100, np.int8)
    got = transform(hla.matmul)(a, a.T)
    assert got.dtype == np.int32 and int(got[0, 0]) == 3_000_000
    assert int(jnp.linalg.matmul(a, a.T)[0, 0]) != 3_000_000  # JAX wraps in int8
    assert transform(hla.vecdot)(a, a).dtype == np.int32
    assert transform(lambda a: hla.tensordot(a, a, axes=2))(a).dtype == np.int32
    assert transform(hla.trace)(a[:, :2]).dtype == np.int32


def _small_ints(n, seed):
    return np.random.default_rng(seed).integers(-7, 8, (n, n)).astype(BF16)


def test_multi_dot_rounds_once(transform):
    # products of small integers: every partial sum of the chain is exact in float32, so the
    # result is the exact product rounded once; bfloat16 (8 bits) cannot hold most entries
    mats = [_small_ints(8, s) for s in range(3)]
    exact = np.linalg.multi_dot([m.astype(np.float64) for m in mats])
    got = transform(hla.multi_dot)(mats)
    assert got.dtype == BF16
    assert np.array_equal(np.asarray(got).view(np.uint16), round_once(exact, BF16).view(np.uint16))


def test_matrix_power_rounds_once(transform):
    a = _small_ints(8, 9)
    exact = np.linalg.matrix_power(a.astype(np.float64), 4)
    assert np.abs(exact).max() < 2**24  # exact in float32
    got = transform(lambda a: hla.matrix_power(a, 4))(a)
    assert np.array_equal(np.asarray(got).view(np.uint16), round_once(exact, BF16).view(np.uint16))
    assert transform(lambda a: hla.matrix_power(a, 3))(np.full((2, 2), 100, np.int8)).dtype == (
        np.int32
    )


def test_outer_and_cross(transform):
    x, y = np.arange(3).astype(BF16), np.arange(3).astype(F16)
    assert transform(hla.outer)(x, y).dtype == F32
    assert transform(hla.cross)(x, x).dtype == BF16


def _precisions(fn, *args):
    found = []

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name == "dot_general":
                found.append(e.params.get("precision"))
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_float32_work_runs_at_highest_precision():
    a = np.eye(4, dtype=F32) * 2
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    for fn in (lambda a: hla.matmul(a, a), lambda a: hla.multi_dot([a, a, a]), hla.pinv, hla.inv):
        found = _precisions(fn, a)
        assert found and all(p == highest for p in found), found
    import dataclasses

    with policy.use(dataclasses.replace(policy.current(), float32_matmul_precision="default")):
        assert _precisions(hla.matmul, a, a) == [None]


# --- fft -------------------------------------------------------------------------------------------


def test_fft_of_a_narrow_float_computes_in_complex64(transform):
    x = np.random.default_rng(10).standard_normal(256).astype(BF16)
    x64 = x.astype(np.float64)
    tol = 8 * 8 * U32 * np.abs(x64).sum()  # log2(256) butterfly levels, a few ulps each
    for ours, ref in [(hfft.fft, np.fft.fft), (hfft.rfft, np.fft.rfft), (hfft.ifft, np.fft.ifft)]:
        got = transform(ours)(x)
        assert got.dtype == np.complex64
        assert np.abs(np.asarray(got) - ref(x64)).max() <= tol
    assert transform(hfft.fftn)(x.reshape(16, 16)).dtype == np.complex64


def test_inverse_real_transforms_round_once(transform):
    spectrum = np.fft.rfft(np.arange(64.0))
    c = spectrum.astype(np.complex64)
    got = transform(hfft.irfft)(c)
    assert got.dtype == F32
    x = np.random.default_rng(11).standard_normal(64).astype(BF16)
    got = transform(hfft.irfft)(x)  # a real input is a (real) spectrum
    assert got.dtype == BF16
    ref = np.fft.irfft(x.astype(np.float64))
    assert_rounded_once(got, ref, BF16, 64 * U32 * np.abs(x.astype(np.float64)).sum())
    assert transform(hfft.hfft)(x).dtype == BF16


def test_fft_dtypes(transform):
    assert transform(hfft.fft)(np.arange(8, dtype=np.int8)).dtype == np.complex64
    assert transform(hfft.fft)(np.arange(8).astype(F16)).dtype == np.complex64
    with jax.enable_x64(True):
        assert transform(hfft.fft)(np.arange(8)).dtype == np.complex64  # JAX: complex128
        assert jnp.fft.fft(np.arange(8)).dtype == np.complex128
        assert transform(hfft.fft)(np.arange(8.0)).dtype == np.complex128  # float64 stays
        assert hfft.fftfreq(8).dtype == F32  # JAX: float64
    assert hfft.fftfreq(8).dtype == F32
    got = hfft.rfftfreq(8, dtype="bfloat16")
    assert got.dtype == BF16 and np.asarray(got).astype(np.float64).tolist() == [
        0.0,
        0.125,
        0.25,
        0.375,
        0.5,
    ]
    assert hfft.fftshift is jnp.fft.fftshift


# --- errors ----------------------------------------------------------------------------------------


def test_promotion_error_through_solve():
    a = np.eye(2, dtype=ml_dtypes.float8_e4m3fn)
    b = np.ones(2, ml_dtypes.float8_e5m2)
    with pytest.raises(policy.PromotionError, match="float8_e4m3fn with float8_e5m2") as e:
        hla.solve(a, b)
    assert "heddle.astype(x, 'float16')" in str(e.value)
    assert hla.solve(a.astype(F16), b.astype(F16)).dtype == F16


def test_64bit_needs_x64():
    with pytest.raises(policy.PrecisionError, match="jax_enable_x64"):
        hfft.fftfreq(8, dtype="float64")
    with pytest.raises(policy.PrecisionError, match="jax_enable_x64"):
        hla.matmul(np.ones((2, 2), F32), np.ones((2, 2), F32), preferred_element_type="float64")
    with jax.enable_x64(True):
        assert hfft.fftfreq(8, dtype="float64").dtype == np.float64
