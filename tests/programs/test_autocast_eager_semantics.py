"""Eager ``heddle.autocast`` behaves as eager JAX: values are concrete inside the call, and every value
that leaves it (returned or not) is a concrete array; ``with heddle.autocast():`` runs a block so.

References are independent of autocast: NumPy on the same values, float64 sums, and plain eager JAX
for the control flow each program takes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import heddle
from heddle import policy

BF16 = jnp.bfloat16
N = 10_000
X = jnp.full(N, 0.1, BF16)
TENTH = float(np.float64(np.asarray(X[0], np.float32)))  # bfloat16's 0.1, as float64
EXACT_SUM = float(np.asarray(np.float64(TENTH) * N, BF16))  # the sum of N of them, rounded once


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x


# ---- values inside the call ------------------------------------------------------------------


def test_python_control_flow_on_values_takes_the_branch_eager_jax_takes():
    def f(x):
        s = x.cumsum()[-1]  # 1000 under the policy (1008 in bfloat16's own sum)
        if s > 1004:
            return s * 0
        return s

    assert float(heddle.autocast(f)(X)) == EXACT_SUM == 1000.0
    assert float(f(X)) == 0.0  # plain JAX's narrow cumsum takes the other branch


def test_float_int_item_tolist_asarray_and_printing_work_inside_the_call():
    seen = {}

    def f(x):
        s = jnp.sum(x.astype(jnp.float32))
        seen["float"] = float(s)
        seen["int"] = int(s)
        seen["item"] = x[:2].sum().item()
        seen["tolist"] = x[:3].tolist()
        seen["asarray"] = np.asarray(x[:4])
        seen["str"] = f"{float(s):.1f} {x[0]}"
        seen["len"] = len(x)
        seen["iter"] = [float(v) for v in x[:2]]
        return s

    out = heddle.autocast(f)(X)
    want = np.sum(np.asarray(X, np.float64))
    assert abs(seen["float"] - want) <= want * 2.0**-20 and float(out) == seen["float"]
    assert seen["int"] == int(seen["float"])
    assert seen["item"] == float(np.asarray(np.float64(TENTH) * 2, BF16))
    assert seen["tolist"] == [TENTH] * 3
    assert (
        seen["asarray"].dtype == BF16 and _bits(seen["asarray"]).tolist() == [int(_bits(X[0]))] * 4
    )
    assert seen["str"] == f"{seen['float']:.1f} {X[0]}"  # as eager JAX formats it
    assert seen["len"] == N and seen["iter"] == [TENTH, TENTH]


def test_boolean_masks_and_data_dependent_shapes_work_as_in_eager_jax():
    x = jnp.linspace(-1, 1, 21, dtype=BF16)
    ref = np.asarray(x)

    def f(x):
        kept = x[x > 0.25]
        (idx,) = jnp.nonzero(x < -0.5)
        uniq = jnp.unique(jnp.round(x))
        return kept, idx, uniq, jnp.zeros(int((x > 0).sum()))

    kept, idx, uniq, zeros = heddle.autocast(f)(x)
    assert _bits(kept).tolist() == _bits(ref[ref > 0.25]).tolist()
    assert np.asarray(idx).tolist() == np.nonzero(ref < -0.5)[0].tolist()
    assert np.asarray(uniq).tolist() == np.unique(np.round(ref.astype(np.float32))).tolist()
    assert zeros.shape == (int((ref > 0).sum()),)


def test_a_concrete_value_asked_for_midway_keeps_float32_accumulation():
    def f(x):
        c = x.cumsum()
        if c[0] > 0:  # asks for a value: what is recorded so far is evaluated
            c = c + 0
        return jnp.cumsum(x)[-1], c[-1]

    a, b = heddle.autocast(f)(X)
    assert float(a) == float(b) == EXACT_SUM


# ---- values that leave the call --------------------------------------------------------------


class _Holder:
    pass


def test_values_leaving_by_yield_attribute_or_list_are_concrete_arrays():
    holder, seen = _Holder(), []

    def gen(x):
        for k in range(3):
            yield x[:4] * (k + 1)

    def f(x):
        holder.value = x.cumsum()
        seen.extend(gen(x))
        return x[:4]

    out = heddle.autocast(f)(X)
    leaked = holder.value
    assert isinstance(leaked, jax.Array)
    assert float(leaked[-1]) == EXACT_SUM
    assert float(np.asarray(leaked)[-1]) == EXACT_SUM
    for k, v in enumerate(seen):  # usable as arrays after the call, eagerly and under jit
        want = np.asarray(np.asarray(out, np.float64) * (k + 1), BF16)
        assert _bits(v).tolist() == _bits(want).tolist()
        assert _bits(v + 0).tolist() == _bits(want).tolist()
        assert _bits(jax.jit(lambda a: a * 1)(v)).tolist() == _bits(want).tolist()
    assert "Array(" in repr(seen[0]) and "Tracer" not in repr(seen[0])


def test_eager_and_jitted_give_the_same_bits_on_a_program_without_concrete_values():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 32)), BF16)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(32, 16)), BF16)

    def f(x, w):
        h = jax.nn.gelu(x @ w, approximate=False)
        return jax.nn.logsumexp(h, axis=-1), jnp.var(h), h.cumsum(axis=0)

    eager = heddle.autocast(f)(x, w)
    jitted = jax.jit(heddle.autocast(f))(x, w)
    for a, b in zip(eager, jitted, strict=True):
        assert _bits(a).tolist() == _bits(b).tolist()


def test_eager_statements_make_no_float32_copy_that_plain_eager_jax_does_not(monkeypatch):
    # each statement is computed in float32 and rounded once, as jitted; eagerly, that float32
    # value need not exist: the eager operations make no more float32 arrays of the input's shape
    # than JAX's own operations make run one by one (jax.disable_jit: jnp.sum's upcast is one),
    # and the bits are the jitted call's
    from jax._src import core

    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 48)), BF16)
    bind = core.EvalTrace.process_primitive

    def f(x):
        for i in range(8):
            x = x * 0.999 + jnp.sin(x) * (1.0 / (i + 2))
        return x, jnp.sum(x, axis=0), jnp.max(x), jnp.argmax(x)

    def float32_copies(fn):
        made = []

        def spy(self, primitive, args, params):
            out = bind(self, primitive, args, params)
            for o in out if primitive.multiple_results else [out]:
                if getattr(o, "shape", None) == x.shape and o.dtype == np.float32:
                    made.append(primitive.name)
            return out

        with monkeypatch.context() as m:
            m.setattr(core.EvalTrace, "process_primitive", spy)
            out = fn(x)
        return made, out

    jitted = jax.jit(heddle.autocast(f))(x)
    with jax.disable_jit():
        plain, _ = float32_copies(f)
    made, eager = float32_copies(heddle.autocast(f))
    assert len(made) <= len(plain) == 1, (made, plain)
    for a, b in zip(eager, jitted, strict=True):
        assert _bits(a).tolist() == _bits(b).tolist()
    # one statement on every bfloat16 pattern against float64: each operation of the rounded
    # operands rounded once (POLICY.md 3: a Python float is first rounded to bfloat16), away from
    # the subnormals XLA:CPU flushes to zero
    b = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    with np.errstate(all="ignore"):
        b64 = b.astype(np.float64)
        rnd = lambda v: v.astype(BF16).astype(np.float64)
        ref = rnd(rnd(b64 * rnd(np.float64(0.999))) + rnd(rnd(np.sin(b64)) * rnd(np.float64(0.3))))
    normal = np.isfinite(ref) & ((np.abs(b64) >= 2.0**-100) | (b64 == 0))
    assert normal.sum() > 58_000
    g = heddle.autocast(lambda x: x * 0.999 + jnp.sin(x) * 0.3)
    for run in (g, jax.jit(g)):
        got = np.asarray(run(b)).astype(np.float64)
        assert np.array_equal(got[normal], ref[normal])


def test_an_exception_in_the_function_leaves_jax_as_it_was():
    def f(x):
        _ = x * 2
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        heddle.autocast(f)(X)
    assert float(X.cumsum()[-1]) == 1008.0  # plain JAX again, not under the policy
    assert isinstance(X * 2, jax.Array) and not isinstance(X * 2, jax.core.Tracer)


# ---- the block form ------------------------------------------------------------------------------


def test_a_block_runs_its_statements_under_the_policy():
    with heddle.autocast():
        c = X.cumsum()
        j = jax.jit(jnp.cumsum)(X)  # a jitted call inside the block too
        branch = "big" if c[-1] > 1004 else "exact"
    assert float(c[-1]) == float(j[-1]) == EXACT_SUM
    assert branch == "exact"
    assert float(X.cumsum()[-1]) == 1008.0  # after the block: plain JAX
    assert float((c * 2)[-1]) == 2 * EXACT_SUM and np.asarray(c).dtype == BF16


def test_blocks_nest_and_follow_their_policy():
    block = heddle.autocast()
    with block:
        with block:
            inner = X.cumsum()
        outer = inner[-1] + X.cumsum()[-1]
    assert float(inner[-1]) == EXACT_SUM and float(outer) == 2 * EXACT_SUM
    with policy.use(policy.HEDDLE):
        with heddle.autocast(policy=policy.JAX):
            active = policy.current()
        assert policy.current() is policy.HEDDLE
    assert active is policy.JAX


def test_an_error_in_a_block_leaves_jax_as_it_was():
    with pytest.raises(ZeroDivisionError):
        with heddle.autocast():
            _ = X.cumsum()
            _ = 1 / 0
    assert float(X.cumsum()[-1]) == 1008.0


def test_a_block_refuses_precision_with_the_wrapping_form():
    entered = False
    with pytest.raises(TypeError) as e:
        with heddle.autocast(precision="mixed_bfloat16"):
            entered = True
    assert not entered
    msg = str(e.value)
    assert msg.startswith("with heddle.autocast(precision='mixed_bfloat16'):")
    assert "a block has neither" in msg
    assert "heddle.autocast(fn, precision='mixed_bfloat16')(*args)" in msg


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap"])
def test_a_block_inside_a_transformation_is_refused_with_the_wrapping_form(transform):
    def f(x):
        with heddle.autocast():
            return jnp.sum(x.astype(jnp.float32))

    wrap = {"jit": jax.jit, "grad": jax.grad, "vmap": jax.vmap}[transform]
    arg = X[:4].astype(jnp.float32) if transform != "vmap" else X[:4].reshape(2, 2)
    with pytest.raises(TypeError) as e:
        wrap(f)(arg)
    msg = str(e.value)
    assert "inside a JAX transformation" in msg and "heddle.autocast(fn)" in msg


def test_a_leaked_value_is_a_jax_array_to_jax_numpy_pickle_and_device_put():
    import pickle

    kept = []

    def f(x):
        kept.append(x[:3] * 2)
        return x

    heddle.autocast(f)(X)
    (v,) = kept
    want = _bits(np.asarray(np.float64(TENTH) * 2, BF16).repeat(3))
    for got in (
        jax.device_put(v),
        jax.device_put(v, jax.devices()[0]),
        jnp.asarray(v),
        pickle.loads(pickle.dumps(v)),
        jax.device_get(v),
        jax.jit(lambda: v * 1)(),  # a closure constant of a later jit
        v.addressable_data(0),
    ):
        assert _bits(got).tolist() == want.tolist()
    assert not isinstance(jnp.asarray(v), jax.core.Tracer)
    assert v.sharding == X.sharding and v.devices() == X.devices()
    assert v.on_device_size_in_bytes() == 6 and not v.is_deleted()


def test_callbacks_and_debug_prints_happen_where_eager_jax_runs_them(capsys):
    def f(x):
        print("before")
        jax.debug.print("sum={s}", s=jnp.sum(x.astype(jnp.float32)))
        print("after")
        return x

    heddle.autocast(f)(X[:4])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "before" and lines[1].startswith("sum=0.4") and lines[2] == "after"


# ---- what a review found --------------------------------------------------------------------


def test_a_constant_made_in_the_call_is_its_own_value():
    ones = jnp.ones(4)
    assert heddle.autocast(lambda x: jnp.array([1, 2, 3]))(ones).tolist() == [1, 2, 3]
    got = heddle.autocast(lambda x: jnp.repeat(x, jnp.array([1, 2, 0, 1])))(ones)
    assert got.tolist() == [1.0, 1.0, 1.0, 1.0]
    with heddle.autocast():
        made = jnp.array([True, False])
        shown = str(jnp.array([1, 2, 3]))
    assert made.tolist() == [True, False] and shown == "[1 2 3]"


def test_nested_calls_blocks_and_values_from_a_block_keep_eager_semantics():
    @heddle.autocast
    def f(x):
        s = x.cumsum()[-1]
        return s if s > 0 else -s

    with heddle.autocast():
        in_block = f(X)
        y = X + 0
    nested = heddle.autocast(lambda x: f(x) * 2)(X)
    assert float(in_block) == float(f(y)) == EXACT_SUM and float(nested) == 2 * EXACT_SUM
    assert heddle.autocast(lambda v: v[v > 0].shape)(y) == (N,)
    assert heddle.autocast(lambda v: float(v.sum()), precision="mixed_bfloat16")(y) == EXACT_SUM


def test_a_loop_that_never_asks_for_a_value_does_not_hold_every_step():
    import weakref

    step = jax.jit(lambda w, b: w - 0.01 * b.mean(0))
    w, alive = jnp.zeros(1024), []
    with heddle.autocast():
        for _ in range(40):
            b = np.ones((1024, 1024), np.float32)  # 4 MiB a step, never read back
            alive.append(weakref.ref(b))
            w = step(w, jnp.asarray(b))
            del b
        held = sum(r() is not None for r in alive)
    assert held <= 20, held  # 64 MiB of constants at most, then evaluated (40 would be all)
    assert np.allclose(np.asarray(w), -0.4, rtol=1e-5)


def test_values_an_error_left_uncomputed_say_so():
    def boom(a):
        raise ValueError("boom")

    with pytest.raises(Exception, match="boom"):
        with heddle.autocast():
            _ = jax.pure_callback(boom, jax.ShapeDtypeStruct((4,), jnp.float32), jnp.ones(4))
            z = jnp.ones(4) * 2
    with pytest.raises(RuntimeError, match="computed by operations that raised") as e:
        np.asarray(z)
    assert "boom" in repr(e.value.__cause__)


def test_blocks_interleaved_by_await_raise_and_leave_jax_as_it_was():
    import asyncio

    async def block(i):
        with heddle.autocast():
            v = X.cumsum()[-1]
            await asyncio.sleep(0.01)
        return float(v)

    async def both():
        return await asyncio.gather(block(0), block(1), return_exceptions=True)

    outcomes = asyncio.run(both())
    assert any(isinstance(o, RuntimeError) and "await or a yield" in str(o) for o in outcomes)
    assert float(X.cumsum()[-1]) == 1008.0  # plain JAX again
    assert type(jax._src.core.trace_ctx.trace).__name__ == "EvalTrace"
