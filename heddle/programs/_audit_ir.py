"""What the audit's rules share: kinds, sets of primitives, the raw finding, one walked jaxpr.

The sets name JAX primitives by what the policy cares about: which ones add up many terms
(POLICY.md 5), which only move values around, which operands are indices rather than values. Each
is computed from the one table of primitives (``_table``), which autocast reads too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.extend import core as jcore

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import PolicyError
from heddle.policy._scalars import result_type
from heddle.programs._audit_source import Location
from heddle.programs._table import Body, Fact, Monoid, Rule, combining, having, holding, names

NARROW_ACCUMULATION = "narrow_accumulation"
IMPLICIT_PROMOTION = "implicit_promotion"
LOSSY_CONVERSION = "lossy_conversion"
FLOAT64_UNAVAILABLE = "float64_unavailable"
UNCLASSIFIED = "unclassified_primitive"
NARROW_COTANGENT = "narrow_cotangent"

# From the one table of primitive rules (``_table``), which autocast reads too.
CONTRACTIONS = names(Rule.CONTRACTION)
# Primitives that add (or multiply) many terms into their first operand's dtype.
ACCUMULATIONS = names(Rule.REDUCTION, Rule.SCAN, Rule.SCATTER, Rule.WINDOW, Rule.COLLECTIVE)
# Reductions by a user-supplied body: they accumulate when the body adds or multiplies (SUMMING).
GENERIC_REDUCTIONS = holding(Body.REDUCER)
SUMMING = combining(Monoid.SUM, Monoid.PRODUCT)
EXPS = having(Fact.EXP)
SUMS_OF_EXP = having(Fact.SUM_OF_EXP)
# Ops an exp's value flows through on its way to the sum of softmax / logsumexp.
PASS_VALUE = having(Fact.PASSES_VALUE)
SHAPE_OPS = having(Fact.RESHAPES)
LOOK_THROUGH = SHAPE_OPS | names(Rule.CONVERT)
# Ops that move values without computing on them.
DATA_MOVEMENT = LOOK_THROUGH | having(Fact.SELECTS, Fact.OVERWRITES)
UPSTREAM_LIMIT = 256


@dataclasses.dataclass(frozen=True)
class RawFinding:
    """A finding before deduplication; ``Finding`` (``_audit_report``) is what users see."""

    kind: str
    primitive: str
    dtypes: tuple[str, ...]
    out_dtype: str
    shapes: tuple[tuple[int, ...], ...]
    source: Location | None
    backward: bool
    origin: str
    note: str
    path: str
    expected: str = ""


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What an equation inherits from the equation whose body it is in."""

    source: Location | None
    backward: bool
    explicit: bool
    path: tuple[str, ...]


_DTYPE_CACHE: dict[Any, np.dtype | None] = {}


def policy_dtype(aval: Any) -> np.dtype | None:
    """The policy dtype of an abstract value, or None for tokens, keys, float0 and the like."""
    raw = getattr(aval, "dtype", None)
    if raw is None:
        return None
    try:
        return _DTYPE_CACHE[raw]
    except (KeyError, TypeError):
        pass
    try:
        d: np.dtype | None = D.dtype(np.dtype(raw))
    except (TypeError, ValueError, PolicyError):
        d = None
    try:
        _DTYPE_CACHE[raw] = d
    except TypeError:
        pass
    return d


def holds(big: np.dtype, small: np.dtype) -> bool:
    """Whether every value of ``small`` is a value of ``big``."""
    return big == small or _lattice.lossless(small, big)


def join(a: np.dtype, b: np.dtype) -> np.dtype:
    """The narrower of two dtypes that holds both (heddle's promotion where they are unrelated)."""
    if holds(a, b):
        return a
    if holds(b, a):
        return b
    try:
        return result_type(a, b)
    except PolicyError:
        return a if a.itemsize >= b.itemsize else b


def shape_of(atom: Any) -> tuple[int, ...]:
    """A variable's shape as ints (-1 for a symbolic dimension)."""
    return tuple(int(s) if isinstance(s, (int, np.integer)) else -1 for s in atom.aval.shape)


def short(d: np.dtype) -> str:
    """A dtype's short alias (``bf16``) where it has one, else its name."""
    return _SHORT.get(d.name, d.name)


_SHORT = {v: k for k, v in D.ALIASES.items() if v not in ("float8_e4m3fn", "float8_e5m2")}


class Level:
    """One jaxpr being walked: who produces (``producer``) and who consumes each variable; for a
    body, the level and equation that hold it (``parent``)."""

    def __init__(self, jaxpr: Any, parent: tuple[Level, Any] | None = None) -> None:
        self.jaxpr = jaxpr
        self.parent = parent
        self.producer: dict[Any, Any] = {}
        for eqn in jaxpr.eqns:
            for v in eqn.outvars:
                self.producer[v] = eqn
        self._consumers: dict[Any, list[Any]] | None = None

    def consumers(self, v: Any) -> list[Any]:
        """The equations of this jaxpr that read ``v``."""
        if self._consumers is None:
            self._consumers = {}
            for eqn in self.jaxpr.eqns:
                for x in eqn.invars:
                    if not isinstance(x, jcore.Literal):
                        self._consumers.setdefault(x, []).append(eqn)
        return self._consumers.get(v, [])
