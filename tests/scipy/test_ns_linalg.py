"""heddle.scipy.linalg: float32 computation for narrow inputs, one rounding, and the creation dtypes.

Reference: NumPy float64 (``numpy.linalg``, a Taylor series for ``expm``) on the same narrow inputs,
rounded once to the narrow dtype. For these well-conditioned 3x3 matrices float32's error is far
below half an ulp of bfloat16 or float16, so the result is the float64 value rounded once except
within ``BAND`` of a midpoint, where either neighbour passes. Eager and under ``jax.jit``, bfloat16
and float16. Copies (``toeplitz``, ``block_diag``, ...) are compared bit for bit with NumPy's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.linalg as hl

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
BAND = 2.0**-17  # 128 float32 ulps: a solve of condition number ~3 is within a few


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


def rounded_once(got, ref, d: np.dtype, band: float = BAND, atol: float = 0.0) -> np.ndarray:
    """Where ``got`` (of dtype ``d``) is the float64 ``ref`` rounded once to ``d`` (either
    neighbour within ``band`` of a midpoint; ``atol`` for results that cancel to 0)."""
    got = np.asarray(got)
    assert got.dtype == d, got.dtype
    ref = np.asarray(ref, np.float64)
    want = ref.astype(d)
    g, w = got.astype(np.float64), want.astype(np.float64)
    u = _ulp(w, d)
    tie = np.abs(np.abs(ref - w) - u / 2) <= band * np.abs(ref) + atol
    return (got.view(np.uint16) == want.view(np.uint16)) | (tie & (np.abs(g - ref) <= u))


TRANSFORMS = [lambda f: f, jax.jit]
IDS = ["eager", "jit"]
A64 = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]])
B64 = np.array([1.0, -2.0, 0.5])


def _expm64(a: np.ndarray) -> np.ndarray:
    out, term = np.eye(len(a)), np.eye(len(a))
    for k in range(1, 40):
        term = term @ a / k
        out = out + term
    return out


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_decompositions_and_solvers_round_float64_values_once(d, transform):
    a, b = A64.astype(d), B64.astype(d)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)

    def ours(a, b):
        c_low = hl.cho_factor(a, lower=True)
        lu_piv = hl.lu_factor(a)
        out = {
            "cho_solve": hl.cho_solve(c_low, b),
            "lu_solve": hl.lu_solve(lu_piv, b),
            "factor": c_low[0],
            "lu": lu_piv[0],
            "pivots": lu_piv[1],
            "lower": c_low[1],
        }
        if transform is jax.jit and d == BF16:  # each compiles on its own: a sample elsewhere
            out |= {
                "solve": hl.solve(a, b),
                "inv": hl.inv(a),
                "det": hl.det(a),
                "cholesky": hl.cholesky(a, lower=True),
                "eigh": hl.eigh(a, eigvals_only=True),
                "solve_triangular": hl.solve_triangular(jnp.triu(a), b),
                "expm": hl.expm(a / 4),
            }
        return out

    got = transform(ours)(a, b)
    # the solvers of a factorisation read the factor as rounded once to d: solve with that one
    low = np.tril(np.asarray(got["factor"], np.float64))
    lu = np.asarray(got["lu"], np.float64)
    pb = b64.copy()
    for i, j in enumerate(np.asarray(got["pivots"])):
        pb[[i, j]] = pb[[j, i]]
    refs = {
        "solve": np.linalg.solve(a64, b64),
        "inv": np.linalg.inv(a64),
        "det": np.linalg.det(a64),
        "cholesky": np.linalg.cholesky(a64),
        "eigh": np.linalg.eigvalsh(a64),
        "cho_solve": np.linalg.solve(low @ low.T, b64),
        "lu_solve": np.linalg.solve(np.triu(lu), np.linalg.solve(np.tril(lu, -1) + np.eye(3), pb)),
        "solve_triangular": np.linalg.solve(np.triu(a64), b64),
        "expm": _expm64(a64 / 4),
    }
    for name, ref in refs.items():
        if name not in got:
            continue
        ok = rounded_once(got[name], ref, d, atol=1e-6)
        assert ok.all(), (name, np.asarray(got[name]), ref)
    assert got["pivots"].dtype == np.int32
    assert bool(got["lower"]) is True


def test_complex_outputs_are_complex64_and_integer_outputs_int32():
    a = A64.astype(BF16)
    assert jax.eval_shape(hl.sqrtm, a).dtype == np.complex64
    t, z = jax.eval_shape(lambda a: hl.schur(a, output="complex"), a)
    assert t.dtype == z.dtype == np.complex64
    t, z = jax.eval_shape(hl.schur, a)
    assert t.dtype == z.dtype == BF16
    with jax.enable_x64(True):
        lu, piv = jax.eval_shape(hl.lu_factor, A64.astype(F16))
        assert lu.dtype == F16 and piv.dtype == np.int32
        assert jax.eval_shape(hl.inv, np.eye(3, dtype=np.int8)).dtype == F32  # JAX: float64


@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_copies_are_bit_exact(d):
    c = np.array([1.0, 0.1, -3.3], d)
    r = np.array([1.0, 2.7, 0.3, -0.1], d)

    def toeplitz(c, r):
        return np.array(
            [[c[i - j] if i >= j else r[j - i] for j in range(len(r))] for i in range(len(c))]
        )

    cases = {
        "toeplitz": (hl.toeplitz(c, r), toeplitz(c, r)),
        "circulant": (hl.circulant(c), np.array([np.roll(c, k) for k in range(3)]).T),
        "block_diag": (
            hl.block_diag(c[None], r[:2, None]),
            np.block([[c[None], np.zeros((1, 1), d)], [np.zeros((2, 3), d), r[:2, None]]]),
        ),
        "hankel": (
            hl.hankel(c),
            np.array([[c[i + j] if i + j < 3 else 0 for j in range(3)] for i in range(3)]),
        ),
    }
    for name, (got, want) in cases.items():
        assert got.dtype == d, name
        np.testing.assert_array_equal(
            np.asarray(got).view(np.uint16), np.asarray(want, d).view(np.uint16), name
        )
    shape = jax.eval_shape
    assert shape(hl.toeplitz, c, r.astype(F32)).dtype == F32  # the promotion of the two
    assert shape(hl.block_diag, c, np.ones(2, np.int8)).dtype == d
    assert shape(hl.leslie, c, r[:2]).dtype == d
    assert shape(lambda c: hl.convolution_matrix(c, 4), c).dtype == d


def test_creation_gives_the_policy_defaults_under_x64():
    with jax.enable_x64(True):
        for fn in (hl.hilbert, hl.helmert, hl.pascal, hl.invpascal, hl.invhilbert):
            assert jax.eval_shape(lambda fn=fn: fn(4)).dtype == F32, fn  # JAX: float64
        assert jax.eval_shape(lambda: hl.dft(4)).dtype == np.complex64  # JAX: complex128
        assert jax.eval_shape(lambda: hl.hadamard(4)).dtype == np.int32  # JAX: int64
        assert jax.eval_shape(lambda: hl.hadamard(4, dtype=BF16)).dtype == BF16
        h = hl.hilbert(5)  # float64 values, rounded once to float32
        want = np.array([[1 / (i + j + 1) for j in range(5)] for i in range(5)], np.float32)
        np.testing.assert_array_equal(h, want)
    assert hl.hadamard(4, dtype="float16").dtype == F16
    assert jsl.hadamard(4).dtype == np.int32
    np.testing.assert_array_equal(hl.hadamard(4), jsl.hadamard(4))
    assert math.isclose(float(hl.dft(4)[1, 1].imag), -1.0, abs_tol=1e-6)
