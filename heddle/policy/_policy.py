"""The active ``Policy``: the promotion table plus the defaults every op reads.

A ``Policy`` is a frozen, hashable value. The active one is held in a ``contextvars.ContextVar``, so
each thread and each asyncio task sees its own, and ``with`` blocks that interleave (tasks, generators
suspended inside a block) can close in any order without leaking a policy. It is mirrored into a
``jax.make_user_context`` value, which is part of ``jax.jit``'s cache key: a function traced under one
policy is traced again under another, never reused stale. Equal policies are interned, so a block that
rebuilds the same policy (``default_dtypes``) reuses every cache made under it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import PromotionError, UnknownDTypeError, message
from heddle.policy._promotion import Pair as Pair
from heddle.policy._promotion import PromotionTable as PromotionTable
from heddle.policy._promotion import _jax_cells, _table_from_csv, promotion_message
from heddle.policy._promotion import promote_all as promote_all


def _default_from_env(var: str, fallback: str, kinds: str) -> np.dtype:
    raw = os.environ.get(var)
    if raw is None:
        return D.dtype(fallback)
    try:
        d = D.dtype(raw)
    except UnknownDTypeError as e:
        raise UnknownDTypeError(
            message(
                f"{var}={raw!r}",
                "that names no dtype of heddle's policy",
                f"Unset it or set e.g. {var}={fallback}. {e}",
            )
        ) from None
    if D.kind(d) not in kinds:
        raise UnknownDTypeError(
            message(
                f"{var}={raw!r}",
                f"{d.name} is not of the kind this default needs",
                f"Set e.g. {var}={fallback}.",
            )
        )
    return d


@dataclasses.dataclass(frozen=True)
class Policy:
    """A dtype policy: the promotion table and the defaults that ops read.

    Attributes:
      name: a label shown in messages.
      table: the pairwise promotion table.
      default_float: dtype of a Python float with no typed operand (and of float-only ops on integers).
      default_int: dtype of a Python int with no typed operand.
      default_complex: dtype of a Python complex with no typed operand.
      min_float_acc: the narrowest float accumulation dtype (``float64`` for statistics work).
      index_dtype: dtype of index-producing ops (argmax, argsort, ...).
      float_result_for_int: dtype that float-only ops give for integer or bool input; None means
        ``default_float``.
      check_scalar_range: whether Python scalars out of the dtype's range are errors.
      float32_matmul_precision: ``jax.lax.Precision`` name for float32 contractions; ``"highest"``
        runs them at full float32 precision, ``"default"`` lets the backend use reduced-precision
        passes (TF32 on NVIDIA GPUs).

    Examples:
      >>> from heddle import policy
      >>> policy.HEDDLE.promote("float16", "bfloat16")
      dtype('float32')
    """

    name: str
    table: PromotionTable
    default_float: np.dtype = np.dtype("float32")
    default_int: np.dtype = np.dtype("int32")
    default_complex: np.dtype = np.dtype("complex64")
    min_float_acc: np.dtype = np.dtype("float32")
    index_dtype: np.dtype = np.dtype("int32")
    float_result_for_int: np.dtype | None = None
    check_scalar_range: bool = True
    float32_matmul_precision: str = "highest"

    def __post_init__(self) -> None:
        if not isinstance(self.table, PromotionTable):
            raise TypeError(
                message(
                    f"Policy(name={self.name!r}, table=<{type(self.table).__name__}>)",
                    "the table must be a PromotionTable, which is immutable and hashable",
                    "Build the policy with heddle.policy.Policy.from_table(table, name=...).",
                )
            )
        for field in (
            "default_float",
            "default_int",
            "default_complex",
            "min_float_acc",
            "index_dtype",
        ):
            object.__setattr__(self, field, D.dtype(getattr(self, field)))
        if self.float_result_for_int is not None:
            object.__setattr__(self, "float_result_for_int", D.dtype(self.float_result_for_int))
        if self.float32_matmul_precision not in ("highest", "high", "default"):
            raise ValueError(
                message(
                    f"Policy(float32_matmul_precision={self.float32_matmul_precision!r})",
                    "it must name a jax.lax.Precision",
                    "Use 'highest' (full float32), 'high' or 'default' (backend's choice, TF32 on NVIDIA).",
                )
            )

    @classmethod
    def from_table(
        cls,
        table: Mapping[tuple[Any, Any], Any] | str | os.PathLike,
        *,
        name: str = "custom",
        **fields: Any,
    ) -> Policy:
        """Builds a policy from a user's own lattice.

        Args:
          table: a mapping ``{(a, b): result}`` with ``None`` or ``"error"`` for refused pairs (dtype
            names or dtypes), or CSV text / a path to a CSV in the layout of ``promotion.csv``.
          name: a label for messages.
          **fields: any other ``Policy`` field (``default_float=...``).

        Returns:
          The policy. Pairs the table does not cover are errors. A mapping needs one entry per
          unordered pair: the mirrored pair and ``(a, a) -> a`` are filled in. The result of a cell is
          the user's choice and is not checked against containment (``float16`` may win over
          ``bfloat16``, as below).

        Raises:
          ValueError: the table is not symmetric.
          UnknownDTypeError: a key or a cell names no dtype of the policy.

        Examples:
          >>> from heddle import policy
          >>> p = policy.Policy.from_table({("float16", "bfloat16"): "float16"}, name="f16-wins")
          >>> p.promote("bfloat16", "float16")
          dtype('float16')
        """
        if isinstance(table, (str, os.PathLike)):
            text = str(table)
            if not text.lstrip().startswith(","):
                with open(table) as f:
                    text = f.read()
            cells = _table_from_csv(text)
        else:
            cells = {}
            for (a, b), r in table.items():
                res = None if r is None or (isinstance(r, str) and r == "error") else D.dtype(r)
                cells[D.dtype(a), D.dtype(b)] = res
                cells.setdefault((D.dtype(b), D.dtype(a)), res)
            for a in {a for a, _ in cells}:
                cells.setdefault((a, a), a)
        for (a, b), r in cells.items():
            if cells.get((b, a), r) != r:
                raise ValueError(
                    message(
                        f"Policy.from_table(...) with {a.name} x {b.name} -> {r} but {b.name} x {a.name} -> {cells[b, a]}",
                        "a promotion table must be symmetric",
                        "Give one result per unordered pair.",
                    )
                )
        return cls(name=name, table=PromotionTable(cells, name), **fields)

    def __hash__(self) -> int:
        # A policy is hashed on every jitted call inside a block (it is part of the jit cache key):
        # compute the field hash once.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        # The cached hash is of this process's string hashes: never carry it into another process.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def promote(self, a: Any, b: Any) -> np.dtype:
        """The promotion of two dtypes under this policy (dtype-likes, no scalars).

        Args:
          a: a dtype-like.
          b: a dtype-like.

        Returns:
          The result dtype of the pair in this policy's table.

        Raises:
          PromotionError: the table has no result for the pair (an ``error`` cell, or a pair it does
            not cover); the message names the explicit conversion.

        Examples:
          >>> from heddle import policy
          >>> policy.JAX.promote("int8", "uint8"), policy.HEDDLE.promote("int8", "bfloat16")
          (dtype('int16'), dtype(bfloat16))
        """
        a, b = D.dtype(a), D.dtype(b)
        r = self.table.get((a, b))
        if r is None:
            raise PromotionError(promotion_message(self, a, b))
        return r

    @property
    def int_float_dtype(self) -> np.dtype:
        """The dtype float-only ops give for integer or bool input."""
        return self.float_result_for_int or self.default_float


HEDDLE = Policy(
    name="heddle",
    table=PromotionTable(_lattice.derive_table(), "heddle"),
    default_float=_default_from_env("HEDDLE_DEFAULT_FLOAT", "float32", "f"),
    default_int=_default_from_env("HEDDLE_DEFAULT_INT", "int32", "iu"),
    float32_matmul_precision="default" if os.environ.get("HEDDLE_TF32", "0") == "1" else "highest",
)
"""The default policy: POLICY.md's lattice and defaults (``HEDDLE_DEFAULT_FLOAT``/``_INT`` read at import)."""


