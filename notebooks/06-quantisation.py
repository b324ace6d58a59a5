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
# # 6. Quantisation formats: memory against error
#
# `heddle.quant` stores a tensor as element codes times scales (one per tensor, channel or block), with
# 4- and 6-bit codes packed (`docs/quantisation.md`). Fewer bits per element cost accuracy; smaller
# blocks buy some back for the price of more scales. This notebook measures both for every format on one
# weight matrix: the bytes actually stored (codes and scales) against the error of the dequantised
# weight, and of a matmul with it (`heddle.quant.qmatmul`), both against float64.

# %%
from _plotting import show  # Agg backend at 80 dpi; show(fig) displays a figure

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import heddle.quant as hq


print("formats:", ", ".join(hq.FORMATS))

# %% [markdown]
# The weight: 512 x 512 standard normal values with one in a thousand scaled by 20, the outliers that
# trained weights have and that make one scale per channel coarse. It is used as `x @ W`, so the scales
# run along axis 0, the contraction axis.

# %%
rng = np.random.default_rng(0)
w = rng.standard_normal((512, 512)).astype(np.float32)
w[rng.random(w.shape) < 0.001] *= 20
x = rng.standard_normal((64, 512)).astype(np.float32)
exact = x.astype(np.float64) @ w.astype(np.float64)


def rel_rms(approx, ref):
    approx = np.asarray(approx, np.float64)
    return float(np.sqrt(np.mean((approx - ref) ** 2)) / np.sqrt(np.mean(ref**2)))


LAYOUTS = {"per channel": {"axis": 0}, "blocks of 32": {"axis": 0, "block_size": 32}}
rows = []
for fmt in hq.FORMATS:
    for layout, kw in LAYOUTS.items():
        if fmt.startswith("mx") and layout == "per channel":
            continue  # MX formats always use blocks of 32
        q = hq.quantize(jnp.asarray(w), fmt, **kw)
        label = layout if not (fmt == "nf4" and layout == "per channel") else "blocks of 64 (nf4 default)"
        rows.append((fmt, label, 8 * q.nbytes / w.size, rel_rms(hq.dequantize(q), w),
                     rel_rms(hq.qmatmul(jnp.asarray(x), q), exact)))
for name, dtype in (("bfloat16", jnp.bfloat16), ("float16", jnp.float16)):
    c = jnp.asarray(w).astype(dtype)
    rows.append((name, "cast", 16.0, rel_rms(c, w),
                 rel_rms(jnp.matmul(jnp.asarray(x), c.astype(jnp.float32)), exact)))

print(f"{'format':15} {'layout':27} {'bits/element':>12} {'weight error':>12} {'matmul error':>12}")
for fmt, layout, bits, werr, merr in sorted(rows, key=lambda r: (r[2], r[3])):
    print(f"{fmt:15} {layout:27} {bits:12.2f} {werr:12.2e} {merr:12.2e}")

# %%
fig, ax = plt.subplots(figsize=(9, 5))
marker = {"per channel": "o", "blocks of 32": "s", "blocks of 64 (nf4 default)": "D"}
colour = {4: "C3", 5: "C3", 6: "C1", 7: "C1", 8: "C0", 9: "C0"}
seen = {}
for fmt, layout, bits, werr, _ in sorted(rows, key=lambda r: (round(r[2], 2), -r[3])):
    if layout == "cast":
        ax.axhline(werr, color="C2", ls="--", lw=1)
        ax.text(9.7, werr * 1.08, f"{fmt} cast (16 bits)", ha="right", fontsize=8, color="C2")
        continue
    near = seen.setdefault(round(bits), [])  # labels already placed close by: step down
    k = sum(abs(np.log10(werr) - np.log10(e)) < 0.12 for e in near)
    near.append(werr)
    ax.scatter(bits, werr, marker=marker[layout], s=60, color=colour[int(bits)], edgecolor="black",
               linewidth=0.5, zorder=2)
    ax.annotate(fmt.replace("float", "f"), (bits, werr), textcoords="offset points",
                xytext=(7, -3 - 10 * k), fontsize=7.5)
for layout, m in marker.items():
    ax.scatter([], [], marker=m, color="white", edgecolor="black", label=layout)
ax.set(yscale="log", xlim=(3.6, 9.8), xlabel="bits per element stored (codes and scales)",
       ylabel="relative RMS error of the weight",
       title="Memory against error, 512 x 512 weight with outliers")
ax.legend(fontsize=8, loc="upper right")
ax.grid(alpha=0.3)
fig.tight_layout()
show(fig)

# %% [markdown]
# Reading the plot and the table:
#
# - **Blocks beat channels** at 4 bits: a block of 32 confines an outlier's large scale to 32 values,
#   where a per-channel scale coarsens the whole column; the extra scales cost one bit per element
#   (a float32 scale per 32 values) or a quarter of a bit (the MX formats' 8-bit power-of-two scales).
# - **At 8 bits** int8 with blocks is the most accurate of the formats here; float8 keeps its relative
#   precision across magnitudes, so its per-channel error is close to its blocked one.
# - **The matmul error follows the weight error**: `qmatmul` dequantises in float32 and accumulates in
#   float32, so it adds nothing measurable to the quantisation error itself.
# - At 16 bits, a float16 cast is more than an order of magnitude more accurate than every 8-bit layout
#   here; bfloat16, with 8 significant bits, only a few times more accurate than int8 in blocks of 32.
