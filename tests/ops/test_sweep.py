"""Every public function, traced in bfloat16 and float16, forward and backward: no narrow accumulation.

POLICY.md 5 and 7: every sum of more than one term (reductions, scans, contractions, scatter-adds,
max-pooling's select_and_scatter_add, window sums) accumulates in acc_dtype, float32 for narrow floats,
also in the backward pass under plain ``jax.grad``. This sweep traces each public function of
heddle.numpy, heddle.numpy.linalg, heddle.numpy.fft, heddle.nn and heddle.lax with
``jax.make_jaxpr`` (nothing runs), differentiates it where JAX can, walks every equation (inner
jaxprs included) and lists each accumulating primitive whose accumulator is a float narrower than
float32. A finding must be on ``ALLOWED`` with the reason it may stay; an entry that no longer
matches fails as stale. A name that cannot be traced from its recipe must be on ``UNTRACED``.
"""

from __future__ import annotations

import inspect
import types

import jax
import jax.extend.core
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import heddle.lax as hlax
import heddle.nn as hnn
import heddle.numpy as hnp

# accumulating primitives; dot/conv accumulate in preferred_element_type when it is set
ACCUMULATING = frozenset(
    "reduce_sum reduce_prod cumsum cumprod cumlogsumexp reduce_window_sum select_and_scatter_add "
    "scatter-add scatter-sub scatter-mul dot_general conv_general_dilated ragged_dot_general "
    "psum".split()
)
# accumulate when their computation adds or multiplies
GENERIC = frozenset({"reduce", "reduce_window"})
SPACES = {
    "numpy": hnp,
    "linalg": hnp.linalg,
    "fft": hnp.fft,
    "nn": hnn,
    "lax": hlax,
}
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _inner_jaxprs(params):
    for v in params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def _narrow(d) -> bool:
    d = np.dtype(d)
    return bool(jnp.issubdtype(d, jnp.floating)) and d.itemsize < 4


_SCANS_AND_SUMS = frozenset("reduce_sum reduce_prod cumsum cumprod cumlogsumexp".split())


def _one_term(eqn) -> bool:
    """A reduction or scan over axes of total size 1 (a broadcast's transpose over an inserted
    axis): each output is one input, nothing is added."""
    axes = eqn.params.get("axes")
    if axes is None and eqn.primitive.name.startswith("cum"):
        axes = (eqn.params["axis"],)
    if axes is None or eqn.primitive.name not in _SCANS_AND_SUMS:
        return False
    shape = eqn.invars[0].aval.shape
    return int(np.prod([shape[a] for a in axes])) == 1


def narrow_accumulations(jaxpr) -> set[str]:
    """Names of the accumulating primitives in ``jaxpr`` (and inner jaxprs) with a narrow accumulator."""
    found = set()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if (name in ACCUMULATING or name in GENERIC) and not _one_term(eqn):
            acc = eqn.params.get("preferred_element_type") or eqn.outvars[0].aval.dtype
            if name in GENERIC:
                comp = eqn.params.get("jaxpr") or eqn.params.get("computation")
                inner = getattr(comp, "jaxpr", comp)
                adds = inner is None or any(
                    e.primitive.name in ("add", "mul") for e in getattr(inner, "eqns", [])
                )
            else:
                adds = True
            if adds and _narrow(acc):
                found.add(name)
        for inner in _inner_jaxprs(eqn.params):
            found |= narrow_accumulations(inner)
    return found


# --- recipes: how to call a name, from a concrete 4x4 array ``x`` of the swept dtype ----------------

I32 = np.int32
IDX = np.array([0, 2, 1, 0], I32)
DN = (((1,), (0,)), ((), ()))
SCATTER_DN = lax.ScatterDimensionNumbers((1,), (0,), (0,))
CONV = {"window_strides": (1, 1), "padding": "VALID"}


def _img(x):
    return np.broadcast_to(x, (1, 1, 4, 4)).copy()


def _ker(x):
    return np.broadcast_to(x[:2, :2], (1, 1, 2, 2)).copy()


