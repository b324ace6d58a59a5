"""Policy versions of ``jax.numpy.linalg`` and ``jax.numpy.fft``: the namespaces ``linalg`` and ``fft``.

Decompositions, solvers, norms and transforms on narrow floats run in the accumulation dtype
(float32; complex64 for transforms) and round once; an integer input becomes the policy's default
float, where JAX would make it float64 under ``jax_enable_x64``. A real output takes the input's float
dtype, a complex output the narrowest complex that holds it (``fft`` of bfloat16 is complex64), an
integer output (``matrix_rank``, ``lstsq``'s rank) the index dtype. Contractions (``matmul``,
``vecdot``, ``tensordot``) use ``preferred_element_type`` like ``heddle.numpy.matmul``. Float32 work
runs its contractions at full float32 precision unless the policy says otherwise.

``LINALG`` and ``FFT`` classify every public name, as data. ``heddle.numpy`` exposes the two namespaces
as ``heddle.numpy.linalg`` and ``heddle.numpy.fft``.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from heddle.ops import _core
from heddle.ops._core import OpSpec, Plan
from heddle.ops._nn import float_op, precision_scope
from heddle.ops._scalars import materialise
from heddle.ops.lowering import cast
from heddle.policy import _dtypes as D
from heddle.policy import _rules, _scalars
from heddle.policy._policy import active
from heddle.policy._rules import OpClass

A, F, R = OpClass.ARITHMETIC, OpClass.FLOAT_ONLY, OpClass.REDUCTION

# name -> (op class, value operands, hyper-parameters): computed in acc_dtype, outputs rounded once.
LINALG_FLOAT: dict[str, tuple[OpClass, tuple[str, ...], tuple[str, ...]]] = {
    **dict.fromkeys(
        "cholesky det eig eigh eigvals eigvalsh inv qr slogdet svd tensorinv".split(),
        (F, ("a",), ()),
    ),
    "solve": (F, ("a", "b"), ()),
    "tensorsolve": (F, ("a", "b"), ()),
    "lstsq": (F, ("a", "b"), ("rcond",)),
    "pinv": (F, ("a",), ("rtol", "rcond")),
    "svdvals": (F, ("x",), ()),
    "cond": (F, ("x",), ()),
    # norms are reductions whose result is float: computed in float32, rounded once
    **dict.fromkeys("norm matrix_norm vector_norm".split(), (F, ("x",), ())),
    # a count: computed on the float values (a float op), its integer output in the index dtype
    "matrix_rank": (F, ("M",), ("rtol", "tol")),
}

# name -> (op class, plan, value positions), built with heddle.numpy's own mechanism.
LINALG_OPS: dict[str, tuple[OpClass, Plan, tuple[int, ...]]] = {
    **dict.fromkeys("matmul vecdot tensordot".split(), (R, Plan.PREFERRED, (0, 1))),
    "trace": (R, Plan.ACC_DTYPE, (0,)),
    **dict.fromkeys("outer cross".split(), (A, Plan.UPCAST, (0, 1))),
    # a copy from the exact float32 copy, so its backward sums in float32 (heddle.numpy.diagonal)
    "diagonal": (OpClass.SELECTION, Plan.UPCAST, (0,)),
}

LINALG_SPECIAL = {
    "multi_dot": "a chain of contractions: every product in acc_dtype, rounded once at the end",
    "matrix_power": "repeated products: computed in acc_dtype, rounded once at the end",
}

LINALG_PASS = {
    "matrix_transpose": "selection: values copied bit-exactly",
}

FFT_TRANSFORMS = tuple(
    "fft ifft fft2 ifft2 fftn ifftn rfft irfft rfft2 irfft2 rfftn irfftn hfft ihfft".split()
)
FFT_FREQ = ("fftfreq", "rfftfreq")
FFT_PASS = {
    "fftshift": "selection: a roll, values copied bit-exactly",
    "ifftshift": "selection: a roll, values copied bit-exactly",
}


def _contraction_chain(fn: Callable[..., Any], name: str, seq: bool) -> Callable[..., Any]:
    """multi_dot / matrix_power: operands to acc_dtype, contract there, round once."""

    sig = inspect.signature(fn)
    first = next(iter(sig.parameters))

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> jax.Array:
        p = active()
        bound = sig.bind(*args, **kwargs)
        operands = tuple(bound.arguments[first]) if seq else (bound.arguments[first],)
        common = _scalars.resolve(operands, p)
        result, acc = _rules.reduction_dtypes(common, None, p)
        for d in {result, acc}:
            D.require_available(d, f"heddle.numpy.linalg.{name}")
        vals = [cast(materialise(v, common), acc) for v in operands]
        bound.arguments[first] = vals if seq else vals[0]
        with precision_scope(acc, p):
            out = fn(*bound.args, **bound.kwargs)
        return cast(out, result)

    return op


def _freq(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fftfreq / rfftfreq: the policy's default float unless ``dtype`` says otherwise."""

    @functools.wraps(fn)
    def op(n: int, d: Any = 1.0, *, dtype: Any = None, **kwargs: Any) -> jax.Array:
        p = active()
        want = p.default_float if dtype is None else D.dtype(dtype)
        comp = _core.compute_dtype(want, p)
        for x in {want, comp}:
            D.require_available(x, f"heddle.numpy.fft.{name}")
        spacing = cast(d, comp) if hasattr(d, "dtype") else d
        return cast(fn(n, spacing, dtype=comp, **kwargs), want)

    return op


