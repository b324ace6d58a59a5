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
# # 1. The promotion lattice
#
# What dtype does an operation on two arrays of different dtypes give? heddle answers with one table,
# derived from the formats themselves: the narrowest dtype that holds every value of both operands
# (POLICY.md 2). This notebook draws the whole table, coloured by the kind of the result, and marks
# every cell where heddle's answer differs from JAX's.
#
# Both tables are data in `heddle.policy`: `policy.HEDDLE.table` and `policy.JAX.table` (JAX's own
# `jax.numpy.promote_types`, read once at import). A cell holding `None` is a `PromotionError` in
# heddle, and a `TypePromotionError` in JAX.

# %%
from _plotting import show  # Agg backend at 80 dpi; show(fig) displays a figure
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from heddle import policy


HEDDLE, JAX = policy.HEDDLE.table, policy.JAX.table
DTYPES = HEDDLE.dtypes
print(len(DTYPES), "dtypes,", len(HEDDLE), "ordered pairs")
print(" ".join(d.name for d in DTYPES))

# %% [markdown]
# Short labels and a kind for each result. The kinds are the colours of the grid; a float's colour also
# says how wide it is, so the float8 block, the 16-bit formats, float32 and float64 stand apart.

# %%
SHORT = {v: k for k, v in policy.ALIASES.items()}
SHORT.update({"bool": "bool", "int2": "i2", "int4": "i4", "uint2": "u2", "uint4": "u4", "float8_e3m4": "e3m4",
              "float8_e4m3": "e4m3", "float8_e4m3fnuz": "4fz", "float8_e4m3b11fnuz": "b11",
              "float8_e5m2fnuz": "5fz", "float8_e8m0fnu": "e8m0"})


def short(d):
    """A label of at most four characters: the alias where there is one ("err" for an error)."""
    return "err" if d is None else SHORT[d.name]


print({d.name: short(d) for d in DTYPES})


KINDS = [
    ("bool", "#bdbdbd"),
    ("signed int", "#6baed6"),
    ("unsigned int", "#74c476"),
    ("float, 4-8 bit", "#fdd0a2"),
    ("float16 / bfloat16", "#fd8d3c"),
    ("float32", "#e6550d"),
    ("float64", "#a63603"),
    ("complex", "#9e9ac8"),
    ("error", "#ffffff"),
]


def kind(d):
    """Index into KINDS of a result dtype (None is an error)."""
    if d is None:
        return 8
    name = d.name
    if name == "bool":
        return 0
    if name.startswith("int"):
        return 1
    if name.startswith("uint"):
        return 2
    if name.startswith("complex"):
        return 7
    return {"float16": 4, "bfloat16": 4, "float32": 5, "float64": 6}.get(name, 3)


def grid(table):
    return np.array([[kind(table[a, b]) for b in DTYPES] for a in DTYPES])


def label(table):
    return [[short(table[a, b]) for b in DTYPES] for a in DTYPES]


differs = np.array(
    [[short(HEDDLE[a, b]) != short(JAX[a, b]) for b in DTYPES] for a in DTYPES]
)  # compare labels, not dtypes: np.dtype(x) != None is False for float64
print(int(differs.sum()), "of", differs.size, "cells differ")

# %% [markdown]
# ## heddle's table
#
# Rows are the first operand, columns the second; the table is symmetric. Cells with a black frame are
# those where JAX gives a different answer (an error where heddle has one, or another dtype).

