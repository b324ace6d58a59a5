"""A ``policy.default_dtypes`` block entered again reuses what the first entry made.

The block's policy is resolved once per (active policy, arguments) and is the same interned instance
every time, so an op's kernel is traced and compiled once per policy however many times the block is
entered, and ``jax.jit`` traces a function once per policy. Results inside and outside the block
keep their dtypes and bits (NumPy references), eagerly and under ``jax.jit``, with and without x64.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import policy
from heddle.ops import _core, _table
from heddle.policy import _policy

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
I16, I32 = np.dtype(np.int16), np.dtype(np.int32)
NI = np.arange(-20, 21, dtype=np.int32)


def _fresh_multiply(calls: list[int]) -> Callable[..., Any]:
    """``multiply`` built anew (empty call caches), its JAX function counting the traces of its
    kernels (it runs only while a kernel is traced: a compiled kernel does not call it)."""
    op_class, plan, values = _table.OPS["multiply"]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return jnp.multiply(*args, **kwargs)

    return _core.make_op("multiply", _core.OpSpec(counted, op_class, plan, values))


def _same(out: Any, ref: np.ndarray) -> None:
    """``out`` has ``ref``'s dtype and bits."""
    got = np.asarray(out)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.shape == ref.shape and got.tobytes() == ref.tobytes(), (got, ref)


# ---- reuse ----------------------------------------------------------------------------------------


def test_entering_a_block_again_reuses_the_ops_compiled_kernel(monkeypatch):
    traces: list[int] = []
    kernels: list[Any] = []
    make = _core._kernel

    def recording(*args: Any) -> Any:
        kernels.append(make(*args))
        return kernels[-1]

    monkeypatch.setattr(_core, "_kernel", recording)
    multiply = _fresh_multiply(traces)
    i = jnp.asarray(NI)
    for _ in range(6):  # in and out of the block in turn: one kernel and one trace per policy
        with policy.default_dtypes(float="bfloat16"):
            assert multiply(i, 0.5).dtype == BF16
        assert multiply(i, 0.5).dtype == F32
    assert len(traces) == 2
    assert len(kernels) == 2
    assert [k._cache_size() for k in kernels] == [1, 1]  # one compiled executable each


def test_entering_a_block_again_does_not_retrace_a_jitted_function():
    traces: list[np.dtype] = []

    @jax.jit
    def f(i: jax.Array) -> jax.Array:
        traces.append(policy.current().default_float)
        return hnp.divide(i, 4) + hnp.asarray(0.5)

    i = jnp.asarray(NI)
    for _ in range(5):
        with policy.default_dtypes(float="bfloat16"):
            assert f(i).dtype == BF16
            with policy.default_dtypes(float="float16"):  # nested: a third policy
                assert f(i).dtype == F16
        assert f(i).dtype == F32
    assert traces == [BF16, F16, F32]
    assert f._cache_size() == 3


def test_a_block_resolves_its_arguments_once(monkeypatch):
    resolved: list[tuple] = []
    changes = _policy._changes

    def counting(*args: Any) -> Any:
        resolved.append(args)
        return changes(*args)

    monkeypatch.setattr(_policy, "_BLOCKS", {})
    monkeypatch.setattr(_policy, "_changes", counting)
    blocks = []
    for _ in range(10):
        with policy.default_dtypes(float="bfloat16", int="int16") as p:
            blocks.append(p)
            assert policy.current() is p and _policy.active() is p
    assert len(resolved) == 1 and len(_policy._BLOCKS) == 1
    assert all(p is blocks[0] for p in blocks)
    assert (blocks[0].default_float, blocks[0].default_int) == (BF16, I16)


def test_spellings_of_one_dtype_give_one_policy_and_the_active_policy_is_part_of_the_key():
    spellings = ["float16", "f16", "half", np.float16, np.dtype("float16"), jnp.float16]
    seen = set()
    for s in spellings * 2:
        with policy.default_dtypes(float=s) as p:
            seen.add(id(p))
            assert p.default_float == F16 and p.name == "heddle"
    assert len(seen) == 1
    with policy.use(policy.JAX), policy.default_dtypes(float="float16") as q:
        assert q.name == "jax" and q.default_float == F16  # not the heddle block's policy
        assert policy.result_type(np.int8(1), np.uint8(1)) == np.dtype("int16")  # JAX's table
    with policy.default_dtypes(float="float16") as r:
        assert r.name == "heddle" and id(r) in seen


def test_an_unhashable_argument_is_resolved_every_time():
    like = np.zeros(2, np.float16)  # an array, for its dtype
    for _ in range(3):
        with policy.default_dtypes(float=like) as p:
            assert p.default_float == F16
            assert hnp.asarray(1.5).dtype == F16
    assert policy.current() is policy.HEDDLE


def test_wrong_arguments_raise_on_every_entry():
    for _ in range(3):
        with pytest.raises(policy.UnknownDTypeError, match="not a float dtype"):
            with policy.default_dtypes(float="int8"):
                pass
        with pytest.raises(policy.UnknownDTypeError, match="float33"):
            with policy.default_dtypes(float="float33"):
                pass
        assert policy.current() is policy.HEDDLE


