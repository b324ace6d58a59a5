"""dynamic_loss_scale: the scale rule, skip semantics, diagnostics, state handling, errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle import scaling
from heddle.scaling import _transform

F32 = np.float32


@pytest.fixture(params=["branch", "select"])
def skip_path(request, monkeypatch):
    """Runs a test with each way of skipping a step: the CPU path (a conditional) and the path
    used on accelerators (compute, then select), which CPU would otherwise never run."""
    monkeypatch.setitem(_transform._PATHS, "cpu", getattr(_transform, f"_{request.param}"))
    return request.param


def reference_rule(flags, *, init, interval, growth, backoff, lo, hi, hysteresis):
    """The rule of POLICY.md 8 written out in float32 host arithmetic, one step at a time."""
    scale, good, bad, skipped, since = F32(init), 0, 0, 0, 0
    out = []
    for finite in flags:
        if finite:
            good, bad, since = good + 1, 0, since + 1
            if good >= interval:
                scale, good = min(F32(scale * F32(growth)), F32(hi)), 0
        else:
            good, bad, skipped, since = 0, bad + 1, skipped + 1, 0
            if bad >= hysteresis:
                scale, bad = max(F32(scale * F32(backoff)), F32(lo)), 0
        out.append((float(scale), good, bad, skipped, since))
    return out


CONFIGS = {
    "defaults-small": dict(init=2.0**15, interval=3, growth=2.0, backoff=0.5, lo=1.0, hi=2.0**24, hysteresis=1),
    "tight-bounds": dict(init=8.0, interval=2, growth=2.0, backoff=0.5, lo=4.0, hi=16.0, hysteresis=1),
    "hysteresis": dict(init=2.0**10, interval=4, growth=2.0, backoff=0.5, lo=1.0, hi=2.0**12, hysteresis=3),
    "odd-factors": dict(init=100.0, interval=2, growth=3.0, backoff=0.3, lo=7.0, hi=1000.0, hysteresis=2),
}  # fmt: skip


@functools.cache
def _stepper(name, jit):
    c = CONFIGS[name]
    opt = scaling.dynamic_loss_scale(
        optax.sgd(0.1),
        init_scale=c["init"],
        growth_interval=c["interval"],
        growth_factor=c["growth"],
        backoff_factor=c["backoff"],
        min_scale=c["lo"],
        max_scale=c["hi"],
        hysteresis=c["hysteresis"],
    )
    return opt, (jax.jit(opt.update) if jit else opt.update)


def _run(name, flags, jit):
    opt, update = _stepper(name, jit)
    params = {"w": jnp.ones(2, jnp.float32)}
    state = opt.init(params)
    seen = []
    for finite in flags:
        g = {"w": jnp.array([1.0, 1.0 if finite else np.inf], jnp.float32)}
        _, state = update(g, state, params)
        s = state.loss_scale
        seen.append(
            (float(s.scale), int(s.good_steps), int(s.bad_steps), int(s.skipped), int(s.since_skip))
        )
    return seen


SCRIPT = [1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1]


@pytest.mark.parametrize(
    ("name", "jit"),
    [(name, True) for name in sorted(CONFIGS)] + [("hysteresis", False)],
    ids=[f"jit-{name}" for name in sorted(CONFIGS)] + ["eager-hysteresis"],
)
def test_scripted_scale_sequence_matches_the_rule(name, jit):
    got = _run(name, SCRIPT, jit)
    assert got == reference_rule(SCRIPT, **CONFIGS[name])


def test_scripted_run_reaches_both_bounds():
    """The script drives 'tight-bounds' into max_scale and min_scale and holds it there."""
    scales = [s[0] for s in _run("tight-bounds", SCRIPT, True)]
    assert 16.0 in scales and 4.0 in scales
    assert min(scales) == 4.0 and max(scales) == 16.0


@settings(max_examples=15, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.sampled_from(sorted(CONFIGS)))
def test_random_sequences_match_the_rule(flags, name):
    assert _run(name, flags, True) == reference_rule(flags, **CONFIGS[name])


def _adam_setup(schedule=False):
    lr = optax.linear_schedule(1e-2, 0.0, 10) if schedule else 1e-2
    opt = scaling.dynamic_loss_scale(optax.adam(lr), growth_interval=5)
    params = {"w": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32), "b": jnp.ones((), jnp.float32)}
    return opt, params


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_skip_leaves_params_and_adam_state_bit_identical(bad, transform, skip_path):
    with jax.numpy_dtype_promotion("standard"):  # optax's adam mixes int and float internally
        opt, params = _adam_setup(schedule=True)
        state = opt.init(params)
        update = transform(opt.update)
        good = {"w": jnp.full(6, 0.5, jnp.float32), "b": jnp.float32(-1.0)}
        updates, state = update(good, state, params)
        params = optax.apply_updates(params, updates)
        before_params, before_state = params, state
        g = {"w": good["w"].at[3].set(bad), "b": good["b"]}
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    for u in jax.tree.leaves(updates):
        assert np.array_equal(np.asarray(u), np.zeros_like(u))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before_params), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for a, b in zip(
        jax.tree.leaves(state.inner_state), jax.tree.leaves(before_state.inner_state), strict=True
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    has_count = lambda x: isinstance(getattr(x, "count", None), jax.Array)
    counts = [int(x.count) for x in jax.tree.leaves(state, is_leaf=has_count) if has_count(x)]
    assert counts and set(counts) == {1}  # adam's count and the schedule's count did not advance
    assert float(state.loss_scale.scale) == 2.0**14


@pytest.mark.parametrize("exact", [True, False], ids=["sgd", "adam"])
def test_finite_step_equals_the_inner_optimiser(transform, exact):
    """Bit for bit with a power-of-two SGD step; with Adam to rounding (the wrapped update may be
    compiled as one unit, so XLA may fuse its arithmetic differently from the plain call)."""
    with jax.numpy_dtype_promotion("standard"):
        plain = optax.sgd(0.125) if exact else optax.adam(1e-2)
        opt = scaling.dynamic_loss_scale(plain, growth_interval=5)
        params = {
            "w": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32),
            "b": jnp.ones((), jnp.float32),
        }
        s1, s2 = opt.init(params), plain.init(params)
        for k in range(3):
            g = {"w": jnp.full(6, 0.1 * (k + 1), jnp.float32), "b": jnp.float32(k)}
            u1, s1 = transform(opt.update)(g, s1, params)
            u2, s2 = transform(plain.update)(g, s2, params)
            for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2), strict=True):
                if exact:
                    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
                else:
                    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)


def test_diagnostics_count_skips_and_nonfinite_losses(transform):
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), growth_interval=100, min_scale=2.0**14)
    params = {"w": jnp.ones(3, jnp.float32)}
    state = opt.init(params)
    update = transform(opt.update)
    steps = [  # (gradient finite, value)
        (True, 1.0), (False, 1.0), (True, 2.0), (True, 1.0), (False, np.nan), (False, np.inf),
        (True, 1.0),
    ]  # fmt: skip
    for finite, value in steps:
        g = {"w": jnp.array([1.0, 2.0, 3.0 if finite else np.inf], jnp.float32)}
        _, state = update(g, state, params, value=jnp.float32(value))
    s = state.loss_scale
    assert int(s.skipped) == 3
    assert int(s.since_skip) == 1
    assert int(s.nonfinite_losses) == 2
    assert float(s.scale) == 2.0**14  # held at min_scale: visible through the counters above
    assert all(x.dtype == jnp.int32 for x in s[1:]) and s.scale.dtype == jnp.float32


def test_value_is_optional_and_forwarded_to_the_inner_transformation():
    seen = {}

    def update(updates, state, params=None, *, value=None):
        seen["value"] = value
        return updates, state

    inner = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), update)
    opt = scaling.dynamic_loss_scale(inner)
    state = opt.init({"w": jnp.ones(1)})
    _, state = opt.update({"w": jnp.ones(1)}, state)
    assert seen["value"] is None and int(state.loss_scale.nonfinite_losses) == 0
    _, state = opt.update({"w": jnp.ones(1)}, state, value=jnp.float32(np.nan))
    assert np.isnan(float(seen["value"])) and int(state.loss_scale.nonfinite_losses) == 1


def test_apply_if_finite_trap_never_applies_a_nonfinite_update(skip_path):
    """optax.apply_if_finite gives up after max_consecutive_errors and applies NaN; heddle never does."""
    params = {"w": jnp.ones(4, jnp.float32)}
    nan = {"w": jnp.full(4, np.nan, jnp.float32)}
    theirs = optax.apply_if_finite(optax.sgd(0.1), max_consecutive_errors=2)
    ours = scaling.dynamic_loss_scale(optax.sgd(0.1))
    p1, s1 = params, theirs.init(params)
    p2, s2 = params, ours.init(params)
    up1, up2 = jax.jit(theirs.update), jax.jit(ours.update)
    for _ in range(10):
        u, s1 = up1(nan, s1, p1)
        p1 = optax.apply_updates(p1, u)
        u, s2 = up2(nan, s2, p2)
        p2 = optax.apply_updates(p2, u)
    assert np.isnan(np.asarray(p1["w"])).all()  # the trap
    assert np.array_equal(np.asarray(p2["w"]), np.ones(4, np.float32))
    assert int(s2.loss_scale.skipped) == 10 and int(s2.loss_scale.since_skip) == 0


def test_jit_round_trip_keeps_every_field():
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), init_scale=2.0**9, min_scale=128.0)
    params = {"w": jnp.ones(2, jnp.float32)}
    state = opt.init(params)
    for g in ([1.0, np.inf], [1.0, 1.0], [np.inf, 1.0]):
        _, state = opt.update({"w": jnp.array(g, jnp.float32)}, state, params, value=jnp.float32(1))
    back = jax.jit(lambda s: s)(state)
    for name in scaling.DynamicLossScale._fields:
        a, b = getattr(state.loss_scale, name), getattr(back.loss_scale, name)
        assert a.dtype == b.dtype and a.shape == b.shape == () and a.item() == b.item(), name
    assert len(jax.tree.leaves(state.loss_scale)) == len(scaling.DynamicLossScale._fields)
    # ... and the floor survives the round trip: backing off from 128 stays at 128.
    s = back
    for _ in range(3):
        _, s = opt.update({"w": jnp.array([np.inf, 1.0], jnp.float32)}, s, params)
    assert float(s.loss_scale.scale) == 128.0


def test_jmp_round_trip_trap():
    """jmp's DynamicLossScale keeps min_loss_scale outside its leaves: a jit round trip resets it."""
    jmp = pytest.importorskip("jmp")
    s = jmp.DynamicLossScale(jnp.float32(2.0**15), min_loss_scale=jnp.float32(128.0))
    assert float(jax.jit(lambda s: s)(s).min_loss_scale) == 1.0