def _doc(qual: str, how: str, jfn: Callable[..., Any]) -> str:
    return (
        f"heddle's policy version of ``jax.numpy.{qual}``.\n\n"
        f"Dtypes: {how} (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.numpy.{qual}.\n  **kwargs: as for jax.numpy.{qual}.\n\n"
        f"Returns:\n  The result of jax.numpy.{qual} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.numpy as hnp\n  >>> hnp.{qual}  # doctest: +ELLIPSIS\n"
        f"  <function ...>\n\n"
        f"Original documentation follows.\n\n{jfn.__doc__ or ''}"
    )


_FLOAT_HOW = (
    "a float input keeps its dtype (complex outputs: the narrowest complex holding it; integer "
    "outputs: the index dtype); an integer input gives the default float; computed in the "
    "accumulation dtype (float32 for narrow floats) and rounded once"
)
_HOW = {
    Plan.PREFERRED: "float: the promotion of the inputs; integer/bool: the accumulation dtype; "
    "accumulates in acc_dtype via preferred_element_type, rounded once",
    Plan.ACC_DTYPE: "float: the input dtype; integer/bool: the accumulation dtype; accumulates "
    "in acc_dtype, rounded once",
    Plan.UPCAST: "the promotion of the inputs; computed in float32 for narrow floats, rounded once",
}


def _namespace(name: str, doc: str, members: dict[str, Any]) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__dict__.update(members)
    mod.__all__ = sorted(members)
    return mod


def _build_linalg() -> types.ModuleType:
    src = jnp.linalg
    members: dict[str, Any] = {}
    for name, (op_class, values, params) in LINALG_FLOAT.items():
        jfn = getattr(src, name)
        op = float_op(
            jfn,
            f"numpy.linalg.{name}",
            op_class=op_class,
            values=values,
            params=params,
            matmul=True,
        )
        op.__doc__ = _doc(f"linalg.{name}", _FLOAT_HOW, jfn)
        members[name] = op
    for name, (op_class, plan, values) in LINALG_OPS.items():
        jfn = getattr(src, name)
        op = _core.make_op(f"linalg.{name}", OpSpec(jfn, op_class, plan, values))
        op.__doc__ = _doc(f"linalg.{name}", _HOW[plan], jfn)
        members[name] = op
    for name in LINALG_SPECIAL:
        jfn = getattr(src, name)
        op = _contraction_chain(jfn, name, seq=name == "multi_dot")
        op.__doc__ = _doc(f"linalg.{name}", LINALG_SPECIAL[name], jfn)
        members[name] = op
    members.update({n: getattr(src, n) for n in LINALG_PASS})
    return _namespace(
        "heddle.numpy.linalg", "``jax.numpy.linalg`` under heddle's dtype policy.", members
    )


def _build_fft() -> types.ModuleType:
    src = jnp.fft
    members: dict[str, Any] = {}
    how = (
        "real input: computed in complex64 for narrow floats (complex128 for float64); a complex "
        "output is the narrowest complex holding the input's float dtype, a real output (irfft, "
        "hfft) that float dtype; an integer input counts as the default float"
    )
    for name in FFT_TRANSFORMS:
        jfn = getattr(src, name)
        op = float_op(jfn, f"numpy.fft.{name}", values=("a",))
        op.__doc__ = _doc(f"fft.{name}", how, jfn)
        members[name] = op
    for name in FFT_FREQ:
        jfn = getattr(src, name)
        op = _freq(jfn, name)
        op.__doc__ = _doc(
            f"fft.{name}",
            "``dtype``, default the policy's default float; computed in float32 for narrow "
            "dtypes, rounded once",
            jfn,
        )
        members[name] = op
    members.update({n: getattr(src, n) for n in FFT_PASS})
    return _namespace("heddle.numpy.fft", "``jax.numpy.fft`` under heddle's dtype policy.", members)


linalg = _build_linalg()
fft = _build_fft()
# ``import heddle.numpy.linalg`` works as ``import jax.numpy.linalg`` does
sys.modules.setdefault("heddle.numpy.linalg", linalg)
sys.modules.setdefault("heddle.numpy.fft", fft)
