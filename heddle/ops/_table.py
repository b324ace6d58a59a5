"""The classification of every public name of ``jax.numpy``: one table, read by ``heddle.numpy``.

Each name is either an op (op class + compute plan, see ``_core``) or a deliberate pass-through with
the reason. ``tests/ops/test_coverage.py`` compares this table with ``dir(jax.numpy)``, so a name that
a new JAX adds fails the test until it is classified here.
"""

from __future__ import annotations

from heddle.ops._core import Plan
from heddle.policy._rules import OpClass

A, C, IDX, F, G, S, R = (
    OpClass.ARITHMETIC,
    OpClass.COMPARISON,
    OpClass.INDEX,
    OpClass.FLOAT_ONLY,
    OpClass.INTEGRAL,
    OpClass.SELECTION,
    OpClass.REDUCTION,
)
UP, NAT, ACC, PREF = Plan.UPCAST, Plan.NATIVE, Plan.ACC_DTYPE, Plan.PREFERRED

FIRST = (0,)
FIRST_TWO = (0, 1)
AFTER_SUBSCRIPTS = tuple(range(1, 64))

# name -> (op class, plan, value operands). Names are grouped by what they do.
OPS: dict[str, tuple[OpClass, Plan, tuple[int, ...] | str]] = {
    # arithmetic, computed in float32 for narrow floats and rounded once
    **dict.fromkeys(
        "add subtract multiply maximum minimum power pow remainder mod fmod floor_divide divmod "
        "copysign fmax fmin heaviside gcd lcm kron outer polyadd polysub".split(),
        (A, UP, "all"),
    ),
    # sums of products (a convolution, Horner's rule): integers accumulate in acc_dtype, as matmul
    **dict.fromkeys("polymul polyval".split(), (R, UP, "all")),
    # the same, with static arguments (axis, order, ...) after the value operands
    **dict.fromkeys("diff ediff1d ptp vander".split(), (A, UP, FIRST)),
    "cross": (A, UP, FIRST_TWO),
    # integer-only and bit-level arithmetic: no float path to take
    **dict.fromkeys(
        "bitwise_and bitwise_or bitwise_xor left_shift right_shift bitwise_left_shift "
        "bitwise_right_shift".split(),
        (A, NAT, "all"),
    ),
    # n-ary copies that promote: the conversion is the only rounding
    **dict.fromkeys(
        "concatenate concat stack hstack vstack dstack column_stack".split(), (A, NAT, "seq")
    ),
    "append": (A, NAT, FIRST_TWO),
    "where": (A, NAT, (1, 2)),
    "select": (A, NAT, (2,)),  # and the sequence choicelist (SEQUENCES)
    "clip": (A, NAT, "all"),
    # integrality-preserving: the input dtype
    **dict.fromkeys(
        "negative positive abs absolute sign square ceil floor round around rint trunc conj "
        "conjugate".split(),
        (G, UP, FIRST),
    ),
    **dict.fromkeys("bitwise_not invert bitwise_invert spacing nextafter".split(), (G, NAT, "all")),
    "nan_to_num": (G, NAT, FIRST),  # and nan=, posinf=, neginf= (VALUE_KWARGS)
    # float-only: a float keeps its dtype, an integer becomes the default float
    **dict.fromkeys(
        "exp exp2 expm1 log log10 log1p log2 sqrt cbrt sin cos tan arcsin arccos arctan asin acos "
        "atan sinh cosh tanh arcsinh arccosh arctanh asinh acosh atanh deg2rad degrees rad2deg "
        "radians divide true_divide hypot arctan2 atan2 logaddexp logaddexp2 sinc i0 float_power "
        "reciprocal fabs polydiv angle modf".split(),
        (F, UP, "all"),
    ),
    # float-only with static arguments after the value operands
    **dict.fromkeys(
        "unwrap average median nanmedian percentile nanpercentile quantile nanquantile "
        "polyder polyint roots poly frexp ldexp sort_complex".split(),
        (F, UP, FIRST),
    ),
    "gradient": (F, UP, "all"),  # the spacings (*varargs) combine with f
    **dict.fromkeys("corrcoef cov trapezoid polyfit".split(), (F, UP, FIRST_TWO)),
    "interp": (F, UP, (0, 1, 2)),
    # float-only and accumulating, with a dtype= argument
    **dict.fromkeys("mean var std nanmean nanvar nanstd".split(), (F, ACC, FIRST)),
    # sums, products and scans: accumulate in acc_dtype, integers return it
    **dict.fromkeys(
        "sum prod cumsum cumprod cumulative_sum cumulative_prod nansum nanprod nancumsum nancumprod "
        "trace".split(),
        (R, ACC, FIRST),
    ),
    # contractions: preferred_element_type = acc_dtype
    **dict.fromkeys(
        "matmul dot vdot inner tensordot vecdot convolve correlate".split(),
        (R, PREF, FIRST_TWO),
    ),
    # contractions without a preferred_element_type: operands upcast to the accumulation dtype
    **dict.fromkeys("matvec vecmat".split(), (R, UP, FIRST_TWO)),
    "einsum": (R, PREF, AFTER_SUBSCRIPTS),
    # comparisons and predicates: bool
    **dict.fromkeys(
        "equal not_equal less less_equal greater greater_equal logical_and logical_or logical_xor "
        "isclose allclose array_equal array_equiv isin".split(),
        (C, NAT, FIRST_TWO),
    ),
    **dict.fromkeys(
        "logical_not isnan isinf isfinite isneginf isposinf isreal iscomplex signbit all any".split(),
        (C, NAT, FIRST),
    ),
    # index-producing: int32
    **dict.fromkeys(
        "argmax argmin argsort argpartition nanargmax nanargmin argwhere nonzero flatnonzero "
        "count_nonzero lexsort".split(),
        (IDX, NAT, FIRST),
    ),
    **dict.fromkeys("searchsorted digitize".split(), (IDX, NAT, FIRST_TWO)),
    # selections whose transpose sums (a gather's repeated indices, ...): copied from the exact
    # float32 copy of a narrow float and rounded back exactly, so the sum of their cotangents runs
    # in float32 under any jax.grad (the convert's transpose widens the cotangent first); XLA fuses
    # the conversions into the copy
    **dict.fromkeys(
        "take take_along_axis diagonal diag diagflat broadcast_to repeat tile resize max min amax "
        "amin nanmax nanmin pad".split(),
        (S, UP, FIRST),
    ),
    # one output per operand, each in that operand's own dtype (OWN_DTYPES): no promotion
    **dict.fromkeys("broadcast_arrays meshgrid".split(), (S, UP, "all")),
    "compress": (S, UP, (1,)),
    "extract": (S, UP, (1,)),
    # copies that write values into an array: n-ary, so they promote (as append and concatenate);
    # a scalar value is broadcast to its slots and its cotangents summed in float32
    **dict.fromkeys("put place insert put_along_axis".split(), (S, UP, (0, 2))),
    "fill_diagonal": (S, UP, FIRST_TWO),
}