JAX = Policy(
    name="jax",
    table=PromotionTable(_jax_cells(), "jax"),
    check_scalar_range=False,
)
"""JAX's own promotion table (``jax.numpy.promote_types``), for comparison and migration."""


# The blocks open in this context, innermost last: (interned policy, the policy as given) pairs. A
# block removes its own entry (compared by identity) when it closes, so blocks that close out of order
# (a generator suspended inside one, asyncio tasks that share a thread) never leave a policy behind.
_OPEN: contextvars.ContextVar[tuple[tuple[Policy, Policy], ...]] = contextvars.ContextVar(
    "heddle_policy", default=()
)
# The same value as a JAX context, which jax.jit reads for its cache key (thread-local, kept in step
# with _OPEN whenever a block opens or closes and whenever heddle reads the policy).
_JIT_KEY = jax.make_user_context(default_value=None)
_INTERNED: dict[Policy, Policy] = {HEDDLE: HEDDLE, JAX: JAX}


def _intern(p: Policy) -> Policy:
    """The one instance of ``p``'s value: caches keyed on the instance are shared by equal policies."""
    return _INTERNED.setdefault(p, p)


_JIT_STATE = _JIT_KEY._obj  # the config object behind the context, read without its property


def _sync(p: Policy | None) -> None:
    if _JIT_STATE.value is not p:
        _JIT_STATE.set_local(p)


