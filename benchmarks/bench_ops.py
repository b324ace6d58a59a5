"""heddle.numpy against what a user would otherwise run (issue 4's performance targets).

1. Compiled forward+backward of the examples' MLP and transformer block in bfloat16: heddle against
   hand-written jax.numpy doing the same explicit dtype handling (float32 compute, one rounding per
   op); time ratio and the number of non-convert ops in the optimised HLO.
2. The cost of correct accumulation per op class: heddle against plain jax.numpy defaults.
3. Eager dispatch of one small op: heddle / jax.numpy.
4. Trace + compile time of the transformer step: heddle / jax.numpy.
5. logsumexp, bfloat16 1024x4096, jitted: heddle.nn.logsumexp and heddle.autocast(jax.nn.logsumexp)
   against jax.nn.logsumexp (target <= 1.1x).

Run: python benchmarks/bench_ops.py (only section 5: python benchmarks/bench_ops.py logsumexp)
"""

from __future__ import annotations

import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from _harness import interleaved_ratio, machine, table

import heddle.numpy as hnp
from heddle import examples

BF16, F32 = jnp.bfloat16, jnp.float32


class Explicit:
    """What a careful user writes by hand with jax.numpy: float32 compute, one rounding per op."""

    @staticmethod
    def _in(*xs):
        return [
            jnp.asarray(x, BF16).astype(F32) if isinstance(x, float) else jnp.asarray(x).astype(F32)
            for x in xs
        ]

    @classmethod
    def _ew(cls, f):
        return lambda *xs: f(*cls._in(*xs)).astype(BF16)

    @classmethod
    def setup(cls):
        for name in (
            "add",
            "subtract",
            "multiply",
            "divide",
            "maximum",
            "exp",
            "tanh",
            "sqrt",
            "square",
        ):
            setattr(cls, name, staticmethod(cls._ew(getattr(jnp, name))))

    @staticmethod
    def matmul(a, b):
        return jnp.matmul(a, b, preferred_element_type=F32).astype(BF16)

    @staticmethod
    def einsum(s, a, b):
        return jnp.einsum(s, a, b, preferred_element_type=F32).astype(BF16)

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return jnp.max(x, axis=axis, keepdims=keepdims)

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return jnp.sum(x.astype(F32), axis=axis, keepdims=keepdims).astype(BF16)

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return jnp.mean(x.astype(F32), axis=axis, keepdims=keepdims).astype(BF16)

    @staticmethod
    def var(x, axis=None, keepdims=False):
        return jnp.var(x.astype(F32), axis=axis, keepdims=keepdims).astype(BF16)


Explicit.setup()


def _loss(xp, model, params, x):
    out = model(xp, params, x)
    return jnp.mean(jnp.square(out.astype(F32)))


def _hlo_ops(compiled) -> int:
    text = compiled.as_text()
    ops = re.findall(r"=\s*\S+\s+([a-z][a-z0-9-]*)\(", text)
    return sum(
        1
        for o in ops
        if o not in ("convert", "parameter", "constant", "tuple", "get-tuple-element")
    )


def models_section() -> list[list]:
    rng = np.random.default_rng(0)
    rows = []
    cases = {
        "MLP 256x(64-128-10)": (
            examples.mlp,
            examples.init_mlp(rng),
            rng.standard_normal((256, 64)),
        ),
        "transformer block 8x64x32": (
            examples.block,
            examples.init_block(rng),
            rng.standard_normal((8, 64, 32)),
        ),
    }
    for name, (model, params, x) in cases.items():
        p, xb = (
            examples.cast_tree(params, ml_dtypes.bfloat16),
            np.asarray(x).astype(ml_dtypes.bfloat16),
        )
        fns = {}
        for label, xp in (("heddle", hnp), ("explicit jnp", Explicit)):
            step = jax.jit(jax.value_and_grad(lambda p, x, xp=xp: _loss(xp, model, p, x)))
            fns[label] = (step, step.lower(p, xb).compile())
        th, te, ratio = interleaved_ratio(
            lambda: fns["heddle"][0](p, xb),
            lambda: fns["explicit jnp"][0](p, xb),
            rounds=5,
            runs=10,
        )
        rows.append(
            [
                f"{name} fwd+bwd",
                f"{th * 1e6:.0f}",
                f"{te * 1e6:.0f}",
                ratio,
                _hlo_ops(fns["heddle"][1]),
                _hlo_ops(fns["explicit jnp"][1]),
            ]
        )
    return rows


def accumulation_section() -> list[list]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1024, 1024)), BF16)
    y = jnp.asarray(rng.standard_normal((1024, 1024)), BF16)
    cases = {
        "sum (1024x1024, axis=-1)": (lambda a: hnp.sum(a, axis=-1), lambda a: jnp.sum(a, axis=-1)),
        "cumsum (1024x1024, axis=-1)": (
            lambda a: hnp.cumsum(a, axis=-1),
            lambda a: jnp.cumsum(a, axis=-1),
        ),
        "matmul (1024^3)": (lambda a: hnp.matmul(a, y), lambda a: jnp.matmul(a, y)),
        # the hand-written float32 accumulation: bfloat16 operands into a float32 dot, one
        # rounding (the dot heddle's matmul feeds, on every backend; bench_contractions.py has the
        # matrix of shapes)
        "matmul (1024^3), explicit: bfloat16 operands into a float32 dot": (
            lambda a: jax.lax.dot(a, y, preferred_element_type=F32).astype(BF16),
            lambda a: jnp.matmul(a, y),
        ),
        "softmax (1024x1024)": (
            lambda a: examples.softmax(hnp, a),
            lambda a: examples.softmax(jnp, a),
        ),
    }
    rows = []
    for name, (h, j) in cases.items():
        hj, jj = jax.jit(h), jax.jit(j)
        th, tj, ratio = interleaved_ratio(lambda: hj(x), lambda: jj(x), rounds=5, runs=10)
        rows.append([name, f"{th * 1e6:.0f}", f"{tj * 1e6:.0f}", ratio])
    return rows