def _train_step(opt):
    def step(params, state, x):
        loss = lambda p: jnp.mean((p["w"] * x - 1.0) ** 2)
        value, grads, _ = scaling.backward_scaled(loss, scaling.loss_scale(state))(params)
        updates, state = opt.update(grads, state, params, value=value)
        return optax.apply_updates(params, updates), state

    return step


def test_first_jitted_step_has_no_host_transfer(skip_path):
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1))
    params = {"w": jnp.ones(8, jnp.float32)}
    state = opt.init(params)
    x = jnp.linspace(0.0, 1.0, 8, dtype=jnp.float32)
    step = jax.jit(_train_step(opt))
    with jax.transfer_guard("disallow"):
        params, state = step(params, state, x)
        params, state = step(params, state, x)
    assert int(state.loss_scale.good_steps) == 2


def test_jmp_transfer_trap():
    """jmp's counter is a NumPy array: the first jitted step transfers it from the host."""
    jmp = pytest.importorskip("jmp")
    s = jmp.DynamicLossScale(jnp.float32(2.0**15))
    with (
        jax.numpy_dtype_promotion("standard"),
        jax.transfer_guard("disallow"),
        pytest.raises(Exception, match="host-to-device"),
    ):
        jax.jit(lambda s: s.adjust(jnp.bool_(True)))(s)


