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
# # 7. heddle.autocast
#
# A flax model calls its layers as they are: `nn.Dense` runs `lax.dot_general`, `nn.LayerNorm` its
# own reductions, `jax.nn.log_softmax` its own sum. None of them names heddle, so heddle's op
# namespaces cannot reach them. `heddle.autocast(fn)` does: it re-binds every primitive of `fn` under
# the policy (float32 accumulation, one rounding), without changing any value's shape or dtype.
#
# Here: a bfloat16 flax MLP audited as it is, audited under `autocast`, and trained under it on
# scikit-learn's digits. See `docs/autocast.md`.

# %%
from _plotting import show  # Agg backend at 80 dpi; show(fig) displays a figure

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from sklearn.datasets import load_digits

import heddle

BF16 = jnp.bfloat16


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm(dtype=BF16, param_dtype=jnp.float32)(x)
        x = nn.relu(nn.Dense(128, dtype=BF16, param_dtype=jnp.float32)(x))
        return nn.Dense(10, dtype=BF16, param_dtype=jnp.float32)(x)


model = MLP()
params = model.init(jax.random.key(0), jnp.zeros((1, 64), BF16))  # float32 masters


def loss(params, x, y):
    logp = jax.nn.log_softmax(model.apply(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)).astype(jnp.float32)


x = jax.ShapeDtypeStruct((64, 64), BF16)
y = jax.ShapeDtypeStruct((64,), jnp.int32)

# %% [markdown]
# ## The audit, before and after
#
# The plain model accumulates narrowly in every layer, forward and backward. Under `autocast` the
# same code, with the same parameters and dtypes, has none left; what the audit still lists are
# `narrow_cotangent`s: the backward pass it traces is plain `jax.vjp`'s, which stores the cotangent of
# each bfloat16 value in bfloat16. The gradient function a training step calls,
# `heddle.autodiff.grad(heddle.autocast(loss))`, keeps them in float32 and audits clean.

# %%
before = heddle.audit(loss, params, x, y, include_backward=True)
print(str(before).splitlines()[0])
for f in before.of_kind("narrow_accumulation")[:6]:
    print(f"  {f.phase:8} {f.primitive:15} {','.join(f.dtypes)} -> {f.out_dtype}   {f.code}")

after = heddle.audit(heddle.autocast(loss), params, x, y, include_backward=True)
print(str(after).splitlines()[0])
trained = heddle.audit(heddle.autodiff.grad(heddle.autocast(loss)), params, x, y)
print(str(trained).splitlines()[0])

kinds = [k for k in heddle.programs.KINDS if before.counts[k] or after.counts[k]]
fig, ax = plt.subplots(figsize=(7, 2.6))
pos = np.arange(len(kinds))
ax.barh(pos + 0.2, [before.counts[k] for k in kinds], 0.4, label="plain")
ax.barh(pos - 0.2, [after.counts[k] for k in kinds], 0.4, label="heddle.autocast")
ax.set_yticks(pos, kinds)
ax.set_xlabel("findings (forward and backward)")
ax.legend()
show(fig)

# %% [markdown]
# ## Training under autocast
#
# One line changes: the loss is wrapped. The gradients of the float32 masters are float32
# (`heddle.autodiff.value_and_grad`), and the forward pass runs in bfloat16 with float32 sums.

# %%
images, labels = load_digits(return_X_y=True)
order = np.random.default_rng(0).permutation(len(images))
xs = (images[order] / 16.0).astype(np.float32)
ys = labels[order].astype(np.int32)
x_train, y_train, x_test, y_test = xs[:898], ys[:898], xs[898:], ys[898:]

opt = optax.sgd(0.05, momentum=0.9)
train_loss = heddle.autocast(loss)  # the one line


@jax.jit
def step(params, opt_state, x, y):
    value, grads = heddle.autodiff.value_and_grad(train_loss)(params, x.astype(BF16), y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


opt_state = opt.init(params)
rng = np.random.default_rng(0)
for i in range(600):
    idx = rng.choice(len(x_train), 64, replace=False)
    params, opt_state, value = step(params, opt_state, x_train[idx], y_train[idx])
    if i % 200 == 0:
        print(f"step {i:4d}  loss {float(value):.4f}")

logits = heddle.autocast(model.apply)(params, jnp.asarray(x_test, BF16))
accuracy = float(jnp.mean(jnp.argmax(logits, axis=1) == y_test)) * 100
print(f"test accuracy after 600 steps: {accuracy:.2f}%")
print("parameter dtypes:", {str(a.dtype) for a in jax.tree.leaves(params)})
