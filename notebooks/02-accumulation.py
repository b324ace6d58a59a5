# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Accumulation
#
# A float16 or bfloat16 number has 11 or 8 significant bits. Adding many of them in that format loses
# the small terms once the running total is large: the total's spacing (ulp) outgrows them. heddle adds
# up every narrow sum in float32 and rounds once, at the end, to the result dtype (POLICY.md 5): sums,
# scans (cumsum), contractions (matmul), softmax. The error of the result is then at most the rounding
# of the final value, whatever the length.
#
# This notebook measures it against exact arithmetic on CPU: first one sum, 100,000 x 0.1, then the
# error against length for `sum`, `cumsum` and the inner dimension of `matmul`.

# %%
from _plotting import show  # Agg backend at 80 dpi; show(fig) displays a figure
from fractions import Fraction

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np

import heddle.lax as hlax
import heddle.numpy as hnp


print("jax", jax.__version__, "on", jax.devices()[0].platform)
DTYPES = {"float16": jnp.float16, "bfloat16": jnp.bfloat16}

# %% [markdown]
# ## 100,000 x 0.1
#
# 0.1 is not representable: float16 stores 0.0999755859375 and bfloat16 0.10009765625. The exact sum of
# 100,000 stored values is computed with `Fraction`; the best any method can return is that sum rounded
# once to the dtype ("exact, rounded once").

# %%
def nearest(value: Fraction, dtype) -> float:
    """The representable value of ``dtype`` nearest ``value`` (ties to even), by exact comparison."""
    guess = np.array(float(value)).astype(dtype)
    finfo = ml_dtypes.finfo(dtype)
    candidates = [guess, np.nextafter(guess.astype(np.float64), np.inf).astype(dtype)]
    step = float(finfo.eps) * max(abs(float(guess)), float(finfo.smallest_normal))
    candidates += [np.array(float(guess) + k * step).astype(dtype) for k in (-1, 1)]
    return float(min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(c.view(np.uint16)) & 1)))


N = 100_000
rows = {}
for name, dt in DTYPES.items():
    x = jnp.full(N, 0.1, dt)
    stored = Fraction(float(x[0]))
    exact = N * stored
    rows.setdefault("exact (Fraction)", {})[name] = float(exact)
    rows.setdefault("exact, rounded once", {})[name] = nearest(exact, dt)
    rows.setdefault("jnp.sum", {})[name] = float(jnp.sum(x))
    rows.setdefault("jnp.cumsum(x)[-1]", {})[name] = float(jnp.cumsum(x)[-1])
    rows.setdefault("jax.lax.reduce_sum", {})[name] = float(jax.lax.reduce_sum(x, (0,)))
    rows.setdefault("NumPy + ml_dtypes, np.cumsum(x)[-1]", {})[name] = float(np.cumsum(np.asarray(x))[-1])
    rows.setdefault("heddle.numpy.sum", {})[name] = float(hnp.sum(x))
    rows.setdefault("heddle.numpy.cumsum(x)[-1]", {})[name] = float(hnp.cumsum(x)[-1])
    rows.setdefault("heddle.lax.reduce_sum", {})[name] = float(hlax.reduce_sum(x, (0,)))

# plain JAX's narrow sums depend on XLA's CPU reduction order, which can vary between machines:
# volatile: ^(jnp\.cumsum|jax\.lax\.reduce_sum)
print(f"{'':38} {'float16':>14} {'bfloat16':>14}")
for label, r in rows.items():
    print(f"{label:38} {r['float16']:14.6f} {r['bfloat16']:14.6f}")

# %% [markdown]
# Every heddle row is the exact sum rounded once. `jnp.sum` is too: JAX upcasts `sum` already. But
# `jnp.cumsum` and the raw `lax.reduce_sum` accumulate in the input dtype, and a sequential loop in the
# input dtype (NumPy with ml_dtypes) stops growing once 0.1 falls below half an ulp of the total: at
# 256 in float16 and 32 in bfloat16.