# Value operands passed by name (or at a later position): they take part in promotion and are
# converted like the positional ones. ``tests/ops/test_value_operands.py`` reads every op's
# jax.numpy signature: each parameter that takes arrays is a value operand or in NOT_VALUES.
VALUE_KWARGS: dict[str, tuple[str, ...]] = {
    "diff": ("prepend", "append"),
    "ediff1d": ("to_end", "to_begin"),
    "nan_to_num": ("nan", "posinf", "neginf"),
    "unwrap": ("discont", "period"),
    "average": ("weights",),
    **dict.fromkeys("percentile nanpercentile quantile nanquantile".split(), ("weights",)),
    "polyint": ("k",),
    "cov": ("aweights",),
    "trapezoid": ("dx",),
    "polyfit": ("w",),
    "interp": ("left", "right", "period"),
    **dict.fromkeys("var std nanvar nanstd".split(), ("mean",)),
    **dict.fromkeys(
        "sum prod nansum nanprod max min amax amin nanmax nanmin".split(), ("initial",)
    ),
    "select": ("default",),
    "pad": ("constant_values", "end_values"),
}

# Hyper-parameters that take arrays: not value operands (NOT_VALUES says why), used at the compute
# dtype (a narrow float array widened exactly, a Python scalar unrounded), as JAX uses a Python one.
HYPER_PARAMS: dict[str, tuple[str, ...]] = dict.fromkeys(
    "percentile nanpercentile quantile nanquantile".split(), ("q",)
)

