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
        "copysign fmax fmin heaviside gcd lcm kron outer polyadd polysub polymul polyval".split(),
        (A, UP, "all"),
    ),
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
    "clip": (A, NAT, "all"),
    # integrality-preserving: the input dtype
    **dict.fromkeys(
        "negative positive abs absolute sign square ceil floor round around rint trunc conj "
        "conjugate".split(),
        (G, UP, FIRST),
    ),
    **dict.fromkeys(
        "bitwise_not invert bitwise_invert nan_to_num spacing nextafter".split(), (G, NAT, "all")
    ),
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
        "unwrap median nanmedian gradient polyder polyint roots poly frexp ldexp "
        "sort_complex".split(),
        (F, UP, FIRST),
    ),
    # weights are value operands: they are summed with a (in float32)
    "average": (F, UP, (0, 2)),
    # q is a value operand too (JAX promotes it with a): nanquantile counts the non-NaN values in
    # its dtype, so a narrow q would count in bfloat16
    **dict.fromkeys("percentile nanpercentile quantile nanquantile".split(), (F, UP, FIRST_TWO)),
    **dict.fromkeys("corrcoef trapezoid polyfit".split(), (F, UP, FIRST_TWO)),
    "cov": (F, UP, (0, 1, 6)),  # m, y and aweights (fweights are integer repeat counts)
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
    **dict.fromkeys("broadcast_arrays meshgrid".split(), (S, UP, "all")),
    "compress": (S, UP, (1,)),
    "extract": (S, UP, (1,)),
    # copies that write values into an array: n-ary, so they promote (as append and concatenate);
    # a scalar value is broadcast to its slots and its cotangents summed in float32
    **dict.fromkeys("put place insert put_along_axis".split(), (S, UP, (0, 2))),
    "fill_diagonal": (S, UP, FIRST_TWO),
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
        "select piecewise block real imag "
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
    "bin edges": (
        "evenly spaced edges in the input's float dtype from its min and max (selections); no sum",
        "histogram_bin_edges",
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
