"""The classification of every public name of ``jax.scipy`` beyond ``special``: one table per module.

``TABLES`` maps each module of ``jax.scipy`` (by its path below ``jax.scipy``: ``"linalg"``,
``"cluster.vq"``, ...) to its names, and each name to one rule:

- ``Compute``: JAX's own function runs in the accumulation dtype (float32 for narrow floats) and every
  output is rounded once (``heddle.ops._float_op.float_op``). ``values`` are the parameters that are
  value operands (they take part in promotion and are converted with heddle's cast); ``params`` are
  numeric hyper-parameters (an array is converted to the compute dtype's real part, a Python scalar
  passes unrounded); ``op_class`` fixes the result dtype (POLICY.md 4).
- ``Own``: a heddle function or class of the same name in ``heddle/scipy/_own.py``, for the names
  whose arguments ``Compute`` cannot describe (a ``(c, lower)`` tuple, a sequence of coordinate
  arrays, a callable operator), creation functions, counts, and JAX's classes that compute.
- ``Pass``: JAX's object, re-exported unchanged, with the reason.

Submodules (``cluster.vq``, ``sparse.linalg``, ``spatial.transform``, the distributions of
``stats``) are modules here as in JAX. The distributions of ``jax.scipy.stats`` are in
``DISTRIBUTIONS`` (``norm`` and ``logistic``: ``heddle.ops._special.STATS``), ``jax.scipy.special``
in ``heddle.ops._special``. ``tests/scipy/test_ns_scipy.py`` compares all of them with the
installed ``jax.scipy``, so a name a new JAX adds fails there until it is classified here.
"""

from __future__ import annotations

import dataclasses

from heddle.policy._rules import OpClass

A, F, S = OpClass.ARITHMETIC, OpClass.FLOAT_ONLY, OpClass.SELECTION


@dataclasses.dataclass(frozen=True)
class Compute:
    """JAX's function in the accumulation dtype, its outputs rounded once (``float_op``).

    Attributes:
      values: the parameters that are value operands.
      params: numeric hyper-parameters (not in promotion; an array goes to the compute dtype).
      op_class: fixes the result dtype from the value operands (POLICY.md 4).
      matmul: whether the function contracts (run at the policy's float32 matmul precision).
    """

    values: tuple[str, ...]
    params: tuple[str, ...] = ()
    op_class: OpClass = F
    matmul: bool = False


@dataclasses.dataclass(frozen=True)
class Own:
    """A function or class of ``heddle/scipy/_own.py`` with JAX's name and arguments.

    Attributes:
      how: what it does about dtypes, for its docstring and the docs.
    """

    how: str


@dataclasses.dataclass(frozen=True)
class Pass:
    """JAX's object, unchanged.

    Attributes:
      reason: why it has no policy version.
    """

    reason: str


Rule = Compute | Own | Pass

_CREATED_FLOAT = (
    "the policy's default float (float32; JAX gives float64 under jax_enable_x64): JAX's values "
    "rounded once to it"
)