try:  # whether JAX is staging a program out (jax.jit, make_jaxpr, eval_shape): its trace is cached
    from jax._src.core import trace_ctx as _trace_ctx
    from jax._src.interpreters.partial_eval import DynamicJaxprTrace as _Staging

    def _staging() -> bool:
        return isinstance(_trace_ctx.trace, _Staging)

except ImportError:  # pragma: no cover - a JAX without these internals: tasks' keys may go stale

    def _staging() -> bool:
        return False


def active() -> Policy:
    """The active policy's interned instance, the one heddle's caches and ``jax.jit``'s key hold.

    Inside a program that ``jax.jit`` is tracing, it is the policy the trace will be cached under
    (the one ``jax.jit`` read for its cache key), so a cached trace always matches its key.
    """
    if _staging():
        p = _JIT_KEY.value
    else:
        stack = _OPEN.get()
        p = stack[-1][0] if stack else None
        _sync(p)
    return HEDDLE if p is None else p


def current() -> Policy:
    """The active policy of this thread or asyncio task (``HEDDLE`` unless inside ``use``).

    It is the object passed to the innermost open ``use`` block. Inside a program that ``jax.jit``
    is tracing, it is the policy the trace will be cached under, which is equal to it (traces are
    shared by equal policies).

    Examples:
      >>> from heddle import policy
      >>> policy.current().name
      'heddle'
    """
    stack = _OPEN.get()
    p = active()
    return stack[-1][1] if stack and stack[-1][0] is p else p


@contextlib.contextmanager
def use(p: Policy) -> Iterator[Policy]:
    """Makes ``p`` the active policy inside the ``with`` block, for this thread or asyncio task.

    The policy is part of ``jax.jit``'s cache key, so a jitted function called inside the block is
    traced under ``p``. Each asyncio task has its own active policy (it starts with the one in force
    where the task was created); a generator suspended inside a block leaves its policy active for its
    caller until it resumes and closes the block, as any ``with`` block does. Blocks may close in any
    order: each removes only its own policy.

    Args:
      p: the policy.

    Returns:
      A context manager yielding ``p``.

    Raises:
      TypeError: ``p`` is not a ``Policy``.

    Examples:
      >>> from heddle import policy
      >>> with policy.use(policy.JAX):
      ...     policy.current().name
      'jax'
    """
    if not isinstance(p, Policy):
        raise TypeError(
            message(
                f"use({p!r})",
                "it takes a heddle.policy.Policy",
                "Pass e.g. heddle.policy.HEDDLE or heddle.policy.JAX.",
            )
        )
    entry = (_intern(p), p)
    _open(entry)
    try:
        yield p
    finally:
        _close(entry)


def _open(entry: tuple[Policy, Policy]) -> None:
    """Opens a block: ``entry`` (interned policy, the policy as given) becomes the innermost."""
    _OPEN.set((*_OPEN.get(), entry))
    _sync(entry[0])


def _close(entry: tuple[Policy, Policy]) -> None:
    """Closes the block of ``entry`` (compared by identity), wherever it is among the open ones."""
    stack = _OPEN.get()
    if stack and stack[-1] is entry:  # the usual case: the innermost block closes
        rest = stack[:-1]
    else:
        rest = tuple(e for e in stack if e is not entry)
    _OPEN.set(rest)
    _sync(rest[-1][0] if rest else None)


