"""Leaves under differentiation: widening the arguments and restoring them for the function.

Each differentiated leaf is replaced, for JAX, by a leaf of its gradient dtype:

- a narrow float leaf (bfloat16, float16, float8, float4) by its float32 value (exact);
- an integer or bool leaf by float32 zeros of its shape, which the function never sees (it gets the
  original leaf), so JAX returns a zero float32 gradient for it;
- every other leaf (float32, float64, complex, keys) is kept.

The function is then called with the narrow leaf as given (bit for bit, a signalling NaN's payload
included), differentiated through its float32 copy, which is the leaf's twin in the evaluator.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from heddle.autodiff._rules import read_as
from heddle.autodiff._twins import is_narrow
from heddle.policy._errors import message

_F32 = np.dtype("float32")


class Kind(enum.Enum):
    """How a differentiated leaf is presented to JAX."""

    NARROW = "narrow"  # float32 copy; the function sees the leaf as given
    INTEGER = "integer"  # float32 zeros; the function sees the original leaf
    KEEP = "keep"  # the leaf itself (float32, float64, complex, anything else)


def _leaf_dtype(x: Any) -> np.dtype | None:
    if isinstance(x, bool):
        return np.dtype("bool")
    if isinstance(x, int):
        return np.dtype("int32")
    d = getattr(x, "dtype", None)
    if d is None:
        return None
    try:
        return np.dtype(d)
    except TypeError:
        return None  # extended dtypes (PRNG keys): JAX decides


def classify(x: Any) -> Kind:
    """The kind of a differentiated leaf."""
    d = _leaf_dtype(x)
    if d is None:
        return Kind.KEEP
    if d.kind in "biu":
        return Kind.INTEGER
    if is_narrow(d):
        return Kind.NARROW
    return Kind.KEEP


def widen(x: Any, kind: Kind) -> Any:
    """The leaf JAX differentiates with respect to."""
    if kind is Kind.NARROW:
        return lax.convert_element_type(x, _F32)
    if kind is Kind.INTEGER:
        return jax.numpy.zeros(np.shape(x), _F32)
    return x


def normalize_argnums(argnums: int | Sequence[int], nargs: int, name: str) -> tuple[int, ...]:
    """``argnums`` as a tuple of non-negative positions, checked against the call."""
    refused = TypeError(
        message(
            f"heddle.autodiff.{name}(argnums={argnums!r})",
            "argnums must be an int or a sequence of ints",
            "Pass the positions of the arguments to differentiate, e.g. argnums=(0, 1).",
        )
    )
    try:
        seq = (operator.index(argnums),) if not hasattr(argnums, "__iter__") else tuple(argnums)
    except TypeError:
        raise refused from None
    out = []
    for a in seq:
        try:
            a = operator.index(a)
        except TypeError:
            raise refused from None
        if not -nargs <= a < nargs:
            raise TypeError(
                message(
                    f"heddle.autodiff.{name}(argnums={argnums!r}) called with {nargs} positional "
                    "argument(s)",
                    f"differentiating with respect to argnums={a} needs at least "
                    f"{(a if a >= 0 else -a - 1) + 1} positional arguments",
                    "Pass the argument positionally or change argnums.",
                )
            )
        if a % nargs in out:
            raise TypeError(
                message(
                    f"heddle.autodiff.{name}(argnums={argnums!r})",
                    f"argnums names argument {a % nargs} twice",
                    "Name each argument once, e.g. argnums=(0, 1).",
                )
            )
        out.append(a % nargs)
    return tuple(out)


class Leaves:
    """The differentiated arguments of one call: kinds, originals and their widened versions."""

    def __init__(self, args: Sequence[Any], argnums: tuple[int, ...]) -> None:
        self.args = tuple(args)
        self.argnums = argnums
        self.trees: dict[int, Any] = {}
        self.kinds: dict[int, list[Kind]] = {}
        self.originals: dict[int, list[Any]] = {}
        wide = list(args)
        for i in dict.fromkeys(argnums):
            leaves, tree = jax.tree.flatten(args[i])
            kinds = [classify(x) for x in leaves]
            self.trees[i], self.kinds[i], self.originals[i] = tree, kinds, leaves
            wide[i] = tree.unflatten([widen(x, k) for x, k in zip(leaves, kinds, strict=True)])
        self.wide_args = tuple(wide)

    def input_dtypes(self, i: int) -> Any:
        """The pytree of widened dtypes of argument ``i`` (None for non-arrays)."""
        leaves = jax.tree.leaves(self.wide_args[i])
        return self.trees[i].unflatten([_leaf_dtype(x) for x in leaves])

    def rebuild(self, wide_args: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any], Any]:
        """Splits traced widened arguments into what the function sees.

        Returns:
          ``(dynamic, twins, args, place)``: the traced values the function reads (narrow leaves
          rounded back), their float32 twins (or None), the full argument list with the dynamic
          leaves marked, and ``place(dynamic) -> args`` that puts traced values back.
        """
        dynamic: list[Any] = []
        twins: list[Any] = []
        slots: dict[int, list[Any]] = {}
        for i in self.trees:
            wl = self.trees[i].flatten_up_to(wide_args[i])
            row = []
            for w, k, orig in zip(wl, self.kinds[i], self.originals[i], strict=True):
                if k is Kind.INTEGER:
                    row.append(("static", orig))
                elif k is Kind.NARROW:
                    row.append(("dyn", len(dynamic)))
                    dynamic.append(read_as(np.dtype(orig.dtype))(w, orig))  # as given
                    twins.append(w)
                elif _leaf_dtype(w) is not None or isinstance(w, float | complex):
                    row.append(("dyn", len(dynamic)))
                    dynamic.append(w)
                    twins.append(None)
                else:
                    row.append(("static", w))
            slots[i] = row

        def place(values: Sequence[Any]) -> list[Any]:
            out = list(wide_args)
            for i, row in slots.items():
                leaves = [values[v] if tag == "dyn" else v for tag, v in row]
                out[i] = self.trees[i].unflatten(leaves)
            return out

        return dynamic, twins, list(wide_args), place
