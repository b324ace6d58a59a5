"""Mixed-precision training policies: the dtypes parameters are stored in, computed in and returned in.

A ``Precision`` names three dtypes. The parameters (the float32 *master weights* in mixed precision)
are stored and updated at ``param_dtype``; the forward pass runs on a copy cast to ``compute_dtype``;
the model's outputs (logits, the loss) are cast to ``output_dtype``. Gradients with respect to the
parameters have ``grad_dtype(param_dtype)`` (float32 for float32 masters), and so does optimiser state
built from them, so a small update is never rounded away by a narrow weight.

The casts touch real floating leaves only: integer, bool and complex leaves, and leaves that are not
arrays (Python numbers, functions, strings), are returned as they are, and so is every node whose
class sets ``__heddle_keep_dtypes__ = True`` (the loss-scale states of ``heddle.scaling``, whose
float32 scale a cast of a whole train state to float16 would otherwise change) and every optax
optimiser state (its moments and hyperparameters keep the optimiser's dtypes). Every cast goes
through heddle's correctly rounded ``astype`` (POLICY.md 6), so a float64 master rounds once to
bfloat16.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, ClassVar

import jax
import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy._casts import astype
from heddle.policy._errors import UnknownDTypeError, message

_FIELDS = ("param_dtype", "compute_dtype", "output_dtype")
_CANONICAL_KEYS = {"param_dtype": "params", "compute_dtype": "compute", "output_dtype": "output"}
_KEYS = {
    "params": "param_dtype",
    "param": "param_dtype",
    "p": "param_dtype",
    "compute": "compute_dtype",
    "c": "compute_dtype",
    "output": "output_dtype",
    "out": "output_dtype",
    "o": "output_dtype",
}
_PRESETS = {
    "float32": ("float32", "float32", "float32"),
    "mixed_bfloat16": ("float32", "bfloat16", "float32"),
    "mixed_float16": ("float32", "float16", "float32"),
}
_FLOATS = frozenset(d for d in D.DTYPES if D.kind(d) == "f")
_F32 = np.dtype("float32")
_FLOAT_NAMES = sorted(
    {n for n in [*D.ALIASES, *(d.name for d in D.DTYPES)] if D.dtype(n) in _FLOATS}
)
_JMP_WORDS = {"full": "float32", "half": "bfloat16"}  # jmp's names, made explicit
_JMP_WHY = {
    "full": "'full' is jmp's name for float32; heddle asks for the dtype by name",
    "half": "'half' is platform-dependent in jmp (float16 on GPU, bfloat16 on TPU); heddle asks "
    "for the dtype by name",
}


def _spec(dtypes: tuple[np.dtype | str, ...]) -> str:
    names = (D.dtype(d).name for d in dtypes)
    return ",".join(f"{_CANONICAL_KEYS[f]}={n}" for f, n in zip(_FIELDS, names, strict=True))


def _closest(word: str, choices: list[str], default: str) -> str:
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return found[0] if found else default


def _float_dtype(value: Any, what: str) -> np.dtype:
    """Parses one dtype of a Precision; refuses anything that is not a real float of the policy."""
    word = value.strip().lower() if isinstance(value, str) else None
    if word in _JMP_WORDS:  # as Precision.parse does: jmp's words, not NumPy's "half"
        fixes = ("bfloat16", "float16") if word == "half" else ("float32",)
        raise UnknownDTypeError(
            message(
                f"Precision({what}={value!r})",
                _JMP_WHY[word],
                "Name the dtype: " + " or ".join(f"Precision({what}='{f}')" for f in fixes),
            )
        )
    try:
        d = D.dtype(value)
    except UnknownDTypeError:
        guess = D.dtype(_closest(str(value).lower(), _FLOAT_NAMES, "float32"))
        fix = _spec(tuple(guess if f == what else _F32 for f in _FIELDS))
        raise UnknownDTypeError(
            message(
                f"Precision({what}={value!r})",
                "that is not a dtype of heddle's policy",
                f"Name a float, e.g. Precision.parse('{fix}')",
            )
        ) from None
    if d not in _FLOATS:
        raise UnknownDTypeError(
            message(
                f"Precision({what}={d.name})",
                "a Precision names real floating dtypes (integer, bool and complex leaves are "
                "never cast by it)",
                "Name a float, e.g. heddle.policy.Precision.parse('params=float32,"
                "compute=bfloat16,output=float32')",
            )
        )
    return d


@dataclasses.dataclass(frozen=True)
class Precision:
    """A mixed-precision training policy: parameter, compute and output dtypes.

    The usual arrangement keeps float32 master weights, runs the forward pass in bfloat16 (or float16
    with loss scaling) and computes the loss in float32: ``Precision.parse("mixed_bfloat16")``.

    Args:
      param_dtype: the dtype parameters are stored and updated in (the master weights).
      compute_dtype: the dtype of the forward pass: parameters and inputs are cast to it.
      output_dtype: the dtype the model's outputs are cast to before the loss.

    Each argument is a dtype-like of ``heddle.policy.dtype`` and is stored as a ``numpy.dtype``. The
    value is frozen and hashable (usable as a static argument of ``jax.jit``), and ``str`` of it is a
    string that ``Precision.parse`` reads back.

    Raises:
      UnknownDTypeError: a dtype that is not a real float of the policy.

    Examples:
      >>> from heddle.policy import Precision
      >>> p = Precision.parse("params=f32,compute=bf16,output=f32")
      >>> p == Precision.parse("mixed_bfloat16") == Precision("float32", "bfloat16", "float32")
      True
      >>> str(p)
      'params=float32,compute=bfloat16,output=float32'
    """

    param_dtype: np.dtype = _F32
    compute_dtype: np.dtype = _F32
    output_dtype: np.dtype = _F32

    PRESETS: ClassVar[tuple[str, ...]] = tuple(_PRESETS)

    def __post_init__(self) -> None:
        for f in _FIELDS:
            object.__setattr__(self, f, _float_dtype(getattr(self, f), f))

    def __str__(self) -> str:
        return _spec((self.param_dtype, self.compute_dtype, self.output_dtype))

    @classmethod
    def parse(cls, spec: str | Precision) -> Precision:
        """Reads a precision from a string (or returns a ``Precision`` as it is).

        Accepted forms (case and spaces do not matter):

        - ``"params=float32,compute=bfloat16,output=float32"``; the keys also as ``param``/``p``,
          ``c``, ``out``/``o``; the dtypes as any name or alias of ``heddle.policy.dtype`` (``f32``,
          ``bf16``, ``f16``). A key left out is ``float32``: ``"compute=bf16"`` is mixed_bfloat16.
        - a preset: ``"float32"``, ``"mixed_bfloat16"``, ``"mixed_float16"`` (float32 params and
          output, narrow compute); more generally ``"mixed_<float dtype>"``, e.g. ``"mixed_bf16"``.
        - one float dtype: all three are that dtype (``"bfloat16"``: pure bfloat16 training).

        Args:
          spec: the string, or a ``Precision``.

        Returns:
          The ``Precision``.

        Raises:
          UnknownDTypeError: (a ``ValueError`` and a ``PolicyError``) the string is not one of the
            forms above, names an unknown key or dtype, repeats a key, or names a dtype that is not
            a real float; or ``spec`` is a dtype rather than a string (``jnp.bfloat16``: narrow
            compute, ``"mixed_bfloat16"``, or bfloat16 throughout, ``"bfloat16"``?). The message
            ends with a ``Precision.parse(...)`` call that works.

        Examples:
          >>> from heddle.policy import Precision
          >>> Precision.parse("mixed_float16")
          Precision(param_dtype=dtype('float32'), compute_dtype=dtype('float16'), output_dtype=dtype('float32'))
          >>> str(Precision.parse("bf16"))
          'params=bfloat16,compute=bfloat16,output=bfloat16'
        """
        if isinstance(spec, Precision):
            return spec
        if not isinstance(spec, str):
            one = _one_float(spec)
            if one is not None:
                raise UnknownDTypeError(
                    message(
                        f"Precision.parse({spec!r})",
                        "a precision names three dtypes (params, compute, output), and this is one "
                        "dtype, which could mean narrow compute or that dtype throughout",
                        "Say which: "
                        + " or ".join(f"Precision.parse({r!r})" for r in _readings(one)),
                    )
                )
            raise UnknownDTypeError(
                message(
                    f"Precision.parse({spec!r})",
                    f"a precision is read from a string, not a {type(spec).__name__}",
                    "Pass a string, e.g. Precision.parse('mixed_bfloat16'), or build one with "
                    "Precision(param_dtype, compute_dtype, output_dtype)",
                )
            )
        return cls(*_parse(spec))

    def cast_to_param(self, tree: Any) -> Any:
        """Casts the floating leaves of ``tree`` to ``param_dtype``; see ``cast_to_param``."""
        return _cast_tree(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        """Casts the floating leaves of ``tree`` to ``compute_dtype``; see ``cast_to_compute``."""
        return _cast_tree(tree, self.compute_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """Casts the floating leaves of ``tree`` to ``output_dtype``; see ``cast_to_output``."""
        return _cast_tree(tree, self.output_dtype)


def _one_float(value: Any) -> np.dtype | None:
    """The float dtype ``value`` is (a dtype, a scalar type such as ``jnp.bfloat16``), else ``None``."""
    if not isinstance(value, np.dtype | type):
        return None
    try:
        d = D.dtype(value)
    except UnknownDTypeError:
        return None
    return d if d in _FLOATS else None


def _readings(d: np.dtype) -> tuple[str, ...]:
    """The precisions one float dtype could mean: narrow compute with float32 params and outputs
    (``mixed_<d>``, for dtypes narrower than float32), and ``d`` throughout."""
    return (f"mixed_{d.name}", d.name) if d.itemsize < 4 else (d.name,)


def _parse(spec: str) -> tuple[np.dtype, np.dtype, np.dtype]:
    text = spec.strip().lower().replace(" ", "")
    asked = f"Precision.parse({spec!r})"
    if "=" not in text and "," not in text:
        return _parse_word(text, asked)
    found: dict[str, np.dtype] = {}
    problems: list[str] = []
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep:  # a lone word among pairs: a key without its dtype, or a dtype without its key
            problems.append(f"{part!r} is not of the form key=dtype")
            key, value = (part, "float32") if part in _KEYS else ("", part)
        field = _KEYS.get(key)
        if field is None:
            if sep:
                problems.append(
                    f"{key!r} is not a key (the keys are params/p, compute/c, output/o)"
                )
            field = _KEYS.get(_closest(key, list(_KEYS), "")) if key else None
            field = field or next((f for f in _FIELDS if f not in found), None)
            if field is None:
                continue
        if field in found:
            problems.append(f"{_CANONICAL_KEYS[field]} is given twice")
            continue
        found[field] = _parse_value(value, problems)
    if not found:
        problems.append("it names no dtype")
    if problems:
        fix = _spec(tuple(found.get(f, _F32) for f in _FIELDS))
        raise UnknownDTypeError(
            message(
                asked,
                "; ".join(dict.fromkeys(problems)),
                f"Use Precision.parse('{fix}'), or a preset: " + ", ".join(_PRESETS),
            )
        )
    return tuple(found.get(f, _F32) for f in _FIELDS)  # type: ignore[return-value]


def _parse_value(value: str, problems: list[str]) -> np.dtype:
    """One dtype of a key=dtype pair; on a problem, records it and returns the likely intent."""
    if value in _JMP_WORDS:
        problems.append(_JMP_WHY[value])
        return D.dtype(_JMP_WORDS[value])
    try:
        d = D.dtype(value)
    except UnknownDTypeError:
        problems.append(f"{value!r} is not a dtype of the policy")
        return D.dtype(_closest(value, _FLOAT_NAMES, "float32"))
    if d not in _FLOATS:
        problems.append(f"{d.name} is not a real floating dtype")
        return _F32
    return d


def _parse_word(word: str, asked: str) -> tuple[np.dtype, np.dtype, np.dtype]:
    if word in _PRESETS:
        return tuple(D.dtype(n) for n in _PRESETS[word])  # type: ignore[return-value]
    mixed = word.startswith(("mixed_", "mixed-"))
    rest = word[len("mixed_") :] if mixed else word
    if rest in _JMP_WORDS:
        fix = "mixed_bfloat16" if mixed or rest == "half" else "float32"
        return _fail(asked, _JMP_WHY[rest], fix)
    try:
        d = D.dtype(rest)
    except UnknownDTypeError:
        d = None
    if d in _FLOATS:
        return (_F32, d, _F32) if mixed else (d, d, d)  # type: ignore[return-value]
    if d is not None:
        return _fail(asked, f"{d.name} is not a real floating dtype", "float32")
    choices = [*_PRESETS, *_FLOAT_NAMES]
    fix = _closest(word, choices, "mixed_bfloat16")
    return _fail(asked, "that is neither a preset, a float dtype, nor key=dtype pairs", fix)


def _fail(asked: str, why: str, fix: str) -> Any:
    raise UnknownDTypeError(
        message(
            asked,
            why,
            f"Use Precision.parse('{fix}'); the presets are {', '.join(_PRESETS)}; or write "
            "key=dtype pairs: Precision.parse('params=float32,compute=bfloat16,output=float32')",
        )
    )


# ---------------------------------------------------------------------------------------------
# Casting the leaves of a pytree


def _cast_leaf(x: Any, dst: np.dtype) -> Any:
    if not isinstance(x, jax.ShapeDtypeStruct | jax.Array | np.ndarray | np.generic):
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):  # PRNG keys (nnx.Rngs), ...
        return x
    if np.dtype(x.dtype) not in _FLOATS or x.dtype == dst:
        return x
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, dst, sharding=x.sharding)
    return astype(x, dst)


def _kept(x: Any) -> bool:
    """A node the casts leave as it is: its class says so (the loss-scale states), or it is an
    optax optimiser state, whose dtypes are the optimiser's (``mu_dtype``; a float16 ``eps=1e-8``
    is 0, an ``inject_hyperparams`` bound of 2**24 is inf)."""
    cls = type(x)
    return getattr(cls, "__heddle_keep_dtypes__", False) is True or (
        cls.__module__.partition(".")[0] == "optax" and hasattr(cls, "_fields")
    )


def _cast_tree(tree: Any, dst: np.dtype) -> Any:
    D.require_available(dst, "a Precision cast")
    return jax.tree.map(lambda x: x if _kept(x) else _cast_leaf(x, dst), tree, is_leaf=_kept)


def cast_to_param(tree: Any, precision: Precision | str) -> Any:
    """Casts every real floating leaf of ``tree`` to ``precision.param_dtype``.

    Use it to build the master weights from an initialiser's output (``float32`` masters from
    whatever the initialiser produced).

    Args:
      tree: any pytree: dicts, lists, NamedTuples, equinox modules, ... Floating array leaves (JAX
        arrays, NumPy arrays and scalars, ``jax.ShapeDtypeStruct``) of another dtype are cast with
        heddle's correctly rounded ``astype``; integer, bool and complex leaves, leaves already of the
        dtype, leaves that are not arrays (Python numbers, functions, strings), loss-scale states
        (``heddle.scaling.DynamicLossScale``, ``StaticLossScale``) and optax optimiser states (their
        moments and hyperparameters keep the optimiser's dtypes) are returned as they are. Works
        eagerly and under ``jax.jit``; differentiable (the derivative of the cast is the cast of the
        tangent, as for ``jax.lax.convert_element_type``).
      precision: a ``Precision`` or a string ``Precision.parse`` reads.

    Returns:
      A pytree of the same structure.

    Raises:
      UnknownDTypeError: ``precision`` is a string ``Precision.parse`` refuses.
      PrecisionError: the dtype is 64-bit and ``jax_enable_x64`` is off.

    Examples:
      >>> import numpy as np
      >>> from heddle.policy import cast_to_param
      >>> tree = {"w": np.ones(2, "float16"), "step": np.int32(3)}
      >>> out = cast_to_param(tree, "mixed_bfloat16")
      >>> out["w"].dtype, out["step"].dtype
      (dtype('float32'), dtype('int32'))
    """
    return Precision.parse(precision).cast_to_param(tree)


def cast_to_compute(tree: Any, precision: Precision | str) -> Any:
    """Casts every real floating leaf of ``tree`` to ``precision.compute_dtype``.

    Use it at the top of the loss: the forward pass runs on the narrow copy, and the gradient flows
    back to the master weights at their own dtype.

    Args:
      tree: any pytree (parameters, inputs, an equinox module); the leaves are treated as in
        ``cast_to_param``.
      precision: a ``Precision`` or a string ``Precision.parse`` reads.

    Returns:
      A pytree of the same structure.

    Raises:
      UnknownDTypeError: ``precision`` is a string ``Precision.parse`` refuses.
      PrecisionError: the dtype is 64-bit and ``jax_enable_x64`` is off.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.policy import cast_to_compute
      >>> params = {"w": jnp.ones((2, 2)), "labels": jnp.arange(2)}
      >>> jax_tree = cast_to_compute(params, "mixed_bfloat16")
      >>> jax_tree["w"].dtype, jax_tree["labels"].dtype
      (dtype(bfloat16), dtype('int32'))
    """
    return Precision.parse(precision).cast_to_compute(tree)


def cast_to_output(tree: Any, precision: Precision | str) -> Any:
    """Casts every real floating leaf of ``tree`` to ``precision.output_dtype``.

    Use it on the model's outputs before the loss, so that the loss is computed in float32.

    Args:
      tree: any pytree; the leaves are treated as in ``cast_to_param``.
      precision: a ``Precision`` or a string ``Precision.parse`` reads.

    Returns:
      A pytree of the same structure.

    Raises:
      UnknownDTypeError: ``precision`` is a string ``Precision.parse`` refuses.
      PrecisionError: the dtype is 64-bit and ``jax_enable_x64`` is off.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle.policy import cast_to_output
      >>> cast_to_output(jnp.ones(3, jnp.bfloat16), "mixed_bfloat16").dtype
      dtype('float32')
    """
    return Precision.parse(precision).cast_to_output(tree)