LINALG: dict[str, Rule] = {
    # decompositions, solvers and matrix functions: float-only, computed in float32 for narrow
    # floats; complex outputs (schur(output="complex"), sqrtm, funm, rsf2csf) are the narrowest
    # complex holding the input's float dtype, integer outputs (lu_factor's pivots) int32
    **dict.fromkeys(
        "cholesky det hessenberg inv lu lu_factor polar qr schur svd".split(),
        Compute(("a",), matmul=True),
    ),
    **dict.fromkeys("expm sqrtm".split(), Compute(("A",), matmul=True)),
    "funm": Compute(("A",), matmul=True),  # func: the user's function, applied in float32
    "expm_frechet": Compute(("A", "E"), matmul=True),
    "eigh": Compute(("a", "b"), matmul=True),
    "eigh_tridiagonal": Compute(("d", "e"), matmul=True),
    "qr_multiply": Compute(("a", "c"), matmul=True),
    "rsf2csf": Compute(("T", "Z"), matmul=True),
    "solve": Compute(("a", "b"), matmul=True),
    "solve_triangular": Compute(("a", "b"), matmul=True),
    "solve_sylvester": Compute(("A", "B", "C"), matmul=True),
    "cho_factor": Own(
        "float-only: the factor computed in float32 for narrow floats and rounded once; "
        "``lower`` returned as given"
    ),
    "cho_solve": Own(
        "float-only: the promotion of the factor and ``b``, solved in float32 for narrow floats "
        "and rounded once"
    ),
    "lu_solve": Own(
        "float-only: the promotion of the LU factor and ``b`` (the pivots are integer positions), "
        "solved in float32 for narrow floats and rounded once"
    ),
    # arithmetic on the entries: companion matrices divide (float-only), fiedler subtracts
    **dict.fromkeys("companion fiedler_companion".split(), Compute(("a",))),
    "fiedler": Compute(("a",), op_class=A),
    # copies
    "circulant": Compute(("c",), op_class=S),
    "convolution_matrix": Compute(("a",), op_class=S),
    **dict.fromkeys("hankel toeplitz".split(), Compute(("c", "r"), op_class=A)),
    "leslie": Compute(("f", "s"), op_class=A),
    "block_diag": Own(
        "the promotion of all the blocks (an n-ary copy: the conversion is the only rounding)"
    ),
    # creation
    **dict.fromkeys("helmert hilbert invhilbert invpascal pascal".split(), Own(_CREATED_FLOAT)),
    "dft": Own(
        "``dtype``, default the policy's default complex (complex64; JAX gives complex128 under "
        "jax_enable_x64)"
    ),
    "hadamard": Own(
        "``dtype``, default the policy's default int (int32; JAX gives int64 under "
        "jax_enable_x64); computed in float32 for a narrow float ``dtype`` (the entries are +-1)"
    ),
}
"""``jax.scipy.linalg``."""

_SPECTRAL_PARAMS = ("fs", "window")  # the sampling rate and a window given as an array

SIGNAL: dict[str, Rule] = {
    # contractions, float-only as in JAX (an integer input gives the default float): narrow
    # floats accumulate in float32 (the whole convolution runs there) and round once
    **dict.fromkeys("convolve correlate".split(), Compute(("in1", "in2"), matmul=True)),
    **dict.fromkeys(
        "convolve2d correlate2d".split(), Compute(("in1", "in2"), ("fillvalue",), matmul=True)
    ),
    # FFT-based: float-only, complex64 inside for narrow floats (JAX's FFT takes no narrow float)
    "fftconvolve": Compute(("in1", "in2")),
    "csd": Compute(("x", "y"), _SPECTRAL_PARAMS),
    **dict.fromkeys("stft welch".split(), Compute(("x",), _SPECTRAL_PARAMS)),
    "istft": Compute(("Zxx",), _SPECTRAL_PARAMS),
    "detrend": Compute(("data",), matmul=True),  # a least-squares fit
}
"""``jax.scipy.signal``."""

FFT: dict[str, Rule] = dict.fromkeys("dct dctn idct idctn".split(), Compute(("x",)))
"""``jax.scipy.fft``: as ``heddle.numpy.fft``, a narrow float computes in float32 (JAX's FFT takes
no narrow float) and the real output is rounded once to the input's dtype."""

STATS: dict[str, Rule] = {
    "sem": Compute(("a",)),
    "mode": Own(
        "the modal values in the input dtype (copied bit-exactly); the counts int32, the index "
        "dtype (JAX: int64 under jax_enable_x64)"
    ),
    "rankdata": Own(
        "ranks in the policy's float for integer inputs (float32; JAX: its default float, float64 "
        "under jax_enable_x64), whatever the input dtype: ranks are counts, exact below 2**24"
    ),
    "gaussian_kde": Own(
        "a float dataset keeps its dtype as the result dtype of the methods (an integer one gives "
        "the default float); the estimator's state is held and every method computes in the "
        "accumulation dtype (float32 for narrow floats), each output rounded once"
    ),
}
"""``jax.scipy.stats``' functions (its distributions: ``DISTRIBUTIONS``)."""

DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "bernoulli": ("k", "q", "p", "loc"),
    "beta": ("x", "a", "b", "loc", "scale"),
    "betabinom": ("k", "n", "a", "b", "loc"),
    "binom": ("k", "n", "p", "loc"),
    "cauchy": ("x", "q", "loc", "scale"),
    "chi2": ("x", "df", "loc", "scale"),
    "dirichlet": ("x", "alpha"),
    "expon": ("x", "q", "loc", "scale"),
    "gamma": ("x", "a", "loc", "scale"),
    "gennorm": ("x", "beta"),
    "geom": ("k", "p", "loc"),
    "gumbel_l": ("x", "p", "loc", "scale"),
    "gumbel_r": ("x", "p", "loc", "scale"),
    "laplace": ("x", "loc", "scale"),
    "multinomial": ("p",),  # x and n: integer counts (JAX requires them integer), not values
    "multivariate_normal": ("x", "mean", "cov"),
    "nbinom": ("k", "n", "p", "loc"),
    "pareto": ("x", "q", "b", "loc", "scale"),
    "poisson": ("k", "mu", "loc"),
    "t": ("x", "df", "loc", "scale"),
    "truncnorm": ("x", "a", "b", "loc", "scale"),
    "uniform": ("x", "q", "loc", "scale"),
    "vonmises": ("x", "kappa"),
    "wrapcauchy": ("x", "c"),
}
"""``jax.scipy.stats`` distributions (besides ``norm`` and ``logistic``, classified in
``heddle.ops._special.STATS``): the value operands of their functions, by name. Every function of
a distribution is float-only: the promotion of the value operands it has (an integer count ``k``
meeting a bfloat16 ``p`` is converted to bfloat16, as in any heddle op), computed in float32 for
narrow floats, rounded once."""

DISTRIBUTION_STATIC: dict[str, str] = {
    "allow_singular": "multivariate_normal.logpdf's flag, not a value",
}
"""Parameters of distribution functions that are not value operands, with the reason."""

DISTRIBUTION_MATMUL = frozenset({"multivariate_normal"})
"""Distributions whose functions contract (a Cholesky solve)."""

_SOLVER = Own(
    "float-only: the promotion of ``b``, ``x0`` and of ``A`` and ``M`` where they are arrays (a "
    "callable operator is the user's function and receives float32 vectors for narrow floats); "
    "the iteration runs in float32 for narrow floats, the solution is rounded once"
)

TABLES: dict[str, dict[str, Rule]] = {
    "cluster.vq": {"vq": Compute(("obs", "code_book"))},  # codes: int32 (the index dtype)
    "fft": FFT,
    "integrate": {"trapezoid": Compute(("y", "x", "dx"))},  # a sum: float32 for narrow floats
    "interpolate": {
        "RegularGridInterpolator": Own(
            "the promotion of ``values`` and ``fill_value`` (float-only); the grid and the "
            "query points are coordinates, converted to the accumulation dtype; the weighted sums "
            "run in the accumulation dtype (float32 for narrow floats), rounded once"
        )
    },
    "linalg": LINALG,
    "ndimage": {
        "map_coordinates": Own(
            "the promotion of ``input`` and ``cval`` (an integer input stays integer, rounded "
            "half away from zero as in JAX); coordinates converted to the accumulation dtype; "
            "the interpolation runs in float32 for narrow floats and integers, rounded once"
        )
    },
    "optimize": {
        # the user's function receives float32 arguments for a narrow x0; the result's arrays are
        # rounded once (x, fun, jac, hess_inv), its counts int32
        "minimize": Compute(("x0",)),
        "OptimizeResults": Pass("a NamedTuple of results, no arithmetic"),
    },
    "signal": SIGNAL,
    "sparse.linalg": dict.fromkeys("bicgstab cg gmres".split(), _SOLVER),
    "spatial.transform": {
        "Rotation": Pass(
            "a class of rotations: its constructors and methods compute in the dtype of the "
            "quaternion it is built from (build it from float32 data to compute in float32)"
        ),
        "Slerp": Pass("a class interpolating Rotations: computes in their quaternions' dtype"),
    },
    "stats": STATS,
}
"""Every module of ``jax.scipy`` with functions (besides ``special`` and the distributions): its
names and their rules. Modules holding only submodules (``cluster``, ``sparse``, ``spatial``) have
no table."""