def default_dtypes(
    float: Any = None, int: Any = None, complex: Any = None
) -> contextlib.AbstractContextManager[Policy]:
    """Changes the scalar defaults of the active policy inside the ``with`` block.

    Args:
      float: dtype of Python floats with no typed operand (a float dtype), or None to keep.
      int: dtype of Python ints with no typed operand (an integer dtype), or None to keep.
      complex: dtype of Python complex numbers with no typed operand, or None to keep.

    Returns:
      A context manager yielding the policy in force inside.

    Raises:
      UnknownDTypeError: a name is not a dtype, or not of the right kind.

    Examples:
      >>> from heddle import policy
      >>> with policy.default_dtypes(float="bfloat16"):
      ...     policy.result_type(0.5)
      dtype(bfloat16)
    """
    return _DefaultDtypes(float, int, complex)


class _DefaultDtypes(contextlib.ContextDecorator):
    """The block ``default_dtypes`` opens: a class, not a ``contextlib.contextmanager`` generator,
    so that entering and leaving it costs two method calls and one dict lookup (``_block_policy``).

    Each ``with`` reads the active policy as it opens. Once closed it may be entered again; as a
    decorator it opens a block of its own for each call.
    """

    __slots__ = ("_args", "_entry")

    def __init__(self, float: Any, int: Any, complex: Any) -> None:
        self._args = (float, int, complex)
        self._entry: tuple[Policy, Policy] | None = None

    def _recreate_cm(self) -> _DefaultDtypes:
        return _DefaultDtypes(*self._args)

    def __enter__(self) -> Policy:
        if self._entry is not None:
            raise RuntimeError(
                message(
                    "entering a default_dtypes(...) block that is already open",
                    "each open block is its own entry in the stack of policies",
                    "Call heddle.policy.default_dtypes(...) again for a nested block.",
                )
            )
        p = _block_policy(*self._args)
        self._entry = entry = (p, p)  # p is interned: the instance caches and the jit key hold
        _OPEN.set((*_OPEN.get(), entry))  # _open, inlined
        _sync(p)
        return p

    def __exit__(self, *exc: object) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            _close(entry)


def _block_policy(float: Any, int: Any, complex: Any) -> Policy:
    """The interned policy of a ``default_dtypes(float, int, complex)`` block opened now.

    A block seen before under the same active policy is one dict lookup (``_BLOCKS``): no dtype
    parsing, no ``dataclasses.replace``, and the same interned instance, so every op kernel and jit
    trace made under it is reused.
    """
    base = active()
    key = (id(base), type(float), float, type(int), int, type(complex), complex)
    try:
        hit = _BLOCKS.get(key)
        hashable = True
    except TypeError:  # an unhashable argument (an array, for its dtype): resolved every time
        hit, hashable = None, False
    if hit is not None and hit[0] is base:
        return hit[1]
    p = _with_defaults(current(), _changes(float, int, complex))
    if hashable:
        if len(_BLOCKS) >= _BLOCKS_LIMIT:
            _BLOCKS.clear()
        _BLOCKS[key] = (base, p)
    return p


# The policy of each default_dtypes block seen before, by (id of the interned active policy, each
# argument's type and value); a hit holds that active policy too, compared by identity. Only
# arguments that resolved and passed their checks are stored; the type in the key keeps equal values
# of other types (``1 == 1.0 == True``) apart. The active policy is interned (``_intern(current())``
# is ``active()``), and ``_with_defaults`` depends on its value only.
_BLOCKS: dict[tuple, tuple[Policy, Policy]] = {}  # key -> (the active policy, the block's)
_BLOCKS_LIMIT = 256


def _changes(float: Any, int: Any, complex: Any) -> tuple[tuple[str, np.dtype], ...]:
    """``default_dtypes``' arguments as the ``Policy`` fields they set, checked: (field, dtype)."""
    changes = {}
    for field, value, kinds in (
        ("default_float", float, "f"),
        ("default_int", int, "iu"),
        ("default_complex", complex, "c"),
    ):
        if value is None:
            continue
        d = D.dtype(value)
        if D.kind(d) not in kinds:
            raise UnknownDTypeError(
                message(
                    f"default_dtypes({field.removeprefix('default_')}={value!r})",
                    f"{d.name} is not {dict(f='a float', iu='an integer', c='a complex')[kinds]} dtype",
                    f"Pass e.g. default_dtypes({field.removeprefix('default_')}={dict(f='float32', iu='int32', c='complex64')[kinds]!r}).",
                )
            )
        changes[field] = d
    return tuple(changes.items())


@functools.lru_cache(maxsize=256)
def _with_defaults(p: Policy, changes: tuple[tuple[str, np.dtype], ...]) -> Policy:
    fields: dict[str, Any] = dict(changes)  # dtype fields: each key names its own
    return _intern(dataclasses.replace(p, **fields))
