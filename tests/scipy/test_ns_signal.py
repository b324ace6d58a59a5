"""heddle.scipy.signal: convolutions accumulate in float32 and round once; spectral functions compute
narrow floats (which JAX's FFT refuses) in float32 / complex64.

References: NumPy float64 (``numpy.convolve``, ``numpy.fft``) on the same narrow inputs. A
convolution output is a sum of ``n`` products: float32 partial sums put it within
``n * 2**-24 * sum|terms|`` of the float64 value before the one rounding, so the result is one of
the two neighbours of the float64 value and the float64 value rounded once wherever that bound
keeps it away from a midpoint. Spectral outputs: JAX's own float32 computation on the widened inputs,
rounded once (the policy's definition), bit for bit.
"""

from __future__ import annotations

import jax
import jax.scipy.signal as jss
import ml_dtypes
import numpy as np
import pytest

import heddle.scipy.signal as hsig

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
C64 = np.dtype(np.complex64)


def _ulp(v: np.ndarray, d: np.dtype) -> np.ndarray:
    fi = ml_dtypes.finfo(d)
    e = np.floor(np.log2(np.maximum(np.abs(v), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


def sum_rounded_once(got, ref, bound, d: np.dtype) -> np.ndarray:
    """Where ``got`` is a value within ``bound`` (the float32 accumulation error) of the float64
    ``ref`` rounded once to ``d``: exactly ``ref`` rounded once wherever the bound keeps ``ref``
    away from a midpoint, otherwise within ``bound`` plus one ulp of ``ref``."""
    got, ref = np.asarray(got), np.asarray(ref, np.float64)
    assert got.dtype == d, got.dtype
    want = ref.astype(d)
    g, w = got.astype(np.float64), want.astype(np.float64)
    u = _ulp(w, d)
    decided = np.abs(np.abs(ref - w) - u / 2) > bound
    same = got.view(np.uint16) == want.view(np.uint16)
    return np.where(decided, same, np.abs(g - ref) <= bound + u)


def mostly_exact(got, ref, d: np.dtype) -> float:
    """The fraction of ``got`` equal to the float64 ``ref`` rounded once (the worst-case bound
    above is loose: float32's actual error is far smaller)."""
    want = np.asarray(ref, np.float64).astype(d)
    return float(np.mean(np.asarray(got).view(np.uint16) == want.view(np.uint16)))


def _bound(x64: np.ndarray, k64: np.ndarray, n: int) -> np.ndarray:
    return n * 2.0**-24 * np.convolve(np.abs(x64), np.abs(k64))


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_convolve_and_correlate_accumulate_in_float32(d, transform):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 3000).astype(d)
    k = rng.uniform(-1, 1, 700).astype(d)
    x64, k64 = x.astype(np.float64), k.astype(np.float64)
    got = transform(lambda a, b: (hsig.convolve(a, b), hsig.correlate(a, b)))(x, k)
    conv, corr = np.convolve(x64, k64), np.convolve(x64, k64[::-1])
    for out, ref in ((got[0], conv), (got[1], corr)):
        assert sum_rounded_once(out, ref, _bound(x64, k64, 700), d).all()
        assert mostly_exact(out, ref, d) > 0.995


def test_a_long_float16_convolution_sums_in_float32():
    x = np.full(4096, 0.01, F16)
    got = hsig.convolve(x, x, mode="valid")
    want = 4096 * float(x[0]) ** 2
    assert got.dtype == F16
    assert float(got[0]) == float(np.float16(want))
    assert hsig.convolve(np.arange(4, dtype=np.int8), np.ones(2, np.int8)).dtype == F32


@pytest.mark.parametrize("d", [BF16, F16], ids=str)
def test_convolve2d_and_fftconvolve(d):
    rng = np.random.default_rng(1)
    a, k = rng.uniform(-1, 1, (12, 10)).astype(d), rng.uniform(-1, 1, (3, 4)).astype(d)
    a64, k64 = a.astype(np.float64), k.astype(np.float64)
    want = np.zeros((14, 13))
    for i in range(3):
        for j in range(4):
            want[i : i + 12, j : j + 10] += k64[i, j] * a64
    bound = 12 * 2.0**-24 * np.abs(want).max() + 2.0**-40
    got = jax.jit(lambda a, k: (hsig.convolve2d(a, k), hsig.fftconvolve(a, k)))(a, k)
    assert sum_rounded_once(got[0], want, bound, d).all()
    # through the FFT: float32's error is relative to the largest output, not to each
    assert got[1].dtype == d
    err = np.abs(np.asarray(got[1], np.float64) - want)
    assert (err <= _ulp(want, d) + 2.0**-18 * np.abs(want).max()).all()
    with pytest.raises(ValueError, match="float32"):
        jss.fftconvolve(a, k)  # JAX's FFT takes no narrow float


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_spectral_functions_are_jax_float32_rounded_once(transform):
    x = np.sin(np.arange(256) / 5.0).astype(BF16)
    y = np.cos(np.arange(256) / 7.0).astype(BF16)
    x32, y32 = x.astype(F32), y.astype(F32)

    def spectra(x, y, fn):
        f, t, z = fn.stft(x, nperseg=32)
        if transform is not jax.jit:  # eagerly each is compiled on its own: stft only
            return f, t, z
        _, pw = fn.welch(x, nperseg=32)
        _, pc = fn.csd(x, y, nperseg=32)
        return f, t, z, pw, pc, fn.detrend(x)

    got = transform(lambda a, b: spectra(a, b, hsig))(x, y)
    ref = jax.jit(lambda a, b: spectra(a, b, jss))(x32, y32)
    names = ["f", "t", "Zxx", "welch", "csd", "detrend"][: len(got)]
    for name, g, r in zip(names, got, ref, strict=True):
        r = np.asarray(r)
        g = np.asarray(g)
        if r.dtype == C64:  # complex64 holds bfloat16's values: kept as float32 computed them
            assert g.dtype == C64, name
            np.testing.assert_allclose(g, r, rtol=0, atol=1e-6 * np.abs(r).max(), err_msg=name)
            continue
        # one rounding of float32's value (two compilations of it may differ in the last bit of
        # float32, so the few values within 2**-20 of a bfloat16 midpoint may round either way)
        want = r.astype(BF16)
        u = _ulp(want.astype(np.float64), BF16)
        tie = np.abs(np.abs(r - want.astype(np.float64)) - u / 2) <= 2.0**-20 * np.abs(r)
        ok = (g.view(np.uint16) == want.view(np.uint16)) | tie
        assert g.dtype == BF16 and ok.all(), name
    _, xr = jax.eval_shape(lambda z: hsig.istft(z, nperseg=32), np.asarray(got[2]))
    assert xr.dtype == F32  # a complex64 spectrum: its real part's dtype