def test_a_block_object_reenters_once_closed_and_decorates():
    cm = policy.default_dtypes(float="bfloat16")
    for _ in range(2):
        with cm as p:
            assert policy.current() is p and p.default_float == BF16
        assert policy.current() is policy.HEDDLE
    with cm, pytest.raises(RuntimeError, match="already open"):
        with cm:
            pass
    assert policy.current() is policy.HEDDLE

    @policy.default_dtypes(float="float16")
    def depth(n: int) -> list[np.dtype]:
        inner = depth(n - 1) if n else []
        return [policy.result_type(0.5), *inner]

    assert depth(3) == [F16] * 4  # each call its own block, nested
    assert policy.current() is policy.HEDDLE


def test_an_exception_inside_the_block_closes_it():
    with pytest.raises(ZeroDivisionError):
        with policy.default_dtypes(float="bfloat16"):
            _ = 1 / 0
    assert policy.current() is policy.HEDDLE
    assert _policy._JIT_KEY.value is None
    assert hnp.asarray(1.5).dtype == F32


# ---- results --------------------------------------------------------------------------------------


def _cases() -> dict[str, tuple[Callable[[jax.Array], Any], np.ndarray, np.ndarray]]:
    """name -> (fn of the int32 array NI, result outside the block, result inside a
    ``default_dtypes(float="bfloat16", int="int16")`` block), the references from NumPy."""
    f = NI.astype(np.float32)
    tenth_bf16 = np.float32(np.asarray(0.1).astype(BF16))  # the scalar, rounded once to bfloat16
    return {
        "divide(i, 4)": (
            lambda i: hnp.divide(i, 4),
            f / np.float32(4),
            (f / np.float32(4)).astype(BF16),
        ),
        "multiply(i, 0.1)": (
            lambda i: hnp.multiply(i, 0.1),
            f * np.float32(0.1),
            (f * tenth_bf16).astype(BF16),
        ),
        "add(i, 0.5)": (lambda i: hnp.add(i, 0.5), f + np.float32(0.5), (f + 0.5).astype(BF16)),
        "add(f32, 0.1)": (
            lambda i: hnp.add(i.astype(jnp.float32), 0.1),  # typed: the defaults do not apply
            f + np.float32(0.1),
            f + np.float32(0.1),
        ),
        "mean(i)": (lambda i: hnp.mean(i), np.asarray(0.0, F32), np.asarray(0.0, BF16)),
        "ones(3)": (lambda i: hnp.ones(3), np.ones(3, F32), np.ones(3, BF16)),
        "asarray(1.5)": (lambda i: hnp.asarray(1.5), np.asarray(1.5, F32), np.asarray(1.5, BF16)),
        "add(1, 2)": (lambda i: hnp.add(1, 2), np.asarray(3, I32), np.asarray(3, I16)),
        "sum(i)": (lambda i: hnp.sum(i), np.asarray(0, I32), np.asarray(0, I32)),
    }


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(_cases()))
def test_results_inside_and_outside_a_block_entered_repeatedly(name, jit):
    fn, outside, inside = _cases()[name]
    run = jax.jit(fn) if jit else fn
    i = jnp.asarray(NI)
    for _ in range(3):
        with policy.default_dtypes(float="bfloat16", int="int16"):
            _same(run(i), inside)
        _same(run(i), outside)


def test_results_and_reuse_with_x64_in_a_subprocess():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        assert jax.config.jax_enable_x64
        import heddle.numpy as hnp
        from heddle import policy

        ni = np.arange(-20, 21, dtype=np.int32)
        i = jnp.asarray(ni)
        f = ni.astype(np.float32)
        traces = []

        @jax.jit
        def g(i):
            traces.append(1)
            return hnp.divide(i, 4)

        def same(out, ref):
            got = np.asarray(out)
            assert got.dtype == ref.dtype and got.tobytes() == ref.tobytes(), (got, ref)

        for _ in range(3):
            with policy.default_dtypes(float="float64", int="int64"):
                for run in (lambda i: hnp.divide(i, 4), g):
                    same(run(i), ni / 4)
                same(hnp.multiply(i, 0.1), ni * 0.1)
                same(hnp.add(1, 2), np.asarray(3, np.int64))
                same(hnp.asarray(1.5), np.asarray(1.5))
                same(hnp.ones(2), np.ones(2))
            for run in (lambda i: hnp.divide(i, 4), g):
                same(run(i), f / np.float32(4))  # heddle's defaults stay 32-bit under x64
            same(hnp.add(1, 2), np.asarray(3, np.int32))
            same(hnp.multiply(i, 0.1), f * np.float32(0.1))
        assert len(traces) == 2, traces
        print("ok")
        """
    )
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_a_block_around_a_traced_call_uses_the_blocks_policy_inside_the_trace():
    @jax.jit
    def f(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        with policy.default_dtypes(float="float16"):  # opened while jax.jit traces
            inner = hnp.divide(i, 4)
        return inner, hnp.divide(i, 4)

    i = jnp.asarray(NI)
    f32 = NI.astype(np.float32) / np.float32(4)
    for outer in (F32, BF16) * 2:
        with contextlib.nullcontext() if outer == F32 else policy.default_dtypes(float="bfloat16"):
            a, b = f(i)
            _same(a, f32.astype(F16))
            _same(b, f32.astype(outer))
    assert f._cache_size() == 2