NUMPY = {
    **dict.fromkeys(
        "polyadd polysub polymul polydiv convolve correlate meshgrid ix_ outer".split(),
        lambda x: ((x[0], x[0]), {}),
    ),
    **dict.fromkeys("vander polyder polyint trim_zeros poly".split(), lambda x: ((x[0],), {})),
    "polyval": lambda x: ((x[0], x), {}),
    "polyfit": lambda x: ((x[0], x[1]), {"deg": 1}),
    "clip": lambda x: ((x, x.min(), x.max()), {}),
    "interp": lambda x: ((x[1], np.sort(x[0]), x[2]), {}),
    **dict.fromkeys(
        "percentile nanpercentile quantile nanquantile".split(), lambda x: ((x, x[2, 0]), {})
    ),
    **dict.fromkeys("cumulative_sum cumulative_prod".split(), lambda x: ((x,), {"axis": 0})),
    "einsum": lambda x: (("ij,jk->ik", x, x), {}),
    **dict.fromkeys("argpartition partition".split(), lambda x: ((x, 1), {})),
    "searchsorted": lambda x: ((np.sort(x[0]), x), {}),
    "digitize": lambda x: ((x, np.sort(x[0])), {}),
    "isin": lambda x: ((x, x[0]), {}),
    "where": lambda x: ((x > x.min(), x, x), {}),
    "select": lambda x: (([x > x.min()], [x]), {}),
    "extract": lambda x: ((np.asarray(x > x.min()), x), {"size": 4}),
    "take": lambda x: ((x, IDX), {"axis": 0}),
    "take_along_axis": lambda x: ((x, np.zeros((4, 3), I32)), {"axis": 1}),
    "piecewise": lambda x: ((x[0], [np.asarray(x[0] > x[0].min())], [lambda t: t, 0.0]), {}),
    "reshape": lambda x: ((x, (16,)), {}),
    "roll": lambda x: ((x, 1), {}),
    "tile": lambda x: ((x, (2,)), {}),
    "repeat": lambda x: ((x, 2), {}),
    "expand_dims": lambda x: ((x, 0), {}),
    "moveaxis": lambda x: ((x, 0, 1), {}),
    "swapaxes": lambda x: ((x, 0, 1), {}),
    "rollaxis": lambda x: ((x, 1), {}),
    "permute_dims": lambda x: ((x, (1, 0)), {}),
    "broadcast_to": lambda x: ((x, (3, 4, 4)), {}),
    **dict.fromkeys("split array_split hsplit vsplit".split(), lambda x: ((x, 2), {})),
    "dsplit": lambda x: ((x[:, :, None], 1), {}),
    "pad": lambda x: ((x, 1), {}),
    "resize": lambda x: ((x, (5, 5)), {}),
    "delete": lambda x: ((x, 1), {}),
    "insert": lambda x: ((x, 1, x[0]), {"axis": 0}),
    "put": lambda x: ((x, IDX, x[0]), {"inplace": False}),
    "put_along_axis": lambda x: (
        (x, np.zeros((4, 1), I32), x[:, :1]),
        {"axis": 1, "inplace": False},
    ),
    "place": lambda x: ((x, np.asarray(x > x.min()), x[0]), {"inplace": False}),
    "fill_diagonal": lambda x: ((x, x[0, 0]), {"inplace": False}),
    "ldexp": lambda x: ((x, np.ones((4, 4), I32)), {}),
    "block": lambda x: (([[x, x]],), {}),
    **dict.fromkeys(
        "concatenate concat stack hstack vstack dstack column_stack".split(),
        lambda x: (([x, x],), {}),
    ),
    "cross": lambda x: ((x[:, :3], x[:, :3]), {}),
    "unstack": lambda x: ((x,), {}),
    "nonzero": lambda x: ((x,), {"size": 4}),
    "flatnonzero": lambda x: ((x,), {"size": 4}),
    "argwhere": lambda x: ((x,), {"size": 4}),
    **dict.fromkeys(
        "unique unique_all unique_counts unique_inverse unique_values".split(),
        lambda x: ((x,), {"size": 4}),
    ),
    "unique": lambda x: ((x,), {"size": 4, "return_index": True, "return_counts": True}),
    "histogram": lambda x: ((x,), {"bins": 3, "weights": x, "range": (0.0, 1.0)}),
    "histogram_bin_edges": lambda x: ((x,), {"bins": 3, "range": (0.0, 1.0)}),
    "histogram2d": lambda x: ((x[0], x[1]), {"bins": 3, "weights": x[2], "range": [(0, 1)] * 2}),
    "histogramdd": lambda x: ((x[:, :2],), {"bins": 3, "weights": x[0], "range": [(0, 1)] * 2}),
    "bincount": lambda x: ((IDX,), {"weights": x[0], "length": 4}),
    "cov": lambda x: ((x, None, True, False, None, None, x[0]), {}),  # aweights positionally
    "average": lambda x: ((x, 0, x), {}),
    "apply_along_axis": lambda x: ((hnp.sum, 0, x), {}),
    "apply_over_axes": lambda x: ((hnp.sum, x, (0,)), {}),
    "vectorize": lambda x: ((jnp.sin,), {}),
    "trapezoid": lambda x: ((x,), {}),
    "gradient": lambda x: ((x,), {}),
    "matvec": lambda x: ((x, x[0]), {}),
    "vecmat": lambda x: ((x[0], x), {}),
    "kron": lambda x: ((x, x), {}),
    "broadcast_arrays": lambda x: ((x, x[0]), {}),
    "choose": lambda x: ((np.zeros((4,), I32), [x[0], x[1]]), {"mode": "clip"}),
    **dict.fromkeys(
        "union1d intersect1d setdiff1d setxor1d".split(), lambda x: ((x[0], x[1]), {"size": 4})
    ),
    "roots": lambda x: ((x[0],), {"strip_zeros": False}),
    **dict.fromkeys("zeros ones empty".split(), lambda x: (((4, 4),), {"dtype": x.dtype})),
    "full": lambda x: (((4, 4), 0.5), {"dtype": x.dtype}),
    **dict.fromkeys("eye identity tri".split(), lambda x: ((4,), {"dtype": x.dtype})),
    "arange": lambda x: ((4,), {"dtype": x.dtype}),
    **dict.fromkeys("bartlett blackman hamming hanning".split(), lambda x: ((4,), {})),
    "kaiser": lambda x: ((4, 0.5), {}),
    "indices": lambda x: (((4, 4),), {}),
    **dict.fromkeys("tril_indices triu_indices diag_indices".split(), lambda x: ((4,), {})),
    "mask_indices": lambda x: ((4, hnp.triu), {"size": 10}),
    "unravel_index": lambda x: ((IDX, (4, 4)), {}),
    "ravel_multi_index": lambda x: (((IDX, IDX), (4, 4)), {"mode": "clip"}),
    "fromfunction": lambda x: ((lambda i, j: i + j, (4, 4)), {"dtype": x.dtype}),
    "compress": lambda x: ((np.array([True, False, True, True]), x), {"axis": 0, "size": 3}),
}
# integer-only names: traced with an int8 operand (their narrow float paths do not exist)
INT_ONLY = set(
    "bitwise_and bitwise_or bitwise_xor bitwise_not invert bitwise_invert left_shift right_shift "
    "bitwise_left_shift bitwise_right_shift gcd lcm packbits unpackbits bitwise_count".split()
)

