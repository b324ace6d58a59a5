"""Step time of dynamic loss scaling against the same step without it (issue 6's target).

One float16 MLP training step (float32 master weights, float16 compute in plain jax.numpy, Adam),
jitted, in four versions that share the gradient computation (``heddle.autodiff``) and differ only in
how non-finite steps are handled:

- baseline: value_and_grad + adam, no scaling, no check;
- heddle: ``backward_scaled`` + ``dynamic_loss_scale(adam)`` (on CPU a skipped step is a conditional);
- heddle with the path GPU and TPU take (compute the update, then select), forced on CPU for
  information;
- jmp: ``jmp.DynamicLossScale`` (scale the loss, unscale, ``jmp.all_finite``, ``adjust``) with
  ``jmp.select_tree`` over parameters and optimiser state, as jmp's documentation does;
- optax: ``optax.apply_if_finite(adam, 5)`` (no loss scale, only the skip).

Each ratio is a version's time over the baseline's. Target: heddle <= 1.05, and no more than jmp's or
optax's. The versions run in rotation, one call each per round, so a noisy shared machine slows them
alike; medians of the per-round ratios.

Run: python benchmarks/bench_scaling.py
"""

from __future__ import annotations

import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import jmp
import numpy as np
import optax
from _harness import machine, table

from heddle import autodiff, scaling
from heddle.scaling import _transform

F16, F32 = jnp.float16, jnp.float32
SIZES = (512, 1024, 1024, 10)
BATCH = 256


def init():
    rng = np.random.default_rng(0)
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(SIZES)):
        params[f"w{i}"] = jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(m), F32)
        params[f"b{i}"] = jnp.zeros(n, F32)
    x = jnp.asarray(rng.standard_normal((BATCH, SIZES[0])), F16)
    y = jnp.asarray(rng.integers(0, SIZES[-1], BATCH), jnp.int32)
    return params, x, y


def loss_fn(params, x, y):
    h = x
    n = len(params) // 2
    for i in range(n):
        h = h @ params[f"w{i}"].astype(F16) + params[f"b{i}"].astype(F16)
        if i < n - 1:
            h = jnp.tanh(h)
    logp = jax.nn.log_softmax(h.astype(F32))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def steps():
    adam = optax.adam(1e-3)

    def baseline(params, state, x, y):
        value, grads = autodiff.value_and_grad(loss_fn)(params, x, y)
        updates, state = adam.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    opt = scaling.dynamic_loss_scale(adam)

    def heddle(params, state, x, y):
        value, grads, _ = scaling.backward_scaled(loss_fn, scaling.loss_scale(state))(params, x, y)
        updates, state = opt.update(grads, state, params, value=value)
        return optax.apply_updates(params, updates), state, value

    def jmp_step(params, state, x, y):
        opt_state, ls = state
        value, grads = autodiff.value_and_grad(lambda p: ls.scale(loss_fn(p, x, y)))(params)
        grads = ls.unscale(grads)
        finite = jmp.all_finite(grads)
        new_ls = ls.adjust(finite)
        updates, new_opt_state = adam.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = jmp.select_tree(
            finite, (new_params, new_opt_state), (params, opt_state)
        )
        return params, (opt_state, new_ls), ls.unscale(value)

    aif = optax.apply_if_finite(adam, 5)

    def optax_step(params, state, x, y):
        value, grads = autodiff.value_and_grad(loss_fn)(params, x, y)
        updates, state = aif.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    # The path GPU and TPU take (compute, then select), forced here for comparison.
    forced = scaling.dynamic_loss_scale(adam)

    def heddle_select(params, state, x, y):
        saved = _transform._PATHS["cpu"]
        _transform._PATHS["cpu"] = _transform._select
        try:
            value, grads, _ = scaling.backward_scaled(loss_fn, scaling.loss_scale(state))(
                params, x, y
            )
            updates, state = forced.update(grads, state, params, value=value)
        finally:
            _transform._PATHS["cpu"] = saved
        return optax.apply_updates(params, updates), state, value

    jmp_scale = jmp.DynamicLossScale(jnp.asarray(2.0**15, F32), counter=jnp.zeros((), jnp.int32))
    return {
        "baseline (no scaling)": (baseline, adam.init),
        "heddle dynamic_loss_scale": (heddle, opt.init),
        "heddle, accelerator path (select) forced on CPU": (heddle_select, forced.init),
        "jmp DynamicLossScale + all_finite + select_tree": (
            jmp_step,
            lambda p: (adam.init(p), jmp_scale),
        ),
        "optax.apply_if_finite": (optax_step, aif.init),
    }


def main(rounds: int = 60) -> None:
    params, x, y = init()
    compiled = {}
    with jax.numpy_dtype_promotion("standard"):
        for name, (step, init_state) in steps().items():
            state = init_state(params)
            fn = jax.jit(step)  # (jmp's state cannot go through .lower())
            compiled[name] = (fn, state)
            for _ in range(3):
                jax.block_until_ready(fn(params, state, x, y))
    names = list(compiled)
    times = {n: [] for n in names}
    ratios = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        t = {}
        for n in order:
            fn, state = compiled[n]
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, state, x, y))
            t[n] = time.perf_counter() - t0
        for n in names:
            times[n].append(t[n])
            ratios[n].append(t[n] / t[names[0]])
    rows = [
        [n, statistics.median(times[n]) * 1e3, f"**{statistics.median(ratios[n]):.3f}**"]
        for n in names
    ]
    print(machine())
    print(f"float16 MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, Adam; {rounds} rounds")
    print()
    print(table(["step", "median (ms)", "time / baseline"], rows))


if __name__ == "__main__":
    main()
