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
# # 3. Casts: rounding once
#
# Converting a float64 to bfloat16 should round the value once, to the nearest bfloat16 (ties to even).
# XLA's `convert` goes through float32 for some pairs, and rounds twice: first to float32, then to the
# target. When the first rounding lands exactly on a midpoint between two target values, the second one
# ties to even, which may be the wrong neighbour. ml_dtypes' `astype` did the same for other pairs before 0.7.
# heddle's `astype` rounds once for every (source, target) pair, on every backend (POLICY.md 6).
#
# This notebook counts the wrong results on the inputs of heddle's cast tests: every midpoint of each
# target format written in the source format, with its neighbours a few ulps away and small relative
# perturbations (the generators of `tests/policy/_reference.py`), checked against the exact reference of
# the same file (integer and `Fraction` arithmetic on the host: no XLA, no ml_dtypes).

# %%
from _plotting import show  # Agg backend at 80 dpi; show(fig) displays a figure
import pathlib
import sys
import warnings
from fractions import Fraction

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
from jax import lax

import heddle

ROOT = next(p for p in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents) if (p / "tests").is_dir())
sys.path.insert(0, str(ROOT / "tests" / "policy"))
import _reference as ref  # the cast tests' exact reference and case generators


def dt(name):
    return np.dtype(getattr(ml_dtypes, name, None) or name)


print("jax", jax.__version__, "on", jax.devices()[0].platform, "| ml_dtypes", ml_dtypes.__version__)

# %% [markdown]
# ## One case, by hand
#
# `1 + 2**-8 + 2**-30` lies just above the midpoint of the bfloat16 neighbours 1 and 1 + 2**-7, so the
# correct bfloat16 is 1.0078125. float32 cannot hold the `2**-30`: rounded to float32 first, the value
# becomes the midpoint itself, and the second rounding ties to even, to 1.

# %%
with jax.enable_x64(True):
    x = np.array([1 + 2**-8 + 2**-30])
    via_f32 = x.astype(np.float32)
    print("exact source        ", Fraction(float(x[0])))
    print("rounded to float32  ", Fraction(float(via_f32[0])), "= 1 + 2**-8, the midpoint")
    print("reference (once)    ", ref.reference_cast(x, "bfloat16")[0])
    print("XLA convert         ", np.asarray(lax.convert_element_type(jnp.asarray(x), jnp.bfloat16))[0])
    print("ml_dtypes astype    ", x.astype(ml_dtypes.bfloat16)[0])
    print("heddle.astype       ", np.asarray(heddle.astype(jnp.asarray(x), jnp.bfloat16))[0])

# %% [markdown]
# ## Counting, pair by pair
#
# Sources: float64, float32 and the 32- and 64-bit integers; targets: bfloat16, float16, three float8
# formats and float4. A wrong result is counted as **routed through float32** when it equals the
# correctly rounded cast of the float32-rounded source: a double rounding (or, below float32's range, a
# value flushed to zero on the way). Other wrong results (NaN, infinity and subnormal handling) are
# counted apart, as "other".

# %%
SOURCES = {
    "float64": lambda: ref.float64_cases(64),
    "float32": lambda: ref.float32_cases(2**12),
    "int32": lambda: ref.int_cases(np.int32, 4),
    "int64": lambda: ref.int_cases(np.int64, 4),
    "uint32": lambda: ref.int_cases(np.uint32, 4),
}
TARGETS = ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn"]
IMPLS = ("XLA convert", "ml_dtypes astype", "heddle.astype")

counts = {}  # (source, target) -> {impl: (double roundings, other wrong)}
examples = {}
sizes = {}
with jax.enable_x64(True), warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")
    for src, make in SOURCES.items():
        x = make()
        sizes[src] = len(x)
        xj = jnp.asarray(x)
        xla = jax.jit(lambda a: [lax.convert_element_type(a, dt(d)) for d in TARGETS])(xj)
        ours = jax.jit(lambda a: [heddle.astype(a, dt(d)) for d in TARGETS])(xj)
        for d, got_xla, got_ours in zip(TARGETS, xla, ours):
            want = ref.reference_cast(x, d)
            twice = ref.reference_cast(x.astype(np.float32), d)  # the route through float32
            results = {"XLA convert": np.asarray(got_xla), "ml_dtypes astype": x.astype(dt(d)),
                       "heddle.astype": np.asarray(got_ours)}
            row = {}
            for impl, got in results.items():
                bad = ref.mismatches(got, want)
                double = bad & ~ref.mismatches(got, twice) & ref.mismatches(twice, want)
                row[impl] = (int(double.sum()), int((bad & ~double).sum()))
                if double.any() and (src, d) not in examples:
                    i = np.flatnonzero(double)[0]
                    examples[src, d] = (x[i], want[i], got[i])
            counts[src, d] = row

