"""heddle.autodiff against jax.grad on the same heddle.numpy forward pass (issue 5's target).

For the MLP and transformer block of ``heddle.examples`` in bfloat16 and float16, written with
heddle.numpy and with jax.numpy, the compiled gradient step ``jax.jit(heddle.autodiff.grad(loss))``
against ``jax.jit(jax.grad(loss))``: the forward pass is the same code; heddle's backward pass keeps
every cotangent of a narrow value in float32 and returns float32 gradients, JAX's keeps cotangents at
the narrow dtype and returns narrow gradients. Target: time ratio <= 1.05. Beside it, the peak memory
of each compiled program (XLA's memory analysis) and the ratio of the two. The two run alternately,
one call each per round (100 rounds), and the ratio is the median of the per-round ratios.

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


def models(dtype):
    rng = np.random.default_rng(0)
    mlp_p = examples.cast_tree(examples.init_mlp(rng, (256, 1024, 1024, 10)), "float32")
    blk_p = examples.cast_tree(examples.init_block(rng, 128, 512), "float32")
    return {
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


def paired(a, b, rounds: int) -> tuple[float, float, float]:
    """Median times of a and b and the median of per-round ratios a/b; one call of each per round,
    alternating which goes first, so a noisy shared machine slows both alike."""
    ta, tb, ratios = [], [], []
    for r in range(rounds):
        first, second = (a, b) if r % 2 == 0 else (b, a)
        t0 = time.perf_counter()
        jax.block_until_ready(first())
        t1 = time.perf_counter()
        jax.block_until_ready(second())
        t2 = time.perf_counter()
        x, y = (t1 - t0, t2 - t1) if r % 2 == 0 else (t2 - t1, t1 - t0)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


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

        ours = jax.jit(autodiff.grad(loss)).lower(params, x).compile()
        theirs = jax.jit(jax.grad(loss)).lower(params, x).compile()
        g_ours, g_theirs = ours(params, x), theirs(params, x)
        assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(g_ours))
        assert all(g.dtype == dtype for g in jax.tree.leaves(g_theirs))
        for _ in range(3):
            jax.block_until_ready((ours(params, x), theirs(params, x)))
        t_ours, t_theirs, ratio = paired(lambda: ours(params, x), lambda: theirs(params, x), 100)
        (p_ours, tmp_ours, out_ours), (p_theirs, tmp_theirs, out_theirs) = (
            memory(ours),
            memory(theirs),
        )
        mib = 2.0**20
        rows.append(
            [
                f"{name}, {jnp.dtype(dtype).name}, {xp.__name__}",
                t_theirs * 1e3,
                t_ours * 1e3,
                f"**{ratio:.3f}**",
                f"{p_theirs / mib:.2f} / {p_ours / mib:.2f} ({p_ours / p_theirs:.2f})",
                f"{tmp_theirs / mib:.2f} / {tmp_ours / mib:.2f}",
                f"{out_theirs / mib:.2f} / {out_ours / mib:.2f}",
            ]
        )
    print(machine())
    print()
    print(
        table(
            [
                "model, dtype, namespace",
                "jax.grad (ms)",
                "heddle grad (ms)",
                "time ratio",
                "peak MiB: jax / heddle (ratio)",
                "temporaries MiB: jax / heddle",
                "gradients MiB: jax / heddle",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
