"""The values the interpreter (``_interpret``) keeps for one jaxpr, for autocast's evaluator and for
heddle.autodiff's: each variable's value, its exact float32 twin and (autocast only) its float32
shadow.

- value: the variable's own array, of its own dtype and shape (what the program computes).
- twin: a narrow float variable's values, widened exactly to its accumulation dtype; one per
  variable, shared by every use (so the backward pass sums the cotangents of all uses in float32),
  and for copies (reshape, broadcast, slicing...) the same copy applied to the twin.
- shadow: the unrounded accumulation-dtype result that a narrow float variable was rounded from.
  It is read only by equations of the same library call (one ``jnp``/``jax.nn`` function or
  operator, told by the equations' source tracebacks): inside a call, intermediates stay float32 and
  only the call's outputs are rounded, as heddle's namespace computes a call; across calls, the
  rounded value is what flows, as between two heddle.numpy calls.

Values and twins are computed lazily: a rounded value that only feeds float32 consumers is never
rounded, and a twin nobody asks for is never widened. The evaluator frees a variable after its last
use (``Frame.free``), as ``jax.core.eval_jaxpr`` does: a lazy value or twin that another one still
needs is held by that one (``Once``), not looked up in the frame, so freeing never loses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import lax
from jax._src import source_info_util
from jax.extend import core as jcore

from heddle.ops.lowering import cast


def _here(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make`` run, whenever it runs, with the source information of now (the equation that
    produced the value), so the audit attributes a lazy rounding or widening to its call."""
    info = source_info_util.current()

    def run() -> Any:
        with source_info_util.user_context(info.traceback, name_stack=info.name_stack):
            return make()

    return run


class Once:
    """A lazy value computed at most once: ``make()`` on the first call, the same object after.

    ``deps`` are the lazy values ``make`` reads: they are computed first, with an explicit stack,
    so a chain of lazy twins through a whole network does not recurse once per link.
    """

    __slots__ = ("_deps", "_make", "_value")

    def __init__(self, make: Callable[[], Any], deps: Sequence[Callable[[], Any]] = ()) -> None:
        self._make: Callable[[], Any] | None = make
        self._deps = deps
        self._value: Any = None

    def __call__(self) -> Any:
        if self._make is not None:
            _resolve(self)
        return self._value

    @property
    def done(self) -> bool:
        """Whether the value is computed."""
        return self._make is None


