"""The one table of JAX primitives: their policy rules, and every other fact heddle's readers of
programs need, read by ``autocast``, by ``audit`` and by ``heddle.autodiff``.

Each primitive JAX can put in a jaxpr has exactly one rule (POLICY.md 4-6 applied to primitives):
``autocast`` rewrites an equation to follow its rule, ``audit`` reports where an equation departs
from it. A primitive that is not in the table is an explicit pass-through: ``autocast`` binds it
unchanged and ``audit`` reports it as ``unclassified``; ``tests/programs/test_table.py`` compares the
table with every primitive the installed JAX defines, so a new one fails the test until it is listed.

Beside its rule a row has its facts (``Fact``: it copies values, it counts ties, it is an exp ...),
the kind of its bodies if it holds jaxprs (``Body``: a jit, a loop, a custom_jvp function ...), the
monoid it is as a reduction's body (``Monoid``) and its index operands. Each reader derives its sets
of primitives from these (``having``, ``kind``, ``holding``, ...) and maps each kind of body to its own
handler; ``tests/programs/test_table_facts.py`` scans the modules that read equations for primitive
names written anywhere but here.
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


class Fact(enum.Enum):
    """Something a reader of programs needs to know about a primitive beyond its rule."""

    COPIES = "copies"
    COUNTS_TIES = "counts_ties"
    ON_VALUES = "on_values"
    DOT = "dot"
    EXP = "exp"
    SUM_OF_EXP = "sum_of_exp"
    PASSES_VALUE = "passes_value"
    RESHAPES = "reshapes"
    KEEPS_ORDER = "keeps_order"
    FROM_FIRST = "from_first"
    SELECTS = "selects"
    OVERWRITES = "overwrites"
    CHOOSES = "chooses"
    IDENTITY = "identity"
    UPDATES = "updates"
    USER_RULE = "user_rule"
    BITS = "bits"
    NAN_ACROSS_DEVICES = "nan_across_devices"
    ROUNDS = "rounds"


FACT_MEANINGS: dict[Fact, str] = {
    Fact.COPIES: "its one result copies values of its operands of the result's dtype: the same "
    "primitive on their exact float32 twins is the result's twin (autocast, heddle.autodiff)",
    Fact.COUNTS_TIES: "a selection whose derivative counts ties in the operand's dtype (a sum): "
    "autocast binds it on the float32 twin of a narrow operand",
    Fact.ON_VALUES: "its meaning depends on the dtype it runs in (nextafter, a bit cast), it rounds "
    "on purpose (reduce_precision) or it moves data between devices: autocast always binds it on "
    "the values, never on float32 shadows (a shadow would change the answer or double the traffic)",
    Fact.DOT: "products of two operands summed over the contracting dimensions its "
    "((contracting), (batch)) dimension numbers name (lax.dot_general): the contraction with "
    "narrow kernels, and heddle.autodiff's float32-tangent contraction",
    Fact.EXP: "an exponential: read by a sum, it is softmax's or logsumexp's (the audit)",
    Fact.SUM_OF_EXP: "the sum of softmax or logsumexp when it reads an exponential (the audit)",
    Fact.PASSES_VALUE: "an exponential's value flows through it on its way to its sum: scaled, "
    "shifted, selected, reshaped (the audit)",
    Fact.RESHAPES: "its result is its one operand's values, reshaped, broadcast or transposed",
    Fact.KEEPS_ORDER: "its result is its one operand's elements in their order (a loop carry "
    "passes through it on its way to its update: the audit)",
    Fact.FROM_FIRST: "its result holds only values of its first operand, moved, not computed on "
    "(a widening read through it can be narrowed back exactly: the audit)",
    Fact.SELECTS: "its result is made of its operands' values, selected, sliced or joined, not "
    "stored into a buffer (the audit)",
    Fact.OVERWRITES: "stores its updates into a buffer operand in place of its values "
    "(x.at[i].set, dynamic_update_slice: the audit)",
    Fact.CHOOSES: "picks each element from one of its operands 1.. by operand 0 (jnp.where: "
    "the audit follows a loop carry into the branch that updates it)",
    Fact.IDENTITY: "each output is the operand in its position, as it is (the audit reads "
    "through it)",
    Fact.UPDATES: "adds, subtracts or multiplies terms into a value (c + x, c * x, "
    "c.at[i].add(x)): a loop carry it updates accumulates (the audit)",
    Fact.USER_RULE: "its derivative is a rule the user wrote for the primal dtypes (custom_vjp): "
    "heddle.autodiff has no float32 version of it",
    Fact.BITS: "reads its operand's bits: its meaning depends on the dtype's width, so "
    "heddle.autodiff has no float32 version of it",
    Fact.NAN_ACROSS_DEVICES: "a max or min across devices, which XLA:CPU's combiner computes "
    "without NaN: autocast and heddle.lax add an exact count of NaN over the same devices",
    Fact.ROUNDS: "rounds its operand to fewer exponent and mantissa bits in the same dtype: an "
    "exact widening of a narrow value read through it is still one (the audit)",
}
"""What each fact says of a primitive (docs/primitives.md prints it)."""

_FACTS: dict[Fact, str] = {
    Fact.COPIES: (
        "abs broadcast_in_dim clamp concatenate copy dynamic_slice dynamic_update_slice gather "
        "max mesh_cast min neg pad reduce_max reduce_min reshape reshard rev select_n "
        "sharding_constraint slice squeeze tile transpose"
    ),
    Fact.COUNTS_TIES: "reduce_max reduce_min cummax cummin reduce_window_max reduce_window_min",
    Fact.ON_VALUES: (
        "nextafter reduce_precision ppermute psend precv all_gather all_to_all pbroadcast "
        "device_put pmax pmin scatter scatter-max scatter-min bitcast_convert_type"
    ),
    Fact.DOT: "dot_general",
    Fact.EXP: "exp exp2",
    Fact.SUM_OF_EXP: "reduce_sum cumsum cumlogsumexp reduce_window_sum psum",
    Fact.PASSES_VALUE: (
        "convert_element_type broadcast_in_dim reshape squeeze transpose copy mul div add sub neg "
        "select_n max min abs stop_gradient"
    ),
    Fact.RESHAPES: "broadcast_in_dim reshape squeeze transpose copy",
    Fact.KEEPS_ORDER: "copy reshape squeeze",
    Fact.FROM_FIRST: (
        "broadcast_in_dim reshape squeeze transpose copy slice rev dynamic_slice gather "
        "reduce_max reduce_min"
    ),
    Fact.SELECTS: "select_n slice rev pad concatenate dynamic_slice gather",
    Fact.OVERWRITES: "scatter dynamic_update_slice",
    Fact.CHOOSES: "select_n",
    Fact.IDENTITY: "optimization_barrier",
    Fact.UPDATES: "add add_any sub mul scatter-add scatter-sub scatter-mul",
    Fact.USER_RULE: "custom_vjp_call custom_lin",
    Fact.BITS: "bitcast_convert_type",
    Fact.NAN_ACROSS_DEVICES: "pmax pmin",
    Fact.ROUNDS: "reduce_precision",
}

FACTS: dict[Fact, frozenset[str]] = {fact: frozenset(_names(t)) for fact, t in _FACTS.items()}
"""Fact -> the primitives it holds for."""


class Body(enum.Enum):
    """The kind of higher-order primitive a primitive with jaxpr parameters is; each reader maps a
    kind to its handler (autocast's evaluator, the audit's walk, heddle.autodiff)."""

    JIT = "jit"
    CALL = "call"
    SCAN = "scan"
    WHILE = "while"
    COND = "cond"
    CUSTOM_JVP = "custom_jvp"
    CUSTOM_VJP = "custom_vjp"
    REMAT = "remat"
    SHARD_MAP = "shard_map"
    LINEAR_SOLVE = "linear_solve"
    REDUCER = "reducer"
    COMBINER = "combiner"


BODY_MEANINGS: dict[Body, str] = {
    Body.JIT: "a jitted call: its body (jaxpr) on its operands, with shardings and layouts",
    Body.CALL: "a plain call: its body (call_jaxpr, closed or open) on its operands",
    Body.SCAN: "a scan: constants, carries and per-step inputs into its body",
    Body.WHILE: "a while loop: a condition and a body over the carries",
    Body.COND: "a conditional: one of its branches on the operands after the index",
    Body.CUSTOM_JVP: "a custom_jvp function: its body and its JVP rule",
    Body.CUSTOM_VJP: "a custom_vjp function: its body, its forward pass and its backward rule",
    Body.REMAT: "jax.checkpoint: its body, recomputed by its policy",
    Body.SHARD_MAP: "shard_map: its body per shard, under its mesh's named axes",
    Body.LINEAR_SOLVE: "a linear solve: matvec and solve bodies, and their transposes",
    Body.REDUCER: "a user-supplied scalar reduction body (lax.reduce, lax.reduce_window): the "
    "primitive follows its rule, the body is not evaluated",
    Body.COMBINER: "a scatter's scalar update combiner: the primitive follows its rule",
}
"""What each kind of body is (docs/primitives.md prints it)."""

_BODIES: dict[Body, str] = {
    Body.JIT: "jit pjit",
    Body.CALL: "closed_call call",
    Body.SCAN: "scan",
    Body.WHILE: "while",
    Body.COND: "cond",
    Body.CUSTOM_JVP: "custom_jvp_call",
    Body.CUSTOM_VJP: "custom_vjp_call",
    Body.REMAT: "remat2",
    Body.SHARD_MAP: "shard_map",
    Body.LINEAR_SOLVE: "custom_linear_solve",
    Body.REDUCER: "reduce reduce_window select_and_scatter",
    Body.COMBINER: "scatter scatter-add scatter-sub scatter-mul scatter-min scatter-max",
}

BODIES: dict[str, Body] = {name: k for k, text in _BODIES.items() for name in _names(text)}
"""Primitive with jaxpr parameters -> the kind of its bodies."""


class Monoid(enum.Enum):
    """What a binary primitive computes as the body of ``lax.reduce``; the value is the primitive of
    the reduction that body makes (a reduce whose body is ``add`` is a ``reduce_sum``)."""

    SUM = "reduce_sum"
    PRODUCT = "reduce_prod"
    MAX = "reduce_max"
    MIN = "reduce_min"


_MONOIDS: dict[Monoid, str] = {
    Monoid.SUM: "add add_any",
    Monoid.PRODUCT: "mul",
    Monoid.MAX: "max",
    Monoid.MIN: "min",
}

MONOIDS: dict[str, Monoid] = {name: m for m, text in _MONOIDS.items() for name in _names(text)}
"""Binary primitive -> the monoid it is as a reduction's body."""