# %%
for label in ("heddle.numpy.sum", "heddle.numpy.cumsum(x)[-1]", "heddle.lax.reduce_sum"):
    assert rows[label] == rows["exact, rounded once"], label
print("heddle rounds once: checked against the exact sum")

# %% [markdown]
# ## Error against length
#
# Uniform random values in [0, 1), stored in the narrow dtype, so every partial sum is positive and the
# relative error is well defined. The reference is the float64 sum of the stored values, which is exact
# here (at most 2**16 terms of at most 11 significant bits). For `cumsum` the error is the largest
# relative error over all prefixes; for `matmul` it is the largest over the entries of a
# `(4, k) @ (k, 4)` product.
#
# All JAX and heddle calls of this section run inside one `jax.jit` per dtype, as in a training step.
# The dashed line is the unit roundoff of the dtype (2**-11 for float16, 2**-8 for bfloat16): the error of
# rounding the exact result once.
#
# JAX's CPU backend happens to accumulate a bfloat16 or float16 `dot` in float32, so `jnp.matmul` and
# heddle coincide here; on other backends the accumulator is the backend's choice (heddle asks for
# float32 through `preferred_element_type` on every backend). To show what a narrow accumulator does to a
# contraction, the matmul panel adds a simulated one: float32 products summed in blocks of 128, the
# running total rounded to the input dtype after each block.

# %%
LENGTHS = [2**k for k in range(4, 17, 3)]
rng = np.random.default_rng(0)


def rel(approx, exact):
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    return float(np.max(np.abs(approx - exact) / exact))


