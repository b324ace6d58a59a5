"""Integer sums, products and scans with an integer ``dtype=``: every (input, dtype=) pair of the
8-, 16- and 32-bit integers gives the exact integer result modulo 2**bits of the requested dtype,
with and without jax_enable_x64 (without it, int32 with uint32 accumulation has no 64-bit
promotion to use), eagerly and under jax.jit."""

from __future__ import annotations

import itertools
import math

import jax
import numpy as np
import pytest

import heddle.numpy as hnp

INTS = [np.dtype(n) for n in ("int8", "uint8", "int16", "uint16", "int32", "uint32")]
PAIRS = list(itertools.product(INTS, INTS))


def _wrap(v: int, d: np.dtype) -> int:
    """``v`` modulo 2**bits, in ``d``'s range."""
    bits = 8 * d.itemsize
    v %= 1 << bits
    return v - (1 << bits) if d.kind == "i" and v >= 1 << (bits - 1) else v


def _input(d: np.dtype) -> np.ndarray:
    info = np.iinfo(d)
    rng = np.random.default_rng(d.itemsize * 2 + (d.kind == "u"))
    x = rng.integers(int(info.min), int(info.max), (5, 4), endpoint=True, dtype=np.int64)
    x[0, :2] = info.min, info.max
    return x.astype(d)


def _scan(rows: list[list[int]], f) -> list[list[int]]:
    return [list(itertools.accumulate(r, f)) for r in rows]


def _reference(name: str, x: np.ndarray) -> list:
    rows = x.astype(object).tolist()
    add, mul = (lambda a, b: a + b), (lambda a, b: a * b)
    return {
        "sum": lambda: [sum(r) for r in rows],
        "nansum": lambda: [sum(r) for r in rows],
        "prod": lambda: [math.prod(r) for r in rows],
        "nanprod": lambda: [math.prod(r) for r in rows],
        "cumsum": lambda: _scan(rows, add),
        "nancumsum": lambda: _scan(rows, add),
        "cumulative_sum": lambda: _scan(rows, add),
        "cumprod": lambda: _scan(rows, mul),
        "nancumprod": lambda: _scan(rows, mul),
        "cumulative_prod": lambda: _scan(rows, mul),
        "trace": lambda: sum(rows[i][i] for i in range(min(x.shape))),
    }[name]()


OPS = (
    "sum prod nansum nanprod cumsum cumprod nancumsum nancumprod cumulative_sum cumulative_prod "
    "trace"
).split()


def _call(name: str, dtype: np.dtype):
    fn = getattr(hnp, name)
    if name == "trace":
        return lambda a: fn(a, dtype=dtype)
    return lambda a: fn(a, axis=1, dtype=dtype)


def _all_pairs(name: str, jit: bool) -> list:
    """Every pair's result: eagerly one call each, under jax.jit all of them in one program."""
    xs = [_input(d) for d, _ in PAIRS]
    calls = [_call(name, want) for _, want in PAIRS]
    if jit:
        return jax.jit(lambda *a: [f(v) for f, v in zip(calls, a, strict=True)])(*xs)
    return [f(v) for f, v in zip(calls, xs, strict=True)]


def _modes():
    """(name, x64, jit) for every op; eagerly a kernel is compiled per pair (seconds each, minutes
    under x64), so by default only ``sum`` and ``cumsum`` also run eagerly without x64."""
    for name in OPS:
        for x64, jit, mode in [
            (False, False, "x32-eager"),
            (False, True, "x32-jit"),
            (True, False, "x64-eager"),
            (True, True, "x64-jit"),
        ]:
            quick = jit or (not x64 and name in ("sum", "cumsum"))
            yield pytest.param(
                name, x64, jit, id=f"{name}-{mode}", marks=() if quick else pytest.mark.slow
            )


@pytest.mark.parametrize("name,x64,jit", list(_modes()))
def test_integer_dtype_argument_wraps_the_exact_result(name, x64, jit):
    bad = []
    with jax.enable_x64(x64):
        outs = _all_pairs(name, jit)
    for (d, want), out in zip(PAIRS, outs, strict=True):
        ref = np.vectorize(lambda v, want=want: _wrap(v, want), otypes=[object])(
            np.asarray(_reference(name, _input(d)), dtype=object)
        )
        if out.dtype != want or not np.array_equal(np.asarray(out).astype(object), ref):
            bad.append((d.name, want.name, out.dtype.name))
    assert not bad, bad


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("name", ["mean", "nanmean"])
def test_integer_dtype_argument_of_a_mean(name, x64):
    """A mean that every integer dtype holds: the exact mean, truncated (as jax.numpy's integer
    division), in the requested dtype."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, 101, (5, 4))
    fn = getattr(hnp, name)
    calls = [lambda a, want=want: fn(a, axis=1, dtype=want) for _, want in PAIRS]
    xs = [values.astype(d) for d, _ in PAIRS]
    with jax.enable_x64(x64):
        outs = jax.jit(lambda *a: [f(v) for f, v in zip(calls, a, strict=True)])(*xs)
    ref = [sum(r) // len(r) for r in values.tolist()]
    bad = [
        (d.name, want.name, out.dtype.name)
        for (d, want), out in zip(PAIRS, outs, strict=True)
        if out.dtype != want or np.asarray(out).tolist() != ref
    ]
    assert not bad, bad


def test_x32_accumulates_in_an_available_dtype():
    """int8 summed to uint8 without x64: the int32/uint32 promotion (int64) is not available."""
    assert not jax.config.read("jax_enable_x64")
    x = np.array([100, -7, 90, 120], np.int8)
    out = hnp.sum(x, dtype=np.uint8)
    assert out.dtype == np.uint8 and int(out) == (100 - 7 + 90 + 120) % 256
    assert np.asarray(hnp.cumsum(x, dtype=np.uint8)).tolist() == [100, 93, 183, 47]