LAX = {
    "dot_general": lambda x: ((x, x, DN), {}),
    "dot": lambda x: ((x, x), {}),
    "batch_matmul": lambda x: ((x[None], x[None]), {}),
    "conv_general_dilated": lambda x: ((_img(x), _ker(x), (1, 1), "VALID"), {}),
    "conv": lambda x: ((_img(x), _ker(x), (1, 1), "VALID"), {}),
    "conv_with_general_padding": lambda x: (
        (_img(x), _ker(x), (1, 1), "VALID", None, None),
        {},
    ),
    "conv_general_dilated_patches": lambda x: ((_img(x), (2, 2), (1, 1), "VALID"), {}),
    "ragged_dot": lambda x: ((x, np.broadcast_to(x, (2, 4, 4)).copy(), np.array([2, 2], I32)), {}),
    **dict.fromkeys(
        "reduce_sum reduce_prod reduce_max reduce_min".split(), lambda x: ((x, (0,)), {})
    ),
    **dict.fromkeys("cumsum cumprod cummax cummin cumlogsumexp".split(), lambda x: ((x,), {})),
    "reduce": lambda x: ((x, x.dtype.type(0), lax.add, (0,)), {}),
    "reduce_window": lambda x: ((x, -np.inf, lax.max, (2, 2), (1, 1), "VALID"), {}),
    "argmax": lambda x: ((x, 0, I32), {}),
    "argmin": lambda x: ((x, 0, I32), {}),
    **dict.fromkeys(
        "scatter_add scatter_sub scatter_mul scatter scatter_max scatter_min".split(),
        lambda x: ((x, np.zeros((3, 1), I32), x[:3], SCATTER_DN), {}),
    ),
    "gather": lambda x: (
        (
            x,
            IDX[:, None],
            lax.GatherDimensionNumbers(
                offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)
            ),
            (1, 4),
        ),
        {},
    ),
    "reduce_precision": lambda x: ((x, 5, 2), {}),
    "broadcast": lambda x: ((x, (2,)), {}),
    "broadcast_in_dim": lambda x: ((x, (2, 4, 4), (1, 2)), {}),
    "broadcast_to_rank": lambda x: ((x, 3), {}),
    "collapse": lambda x: ((x, 0, 2), {}),
    "concatenate": lambda x: (([x, x], 0), {}),
    "dynamic_slice": lambda x: ((x, (1, 1), (2, 2)), {}),
    "dynamic_slice_in_dim": lambda x: ((x, 1, 2), {}),
    "dynamic_index_in_dim": lambda x: ((x, 1), {}),
    "dynamic_update_slice": lambda x: ((x, x[:2, :2], (1, 1)), {}),
    "dynamic_update_slice_in_dim": lambda x: ((x, x[:2], 1, 0), {}),
    "dynamic_update_index_in_dim": lambda x: ((x, x[0], 1, 0), {}),
    "expand_dims": lambda x: ((x, (0,)), {}),
    "index_in_dim": lambda x: ((x, 1), {}),
    "index_take": lambda x: ((x, (IDX,), (0,)), {}),
    "integer_pow": lambda x: ((x, 3), {}),
    "pad": lambda x: ((x, x.dtype.type(0), ((1, 1, 1), (0, 0, 0))), {}),
    "reshape": lambda x: ((x, (16,)), {}),
    "rev": lambda x: ((x, (0,)), {}),
    "slice": lambda x: ((x, (0, 0), (2, 2)), {}),
    "slice_in_dim": lambda x: ((x, 0, 2), {}),
    "split": lambda x: ((x, (2, 2)), {}),
    "squeeze": lambda x: ((x[None], (0,)), {}),
    "tile": lambda x: ((x, (2, 1)), {}),
    "transpose": lambda x: ((x, (1, 0)), {}),
    "top_k": lambda x: ((x, 2), {}),
    "approx_max_k": lambda x: ((x, 2), {}),
    "approx_min_k": lambda x: ((x, 2), {}),
    "sort": lambda x: ((x,), {}),
    "sort_key_val": lambda x: ((x, x), {}),
    "select": lambda x: ((np.asarray(x > x.min()), x, x), {}),
    "select_n": lambda x: ((np.asarray(x > x.min()), x, x), {}),
    "clamp": lambda x: ((x.dtype.type(0), x, x.dtype.type(1)), {}),
    "convert_element_type": lambda x: ((x, np.float32), {}),
    "bitcast_convert_type": lambda x: ((x, np.int16), {}),
    "full_like": lambda x: ((x, 1.0), {}),
    "zeros_like_array": lambda x: ((x,), {}),
    "reduce_and": lambda x: ((np.asarray(x > 0), (0,)), {}),
    "reduce_or": lambda x: ((np.asarray(x > 0), (0,)), {}),
    "reduce_xor": lambda x: ((np.asarray(x > 0), (0,)), {}),
    "fft": lambda x: ((x.astype(np.complex64), "FFT", (4,)), {}),
    "associative_scan": lambda x: ((lax.add, x), {}),
    "map": lambda x: ((jnp.sin, x), {}),
    "cond": lambda x: ((True, jnp.sin, jnp.cos, x), {}),
    "switch": lambda x: ((0, [jnp.sin, jnp.cos], x), {}),
    "stop_gradient": lambda x: ((x,), {}),
    "optimization_barrier": lambda x: ((x,), {}),
    "conv_general_dilated_local": lambda x: (
        (_img(x), np.ones((1, 4, 3, 3), x.dtype), (1, 1), "VALID", (2, 2)),
        {},
    ),
    "conv_transpose": lambda x: (
        (_img(x), _ker(x), (1, 1), "VALID"),
        {"dimension_numbers": ("NCHW", "OIHW", "NCHW")},
    ),
    "ragged_dot_general": lambda x: (
        (x, np.broadcast_to(x, (2, 4, 4)).copy(), np.array([2, 2], I32)),
        {
            "ragged_dot_dimension_numbers": lax.RaggedDotDimensionNumbers(
                dot_dimension_numbers=(((1,), (1,)), ((), ())),
                lhs_ragged_dimensions=[0],
                rhs_group_dimensions=[0],
            )
        },
    ),
    "scatter_apply": lambda x: (
        (x, np.zeros((3, 1), I32), jnp.sin, SCATTER_DN),
        {"update_shape": (3, 4)},
    ),
    "iota": lambda x: ((x.dtype, 4), {}),
    "broadcasted_iota": lambda x: ((x.dtype, (4, 4), 0), {}),
    "full": lambda x: (((4, 4), 0.5, x.dtype), {}),
    "empty": lambda x: (((4, 4), x.dtype), {}),
    "complex": lambda x: ((x.astype(np.float32), x.astype(np.float32)), {}),
    "rng_uniform": lambda x: ((np.float32(0), np.float32(1), (4,)), {}),
    "rng_bit_generator": lambda x: ((np.zeros(4, np.uint32), (4,)), {}),
    "scan": lambda x: ((lambda c, v: (c + v, c), x[0], x), {}),
    "fori_loop": lambda x: ((0, 3, lambda i, c: c * c, x), {}),
    "while_loop": lambda x: ((lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * c[1]), (0, x)), {}),
    "with_sharding_constraint": lambda x: ((x, None), {}),
    "platform_dependent": lambda x: ((x,), {"default": jnp.sin}),
    "custom_root": lambda x: (
        (lambda t: t - x, x, lambda f, t0: t0, lambda f, t: t),
        {},
    ),
    "custom_linear_solve": lambda x: ((lambda t: t, x, lambda f, t: t), {}),
    "composite": lambda x: ((jnp.sin, "heddle.sin"), {}),
}
# collectives: traced under jax.vmap with a named axis of size 4 (the leading axis of x)
COLLECTIVES = {
    **dict.fromkeys(
        "psum pmean pmax pmin all_gather psum_scatter".split(), lambda x: ((x, "i"), {})
    ),
    "ppermute": lambda x: ((x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)]), {}),
    "pshuffle": lambda x: ((x, "i", [1, 2, 3, 0]), {}),
    "pswapaxes": lambda x: ((x, "i", 0), {}),
    "all_to_all": lambda x: ((x, "i", 0, 0), {}),
    "axis_index": lambda x: (("i",), {}),
    "axis_size": lambda x: (("i",), {}),
    "pbroadcast": lambda x: ((x, "i", 0), {}),
}
# lax names traced with complex or integer operands
LAX_COMPLEX = set("real imag conj".split())
LAX_INT = set(
    "bitwise_and bitwise_or bitwise_xor bitwise_not shift_left shift_right_arithmetic "
    "shift_right_logical population_count clz mulhi".split()
)

