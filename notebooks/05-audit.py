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
# # 5. The audit
#
# `heddle.policy.audit(fn, *args)` traces a JAX function (arguments may be `jax.ShapeDtypeStruct`s:
# nothing is allocated or run) and lists every place where it breaks heddle's policy: sums and
# contractions that accumulate in a narrow float, promotions JAX inserted implicitly, lossy
# conversions, float64 requested without x64. With `include_backward=True` it audits the backward pass
# too. See `docs/audit.md` for what counts.
#
# Here: a small bfloat16 MLP written with plain `jax.numpy`, audited; the same model written with
# heddle's namespaces, audited clean; and the one trap that remains (Python operators).

# %%
from _plotting import show  # Agg backend at 80 dpi; show(fig) displays a figure

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

import heddle.nn as hnn
import heddle.numpy as hnp
from heddle import autodiff, policy


def findings(report):
    """The report's summary line, then one line per finding: pass, primitive, dtypes, shapes, code."""
    print(str(report).splitlines()[0])
    for f in report:
        shapes = " ".join("[" + ",".join(map(str, s)) + "]" for s in f.shapes)
        dtypes = f"{','.join(f.dtypes)} -> {f.out_dtype}"
        print(f"  {f.phase:8} {f.kind:20} {f.primitive:14} {dtypes:18} {shapes:20} {f.code.strip()}")


# %% [markdown]
# ## A plain JAX model
#
# A two-layer MLP with bfloat16 weights, and a float32 temperature on the logits, written the way most
# JAX code is:

# %%
def mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss(params, temperature, x, labels):
    logp = jax.nn.log_softmax(mlp(params, x) / temperature)
    return -jnp.mean(jnp.sum(logp * labels, axis=-1))


bf16, f32 = jnp.bfloat16, jnp.float32
S = jax.ShapeDtypeStruct
params = [(S((784, 256), bf16), S((256,), bf16)), (S((256, 10), bf16), S((10,), bf16))]
args = (params, S((), f32), S((128, 784), bf16), S((128, 10), bf16))

plain = policy.audit(loss, *args, include_backward=True)
findings(plain)

# %% [markdown]
# Reading it: both matmuls accumulate in bfloat16 (`x @ w` leaves the accumulator to the backend). In
# the backward pass, the bias gradients (a `reduce_sum` over the batch) and all four gradient matmuls add
# up in bfloat16 too. `mlp(...) / temperature` mixes bfloat16 logits with a float32 temperature, and
# `logp * labels` float32 log-probabilities with bfloat16 labels: JAX converts one operand implicitly
# each time. (The float32 temperature also moves the softmax to float32, so it is not listed; without
# it the audit reports an `exp+reduce_sum` in bfloat16.) `jnp.mean` and `jnp.sum` are not listed: JAX
# already accumulates those in float32.

# %% [markdown]
# ## The same model with heddle
#
# Every call goes through `heddle.numpy` and `heddle.nn`: contractions ask for a float32 accumulator,
# the softmax runs in float32 and rounds once, and the promotion bfloat16/float32 is heddle's explicit
# one.

# %%
def mlp_heddle(params, x):
    for w, b in params[:-1]:
        x = hnn.relu(hnp.add(hnp.matmul(x, w), b))
    w, b = params[-1]
    return hnp.add(hnp.matmul(x, w), b)


def loss_heddle(params, temperature, x, labels):
    logp = hnn.log_softmax(hnp.divide(mlp_heddle(params, x), temperature))
    return -hnp.mean(hnp.sum(hnp.multiply(logp, labels), axis=-1))


clean = policy.audit(loss_heddle, *args, include_backward=True)
findings(clean)

# %% [markdown]
# No narrow accumulation is left, forward or backward. What remains is `narrow_cotangent`: the backward
# pass the audit traces is plain `jax.vjp`'s, and JAX stores the cotangent of every bfloat16 value in
# bfloat16 (8 bits; in float16 a cotangent below 6e-8 would be 0). `heddle.autodiff` keeps them in
# float32 (POLICY.md 7), so its gradient function audits clean. The audit is usable as a test:
# `raise_if_any()` raises a `PolicyError` with the table when there is a finding.

# %%
trained = policy.audit(autodiff.grad(loss_heddle), *args)  # the gradient a training step computes
findings(trained)
trained.raise_if_any()  # what a test of the model would assert
print("raise_if_any(): nothing raised")

# %% [markdown]
# With `heddle.autodiff`, the gradients of the bfloat16 parameters are float32 as well:

# %%
zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), args)
grads = jax.jit(autodiff.grad(loss_heddle))(*zeros)
print("heddle.autodiff:", sorted({g.dtype.name for g in jax.tree.leaves(grads)}))
grads = jax.jit(jax.grad(loss))(*zeros)
print("jax.grad:       ", sorted({g.dtype.name for g in jax.tree.leaves(grads)}))

# %% [markdown]
# ## The trap: Python operators
#
# `a @ b` and `a + b` on JAX arrays call JAX's own operators, not heddle's. Written with
# `hnp.matmul(x, w) + b`, the forward pass is fine, but the `+` is `jax.numpy.add` and its backward sums
# the bias gradient over the batch in bfloat16. The audit finds it:

# %%
def mlp_operators(params, x):
    for w, b in params[:-1]:
        x = hnn.relu(hnp.matmul(x, w) + b)
    w, b = params[-1]
    return hnp.matmul(x, w) + b


def loss_operators(params, temperature, x, labels):
    logp = hnn.log_softmax(hnp.divide(mlp_operators(params, x), temperature))
    return -hnp.mean(hnp.sum(hnp.multiply(logp, labels), axis=-1))


mixed = policy.audit(loss_operators, *args, include_backward=True)
findings(mixed)
try:
    mixed.raise_if_any()
except policy.PolicyError as e:
    print("raise_if_any():", type(e).__name__, "with", len(mixed), "findings")

# %% [markdown]
# `heddle.policy.enforce()` makes the operators fail loudly instead: inside it JAX's own implicit
# promotion is strict, so a mixed-dtype `+` raises at trace time.

# %%
with policy.enforce():
    try:
        jax.eval_shape(lambda a, b: a + b, S((4,), bf16), S((4,), f32))
    except Exception as e:
        print(type(e).__name__ + ":", str(e).splitlines()[0][:100])
    print("heddle:", jax.eval_shape(hnp.add, S((4,), bf16), S((4,), f32)).dtype)

# %% [markdown]
# ## Summary

# %%
reports = {
    "plain JAX": plain,
    "heddle, operators": mixed,
    "heddle, jax.grad": clean,
    "heddle.autodiff": trained,
}
fig, ax = plt.subplots(figsize=(6.5, 2.6))
kinds = [k for k in policy.AUDIT_KINDS if any(r.counts[k] for r in reports.values())]
left = [0] * len(reports)
for k, colour in zip(kinds, ("C3", "C1", "C4", "C7", "C2", "C5")):
    for phase, hatch in (("forward", ""), ("backward", "//")):
        n = [sum(1 for f in r if f.kind == k and f.phase == phase) for r in reports.values()]
        if any(n):
            ax.barh(list(reports), n, left=left, color=colour, hatch=hatch, ec="white",
                    label=f"{k} ({phase})")
        left = [a + b for a, b in zip(left, n)]
ax.invert_yaxis()
ax.set_xlabel("findings (forward and backward pass)")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
show(fig)
for name, r in reports.items():
    print(f"{name:18} {len(r):2d} findings", {k: v for k, v in r.counts.items() if v})