_INDEX_OPERANDS: dict[tuple[int, int | None], str] = {
    (0, 1): "select_n",  # the predicate (or case index)
    (1, 2): "gather scatter scatter-add scatter-sub scatter-mul scatter-min scatter-max",
    (1, None): "dynamic_slice",  # the start indices
    (2, None): "dynamic_update_slice ragged_dot_general",  # its start indices; the group sizes
}

INDEX_OPERANDS: dict[str, tuple[int, int | None]] = {
    name: span for span, text in _INDEX_OPERANDS.items() for name in _names(text)
}
"""Primitive -> the positions (first, end or None: to the last) of its operands that are indices,
not values (the audit skips them when it compares operand dtypes)."""

HEDDLE_FUNCTIONS: dict[str, str] = {
    "dot_general": "heddle.lax.dot_general",
    "conv_general_dilated": "heddle.lax.conv_general_dilated",
    "ragged_dot_general": "heddle.lax.ragged_dot",
    "reduce_sum": "heddle.numpy.sum",
    "reduce_prod": "heddle.numpy.prod",
    "cumsum": "heddle.numpy.cumsum",
    "cumprod": "heddle.numpy.cumprod",
    "scatter-add": "heddle.lax.scatter_add",
    "reduce_window_sum": "heddle.lax.reduce_window",
}
"""Accumulating primitive -> the heddle function that computes it by its rule (a narrow
accumulation the audit reports names it in the fix, unless the call's own function has one)."""