NN = {
    "one_hot": lambda x: ((IDX, 4), {}),
    "glu": lambda x: ((x,), {}),
    "logsumexp": lambda x: ((x,), {"b": x}),
    "standardize": lambda x: ((x,), {"mean": x, "variance": x}),
    "dot_product_attention": lambda x: ((x[None, :, None], x[None, :, None], x[None, :, None]), {}),
}

LINALG = {
    "multi_dot": lambda x: (([x, x, x],), {}),
    "matrix_power": lambda x: ((x, 3), {}),
    "cross": lambda x: ((x[:, :3], x[:, :3]), {}),
    "outer": lambda x: ((x[0], x[0]), {}),
    "tensorinv": lambda x: ((x,), {"ind": 1}),
    "tensorsolve": lambda x: ((x, x[0]), {}),
    "solve": lambda x: ((x, x[0]), {}),
    "lstsq": lambda x: ((x, x[0]), {}),
    "vecdot": lambda x: ((x, x), {}),
}
FFT = {
    "fftfreq": lambda x: ((4,), {}),
    "rfftfreq": lambda x: ((4,), {}),
}

RECIPES = {"numpy": NUMPY, "lax": LAX, "nn": NN, "linalg": LINALG, "fft": FFT}

# further calls of a name whose other modes compute differently (swept beside the recipe)
VARIANTS = {
    ("numpy", "pad"): [
        lambda x, mode=mode: ((x, 2), {"mode": mode})
        for mode in "edge reflect symmetric wrap maximum minimum mean median linear_ramp".split()
    ],
}