def _resolve(root: Once) -> None:
    """Computes ``root`` after every lazy value it depends on, deepest first."""
    stack: list[tuple[Once, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node._make is None:
            continue
        if ready:
            node._value = node._make()
            node._make, node._deps = None, ()
            continue
        stack.append((node, True))
        stack.extend((d, False) for d in node._deps if isinstance(d, Once) and not d.done)


def _const(x: Any) -> Callable[[], Any]:
    return lambda: x


def dtype_of(atom: Any) -> np.dtype | None:
    """An atom's dtype as NumPy sees it, or None (tokens, keys, refs)."""
    d = getattr(atom.aval, "dtype", None)
    try:
        return None if d is None else np.dtype(d)
    except TypeError:
        return None


def is_narrow(d: np.dtype | None) -> bool:
    """A real float narrower than float32."""
    return d is not None and d.itemsize < 4 and _is_ml_float(d)


_ML_FLOAT_CACHE: dict[np.dtype, bool] = {}


def _is_ml_float(d: np.dtype) -> bool:
    hit = _ML_FLOAT_CACHE.get(d)
    if hit is None:
        import jax.numpy as jnp

        hit = _ML_FLOAT_CACHE[d] = bool(jnp.issubdtype(d, jnp.floating))
    return hit


class Frame:
    """Values, twins and shadows of one jaxpr's variables."""

    def __init__(
        self,
        acc: Callable[[np.dtype], np.dtype],
        widen: Callable[[Any, np.dtype], Any] = lax.convert_element_type,
    ) -> None:
        self.acc = acc  # a narrow float dtype -> its twin's dtype
        self.widen = widen  # (narrow value, twin dtype) -> the twin, exactly
        self.env: dict[Any, Any] = {}
        self.pending: dict[Any, Callable[[], Any]] = {}  # lazily rounded values
        self.twins: dict[Any, Any] = {}
        self.pending_twins: dict[Any, Callable[[], Any]] = {}
        self.shadows: dict[Any, tuple[Any, int]] = {}  # var -> (unrounded value, segment)
        self._shadowed: list[tuple[Any, int]] = []  # (var, segment) of each shadow set, for prune
        self.contexts: dict[Any, Any] = {}  # narrow var -> source info of the equation producing it
        # twins that lazy twins of other variables read (``twin_ref``), not yet asked for themselves:
        # ``twin`` takes one from here, so every use of a variable shares one twin
        self.referenced_twins: dict[Any, Once] = {}
        self.producers: dict[Any, Any] = {}  # var -> the equation of the jaxpr that produces it
        # evaluating concrete values (an eager call), and the variables whose shadow no equation
        # reads there (``Evaluator._unshadowed``)
        self.concrete = False
        self.unshadowed: set[Any] = set()

    # -- values ----------------------------------------------------------------------------------

    def read(self, atom: Any) -> Any:
        """The atom's value, of its own dtype."""
        if isinstance(atom, jcore.Literal):
            return atom.val
        try:
            return self.env[atom]
        except KeyError:
            v = self.env[atom] = self.pending.pop(atom)()
            return v

    def write(self, v: Any, x: Any) -> None:
        """Sets a variable's value."""
        if not isinstance(v, jcore.DropVar):
            self.env[v] = x
            if is_narrow(dtype_of(v)):
                self.contexts[v] = source_info_util.current()

    def write_rounded(self, v: Any, wide: Any, segment: int) -> None:
        """Sets a variable from a result computed at a wider dtype: the value is ``wide`` rounded
        once to the variable's dtype (when first read); ``wide`` stays as its shadow."""
        if isinstance(v, jcore.DropVar):
            return
        d = dtype_of(v)
        if d is None or np.dtype(wide.dtype) == d:
            self.env[v] = wide
            return
        if is_narrow(d) and np.dtype(wide.dtype) == self.acc(d):
            self.set_shadow(v, wide, segment)
        if is_narrow(d):
            self.contexts[v] = source_info_util.current()
        self.pending[v] = _here(lambda: cast(wide, d))

    def value_ref(self, atom: Any) -> Callable[[], Any]:
        """The atom's value as a thunk that stays valid after the atom is freed (a lazy value is
        shared with the frame, computed once)."""
        if isinstance(atom, jcore.Literal):
            return _const(atom.val)
        if atom in self.env:
            return _const(self.env[atom])
        make = self.pending[atom]
        if not isinstance(make, Once):
            make = self.pending[atom] = Once(make)
        return make

    def free(self, atom: Any) -> None:
        """Forgets a variable no equation reads any more: its value, twin and shadow."""
        for table in (
            self.env,
            self.pending,
            self.twins,
            self.pending_twins,
            self.shadows,
            self.contexts,
            self.referenced_twins,
        ):
            table.pop(atom, None)
        self.unshadowed.discard(atom)

    def computed(self, atom: Any) -> Any | None:
        """The atom's value where it is computed already (a constant, an input), else None: reading
        it computes nothing."""
        if isinstance(atom, jcore.Literal):
            return atom.val
        return self.env.get(atom)

    def has_value(self, atom: Any) -> bool:
        return isinstance(atom, jcore.Literal) or atom in self.env or atom in self.pending

    # -- float32 versions ------------------------------------------------------------------------

    def set_shadow(self, v: Any, wide: Any, segment: int) -> None:
        """Sets a variable's shadow: ``wide``, readable by the equations of ``segment``."""
        self.shadows[v] = (wide, segment)
        self._shadowed.append((v, segment))

    def prune(self, segment: int) -> None:
        """Forgets the shadows of every segment but ``segment``: a segment that has ended is never
        read again (the evaluator numbers segments in order), so its float32 values go."""
        keep = []
        for v, s in self._shadowed:
            if s == segment:
                keep.append((v, s))
            else:
                hit = self.shadows.get(v)
                if hit is not None and hit[1] == s:
                    del self.shadows[v]
        self._shadowed = keep

    def shadow(self, atom: Any, segment: int) -> Any | None:
        """The atom's shadow if it was computed in ``segment`` (the same library call)."""
        if isinstance(atom, jcore.Literal):
            return None
        hit = self.shadows.get(atom)
        return hit[0] if hit is not None and hit[1] == segment else None

    def twin(self, atom: Any) -> Any:
        """A narrow float atom's exact widening to its accumulation dtype (shared by all uses)."""
        if isinstance(atom, jcore.Literal):
            d = dtype_of(atom)
            assert d is not None, "a literal has a dtype"
            return np.asarray(atom.val).astype(self.acc(d))
        t = self.twins.get(atom)
        if t is None:
            make = self.pending_twins.pop(atom, None)
            if make is None:
                make = self.referenced_twins.pop(atom, None)
            if make is None:
                make = self.twin_maker(atom)
            t = self.twins[atom] = make()
        return t

    def defer_twin(
        self, v: Any, make: Callable[[], Any], deps: Sequence[Callable[[], Any]] = ()
    ) -> None:
        """Sets ``v``'s twin to ``make()``, computed when first asked for, after ``deps`` (the lazy
        values ``make`` reads), under the source information of now (the equation making it)."""
        self.pending_twins[v] = Once(_here(make), deps)

    def twin_ref(self, atom: Any) -> Callable[[], Any]:
        """The atom's twin as a thunk that stays valid after the atom is freed; the twin is the one
        ``twin(atom)`` gives, whichever is asked first."""
        if isinstance(atom, jcore.Literal):
            return _const(self.twin(atom))
        if atom in self.twins:
            return _const(self.twins[atom])
        pending = self.pending_twins.get(atom)
        if pending is not None:
            if not isinstance(pending, Once):
                pending = self.pending_twins[atom] = Once(pending)
            return pending
        ref = self.referenced_twins.get(atom)
        if ref is None:
            ref = self.referenced_twins[atom] = Once(self.twin_maker(atom))
        return ref

    def twin_maker(self, atom: Any) -> Callable[[], Any]:
        """The default twin: the value widened exactly, where the value was produced."""
        ctx = self.contexts.get(atom)
        d, acc, exactly = dtype_of(atom), self.acc, self.widen
        value = self.value_ref(atom)

        def widen() -> Any:  # holds no reference to the frame: freeing a variable frees its twin
            assert d is not None, "only narrow float atoms have twins"
            return exactly(value(), acc(d))

        if ctx is None:
            return widen
        with source_info_util.user_context(ctx.traceback, name_stack=ctx.name_stack):
            return _here(widen)

    def has_twin(self, atom: Any) -> bool:
        """Whether the atom's twin exists or is set to be made (a twin that another variable's lazy
        twin read counts once it is made, as if asked for)."""
        if isinstance(atom, jcore.Literal):
            return False
        ref = self.referenced_twins.get(atom)
        return atom in self.twins or atom in self.pending_twins or (ref is not None and ref.done)

    def wide(self, atom: Any, segment: int) -> Any:
        """What an equation of ``segment`` computes with: a narrow float atom's shadow (same call)
        or twin; any other atom's value."""
        if not is_narrow(dtype_of(atom)):
            return self.read(atom)
        s = self.shadow(atom, segment)
        return s if s is not None else self.twin(atom)

    def inherit(self, v: Any, outer: Frame, a: Any) -> None:
        """Makes ``v`` (of this frame) stand for ``a`` (of ``outer``): value, twin and shadow."""
        if isinstance(a, jcore.Literal):
            self.env[v] = a.val
            return
        if a in outer.env:
            self.env[v] = outer.env[a]
        else:
            self.pending[v] = outer.value_ref(a)
        if outer.has_twin(a) or is_narrow(dtype_of(a)):  # one twin, whichever side asks first
            self.pending_twins[v] = outer.twin_ref(a)
        if a in outer.shadows:
            self.set_shadow(v, *outer.shadows[a])
        if a in outer.contexts:
            self.contexts[v] = outer.contexts[a]
