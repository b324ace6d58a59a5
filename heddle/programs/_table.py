"""The one table of JAX primitives and their policy rules, read by ``autocast`` and by ``audit``.

Each primitive JAX can put in a jaxpr has exactly one rule (POLICY.md 4-6 applied to primitives):
``autocast`` rewrites an equation to follow its rule, ``audit`` reports where an equation departs
from it. A primitive that is not in the table is an explicit pass-through: ``autocast`` binds it
unchanged and ``audit`` reports it as ``unclassified``; ``tests/programs/test_table.py`` compares the
table with every primitive the installed JAX defines, so a new one fails the test until it is listed.
"""

from __future__ import annotations

import enum


class Rule(enum.Enum):
    """What the policy asks of one primitive."""

    CONTRACTION = "contraction"  # float32 (acc_dtype) accumulator via preferred_element_type
    REDUCTION = "reduction"  # adds or multiplies many terms: operand at acc_dtype
    SCAN = "scan"  # cumulative: each output element accumulated at acc_dtype
    SCATTER = "scatter"  # scatter-add/-sub/-mul: repeated indices accumulate at acc_dtype
    WINDOW = "window"  # window sums (pooling and its transpose) at acc_dtype
    COLLECTIVE = "collective"  # cross-device sums at acc_dtype
    CONVERT = "convert"  # a narrowing float conversion rounds once (heddle's cast)
    FLOAT = "float"  # narrow float arithmetic computed in float32, rounded once
    EXACT = "exact"  # exact in every float format (copies, selection, comparisons, max/min)
    INDEX = "index"  # produces indices or creates values: JAX's dtype kept
    MONOID = "monoid"  # reduce with an add/mul/max/min body: as reduce_sum ... reduce_min
    HIGHER_ORDER = "higher_order"  # has jaxpr bodies: descended into
    PASS = "pass"  # bound unchanged, for the reason listed


MEANINGS: dict[Rule, str] = {
    Rule.CONTRACTION: "products summed over contracting dimensions into an acc_dtype (float32) "
    "accumulator, through preferred_element_type; rounded once",
    Rule.REDUCTION: "adds or multiplies many terms: the operand at acc_dtype, rounded once",
    Rule.SCAN: "cumulative: each output element accumulated at acc_dtype, rounded once",
    Rule.SCATTER: "scatter-add/-sub/-mul: updates at repeated indices accumulate at acc_dtype",
    Rule.WINDOW: "window sums (sum pooling and the transpose of max pooling) at acc_dtype",
    Rule.COLLECTIVE: "cross-device sums at acc_dtype",
    Rule.CONVERT: "a narrowing float conversion rounds once (heddle's correctly rounded cast)",
    Rule.FLOAT: "narrow float arithmetic computed in float32 and rounded once",
    Rule.EXACT: "exact in every float format (copies, selections, comparisons, max/min): bound as "
    "they are",
    Rule.INDEX: "produce indices or create values: JAX's dtype kept",
    Rule.MONOID: "a reduction with a body: follows the rule of the reduction its body computes",
    Rule.HIGHER_ORDER: "hold jaxpr bodies: the bodies are evaluated (autocast) and walked (audit) "
    "under the same rules",
    Rule.PASS: "bound unchanged, for the reason listed",
}
"""What each rule asks of a primitive (docs/primitives.md prints it)."""


def _names(text: str) -> list[str]:
    return text.split()