def _names(space: str):
    mod = SPACES[space]
    for name in sorted(dir(mod)):
        if name.startswith("_") or (space == "lax" and name.endswith("_p")):
            continue
        obj = getattr(mod, name)
        if inspect.isclass(obj) or isinstance(obj, types.ModuleType) or not callable(obj):
            continue
        yield name


def _input(space: str, name: str, d):
    x = ((np.arange(16).reshape(4, 4) % 7 + 1) / 8).astype(d)
    if (space == "numpy" and name in INT_ONLY) or (space == "lax" and name in LAX_INT):
        return x.astype(np.float32).astype(np.uint8 if name == "unpackbits" else np.int8)
    if space == "lax" and name in LAX_COMPLEX:
        return x.astype(np.complex64)
    return x


def _call(space: str, name: str, x, recipe=None):
    recipe = (
        recipe or RECIPES[space].get(name) or (COLLECTIVES.get(name) if space == "lax" else None)
    )
    if recipe is not None:
        return recipe(x)
    nin = getattr(getattr(jnp, name, None), "nin", None) if space == "numpy" else None
    if nin is not None:  # a jax.numpy ufunc: its signature is (*args, ...)
        return (x,) * nin, {}
    sig = inspect.signature(getattr(SPACES[space], name))
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    k = sum(1 for p in sig.parameters.values() if p.kind in positional and p.default is p.empty)
    return (x,) * k, {}