def _script_grads(n):
    rng = np.random.default_rng(1)
    gs = []
    for k in range(n):
        g = rng.standard_normal(5).astype(np.float32)
        if k in (3, 4, 9):
            g[k % 5] = np.inf if k != 4 else np.nan
        gs.append({"w": jnp.asarray(g), "b": jnp.asarray(g[:2])})
    return gs


def _opt():
    return scaling.dynamic_loss_scale(
        optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)), growth_interval=2
    )


def _run_modes(opt, n):
    params = {"w": jnp.ones(5, jnp.float32), "b": jnp.zeros(2, jnp.float32)}
    runs = []
    for update in (opt.update, jax.jit(opt.update)):
        p, s = params, opt.init(params)
        for g in _script_grads(n):
            u, s = update(g, s, p)
            p = optax.apply_updates(p, u)
        runs.append((p, s))
    return runs


def test_n_jitted_steps_equal_n_eager_steps(skip_path):
    """Bit for bit with an inner update whose arithmetic is exact (a power-of-two SGD step)."""
    (pa, sa), (pb, sb) = _run_modes(
        scaling.dynamic_loss_scale(optax.sgd(0.125), growth_interval=2), 8
    )
    for a, b in zip(jax.tree.leaves((pa, sa)), jax.tree.leaves((pb, sb)), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    flags = [1, 1, 1, 0, 0, 1, 1, 1]
    rule = dict(init=2.0**15, interval=2, growth=2.0, backoff=0.5, lo=1.0, hi=2.0**24, hysteresis=1)
    want = reference_rule(flags, **rule)[-1]
    assert (float(sa.loss_scale.scale), int(sa.loss_scale.skipped)) == (want[0], want[3])


def test_n_jitted_steps_match_n_eager_steps_with_adam():
    """XLA fuses Adam's arithmetic differently under jit (optax alone differs by an ulp too): the
    loss-scale state and every skip decision still agree exactly."""
    with jax.numpy_dtype_promotion("standard"):
        (pa, sa), (pb, sb) = _run_modes(_opt(), 6)
    assert int(sa.loss_scale.skipped) == 2
    for a, b in zip(sa.loss_scale, sb.loss_scale, strict=True):
        assert a.dtype == b.dtype and a.item() == b.item()
    for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_checkpoint_restore_continues_bit_identically():
    with jax.numpy_dtype_promotion("standard"):
        opt = _opt()
        update = jax.jit(opt.update)
        params = {"w": jnp.ones(5, jnp.float32), "b": jnp.zeros(2, jnp.float32)}
        grads = _script_grads(12)

        def run(p, s, gs):
            for g in gs:
                u, s = update(g, s, p)
                p = optax.apply_updates(p, u)
            return p, s

        p_full, s_full = run(params, opt.init(params), grads)
        p_mid, s_mid = run(params, opt.init(params), grads[:6])
        saved = [np.asarray(x) for x in jax.tree.leaves((p_mid, s_mid))]  # plain host arrays
        treedef = jax.tree.structure((p_mid, s_mid))
        p_res, s_res = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in saved])
        p_end, s_end = run(p_res, s_res, grads[6:])
    for a, b in zip(
        jax.tree.leaves((p_full, s_full)), jax.tree.leaves((p_end, s_end)), strict=True
    ):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