# rule -> (reason, primitive names). Grouped by what the primitives do.
_GROUPS: dict[Rule, dict[str, str]] = {
    Rule.CONTRACTION: {
        "products summed over the contracting dimensions": (
            "dot_general conv_general_dilated ragged_dot_general"
        ),
    },
    Rule.REDUCTION: {"sums and products of many terms": "reduce_sum reduce_prod"},
    Rule.SCAN: {"running sums, products and logsumexps": "cumsum cumprod cumlogsumexp"},
    Rule.SCATTER: {
        "values added (multiplied) at repeated indices": "scatter-add scatter-sub scatter-mul"
    },
    Rule.WINDOW: {
        "window sums (sum pooling, the transpose of max pooling)": (
            "reduce_window_sum select_and_scatter_add"
        ),
    },
    Rule.COLLECTIVE: {
        "sums across devices": "psum psum_invariant reduce_scatter unreduced_psum",
    },
    Rule.CONVERT: {"dtype conversions": "convert_element_type"},
    Rule.FLOAT: {
        "float arithmetic and transcendentals": (
            "add add_any sub mul div rem pow integer_pow square sqrt rsqrt cbrt exp exp2 expm1 log "
            "log1p logistic tanh sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh erf "
            "erfc erf_inv lgamma digamma polygamma zeta igamma igammac igamma_grad_a "
            "regularized_incomplete_beta bessel_i0e bessel_i1e random_gamma_grad"
        ),
        "linear algebra (heddle.numpy.linalg computes it in float32)": (
            "cholesky eigh eig lu qr svd triangular_solve schur hessenberg tridiagonal "
            "tridiagonal_solve householder_product geqrf geqp3 ormqr cholesky_update "
            "symmetric_product"
        ),
    },
    Rule.EXACT: {
        "values copied bit-exactly": (
            "broadcast_in_dim reshape squeeze transpose rev slice dynamic_slice "
            "dynamic_update_slice gather scatter concatenate pad select_n copy tile split stack "
            "unstack stop_gradient optimization_barrier sharding_constraint reshard mesh_cast "
            "device_put pvary all_gather all_to_all ppermute psend precv axis_index "
            "layout_constraint with_memory_space_constraint pbroadcast real imag conj complex "
            "reduce_precision"
        ),
        "selection: the result is one of the operands' values": (
            "max min clamp reduce_max reduce_min cummax cummin reduce_window_max reduce_window_min "
            "select_and_gather_add sort top_k approx_top_k pmax pmin scatter-max scatter-min "
            "abs neg sign floor ceil round nextafter is_finite"
        ),
        "comparisons and logic: bool results": (
            "eq ne lt le gt ge eq_to lt_to le_to and or xor not reduce_and reduce_or reduce_xor"
        ),
        "integer and bit-level arithmetic": (
            "shift_left shift_right_arithmetic shift_right_logical population_count clz mulhi"
        ),
    },
    Rule.INDEX: {
        "index-producing (JAX's index dtype is kept)": "argmax argmin iota lu_pivots_to_permutation",
        "creation and shapes": "empty empty2 zeros_like broadcast_to dim_as_value dimension_size",
    },
    Rule.MONOID: {
        "a reduction with a body: one operand whose body is add, mul, max or min follows the rule of "
        "reduce_sum, reduce_prod, reduce_max or reduce_min (an init value that is the identity as "
        "the dtype holds it, NaN where it has no zero or infinity, is the identity); any other body "
        "is bound unchanged": "reduce",
    },
    Rule.HIGHER_ORDER: {
        "bodies interpreted under the same rules": (
            "jit pjit closed_call call scan while cond custom_jvp_call custom_vjp_call remat2 "
            "shard_map custom_linear_solve"
        ),
    },
    Rule.PASS: {
        "callbacks run the user's host code on the values as they are": (
            "pure_callback io_callback debug_callback debug_print"
        ),
        "random bits and keys: no float arithmetic": (
            "random_bits random_seed random_split random_fold_in random_wrap random_unwrap "
            "random_clone threefry2x32 threefry4x32 philox2x32 philox4x32 rng_bit_generator "
            "rng_uniform iota_2x32_shape random_gamma"
        ),
        "bit reinterpretation: the bits are the value": "bitcast_convert_type",
        "a user-supplied reduction body (the audit reports one that sums)": (
            "reduce_window select_and_scatter"
        ),
        "linear solves and calls with user-supplied transposes": (
            "linear_call custom_lin custom_vmap_call custom_partitioning"
        ),
        "fft: complex arithmetic, computed as JAX does": "fft",
        "fused kernels that fix their own accumulation (cuDNN, scaled matmuls)": (
            "dot_product_attention_fwd dot_product_attention_bwd dot_product_attention_fwd_wrapper "
            "dot_product_attention_bwd_wrapper dot_product_attention_fp8_fwd "
            "dot_product_attention_fp8_bwd dot_product_attention_fp8_fwd_wrapper "
            "dot_product_attention_fp8_bwd_wrapper scaled_dot scaled_matmul scaled_matmul_wrapper "
            "cudnn_fusion ffi_call composite"
        ),
        "asynchronous halves of collectives, bound as JAX staged them": (
            "all_gather_start all_gather_done all_gather_invariant all_gather_reduced "
            "all_gather_reduced_start all_to_all_start all_to_all_done pbroadcast_start "
            "pbroadcast_done ppermute_start ppermute_done psum_start psum_done psum_invariant_start "
            "reduce_scatter_start reduce_scatter_done unreduced_psum_start unreduced_reduce_scatter "
            "unreduced_reduce_scatter_start ragged_all_to_all preduced reduced_vary_cast_p "
            "vary_unreduced_cast_p"
        ),
        "mutable state, references and boxes: values stored and loaded as they are": (
            "accum_grad_in_ref addupdate box_get box_set empty_ref free_ref freeze get new_box "
            "new_ref swap run_state pin unpin tie create_linear log_extend log_read new_log stage"
        ),
        "calls of exported or already lowered programs": (
            "call_exported call_hi_primitive call_hi_primitive_linearized core_map eval_jaxpr "
            "custom_jvp_call_jaxpr remat_opt"
        ),
        "extended dtypes (keys, custom element types)": "from_edtype to_edtype",
        "multi-process array conversions: data moved as it is": (
            "global_array_to_host_local_array host_local_array_to_global_array"
        ),
        "tokens, effects, state and assertions: no values computed": (
            "after_all create_token check shape_assertion platform_index inspect_sharding "
            "name unreachable dce_sink"
        ),
    },
}