def _is_traced(leaf) -> bool:
    return isinstance(leaf, np.ndarray) and _narrow(leaf.dtype)


def _vmapped(fn):
    def call(x, *args, **kwargs):
        return jax.vmap(lambda v: fn(v, *args, **kwargs), axis_name="i")(x)

    return call


def trace(space: str, name: str, d, recipe=None) -> tuple[set[str], bool]:
    """(narrow accumulations found, whether the backward pass was traced too)."""
    fn = getattr(SPACES[space], name)
    if space == "lax" and name in COLLECTIVES:  # a named axis: the leading axis of x, under vmap
        if name.startswith("axis"):
            fn = jax.vmap(fn, in_axes=None, axis_name="i", axis_size=4)
        else:
            fn = _vmapped(fn)
    args, kwargs = _call(space, name, _input(space, name, d), recipe)
    leaves, tree = jax.tree.flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if _is_traced(leaf)]

    def closed(*arrays):
        full = list(leaves)
        for i, a in zip(where, arrays, strict=True):
            full[i] = a
        a, k = jax.tree.unflatten(tree, full)
        return fn(*a, **k)

    structs = [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in where]
    if structs:

        def loss(*arrays):
            total = jnp.float32(0)
            for leaf in jax.tree.leaves(closed(*arrays)):
                if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact):
                    total = total + jnp.real(leaf).astype(jnp.float32).sum()
            return total

        try:
            jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(len(structs)))))(*structs)
            return narrow_accumulations(jaxpr.jaxpr), True
        except Exception:  # not differentiable (integer outputs, no derivative): forward only
            pass
    jaxpr = jax.make_jaxpr(closed)(*structs)
    return narrow_accumulations(jaxpr.jaxpr), False