def narrow_blocked_matmul(a, b):
    """(m, k) @ (k, n) with a narrow accumulator: float32 blocks of 128, the total rounded per block."""
    k = a.shape[1]
    blocks = max(1, k // 128)
    a3 = a.reshape(a.shape[0], blocks, -1).transpose(1, 0, 2)
    b3 = b.reshape(blocks, -1, b.shape[1])

    def step(acc, ab):
        part = jnp.matmul(ab[0].astype(jnp.float32), ab[1].astype(jnp.float32))
        return (acc.astype(jnp.float32) + part).astype(a.dtype), None

    acc0 = jnp.zeros((a.shape[0], b.shape[1]), a.dtype)
    return jax.lax.scan(step, acc0, (a3, b3))[0]


@jax.jit
def every_method(xs, as_, bs):
    """Every method at every length, in one compiled program (one compilation per dtype)."""
    out = []
    for x, a, b in zip(xs, as_, bs):
        out.append({
            ("sum", "jnp.sum"): jnp.sum(x),
            ("sum", "jax.lax.reduce_sum"): jax.lax.reduce_sum(x, (0,)),
            ("sum", "heddle.numpy.sum"): hnp.sum(x),
            ("cumsum", "jnp.cumsum"): jnp.cumsum(x),
            ("cumsum", "heddle.numpy.cumsum"): hnp.cumsum(x),
            ("matmul", "jnp.matmul"): jnp.matmul(a, b),
            ("matmul", "narrow accumulator (simulated)"): narrow_blocked_matmul(a, b),
            ("matmul", "heddle.numpy.matmul"): hnp.matmul(a, b),
        })
    return out


errors = {}
for name, dt in DTYPES.items():
    xs = [rng.random(n).astype(dt) for n in LENGTHS]
    as_ = [rng.random((4, n)).astype(dt) for n in LENGTHS]
    bs = [rng.random((n, 4)).astype(dt) for n in LENGTHS]
    results = every_method(xs, as_, bs)
    for x, a, b, result in zip(xs, as_, bs, results):
        x64 = x.astype(np.float64)
        exact = {"sum": x64.sum(), "cumsum": np.cumsum(x64),
                 "matmul": a.astype(np.float64) @ b.astype(np.float64)}
        result[("sum", "NumPy + ml_dtypes (sequential)")] = np.cumsum(x)[-1]
        for (op, method), value in result.items():
            errors.setdefault((name, op, method), []).append(rel(value, exact[op]))

STYLE = {  # method: (colour, line style, line width); heddle drawn wide and pale, underneath
    "jnp.sum": ("C0", "o-", 1.2), "jax.lax.reduce_sum": ("C1", "s-", 1.2),
    "NumPy + ml_dtypes (sequential)": ("C7", "x:", 1.2), "jnp.cumsum": ("C1", "s-", 1.2),
    "jnp.matmul": ("C0", "o-", 1.2), "narrow accumulator (simulated)": ("C7", "x:", 1.2),
    "heddle.numpy.sum": ("C3", "-", 5), "heddle.numpy.cumsum": ("C3", "-", 5),
    "heddle.numpy.matmul": ("C3", "-", 5),
}
ORDER = list(STYLE)
OPS = ("sum", "cumsum", "matmul")


def order(item):
    (_, op, method), _ = item
    return OPS.index(op), ORDER.index(method)


fig, axes = plt.subplots(2, 3, figsize=(12, 6.6), sharex=True, sharey="row")
for row, (name, dt) in enumerate(DTYPES.items()):
    u = 2.0 ** -(ml_dtypes.finfo(dt).nmant + 1)
    for col, op in enumerate(OPS):
        ax = axes[row, col]
        for (d, o, method), e in sorted(errors.items(), key=order):
            if d == name and o == op:
                colour, style, width = STYLE[method]
                heddle = method.startswith("heddle")
                ax.plot(LENGTHS, e, style, color=colour, label=method, ms=4, lw=width,
                        alpha=0.45 if heddle else 1.0, zorder=1 if heddle else 2)
        ax.axhline(u, color="black", ls="--", lw=0.8, label="unit roundoff")
        ax.set(xscale="log", yscale="log", title=f"{op}, {name}")
        ax.set_xlabel("inner dimension k" if op == "matmul" else "length n")
        if col == 0:
            ax.set_ylabel("largest relative error")
        if row == 0:
            ax.legend(fontsize=7, loc="upper left")
fig.tight_layout()
show(fig)

# %% [markdown]
# What the plot shows, at the longest length (2**16). heddle's lines are the wide pale red ones; where
# JAX already accumulates in float32 (`jnp.sum`, and `jnp.matmul` on CPU) its line lies on top of them.

# %%
# plain JAX's narrow sums depend on XLA's CPU reduction order, which can vary between machines:
# volatile: (jnp\.cumsum|jax\.lax\.reduce_sum)
for name in DTYPES:
    u = 2.0 ** -(ml_dtypes.finfo(DTYPES[name]).nmant + 1)
    print(f"{name} (unit roundoff {u:.2g})")
    for (d, op, method), e in sorted(errors.items(), key=order):
        if d == name:
            print(f"  {op:7} {method:32} {e[-1]:9.2e}  ({e[-1] / u:6.2f} x unit roundoff)")

# %%
for (d, op, method), e in errors.items():
    if method.startswith("heddle"):
        u = 2.0 ** -(ml_dtypes.finfo(DTYPES[d]).nmant + 1)
        assert max(e) <= u * 1.01, (d, op, method, max(e))
print("every heddle result is within one rounding of the exact value, at every length")

# %% [markdown]
# heddle's error stays within one rounding of the result at every length measured (the check above).
# Accumulating in the input dtype costs accuracy: `jnp.cumsum` grows to several units of roundoff;
# `lax.reduce_sum` is past one rounding at some lengths (XLA's CPU reduction order decides which); the
# sequential sum stalls completely (relative error close to 1) once the terms fall below half an ulp of
# the total. `jnp.sum` and, on this CPU backend, `jnp.matmul` already accumulate in float32; the
# simulated narrow accumulator shows what the same contraction costs when the backend does not: roughly
# ten units of roundoff at k = 2**16.
