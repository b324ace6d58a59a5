"""The active policy as per-task state: asyncio tasks, generators, threads, and cache reuse.

``policy.use`` / ``default_dtypes`` blocks that interleave in one thread must neither leak a policy
nor hand one task another task's policy, and a block that rebuilds an equal policy must reuse every
cache (jit traces and heddle's kernels) made under it.
"""

from __future__ import annotations

import asyncio
import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import policy
from heddle.ops import _core
from heddle.policy import _policy

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def test_asyncio_tasks_each_see_their_own_defaults_and_nothing_leaks():
    seen: dict[str, list[np.dtype]] = {}

    async def task(name: str) -> None:
        with policy.default_dtypes(float=name):
            seen[name] = [policy.result_type(0.5)]
            await asyncio.sleep(0.01)  # the other task opens its block meanwhile
            seen[name].append(policy.result_type(0.5))
            seen[name].append(hnp.add(1.0, 2.0).dtype)  # an op, eagerly, after the switch

    async def main() -> None:
        await asyncio.gather(task("bfloat16"), task("float16"))

    asyncio.run(main())
    assert seen == {"bfloat16": [BF16] * 3, "float16": [F16] * 3}
    assert policy.current() is policy.HEDDLE
    assert hnp.add(1.0, 2.0).dtype == F32


def test_a_task_inherits_the_policy_in_force_where_it_was_created():
    async def child() -> np.dtype:
        return policy.result_type(0.5)

    async def main() -> tuple[np.dtype, np.dtype]:
        with policy.default_dtypes(float="bfloat16"):
            inner = asyncio.create_task(child())
        outer = asyncio.create_task(child())
        return await inner, await outer

    assert asyncio.run(main()) == (BF16, F32)


def test_jitted_function_in_interleaved_tasks_is_traced_under_each_tasks_policy():
    traces = []

    @jax.jit
    def f(x):
        traces.append(policy.current().default_float)
        return hnp.add(x, 1.0)  # a Python float: takes x's dtype; result dtype fixed by x

    @jax.jit
    def g(x):
        return jnp.zeros((), policy.result_type(0.5)) + x.astype(policy.result_type(0.5))

    results: dict[str, np.dtype] = {}

    async def task(name: str) -> None:
        with policy.default_dtypes(float=name):
            await asyncio.sleep(0.01)
            policy.current()  # any heddle call re-mirrors this task's policy into the jit key
            results[name] = g(jnp.ones(2, jnp.float32)).dtype
            f(jnp.ones(2, jnp.float32))

    async def main() -> None:
        await asyncio.gather(task("bfloat16"), task("float16"), task("bfloat16"))

    asyncio.run(main())
    assert results == {"bfloat16": BF16, "float16": F16}
    assert sorted(map(str, traces)) == ["bfloat16", "float16"]  # one trace per policy value


def test_generators_suspended_inside_blocks_close_in_any_order_without_leaking():
    def gen(name: str):
        with policy.default_dtypes(float=name):
            yield policy.result_type(0.5)
            yield policy.result_type(0.5)

    g1, g2 = gen("bfloat16"), gen("float16")
    assert next(g1) == BF16
    assert next(g2) == F16
    g1.close()  # the first block opened closes first
    assert policy.current().default_float == F16  # g2 is still inside its block
    assert next(g2) == F16
    g2.close()
    assert policy.current() is policy.HEDDLE
    assert policy._policy._JIT_KEY.value is None  # the jit cache key is back to the default too


def test_out_of_order_exit_of_nested_use_blocks():
    a = policy.use(policy.JAX)
    b = policy.default_dtypes(float="float16")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert policy.current().default_float == F16
    assert policy.current().name == "jax"  # b was made from JAX and is still open
    b.__exit__(None, None, None)
    assert policy.current() is policy.HEDDLE


def test_threads_do_not_share_the_active_policy():
    inside, other = threading.Event(), {}

    def worker() -> None:
        inside.wait()
        other["float"] = policy.result_type(0.5)

    t = threading.Thread(target=worker)
    t.start()
    with policy.default_dtypes(float="bfloat16"):
        inside.set()
        t.join()
        assert policy.result_type(0.5) == BF16
    assert other["float"] == F32