_PRINTING = "printing: formats on the host, no array computation"
_IO = "i/o: reads or writes host buffers and files"
_USER = "returns a function wrapping the user's own; the ops inside it carry the policy"
_META = "metadata: computes shapes, dimension numbers or dtypes, no arrays"
_ALIAS = "a type alias, not a function"
_MESH = "needs shard_map over a device mesh (no vmap rule); communicates, adds nothing"
_MX = (
    "block-scaled (MX) contraction over quantised operands with their own scale formats; "
    "accumulates in preferred_element_type (float32 by default)"
)

# (space, name) -> why it cannot be traced from a recipe
UNTRACED: dict[tuple[str, str], str] = {
    **{
        ("numpy", n): _PRINTING
        for n in "array_repr array_str get_printoptions printoptions".split()
    },
    **{
        ("numpy", n): _IO
        for n in "from_dlpack frombuffer fromfile fromiter fromstring load save savez".split()
    },
    **{("numpy", n): _USER for n in "frompyfunc vectorize".split()},
    ("lax", "composite"): _USER,
    **{("numpy", n): _META for n in "einsum_path result_type".split()},
    ("numpy", "trim_zeros"): "its output shape depends on the values, so it cannot be traced",
    **{
        ("lax", n): _META
        for n in (
            "broadcast_shapes conv_dimension_numbers conv_general_permutations "
            "conv_general_shape_tuple conv_shape_tuple conv_transpose_shape_tuple padtype_to_pads "
            "reduce_window_shape_tuple"
        ).split()
    },
    **{
        ("lax", n): _ALIAS
        for n in "ConvGeneralDilatedDimensionNumbers DotDimensionNumbers PrecisionLike".split()
    },
    **{("lax", n): _MESH for n in "pbroadcast pcast psend precv ragged_all_to_all".split()},
    ("lax", "with_sharding_constraint"): "a sharding annotation: needs a mesh; no arithmetic",
    ("lax", "random_gamma_grad"): "jax.random's internal derivative of the gamma sampler",
    ("nn", "get_scaled_dot_general_config"): "returns a configuration object, not an array",
    ("nn", "scaled_dot_general"): _MX,
    ("nn", "scaled_matmul"): _MX,
}

_PERMUTATION = (
    "a permutation or a choice of distinct elements: the backward scatter-add gives every slot at "
    "most one cotangent, so nothing is added"
)
_PRIMITIVE = (
    "jax.lax's own structural primitive, re-exported unchanged (heddle.lax replaces the entry "
    "points that accumulate in their forward pass); under plain jax.grad its transpose sums "
    "cotangents in their own dtype. heddle.autodiff sums them in float32 (its float32 twins) and "
    "heddle.numpy's versions of these copies (take, broadcast_to, tile, ...) copy from an exact "
    "float32 copy (docs/differences.md)"
)
_COLLECTIVE = (
    "JAX's all_gather, re-exported: its transpose is a narrow psum_scatter; heddle.lax.psum_scatter "
    "is the float32 one (docs/ops.md)"
)
_SA = frozenset({"scatter-add"})
_RS = frozenset({"reduce_sum"})