RULES: dict[str, Rule] = {
    name: rule
    for rule, groups in _GROUPS.items()
    for text in groups.values()
    for name in _names(text)
}
"""Primitive name -> its rule."""

REASONS: dict[str, str] = {
    name: reason
    for groups in _GROUPS.values()
    for reason, text in groups.items()
    for name in _names(text)
}
"""Primitive name -> why it has its rule (the group it is listed in)."""

OTHER_VERSIONS: dict[str, str] = {
    "pjit": "jax < 0.7: the name of jit's primitive (pjit_p), renamed jit",
    "mesh_cast": "jax 0.5-0.6 (explicit sharding): a cast between mesh axis types, gone by 0.10 "
    "(reshard)",
    "random_gamma_grad": "jax <= 0.4: a primitive of lax.special; jax 0.10 computes "
    "lax.random_gamma_grad from other primitives",
}
"""Rows for primitives the installed JAX (0.10.2) does not define, kept for the JAX versions that
do: primitive name -> which versions, and what became of it. ``tests/programs/test_table_versions.py``
fails for a row that names neither a primitive of the installed JAX nor an entry here, and for an
entry the installed JAX defines after all."""

ACCUMULATING = frozenset(
    {Rule.CONTRACTION, Rule.REDUCTION, Rule.SCAN, Rule.SCATTER, Rule.WINDOW, Rule.COLLECTIVE}
)
"""The rules of primitives that add up many terms (POLICY.md 5)."""


NARROW_ONLY = frozenset(
    "nextafter reduce_precision ppermute psend precv all_gather all_to_all pbroadcast device_put "
    "pmax pmin scatter scatter-max scatter-min bitcast_convert_type".split()
)
"""Exact primitives whose meaning depends on the dtype they run in (``nextafter``), that round on
purpose (``reduce_precision``) or that move data between devices: always bound on the values, never
on float32 shadows (a shadow would change the answer or double the traffic)."""


def rule(name: str) -> Rule | None:
    """The rule of a primitive name, or None for a primitive the table does not list."""
    return RULES.get(name)


def names(*rules: Rule) -> frozenset[str]:
    """The primitive names that have any of ``rules``."""
    return frozenset(n for n, r in RULES.items() if r in rules)