def dispatch_section() -> list[list]:
    rows = []
    for dt in ("float32", "bfloat16"):
        a, b = jnp.ones(8, dt), jnp.ones(8, dt)
        cases = {
            "add(x, y)": (lambda: hnp.add(a, b), lambda: jnp.add(a, b)),
            "multiply(x, 2.0)": (lambda: hnp.multiply(a, 2.0), lambda: jnp.multiply(a, 2.0)),
            "sum(x)": (lambda: hnp.sum(a), lambda: jnp.sum(a)),
        }
        for name, (h, j) in cases.items():
            th, tj, ratio = interleaved_ratio(h, j, rounds=7, runs=20, inner=200, warmup=50)
            rows.append([f"{name} {dt}", f"{th * 1e6:.1f}", f"{tj * 1e6:.1f}", ratio])
    return rows


def compile_section() -> list[list]:
    rng = np.random.default_rng(0)
    p = examples.cast_tree(examples.init_block(rng), ml_dtypes.bfloat16)
    x = np.asarray(rng.standard_normal((8, 64, 32))).astype(ml_dtypes.bfloat16)

    def once(xp):
        f = jax.jit(jax.value_and_grad(lambda p, x: _loss(xp, examples.block, p, x)))
        t0 = time.perf_counter()
        f.lower(p, x).compile()
        return time.perf_counter() - t0

    once(hnp), once(jnp)  # warm imports and caches of the lowering machinery
    ratios, th, tj = [], [], []
    for _ in range(7):
        a, b = once(hnp), once(jnp)
        th.append(a)
        tj.append(b)
        ratios.append(a / b)
    return [
        [
            "transformer block step",
            f"{statistics.median(th) * 1e3:.0f}",
            f"{statistics.median(tj) * 1e3:.0f}",
            statistics.median(ratios),
        ]
    ]


def logsumexp_section(rounds: int = 9) -> list[list]:
    """heddle.nn.logsumexp / jax.nn.logsumexp, bfloat16 1024x4096 over the last axis, jitted.

    Also the float32-widen-everything formulation (JAX's logsumexp on the input converted to
    float32, heddle's implementation before the max moved to the narrow input) and
    heddle.autocast(jax.nn.logsumexp), each against jax.nn.logsumexp, interleaved.
    """
    import heddle
    import heddle.nn as hnn

    x = jnp.asarray(np.random.default_rng(0).standard_normal((1024, 4096)), BF16)
    base = jax.jit(lambda a: jax.nn.logsumexp(a, axis=-1))
    cases = {
        "heddle.nn.logsumexp": jax.jit(lambda a: hnn.logsumexp(a, axis=-1)),
        "widen all to float32 (heddle before)": jax.jit(
            lambda a: jax.nn.logsumexp(a.astype(F32), axis=-1).astype(BF16)
        ),
        "heddle.autocast(jax.nn.logsumexp)": jax.jit(
            heddle.autocast(lambda a: jax.nn.logsumexp(a, axis=-1))
        ),
    }
    rows = []
    for name, f in cases.items():
        th, tj, ratio = interleaved_ratio(
            lambda f=f: f(x), lambda: base(x), rounds=rounds, runs=15, warmup=5
        )
        rows.append(
            [f"{name} (bf16 1024x4096, axis=-1)", f"{th * 1e6:.0f}", f"{tj * 1e6:.0f}", ratio]
        )
    return rows


def main() -> None:
    if sys.argv[1:] == ["logsumexp"]:
        print(f"Machine: {machine()}\n")
        print(table(["op", "heddle us", "jax.nn us", "ratio"], logsumexp_section()))
        return
    print(f"# heddle.numpy benchmarks\n\nMachine: {machine()}\n")
    print("## Compiled forward+backward, bfloat16: heddle vs hand-written explicit jax.numpy\n")
    print(
        table(
            [
                "model",
                "heddle us",
                "explicit us",
                "ratio (median of rounds)",
                "HLO ops heddle",
                "HLO ops explicit",
            ],
            models_section(),
        )
    )
    print(
        "\n## Cost of correct accumulation (compiled, bfloat16): heddle vs plain jax.numpy defaults\n"
    )
    print(table(["op", "heddle us", "jax.numpy us", "ratio"], accumulation_section()))
    print("\n## Eager dispatch of one small op\n")
    print(table(["op", "heddle us", "jax.numpy us", "ratio"], dispatch_section()))
    print("\n## Trace + compile\n")
    print(table(["function", "heddle ms", "jax.numpy ms", "ratio"], compile_section()))
    print("\n## logsumexp (compiled, bfloat16): heddle vs jax.nn.logsumexp\n")
    print(table(["op", "heddle us", "jax.nn us", "ratio"], logsumexp_section()))
    print(
        "\nRatios are medians of per-round ratios, heddle and the baseline alternating in one process."
    )


if __name__ == "__main__":
    main()