def test_equal_policies_are_one_instance_and_reuse_jit_traces():
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return x + 1

    blocks = []
    for _ in range(50):
        with policy.default_dtypes(float="bfloat16") as p:
            blocks.append(p)
            f(jnp.ones(3))
            hnp.add(jnp.ones(3, jnp.bfloat16), 1.0)
    assert all(p is blocks[0] for p in blocks)
    assert len(traces) == 1
    rebuilt = policy.Policy(name="heddle", table=policy.HEDDLE.table)
    with policy.use(rebuilt) as p:
        # the block is the user's object; caches and jit traces are the equal preset's
        assert p is rebuilt and policy.current() is rebuilt
        assert _policy.active() is policy.HEDDLE
        f(jnp.ones(3))
    with policy.use(policy.Policy(name="heddle", table=policy.HEDDLE.table)):
        f(jnp.ones(3))  # another equal instance: the same trace
    assert len(traces) == 2  # the bfloat16 blocks' trace, then the preset's one


def test_policy_hash_is_stable_and_not_pickled():
    p = policy.Policy.from_table({("float16", "bfloat16"): "float16"}, name="f16-wins")
    h = hash(p)
    assert hash(p) == h
    state = p.__getstate__()
    assert "_hash" not in state
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == h


def test_op_call_caches_are_bounded(monkeypatch):
    monkeypatch.setattr(_core, "CACHE_LIMIT", 3)
    cache: dict = {}
    for i in range(10):
        _core.remember(cache, i, i)
        assert len(cache) <= 3
    assert cache[9] == 9


@pytest.mark.parametrize("n", [200])
def test_many_default_dtypes_blocks_do_not_grow_an_ops_caches(n):
    x = jnp.ones(4, jnp.bfloat16)
    add = hnp.add
    with policy.default_dtypes(float="bfloat16"):
        add(x, 1.0)
    cells = {c.cell_contents.__class__.__name__: c.cell_contents for c in add.__closure__ or ()}
    sizes = [len(v) for v in cells.values() if isinstance(v, dict)]
    for _ in range(n):
        with policy.default_dtypes(float="bfloat16"):
            add(x, 1.0)
    after = [len(v) for v in cells.values() if isinstance(v, dict)]
    assert after == sizes


def test_a_trace_is_cached_under_the_policy_it_was_made_with():
    """jax.jit's cache key is per thread; a context switch without a block boundary (a copied
    context, an asyncio task) may leave it on another policy. A trace then follows the key it is
    cached under, so a later call with that key never reuses a trace made under another policy."""
    import contextvars

    @jax.jit
    def h():
        return hnp.asarray(1.5)

    with policy.default_dtypes(float="bfloat16"):
        ctx = contextvars.copy_context()
    ctx.run(h)  # a context whose policy differs from the thread's jit key at the call
    assert [h().dtype for _ in range(3)] == [F32] * 3
    with policy.default_dtypes(float="bfloat16"):
        assert h().dtype == BF16
    assert h().dtype == F32


def test_a_policy_pickled_in_another_process_equals_the_preset_here(tmp_path):
    """String hashes differ between processes: a table that pickled its hash compared unequal."""
    import os
    import subprocess
    import sys

    path = tmp_path / "heddle.pkl"
    code = (
        "import pickle, sys\nfrom heddle import policy\n"
        "open(sys.argv[1], 'wb').write(pickle.dumps((policy.HEDDLE, policy.JAX)))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=True, timeout=120)
    heddle_p, jax_p = pickle.loads(path.read_bytes())
    assert heddle_p == policy.HEDDLE and heddle_p.table == policy.HEDDLE.table
    assert jax_p == policy.JAX and hash(heddle_p) == hash(policy.HEDDLE)
    with policy.use(heddle_p):
        assert _policy.active() is policy.HEDDLE  # shares the preset's caches and traces