# Ops whose value operands never meet: operand i is resolved, converted (to its own float32 copy,
# for a narrow float) and rounded back exactly on its own, and output i keeps operand i's dtype and
# bits, as in jax.numpy; a Python scalar among them takes its kind's default, as it would alone.
OWN_DTYPES = frozenset("broadcast_arrays meshgrid".split())

# name -> position of an argument that is a sequence of value operands
SEQUENCES: dict[str, int] = {"select": 1}

# Parameters that take arrays but are not value operands: "param" for every op, "op.param" for one.
NOT_VALUES: dict[str, str] = {
    "where": "a bool mask choosing the elements, not a value",
    "condition": "a bool mask choosing the operand, not a value",
    "condlist": "bool masks choosing the operand, not values",
    "fill_value": "fills the index output of the size= form, not a value of the result",
    "out_sharding": "a sharding, not a value",
    "_dot_general": "a function, not a value",
    "out": "JAX does not support out=",
    "sorter": "integer indices into the sorted array",
    "method": "the name of an algorithm",
    "trace.offset": "the diagonal offset, an integer",
    "pad.pad_width": "integer widths, not values",
    "insert.obj": "integer positions, not values",
    "put.ind": "integer positions, not values",
    "take.indices": "integer positions, not values",
    "take_along_axis.indices": "integer positions, not values",
    "repeat.repeats": "integer repeat counts, not values",
    "put_along_axis.indices": "integer positions, not values",
    "place.mask": "a bool mask choosing the elements, not a value",
    "ldexp.x2": "the integer exponent: ldexp(x, 3) is x * 2**3 in x's dtype",
    "cov.fweights": "integer repeat counts of the observations",
    "isclose.rtol": "a tolerance (hyper-parameter) applied in the operands' dtype",
    "isclose.atol": "a tolerance (hyper-parameter) applied in the operands' dtype",
    "allclose.rtol": "a tolerance (hyper-parameter) applied in the operands' dtype",
    "allclose.atol": "a tolerance (hyper-parameter) applied in the operands' dtype",
    "linalg.cond.p": "the order of the norm",
    **{
        f"{name}.q": "the probabilities, a hyper-parameter used at the compute dtype, as JAX uses a"
        " Python q (rounded to bfloat16, 0.3 is 0.30078125 and picks other order statistics)"
        for name in HYPER_PARAMS
    },
    "linalg.cross.axis": "the axis, an integer",
}

# Counting and index grids (heddle/ops/_counting.py: COUNTING) are neither ops nor pass-throughs.

# Names with no dtype decision, each with the reason it passes through unchanged.
PASS_REASONS = {
    "selection": (
        "values are copied bit-exactly, each read into at most one output slot (so the backward "
        "pass adds nothing), the result has the input's dtype",
        "reshape transpose flip fliplr flipud roll squeeze expand_dims ravel "
        "moveaxis swapaxes rollaxis rot90 matrix_transpose permute_dims "
        "atleast_1d atleast_2d atleast_3d split array_split hsplit vsplit dsplit unstack "
        "tril triu trim_zeros delete copy "
        "piecewise block real imag "
        "bitwise_count packbits unpackbits ix_",
    ),
    "permutations": (
        "values are copied bit-exactly and each input value lands in exactly one output slot, so "
        "the backward scatter-add gives every slot one cotangent (no sum)",
        "sort partition",
    ),
    "metadata": (
        "returns shapes, flags or dtype facts, not arrays",
        "shape ndim size isscalar iscomplexobj isrealobj isdtype issubdtype iterable can_cast "
        "broadcast_shapes einsum_path get_printoptions printoptions set_printoptions",
    ),
    "user functions": (
        "applies the user's own function; the ops inside it carry the policy",
        "vectorize apply_along_axis apply_over_axes frompyfunc fromfunction",
    ),
    "masks": ("a 0/1 lower-triangular mask: no arithmetic", "tri"),
    "i/o": (
        "reads or writes files and buffers",
        "save savez load frombuffer fromfile fromiter fromstring from_dlpack",
    ),
    "index helpers": (
        "slicing helpers and constants",
        "c_ r_ s_ mgrid ogrid index_exp newaxis e pi inf nan euler_gamma",
    ),
}

PASS: dict[str, str] = {
    name: f"{group}: {reason}"
    for group, (reason, names) in PASS_REASONS.items()
    for name in names.split()
}