# %%
def draw(table, title, dtypes=DTYPES, frame=None, text=False, size=8.0):
    n = len(dtypes)
    index = [DTYPES.index(d) for d in dtypes]
    fig, ax = plt.subplots(figsize=(size, size * 0.82))
    cmap = ListedColormap([c for _, c in KINDS])
    ax.imshow(grid(table)[np.ix_(index, index)], cmap=cmap, vmin=-0.5, vmax=len(KINDS) - 0.5)
    ax.set_xticks(range(n), [short(d) for d in dtypes], rotation=90, fontsize=8)
    ax.set_yticks(range(n), [short(d) for d in dtypes], fontsize=8)
    ax.set_xticks(np.arange(n + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="#eeeeee", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    if text:
        for i, a in enumerate(dtypes):
            for j, b in enumerate(dtypes):
                s = short(table[a, b])
                ax.text(j, i, s, ha="center", va="center", fontsize=7.5,
                        color="#999999" if s == "err" else "black")
    if frame is not None:
        for i, j in zip(*np.nonzero(frame[np.ix_(index, index)])):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
    ax.legend(handles=[Patch(fc=c, ec="#999999", label=k) for k, c in KINDS],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


show(draw(HEDDLE, "heddle: kind of the result of (row, column); framed where JAX differs",
          frame=differs))

# %% [markdown]
# The floats, with each result named (the aliases: `fp8` is float8_e4m3fn, `bf8` float8_e5m2,
# `4fz`/`5fz` the `fnuz` variants, `b11` float8_e4m3b11fnuz). Inside the float8 block, a format nested
# in another promotes to it (`e4m3 + fp8 -> fp8`); pairs with no unique narrowest container are errors
# (`fp8 + bf8` fits both float16 and bfloat16).

# %%
FLOATS = [d for d in DTYPES if 3 <= kind(d) <= 6]
show(draw(HEDDLE, "heddle: the floats; framed where JAX differs", dtypes=FLOATS,
          frame=differs, text=True, size=8.0))

# %% [markdown]
# ## JAX's table, for comparison
#
# The same grid for `jax.numpy.promote_types`. JAX refuses to promote an 8- or 4-bit float with any other
# float or complex, and the 2- and 4-bit integers with anything else; it makes `uint64` with a signed
# integer a float64.

# %%
show(draw(JAX, "JAX (jax.numpy.promote_types): kind of the result", size=6.0))

# %% [markdown]
# ## The differences, grouped
#
# Each unordered pair once, grouped by the reason for the disagreement.

# %%
from collections import defaultdict

SUB_BYTE_INTS = {"int2", "int4", "uint2", "uint4"}


def reason(a, b):
    ours, theirs = HEDDLE[a, b], JAX[a, b]
    if {a.name, b.name} & SUB_BYTE_INTS:
        return "a 2- or 4-bit integer operand (JAX promotes none of these)"
    if ours is None:
        return "uint64 with a signed integer (heddle: error, JAX: float64)"
    if theirs is None:
        return "an 8- or 4-bit float with another float or a complex (JAX: error)"
    return "uint32 with a signed integer (heddle: int64, JAX without x64: int32)"


groups = defaultdict(list)
for i, a in enumerate(DTYPES):
    for j, b in enumerate(DTYPES[i:], start=i):
        if differs[i, j]:
            groups[reason(a, b)].append(f"{short(a)}+{short(b)}: {short(HEDDLE[a, b])} / {short(JAX[a, b])}")
for why, pairs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
    print(f"{len(pairs):4d} pairs: {why}")
    print("      e.g. (heddle / JAX)", ", ".join(pairs[:: max(1, len(pairs) // 4)][:4]))

# %% [markdown]
# Reading the groups:
#
# - **2- and 4-bit integers promote** like the other integers in heddle (`u4 + i8 -> i8`,
#   `i4 + bf16 -> bf16`); JAX refuses every implicit promotion with them.
# - **8- and 4-bit floats promote with other floats** in heddle: a format nested in another promotes to
#   its container (`fp4 + fp8 -> fp8`, `e4m3 + fp8 -> fp8`), a float8 format with float16 or bfloat16
#   gives the 16-bit format that holds it, and with float32, float64 or a complex gives that. JAX
#   refuses them all (an integer with a float8 is
#   allowed in both, and gives the float8: POLICY.md 2.4, an integer never widens a float). Pairs with no
#   unique narrowest container stay errors in both (`fp8 + bf8` fits float16 and bfloat16 alike).
# - **`uint64` with a signed integer** is an error in heddle (no integer holds both) and float64 in JAX.
# - **`uint32` with a signed integer** is `int64` in heddle (the narrowest integer holding both) and
#   `int32` in JAX's table as read here without `jax_enable_x64` (JAX narrows its int64 answer).
#
# Everything else agrees, including the 16-bit pair: `float16 + bfloat16 -> float32` in both.

# %%
same = sum(short(HEDDLE[a, b]) == short(JAX[a, b]) for a in DTYPES for b in DTYPES)
print(same, "of", len(DTYPES) ** 2, "cells agree")
print("float16 + bfloat16:", HEDDLE[policy.dtype("f16"), policy.dtype("bf16")], "in heddle,",
      JAX[policy.dtype("f16"), policy.dtype("bf16")], "in JAX")