# (space, name) -> (primitives, why the narrow accumulation may stay)
ALLOWED: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    **{("numpy", n): (_SA, _PERMUTATION) for n in "sort partition".split()},
    **{
        ("lax", n): (_SA, _PERMUTATION)
        for n in "sort sort_key_val top_k approx_max_k approx_min_k ppermute pshuffle".split()
    },
    **{("lax", n): (_RS, _PRIMITIVE) for n in "broadcast broadcast_in_dim tile".split()},
    **{
        ("lax", n): (_SA, _PRIMITIVE)
        for n in "gather index_take scatter scatter_max scatter_min".split()
    },
    ("lax", "all_gather"): (_RS, _COLLECTIVE),
}


def sweep(dtype) -> tuple[dict, dict]:
    found, failed = {}, {}
    for space in SPACES:
        for name in _names(space):
            try:
                prims, _ = trace(space, name, dtype)
                for variant in VARIANTS.get((space, name), []):
                    prims = prims | trace(space, name, dtype, variant)[0]
            except Exception as e:
                failed[(space, name)] = f"{type(e).__name__}: {str(e)[:120]}"
                continue
            if prims:
                found[(space, name)] = prims
    return found, failed


@pytest.mark.parametrize(
    "dtype",
    # the same traces in another narrow dtype: float16 with the slow marker
    [pytest.param(d, id=d, marks=() if d == "bfloat16" else pytest.mark.slow) for d in DTYPES],
)
def test_no_narrow_accumulation_in_any_public_function(dtype):
    found, failed = sweep(DTYPES[dtype])
    untraced = {k: v for k, v in failed.items() if k not in UNTRACED}
    assert not untraced, f"cannot trace (add a recipe, or to UNTRACED with why): {untraced}"
    unexpected = {
        k: sorted(v) for k, v in found.items() if k not in ALLOWED or not v <= ALLOWED[k][0]
    }
    assert not unexpected, f"narrow accumulations: {unexpected}"
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that no longer accumulate narrowly: {stale}"
    assert not sorted(set(UNTRACED) - set(failed)), "UNTRACED entries that trace now"


# Value operands passed by keyword: converted like positional ones (the sweep above passes them
# positionally).
KEYWORD_OPERANDS = {
    "cov(aweights=)": ("cov", lambda x: ((x,), {"aweights": x[0]})),
    "average(weights=)": ("average", lambda x: ((x,), {"weights": x, "axis": 0})),
}


@pytest.mark.parametrize("call", list(KEYWORD_OPERANDS))
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_value_operands_given_by_keyword(call, dtype):
    name, recipe = KEYWORD_OPERANDS[call]
    saved = NUMPY[name]
    NUMPY[name] = recipe
    try:
        prims, _ = trace("numpy", name, DTYPES[dtype])
    finally:
        NUMPY[name] = saved
    assert prims == set()


def test_the_walk_finds_what_it_looks_for():
    """The detector, on JAX's own functions that accumulate in bfloat16 (and heddle's that do not)."""
    x = jax.ShapeDtypeStruct((8, 8), jnp.bfloat16)
    assert narrow_accumulations(jax.make_jaxpr(jnp.cumsum)(x).jaxpr) == {"cumsum"}
    assert narrow_accumulations(jax.make_jaxpr(hnp.cumsum)(x).jaxpr) == set()
    assert narrow_accumulations(jax.make_jaxpr(jnp.matmul)(x, x).jaxpr) == {"dot_general"}
    assert narrow_accumulations(jax.make_jaxpr(hnp.matmul)(x, x).jaxpr) == set()
    g = jax.grad(lambda t: jnp.take(t, jnp.zeros(9, I32), axis=0).astype(jnp.float32).sum())
    assert narrow_accumulations(jax.make_jaxpr(g)(x).jaxpr) == {"scatter-add"}
    pool = jax.grad(
        lambda t: (
            lax.reduce_window(t, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID")
            .astype(jnp.float32)
            .sum()
        )
    )
    assert narrow_accumulations(jax.make_jaxpr(pool)(x).jaxpr) == {"select_and_scatter_add"}
