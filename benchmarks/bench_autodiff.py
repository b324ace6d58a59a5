"""heddle.autodiff against jax.grad on the same heddle.numpy forward pass (issue 5's target).

For the MLP and transformer block of ``heddle.examples`` and a scan over stacked layers with a
float32 residual stream (``scanned_layers``), in bfloat16 and float16, written with
heddle.numpy and with jax.numpy, the compiled gradient step ``jax.jit(heddle.autodiff.grad(loss))``
(its default ``contractions="float32"``, and ``contractions="scaled"``) against
``jax.jit(jax.grad(loss))``: the forward pass is the same code; heddle's backward pass keeps every
cotangent of a narrow value in float32 and returns float32 gradients, JAX's keeps cotangents at the
narrow dtype and returns narrow gradients. Target: time ratio <= 1.05. Beside it, the peak memory of
each compiled program (XLA's memory analysis). The three run in rotating order, one call each per
round (100 rounds), and each ratio is the median of the per-round ratios to jax.grad.

Then the train step users run: float32 master parameters cast to the narrow dtype inside the loss,
the gradient with respect to the masters (float32 either way) and an SGD update, in one
``jax.jit``; the same three ways. Here the update consumes the gradient, so XLA fuses elementwise
work on it (float16's ``"scaled"`` undoing its scale) into the update.

Run: python benchmarks/bench_autodiff.py
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _harness import machine, table

import heddle.numpy as hnp
from heddle import autodiff, examples

BF16 = jnp.bfloat16


def scanned_layers(xp, p, x):
    """A scan over stacked layers with a float32 residual stream, each layer in the weights' dtype
    (the layout of a scanned deep model): ``h + tanh(h @ w)``."""

    def layer(h, w):
        z = xp.tanh(xp.matmul(h.astype(w.dtype), w))
        return h + z.astype(jnp.float32), None

    return jax.lax.scan(layer, x.astype(jnp.float32), p["w"])[0]


def models(dtype):
    rng = np.random.default_rng(0)
    mlp_p = examples.cast_tree(examples.init_mlp(rng, (256, 1024, 1024, 10)), "float32")
    blk_p = examples.cast_tree(examples.init_block(rng, 128, 512), "float32")
    scan_w = rng.standard_normal((6, 256, 256)) / 16
    return {
        "scan over 6 layers d=256, batch 256": (
            scanned_layers,
            {"w": jnp.asarray(scan_w, jnp.float32).astype(dtype)},
            jnp.asarray(rng.standard_normal((256, 256)), jnp.float32).astype(dtype),
        ),
        "MLP 256-1024-1024-10, batch 512": (
            examples.mlp,
            {k: jnp.asarray(v).astype(dtype) for k, v in mlp_p.items()},
            jnp.asarray(rng.standard_normal((512, 256)), jnp.float32).astype(dtype),
        ),
        "transformer block d=128, batch 8 x 128": (
            examples.block,
            {k: jnp.asarray(v).astype(dtype) for k, v in blk_p.items()},
            jnp.asarray(rng.standard_normal((8, 128, 128)), jnp.float32).astype(dtype),
        ),
    }


def rotated(fns, rounds: int) -> tuple[list[float], list[float]]:
    """Median times of each of ``fns`` and the medians of the per-round ratios of each to the first;
    one call of each per round, the order rotating, so a noisy shared machine slows all alike."""
    n = len(fns)
    times: list[list[float]] = [[] for _ in fns]
    ratios: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        took = [0.0] * n
        for j in range(n):
            i = (r + j) % n
            t0 = time.perf_counter()
            jax.block_until_ready(fns[i]())
            took[i] = time.perf_counter() - t0
        for i in range(n):
            times[i].append(took[i])
            ratios[i].append(took[i] / took[0])
    return [statistics.median(t) for t in times], [statistics.median(q) for q in ratios]


def memory(compiled) -> tuple[int, int, int]:
    """(peak, temporaries, outputs) in bytes, from XLA's memory analysis of the compiled program."""
    m = compiled.memory_analysis()
    peak = getattr(m, "peak_memory_in_bytes", 0)
    peak = peak or m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
    return peak, m.temp_size_in_bytes, m.output_size_in_bytes