def rule(name: str) -> Rule | None:
    """The rule of a primitive name, or None for a primitive the table does not list."""
    return RULES.get(name)


def names(*rules: Rule) -> frozenset[str]:
    """The primitive names that have any of ``rules``."""
    return frozenset(n for n, r in RULES.items() if r in rules)


def having(*facts: Fact) -> frozenset[str]:
    """The primitive names that have any of ``facts``."""
    return frozenset().union(*(FACTS[f] for f in facts))


def has(name: str, fact: Fact) -> bool:
    """Whether the primitive ``name`` has ``fact``."""
    return name in FACTS[fact]


def facts(name: str) -> frozenset[Fact]:
    """Every fact of the primitive ``name`` (its row's)."""
    return frozenset(f for f, held in FACTS.items() if name in held)


def kind(name: str) -> Body | None:
    """The kind of the primitive's bodies, or None for one without jaxpr parameters."""
    return BODIES.get(name)


def holding(*kinds: Body) -> frozenset[str]:
    """The primitive names whose bodies are of any of ``kinds``."""
    return frozenset(n for n, k in BODIES.items() if k in kinds)


def monoid(name: str) -> Monoid | None:
    """The monoid a binary primitive is as a reduction's body, or None."""
    return MONOIDS.get(name)


def combining(*monoids: Monoid) -> frozenset[str]:
    """The binary primitives that are any of ``monoids`` as a reduction's body."""
    return frozenset(n for n, m in MONOIDS.items() if m in monoids)


def is_index(name: str, position: int) -> bool:
    """Whether operand ``position`` of the primitive ``name`` is an index, not a value."""
    span = INDEX_OPERANDS.get(name)
    if span is None:
        return False
    first, end = span
    return position >= first and (end is None or position < end)