print("cases per source:", sizes)
print(f"\n{'source':8} {'target':15}" + "".join(f"{i:>22}" for i in IMPLS))
print(" " * 24 + "".join(f"{'via f32 / other':>22}" for _ in IMPLS))
for (src, d), row in counts.items():
    if any(sum(v) for v in row.values()):
        print(f"{src:8} {d:15}" + "".join(f"{row[i][0]:>14} / {row[i][1]:<5}" for i in IMPLS))
quiet = [f"{s}->{d}" for (s, d), row in counts.items() if not any(sum(v) for v in row.values())]
print(f"\nno wrong result from any of the three: {len(quiet)} pairs ({', '.join(quiet[:6])}, ...)")

# %%
pairs = [k for k, row in counts.items() if any(row[i][0] for i in IMPLS)]
fig, ax = plt.subplots(figsize=(10, 3.6))
width = 0.27
for j, (impl, colour) in enumerate(zip(IMPLS, ("C0", "C1", "C3"))):
    n = [counts[p][impl][0] for p in pairs]
    ax.bar(np.arange(len(pairs)) + (j - 1) * width, np.maximum(n, 0.8), width, color=colour,
           label=impl, alpha=1.0 if impl != "heddle.astype" else 0.9)
    for k, v in enumerate(n):
        if v == 0:
            ax.text(k + (j - 1) * width, 1.0, "0", ha="center", va="bottom", fontsize=7)
ax.set_yscale("log")
ax.set_ylim(0.8, None)
SHORT = {"float64": "f64", "float32": "f32", "int32": "i32", "int64": "i64", "uint32": "u32",
         "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2",
         "float8_e8m0fnu": "e8m0", "float4_e2m1fn": "fp4"}
ax.set_xticks(range(len(pairs)), [f"{SHORT[s]}\n-> {SHORT[d]}" for s, d in pairs], fontsize=9)
ax.set_ylabel("wrong results routed via float32")
ax.set_title("Double roundings through float32, on the cast tests' inputs (log scale)")
ax.legend(fontsize=8)
fig.tight_layout()
show(fig)

# %% [markdown]
# One case per pair routed through float32, as (source value, correct result, wrong result), from the
# first implementation that gave it in the order XLA, ml_dtypes:

# %%
for (src, d), (value, want, got) in examples.items():
    print(f"{src:8} -> {d:15} {value!r:>28}: correct {want}, got {got}")

# %%
assert all(counts[p]["heddle.astype"] == (0, 0) for p in counts), "heddle.astype is wrong somewhere"
print("heddle.astype: no wrong result on", sum(sizes[s] for s in SOURCES) * len(TARGETS), "casts")

# %% [markdown]
# What the counts show (JAX and ml_dtypes versions above; the exact numbers depend on how many
# perturbed inputs the generators draw):
#
# - **XLA's `convert`** rounds through float32 for float64 -> bfloat16, float64 -> float16,
#   float64 -> float8_e8m0fnu, and the 32- and 64-bit integers -> bfloat16 and -> float8_e8m0fnu.
# - **ml_dtypes' `astype`** before version 0.7 rounded through float32 for float64 -> bfloat16 and
#   float64 -> every float8 and float4 format, and for the integers -> bfloat16 and -> float8_e8m0fnu;
#   from 0.7 on it rounds once (its column is then zero but for the special values below). Its float64
#   -> float16 is NumPy's own conversion and correct.
# - Both also disagree with the exact reference on a few special values (the "other" column: NaN to
#   float4 and the exact tie +-464 to float8_e4m3fn in both; XLA also flushes results below float32's
#   normal range to zero, float64 -> bfloat16 included, and misses at the smallest values of the
#   power-of-two format e8m0), which heddle handles as POLICY.md 6 says.
# - **heddle.astype** gives the correctly rounded result on every input. It uses XLA's `convert` where
#   that is already correct and computes the other pairs from the bit patterns with integer arithmetic
#   (`heddle/policy/_casts.py` picks the path; the integer arithmetic is in `heddle/policy/_bits.py`).