def main() -> None:
    rows = []
    cases = [
        (dtype, xp, name, case)
        for dtype in (BF16, jnp.float16)
        for xp in (hnp, jnp)
        for name, case in models(dtype).items()
    ]
    for dtype, xp, name, (model, params, x) in cases:

        def loss(p, x, model=model, xp=xp):
            y = model(xp, p, x)
            return xp.mean(xp.multiply(y, y))

        theirs = jax.jit(jax.grad(loss)).lower(params, x).compile()
        ours = jax.jit(autodiff.grad(loss)).lower(params, x).compile()
        scaled = jax.jit(autodiff.grad(loss, contractions="scaled")).lower(params, x).compile()
        assert all(g.dtype == dtype for g in jax.tree.leaves(theirs(params, x)))
        for fn in (ours, scaled):
            assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(fn(params, x)))
        label = f"{name}, {jnp.dtype(dtype).name}, {xp.__name__}"
        timed = timed_row(label, [lambda f=f: f(params, x) for f in (theirs, ours, scaled)])
        mib = 2.0**20
        (p_t, tmp_t, out_t), (p_o, tmp_o, out_o), (p_s, tmp_s, out_s) = (
            memory(c) for c in (theirs, ours, scaled)
        )
        rows.append(
            [
                *timed,
                f"{p_t / mib:.2f} / {p_o / mib:.2f} / {p_s / mib:.2f}",
                f"{tmp_t / mib:.2f} / {tmp_o / mib:.2f} / {tmp_s / mib:.2f}",
                f"{out_t / mib:.2f} / {out_o / mib:.2f} / {out_s / mib:.2f}",
            ]
        )
    steps = train_steps(cases)
    times = [
        "model, dtype, namespace",
        "jax.grad (ms)",
        "heddle float32 (ms)",
        "heddle scaled (ms)",
        "float32 / jax",
        "scaled / jax",
    ]
    memory_cols = ["peak MiB: jax / float32 / scaled", "temporaries MiB", "gradients MiB"]
    print(machine())
    print()
    print(table(times + memory_cols, rows))
    print()
    print("Train step: float32 masters cast in the loss, gradient and SGD update in one jax.jit")
    print()
    print(table(times, steps))


def train_steps(cases) -> list[list]:
    """The train-step rows: ``p - 1e-3 * grad(loss)(p, x)`` for float32 masters ``p``."""
    rows = []
    for dtype, xp, name, (model, params, x) in cases:

        def loss(p, x, model=model, xp=xp, dtype=dtype):
            y = model(xp, {k: v.astype(dtype) for k, v in p.items()}, x)
            return xp.mean(xp.multiply(y, y))

        masters = {k: v.astype(jnp.float32) for k, v in params.items()}

        def step(grad):
            def f(p, x):
                return jax.tree.map(lambda w, g: w - 1e-3 * g, p, grad(loss)(p, x))

            return jax.jit(f).lower(masters, x).compile()

        compiled = [
            step(jax.grad),
            step(autodiff.grad),
            step(lambda f: autodiff.grad(f, contractions="scaled")),
        ]
        label = f"{name}, {jnp.dtype(dtype).name}, {xp.__name__}"
        rows.append(timed_row(label, [lambda c=c: c(masters, x) for c in compiled]))
    return rows


def timed_row(label: str, fns) -> list:
    """``label``, the median times (ms) of jax.grad's, heddle's and heddle scaled's programs
    ``fns`` after warm-up, and the two ratios to jax.grad's (100 rotating rounds)."""
    for _ in range(3):
        jax.block_until_ready([f() for f in fns])
    (t_theirs, t_ours, t_scaled), (_, r_ours, r_scaled) = rotated(fns, 100)
    ms = [t * 1e3 for t in (t_theirs, t_ours, t_scaled)]
    return [label, *ms, f"**{r_ours:.3f}**", f"**{r_scaled:.3f}**"]


if __name__ == "__main__":
    main()
