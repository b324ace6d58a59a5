"""heddle.autocast: a jitted train step of ``autocast(model)`` against the same model written by
hand with explicit ``preferred_element_type`` and upcasts, and against the plain model; tracing and
compilation of ``autocast(f)`` against ``jax.jit(f)``.

Usage: ``python benchmarks/bench_autocast.py``. Ratios are medians of per-round ratios of
interleaved rounds in one process (the machine is shared and noisy; absolute times are not results).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _harness import block, interleaved_ratio, machine, table

import heddle

BF16, F32 = jnp.bfloat16, jnp.float32
LR = 1e-3


def _w(rng, *shape):
    return jnp.asarray(rng.normal(0, 1 / np.sqrt(shape[0]), shape), BF16)


# -- models: plain (what users write), hand (explicit float32 accumulation) ------------------------


def mlp_plain(p, x):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    return h @ p["w3"]


def _dot(a, b):
    return jnp.matmul(a, b, preferred_element_type=F32).astype(a.dtype)


def mlp_hand(p, x):
    h = jax.nn.relu(_dot(x, p["w1"]) + p["b1"])
    h = jax.nn.relu(_dot(h, p["w2"]) + p["b2"])
    return _dot(h, p["w3"])


def _ln_plain(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(jnp.var(x, -1, keepdims=True) + 2.0**-10)


def _ln_hand(x):
    y = x.astype(F32)
    m = y.mean(-1, keepdims=True)
    return ((y - m) / jnp.sqrt(jnp.var(y, -1, keepdims=True) + 2.0**-10)).astype(x.dtype)


def block_plain(p, x):
    h = _ln_plain(x)
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
    a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) * 0.125, axis=-1)
    x = x + jnp.einsum("bts,bsd->btd", a, v) @ p["wo"]
    return x + jax.nn.relu(_ln_plain(x) @ p["w1"]) @ p["w2"]


def block_hand(p, x):
    h = _ln_hand(x)
    q, k, v = _dot(h, p["wq"]), _dot(h, p["wk"]), _dot(h, p["wv"])
    logits = jnp.einsum("btd,bsd->bts", q, k, preferred_element_type=F32) * 0.125
    a = jax.nn.softmax(logits, axis=-1).astype(x.dtype)
    o = jnp.einsum("bts,bsd->btd", a, v, preferred_element_type=F32).astype(x.dtype)
    x = x + _dot(o, p["wo"])
    return x + _dot(jax.nn.relu(_dot(_ln_hand(x), p["w1"])), p["w2"])


_DN = ("NHWC", "HWIO", "NHWC")


def cnn_plain(p, x):
    y = jax.nn.relu(jax.lax.conv_general_dilated(x, p["k1"], (1, 1), "SAME", dimension_numbers=_DN))
    y = jax.nn.relu(jax.lax.conv_general_dilated(y, p["k2"], (2, 2), "SAME", dimension_numbers=_DN))
    return y.mean((1, 2)) @ p["wc"]


def cnn_hand(p, x):
    def conv(a, k, s):
        return jax.lax.conv_general_dilated(
            a, k, s, "SAME", dimension_numbers=_DN, preferred_element_type=F32
        ).astype(a.dtype)

    y = jax.nn.relu(conv(x, p["k1"], (1, 1)))
    y = jax.nn.relu(conv(y, p["k2"], (2, 2)))
    return _dot(y.astype(F32).mean((1, 2)).astype(y.dtype), p["wc"])


def _setup(name):
    rng = np.random.default_rng(0)
    if name == "MLP 784-1024-1024-10, batch 256":
        p = {"w1": _w(rng, 784, 1024), "b1": _w(rng, 1024), "w2": _w(rng, 1024, 1024),
             "b2": _w(rng, 1024), "w3": _w(rng, 1024, 10)}  # fmt: skip
        return mlp_plain, mlp_hand, p, jnp.asarray(rng.normal(size=(256, 784)), BF16)
    if name == "transformer block d=128, batch 8 x 128":
        d = 128
        p = {k: _w(rng, d, d) for k in ("wq", "wk", "wv", "wo")}
        p.update(w1=_w(rng, d, 4 * d), w2=_w(rng, 4 * d, d))
        return block_plain, block_hand, p, jnp.asarray(rng.normal(size=(8, 128, d)), BF16)
    p = {"k1": _w(rng, 3, 3, 3, 32), "k2": _w(rng, 3, 3, 32, 64), "wc": _w(rng, 64, 10)}
    return cnn_plain, cnn_hand, p, jnp.asarray(rng.normal(size=(64, 32, 32, 3)), BF16)


def _step(model):
    def loss(p, x):
        return model(p, x).astype(F32).mean()

    @jax.jit
    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda w, gw: (w - LR * gw).astype(w.dtype), p, g)

    return step


def train_steps() -> list[list]:
    rows = []
    for name in (
        "MLP 784-1024-1024-10, batch 256",
        "transformer block d=128, batch 8 x 128",
        "CNN 3-32-64 on 64 x 32x32",
    ):
        plain, hand, p, x = _setup(name)
        s_auto, s_hand, s_plain = _step(heddle.autocast(plain)), _step(hand), _step(plain)
        for s in (s_auto, s_hand, s_plain):
            block(s(p, x))
        ta, th, r_hand = interleaved_ratio(lambda: s_auto(p, x), lambda: s_hand(p, x), runs=9)
        _, tp, r_plain = interleaved_ratio(lambda: s_auto(p, x), lambda: s_plain(p, x), runs=9)
        ok = "ok" if r_hand <= 1.02 else "over"
        rows.append(
            [name, ta * 1e3, th * 1e3, tp * 1e3, f"**{r_hand:.3f}** ({ok})", f"{r_plain:.3f}"]
        )
    return rows


def _stack(p, x):
    for _ in range(4):
        x = block_plain(p, x)
    return x.astype(F32).mean()


def trace_compile(rounds: int = 7) -> list:
    plain, _, p, x = _setup("transformer block d=128, batch 8 x 128")
    del plain

    def compile_plain():
        f = lambda p, x: _stack(p, x)
        return jax.jit(jax.grad(f)).lower(p, x).compile()

    def compile_auto():
        f = lambda p, x: _stack(p, x)
        return jax.jit(jax.grad(heddle.autocast(f))).lower(p, x).compile()

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    compile_plain(), compile_auto()
    ta, tp, ratios = [], [], []
    for _ in range(rounds):
        a, b = timed(compile_auto), timed(compile_plain)
        ta.append(a)
        tp.append(b)
        ratios.append(a / b)
    r = statistics.median(ratios)
    ok = "ok" if r <= 1.3 else "over"
    return [
        "4-block transformer, grad",
        statistics.median(ta) * 1e3,
        statistics.median(tp) * 1e3,
        f"**{r:.3f}** ({ok})",
    ]


def main() -> None:
    print(machine())
    print(
        "bfloat16 parameters; jitted SGD train step (loss, jax.grad, update); ratios: medians of "
        "per-round ratios of 7 interleaved rounds (9 runs each, after warm-up), one process; the "
        "machine is shared with other jobs and noisy, so ratios within a few percent of 1 are ties"
    )
    print()
    print(
        table(
            [
                "model",
                "autocast (ms)",
                "hand-written (ms)",
                "plain (ms)",
                "autocast / hand (target <= 1.02)",
                "autocast / plain",
            ],
            train_steps(),
        )
    )
    print()
    print("Trace + lower + compile of jax.jit(jax.grad(f)), medians of 7 interleaved rounds:")
    print()
    print(
        table(
            ["function", "autocast (ms)", "jax.jit (ms)", "ratio (target <= 1.3)"],
            [trace_compile()],
        )
    )


if __name__ == "__main__":
    main()
