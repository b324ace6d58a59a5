"""``autocast``'s evaluator: every equation of a jaxpr re-bound under its rule from ``_table``.

The jaxpr is evaluated equation by equation (JAX's "custom interpreter" pattern), binding each
primitive again on the current trace, so the result composes with whatever transformation is
active (jit, grad, vmap, shard_map). Each equation's outputs keep their avals; only how they are
computed changes (the accumulator, the one rounding). The rules:

- contractions: operands at the promotion of both (then float32 on CPU, as heddle.numpy does),
  ``preferred_element_type`` the accumulation dtype, float32 at the policy's matmul precision;
- reductions, scans, window sums, scatter-accumulations, cross-device sums: operand at acc_dtype;
- narrow float arithmetic: computed at acc_dtype;
- conversions that can change a value: heddle's correctly rounded cast;
- exact operations: bound as they are (computed on float32 shadows inside a call that has them);
- higher-order primitives: their bodies evaluated by the same rules (``_higher``);
- the equations of a known library call (``jnp.log10``, ``jax.nn.gelu``, ...: ``_known``): computed
  as heddle's own function of the call's input, which uses the constants and formulas JAX's
  narrow trace has lost.

Results computed at a wider dtype are rounded once to the equation's own dtype (``Frame``); see
``_frame`` for the shadows that keep a library call's intermediates in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jax._src import core
from jax._src.lax.lax import canonicalize_precision
from jax.extend import core as jcore

from heddle.ops import _nanprop
from heddle.ops._core import order_dtype
from heddle.ops.lowering import (
    PRECISION,
    cast,
    contraction_operand_dtype,
    dot_needs_widening,
    is_differentiated,
    runnable_precision,
    transposes_weight_on_cpu,
    widens_narrow_contractions,
)
from heddle.policy import _dtypes as D
from heddle.policy import _lattice
from heddle.policy._errors import PolicyError
from heddle.policy._policy import Policy
from heddle.policy._rules import acc_dtype
from heddle.programs import _interpret, _known
from heddle.programs._audit_source import LIBRARY_BODY, SiteCache, entry_name
from heddle.programs._frame import Frame, dtype_of, is_narrow
from heddle.programs._on_twins import on_twins
from heddle.programs._table import Fact, Monoid, Rule, has, having, monoid, names, rule

# The control flow of jax.lax a program writes itself: what crosses its bodies' boundary is rounded
# (narrow carries stay narrow between steps), as between two calls.
_LAX_CONTROL: tuple[Any, ...] = (lax.scan, lax.fori_loop, lax.map, lax.while_loop, lax.cond)
_USER_CONTROL = frozenset(map(entry_name, (*_LAX_CONTROL, lax.associative_scan, lax.switch)))
# Bound on the values, never on float32 shadows.
_ON_VALUES = having(Fact.ON_VALUES)
# Exact primitives whose one result copies operand values: the result's twin is the same copy of
# the operands' twins (so cotangents of a transposed or broadcast narrow value sum in float32).
_COPYING = having(Fact.COPIES)


class Evaluator:
    """Evaluates jaxprs under the policy ``p``; one per ``autocast`` call."""

    def __init__(self, p: Policy, eager: bool = False) -> None:
        self.p = p
        self.eager = eager  # evaluating on concrete arrays, not under a trace
        self.sites = SiteCache()
        self.segment = 0  # the current segment
        self._segments = 0  # segments started so far: a new one is never an old number
        self._last_key: Any = object()
        self._acc: dict[np.dtype, np.dtype] = {}
        self.widen = widens_narrow_contractions()
        from heddle.programs import _higher

        self.higher = _higher

    # -- helpers -----------------------------------------------------------------------------------

    def acc(self, d: np.dtype) -> np.dtype:
        """acc_dtype of ``d`` under the policy (cached)."""
        hit = self._acc.get(d)
        if hit is None:
            hit = self._acc[d] = acc_dtype(D.dtype(d), self.p)
        return hit

    def frame(self) -> Frame:
        return Frame(self.acc)

    def _segment(self, eqn: Any) -> int:
        """The segment of ``eqn``: the library call it belongs to, a new one where the call key
        changes. The body of a jitted helper the call runs (``jnp.where``'s ``_where``, which has
        no caller in its traceback) continues the call."""
        key = self.sites.site(eqn.source_info.traceback).key
        if key is LIBRARY_BODY:
            return self.segment
        if key != self._last_key:
            self._last_key = key
            self._start()
        return self.segment

    def _start(self) -> None:
        self._segments += 1
        self.segment = self._segments

    def new_segment(self) -> None:
        """Starts a new call (values crossing a body boundary are rounded)."""
        self._last_key = object()
        self._start()

    def continue_call(self, eqn: Any) -> int:
        """Starts a new segment that ``eqn``'s library call continues in: the equations of that call
        that come next (a loop body's, or the outer ones after the loop) read the shadows written
        in it. Returns the segment."""
        self.new_segment()
        self._last_key = self.sites.site(eqn.source_info.traceback).key
        return self.segment

    def resume(self, seg: int, eqn: Any) -> int:
        """Returns to ``eqn``'s segment ``seg`` after its bodies ran (each in segments of their
        own): the call's next equations read the shadows written in it before ``eqn`` and those
        of ``eqn``'s results, written in ``seg``. Returns ``seg``."""
        self.segment = seg
        self._last_key = self.sites.site(eqn.source_info.traceback).key
        return seg

    def position(self) -> tuple[int, Any]:
        """Where evaluation is: the current segment and the call key it belongs to."""
        return self.segment, self._last_key

    def restore(self, position: tuple[int, Any]) -> int:
        """Returns to ``position`` (``position()``) after an equation's bodies ran, each in segments
        of their own: as ``resume``, also for an equation of a library body (``xlogy`` inside
        ``_xlogx``), whose own key says nothing of the call it continues. Returns the segment."""
        self.segment, self._last_key = position
        return self.segment

    def segment_of(self, eqn: Any) -> int | None:
        """The current segment if it belongs to ``eqn``'s call, else None."""
        key = self.sites.site(eqn.source_info.traceback).key
        return self.segment if key == self._last_key else None

    def in_library_call(self, eqn: Any) -> bool:
        """Whether a loop or cond equation is part of one library call (``jnp.polyval``'s ``scan``,
        ``jnp.diagonal``'s ``cond``), not control flow the caller wrote: the JAX function the caller
        called is not one of ``jax.lax``'s (``scan``, ``fori_loop``, ``map``, ``while_loop``,
        ``associative_scan``, ``cond``, ``switch``, also when flax or equinox call them)."""
        entry = self.sites.site(eqn.source_info.traceback).entry
        return entry is not None and entry not in _USER_CONTROL

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, frame: Frame, jaxpr: Any) -> None:
        """Evaluates every equation of ``jaxpr`` (a Jaxpr) into ``frame``; the equations of a known
        library call (``_known``) as heddle's own function of its input."""
        eqns = jaxpr.eqns
        frame.producers.update((v, e) for e in eqns for v in e.outvars)
        frame.concrete = isinstance(core.trace_ctx.trace, core.EvalTrace)  # an eager call
        if frame.concrete:
            frame.unshadowed.update(self._unshadowed(jaxpr))
        last = self.segment

        def step(i: int) -> int:
            nonlocal last
            eqn = eqns[i]
            seg = self._segment(eqn)
            if seg != last:  # a segment ended: its shadows are never read again
                frame.prune(seg)
                last = seg
            known = _known.calls(self._key, frame, jaxpr, i)
            if known is None:
                with _interpret.context(eqn):
                    self.eqn(frame, eqn, seg)
                return i + 1
            end, found = known
            for call in found:
                with _interpret.context(call.eqn):
                    _known.evaluate(frame, call, seg)
            return end

        _interpret.run(frame, jaxpr, step)

    def _key(self, eqn: Any) -> Any:
        return self.sites.site(eqn.source_info.traceback).key

    def _unshadowed(self, jaxpr: Any) -> set[Any]:
        """The variables whose shadow no equation can read: every equation reading one belongs
        to another library call than the one producing it (a different call site, not the body of
        a jitted helper), and the jaxpr does not return it (a later batch of an eager call may
        continue its call). Their equations may round at once, in one fused kernel."""
        keys = [self._key(e) for e in jaxpr.eqns]
        made = {v: k for e, k in zip(jaxpr.eqns, keys, strict=True) for v in e.outvars}
        out = {v for v, k in made.items() if k is not LIBRARY_BODY}
        for e, k in zip(jaxpr.eqns, keys, strict=True):
            for a in e.invars:
                if isinstance(a, jcore.Var) and a in out and (k is LIBRARY_BODY or k == made[a]):
                    out.discard(a)
        out.difference_update(a for a in jaxpr.outvars if isinstance(a, jcore.Var))
        return out

    def eqn(self, frame: Frame, eqn: Any, seg: int) -> None:
        """One equation under its rule."""
        name = eqn.primitive.name
        r = rule(name)
        handler = _HANDLERS.get(r)
        if name in _NAN_ACROSS_DEVICES:
            _across_devices(frame, eqn)
        elif handler is None or (name in _ON_VALUES):
            self.bind_plain(frame, eqn)
        else:
            handler(self, frame, eqn, seg)

    def bind_plain(self, frame: Frame, eqn: Any, params: dict[str, Any] | None = None) -> None:
        """Binds the equation unchanged, on the values."""
        params = eqn.primitive.get_bind_params(eqn.params if params is None else params)
        ans = eqn.primitive.bind(*map(frame.read, eqn.invars), **params)
        outs = ans if eqn.primitive.multiple_results else [ans]
        for v, x in zip(eqn.outvars, outs, strict=True):
            frame.write(v, x)

    def bind_wide(
        self,
        frame: Frame,
        eqn: Any,
        seg: int,
        args: list[Any],
        params: dict[str, Any] | None = None,
    ) -> None:
        """Binds the equation on (widened) ``args``; outputs rounded once to their dtypes."""
        params = eqn.primitive.get_bind_params(eqn.params if params is None else params)
        ans = eqn.primitive.bind(*args, **params)
        outs = ans if eqn.primitive.multiple_results else [ans]
        for v, x in zip(eqn.outvars, outs, strict=True):
            frame.write_rounded(v, x, seg)

    def bind_acc(
        self, frame: Frame, eqn: Any, seg: int, widens: Callable[[np.dtype], bool]
    ) -> None:
        """``bind_wide`` on every operand whose dtype ``widens`` at its accumulation dtype
        (``to_acc``), the others as they are.

        On concrete values (an eager call) the equation runs as one jitted kernel that widens
        its variable operands itself and, where no equation of the same library call reads a
        result unrounded, rounds the results too: bit for bit the same values, without a float32
        copy of an operand or a result in memory (XLA fuses the conversions into the operation).
        """

        def operand(a: Any) -> Any:
            d = dtype_of(a)
            return self.to_acc(frame, a, seg) if d is not None and widens(d) else frame.read(a)

        widen = _widening(self, frame, eqn, seg, widens)
        if frame.concrete:
            rounded = all(v in frame.unshadowed for v in eqn.outvars)
            params = eqn.primitive.get_bind_params(eqn.params)
            kernel = _fused(eqn, params, widen, rounded)
            if kernel is not None:
                args = [
                    frame.read(a) if w is not None else operand(a)
                    for a, w in zip(eqn.invars, widen, strict=True)
                ]
                for v, x in zip(eqn.outvars, kernel(*args), strict=True):
                    if rounded:
                        frame.write(v, x)
                    else:
                        frame.write_rounded(v, x, seg)
                return
        args = [operand(a) for a in eqn.invars]
        self.bind_wide(frame, eqn, seg, args)

    def shadowed(self, frame: Frame, eqn: Any, seg: int) -> bool:
        return any(frame.shadow(a, seg) is not None for a in eqn.invars)

    def to_acc(self, frame: Frame, a: Any, seg: int) -> Any:
        """An operand at its accumulation dtype: float32 shadow/twin for narrow floats, an exact
        widening for narrow integers and bool, the value otherwise."""
        d = dtype_of(a)
        if d is None:
            return frame.read(a)
        if is_narrow(d):
            return frame.wide(a, seg)
        acc = self.acc(d) if D.kind(d) in "biuf" else d
        x = frame.read(a)
        return x if acc == d else lax.convert_element_type(x, acc)


def _integer_or_float(d: np.dtype) -> bool:
    return D.kind(d) in "biuf"


def _widening(
    ev: Evaluator, frame: Frame, eqn: Any, seg: int, widens: Callable[[np.dtype], bool]
) -> tuple[Any, ...]:
    """For each operand of ``eqn``, the accumulation dtype that ``to_acc`` widens its value to
    exactly, or None: a literal, a dtype ``widens`` leaves as it is or already at its
    accumulation dtype, a narrow float read through its shadow (this call's unrounded value)."""
    out = []
    for a in eqn.invars:
        d = dtype_of(a)
        wide = None
        if isinstance(a, jcore.Var) and d is not None and widens(d):
            acc = ev.acc(d)
            if acc != d and frame.shadow(a, seg) is None:
                wide = acc
        out.append(wide)
    return tuple(out)


def _fused(
    eqn: Any, params: dict[str, Any], widen: tuple[Any, ...], rounded: bool
) -> Callable[..., list[Any]] | None:
    """The equation as one jitted kernel (None where a parameter is unhashable): widen the
    operands ``widen`` names, bind, and round the results once to their dtypes if ``rounded``."""
    outs = tuple(dtype_of(v) for v in eqn.outvars) if rounded else None
    try:
        return _kernel(eqn.primitive, tuple(sorted(params.items())), widen, outs)
    except TypeError:  # an unhashable parameter
        return None


@functools.lru_cache(maxsize=1024)
def _kernel(
    prim: Any,
    params: tuple[tuple[str, Any], ...],
    widen: tuple[Any, ...],
    outs: tuple[Any, ...] | None,
) -> Callable[..., list[Any]]:
    kwargs = dict(params)

    def kernel(*args: Any) -> list[Any]:
        wide = [
            a if w is None else lax.convert_element_type(a, w)
            for a, w in zip(args, widen, strict=True)
        ]
        ans = prim.bind(*wide, **kwargs)
        res = ans if prim.multiple_results else [ans]
        if outs is None:
            return list(res)
        return [
            x if d is None or x.dtype == d else cast(x, d) for x, d in zip(res, outs, strict=True)
        ]

    return jax.jit(kernel)


# -- rules ---------------------------------------------------------------------------------------


def _float(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    narrow = any(is_narrow(dtype_of(a)) for a in (*eqn.invars, *eqn.outvars))
    if not narrow:
        ev.bind_plain(frame, eqn)
        return
    ev.bind_acc(frame, eqn, seg, is_narrow)


# Selections whose JVP rule counts ties in the operand's dtype (a sum): bound on the float32 twins so
# that the derivative's count accumulates in float32 (the value, a copy, is the same).
_TIE_COUNTING = having(Fact.COUNTS_TIES)


def _exact(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    other = _past_identity(frame, eqn)
    if other is not None:
        frame.inherit(eqn.outvars[0], frame, other)
        return
    tie = eqn.primitive.name in _TIE_COUNTING and is_narrow(dtype_of(eqn.invars[0]))
    shadowed = ev.shadowed(frame, eqn, seg)
    if tie and not shadowed:
        _selection(frame, eqn, seg)
        return
    wide = tie or shadowed
    if eqn.primitive.name in _nanprop.REDUCTIONS:
        _propagating(ev, frame, eqn, seg, wide)
        if wide:
            return
    elif wide:
        ev.bind_wide(frame, eqn, seg, [frame.wide(a, seg) for a in eqn.invars])
        return
    else:
        ev.bind_plain(frame, eqn)
    name = eqn.primitive.name
    if name in _COPYING and not eqn.primitive.multiple_results:
        _copying_twin(frame, eqn)


def _past_identity(frame: Frame, eqn: Any) -> Any | None:
    """The other operand of a binary ``max``/``min`` with its identity as a literal that the dtype
    holds as NaN, where that operand is a ``max``/``min`` reduction of the same kind: JAX's
    ``max(-inf, reduce_max(x))`` guard (softmax, logsumexp) in a float8 format without infinities
    (the same rule as a ``reduce``'s init value, ``_is_identity``). None for anything else: a NaN
    the code wrote (``jnp.maximum(x, jnp.nan)``) stays NaN."""
    kind = monoid(eqn.primitive.name)
    if kind not in (Monoid.MAX, Monoid.MIN) or len(eqn.invars) != 2:
        return None
    identity = _MONOIDS[kind][2]
    d = dtype_of(eqn.outvars[0])
    if d is None or D.kind(d) != "f" or not np.isnan(np.asarray(identity).astype(d)):
        return None
    a, b = eqn.invars
    for lit, other in ((a, b), (b, a)):
        if (
            isinstance(lit, jcore.Literal)
            and isinstance(other, jcore.Var)
            and getattr(other.aval, "shape", None) == getattr(eqn.outvars[0].aval, "shape", ())
            and _is_identity(lit, identity, d)
            and _reduces(frame.producers.get(other), kind)
        ):
            return other
    return None


def _reduces(eqn: Any, kind: Monoid) -> bool:
    """Whether ``eqn`` is a ``kind`` (max or min) reduction: ``reduce_max``, or a ``reduce`` with
    that body (JAX's reduction of a float8 format without infinities)."""
    if eqn is None:
        return False
    name = eqn.primitive.name
    return name == kind.value or (rule(name) is Rule.MONOID and _monoid(eqn) is kind)


def _selection(frame: Frame, eqn: Any, seg: int) -> None:
    """A tie-counting selection (``reduce_max``, ``cummax``, ...) of a narrow operand whose float32
    version is its exact twin: the same values, selected from the narrow operand (widening is exact
    and monotone), so no float32 copy of the operand is computed for it (jax.nn.logsumexp's max),
    with the derivative of the selection on the twin, whose tie count sums in float32. The
    narrow operand's own tangent is the twin's, already counted: it is not read."""
    (a,), (v,) = eqn.invars, eqn.outvars
    params = eqn.primitive.get_bind_params(eqn.params)
    name = eqn.primitive.name

    def select(y: Any) -> Any:
        bind = lambda z: eqn.primitive.bind(z, **params)
        if name in _nanprop.REDUCTIONS:
            return _nanprop.reduce(name, y, eqn.params["axes"], bind)
        return bind(y)

    def selected(tw: Any, x: Any) -> Any:
        return lax.convert_element_type(select(x), tw.dtype)

    if frame.concrete:  # an eager value: no derivative reaches it, so no twin is needed
        frame.write(v, select(frame.read(a)))
        return
    frame.write_rounded(v, on_twins(selected, select, [frame.wide(a, seg)], [frame.read(a)]), seg)


def _propagating(ev: Evaluator, frame: Frame, eqn: Any, seg: int, wide: bool) -> None:
    """reduce_max / reduce_min: NaN wherever the reduced slice holds one, on any sharding (XLA:CPU's
    cross-device max/min combiner drops NaN; see heddle/ops/_nanprop.py); on the float32 shadow or
    twin of a narrow operand when ``wide``, rounded back exactly."""
    (a,), (v,) = eqn.invars, eqn.outvars
    params = eqn.primitive.get_bind_params(eqn.params)
    x = frame.wide(a, seg) if wide else frame.read(a)
    out = _nanprop.reduce(
        eqn.primitive.name, x, eqn.params["axes"], lambda y: eqn.primitive.bind(y, **params)
    )
    if wide:
        frame.write_rounded(v, out, seg)
    else:
        frame.write(v, out)


_NAN_ACROSS_DEVICES = having(Fact.NAN_ACROSS_DEVICES)


def _across_devices(frame: Frame, eqn: Any) -> None:
    """pmax / pmin on the values, NaN wherever a device's value is NaN (heddle/ops/_nanprop.py)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    args = [frame.read(a) for a in eqn.invars]
    outs = eqn.primitive.bind(*args, **params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    groups = eqn.params.get("axis_index_groups")
    for v, a, o in zip(eqn.outvars, args, outs, strict=True):
        frame.write(v, _nanprop.across_devices(a, o, eqn.params["axes"], groups))


def _copying_twin(frame: Frame, eqn: Any) -> None:
    (out,) = eqn.outvars
    d = dtype_of(out)
    if not is_narrow(d) or isinstance(out, jcore.DropVar):
        return
    if all(isinstance(a, jcore.Literal) for a in eqn.invars if dtype_of(a) == d):
        return  # a copy of constants (``full_like(x, 0)``) has no cotangent to sum: its twin is its
        # value widened, which the program then shows as the narrow constant it is
    # always (lazily): widening the copy instead of copying the twin would make the backward
    # pass's sum (a broadcast's reduce_sum, a gather's scatter-add) narrow

    refs = [frame.twin_ref(a) if dtype_of(a) == d else frame.value_ref(a) for a in eqn.invars]
    frame.defer_twin(out, lambda: _interpret.bind(eqn, [ref() for ref in refs])[0], refs)


def _accumulate(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    """Reductions, scans, window sums, cross-device sums: every operand at acc_dtype."""
    ds = [dtype_of(a) for a in eqn.invars]
    if all(d is None or D.kind(d) not in "biuf" or ev.acc(d) == d for d in ds):
        if not ev.shadowed(frame, eqn, seg):
            ev.bind_plain(frame, eqn)
            return
    ev.bind_acc(frame, eqn, seg, _integer_or_float)


# A generic ``reduce`` whose body is a monoid (``_table.monoid``) on its two arguments is that
# reduction: (the function computing it, its binary op, its identity).
_MONOIDS: dict[Monoid, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any], float]] = {
    Monoid.SUM: (lax.reduce_sum, lax.add, 0.0),
    Monoid.PRODUCT: (lax.reduce_prod, lax.mul, 1.0),
    Monoid.MAX: (lax.reduce_max, lax.max, -np.inf),
    Monoid.MIN: (lax.reduce_min, lax.min, np.inf),
}


def _monoid(eqn: Any) -> Monoid | None:
    """The monoid that a one-operand ``reduce``'s body computes, or None."""
    if len(eqn.invars) != 2:
        return None
    closed = eqn.params["jaxpr"]
    jaxpr = getattr(closed, "jaxpr", closed)
    if len(jaxpr.eqns) != 1 or len(jaxpr.outvars) != 1 or len(jaxpr.invars) != 2:
        return None
    (body,) = jaxpr.eqns
    kind = monoid(body.primitive.name)
    if kind is None or body.outvars[0] is not jaxpr.outvars[0]:
        return None
    if len(body.invars) != 2 or set(body.invars) != set(jaxpr.invars):
        return None
    return kind


def _is_identity(init: Any, identity: float, d: np.dtype) -> bool:
    """Whether a literal init value is the monoid's identity as ``d`` holds it. JAX builds a sum of
    ``float8_e8m0fnu`` (no zero, no infinity) with the identity cast to it: NaN."""
    if not isinstance(init, jcore.Literal):
        return False
    val = np.asarray(init.val).astype(np.float64)
    if D.kind(d) in "iu":
        info = np.iinfo(d)
        held = {0.0: 0.0, 1.0: 1.0, -np.inf: info.min, np.inf: info.max}[identity]
        return bool(val == held)
    held = np.float64(np.asarray(identity).astype(d).astype(np.float64))
    return bool(val == held or val == identity or (np.isnan(val) and np.isnan(held)))


def _generic_reduce(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    """``reduce`` with an add/mul body: operand at acc_dtype, rounded once; with a max/min body: on
    the float32 twin of a narrow operand (the tie counts of the derivative), NaN-propagating. An init
    value that is the identity is dropped (JAX's NaN identity of ``float8_e8m0fnu`` would poison
    the result); any other init value is combined at the same dtype. Other bodies pass through."""
    kind = _monoid(eqn)
    d = dtype_of(eqn.invars[0]) if kind is not None else None
    if kind is None or d is None or D.kind(d) not in "iuf":
        ev.bind_plain(frame, eqn)
        return
    (a, init), (v,) = eqn.invars, eqn.outvars
    reducer, combine, identity = _MONOIDS[kind]
    axes = tuple(eqn.params["dimensions"])
    selection = kind in (Monoid.MAX, Monoid.MIN)
    if selection:
        wide = is_narrow(d) or ev.shadowed(frame, eqn, seg)
    else:
        wide = ev.acc(d) != d or ev.shadowed(frame, eqn, seg)
    if not wide:
        ev.bind_plain(frame, eqn)
        return
    x, x0 = (ev.to_acc(frame, u, seg) for u in (a, init))
    if selection:
        out = _nanprop.reduce(kind.value, x, axes, lambda y: reducer(y, axes))
    else:
        out = reducer(x, axes)
    if not _is_identity(init, identity, d):
        out = combine(out, x0)
    frame.write_rounded(v, out, seg)


# The accumulating scatters and jax.lax's function of each (scatter-add: lax.scatter_add).
_SCATTERS: dict[str, Callable[..., Any]] = {
    name: getattr(lax, name.replace("-", "_")) for name in names(Rule.SCATTER)
}


def _scatter(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    operand, indices, updates = eqn.invars
    d = dtype_of(operand)
    if (
        d is None
        or D.kind(d) not in "biuf"
        or (ev.acc(d) == d and not ev.shadowed(frame, eqn, seg))
    ):
        ev.bind_plain(frame, eqn)
        return
    p = eqn.params
    out = _SCATTERS[eqn.primitive.name](
        ev.to_acc(frame, operand, seg),
        frame.read(indices),
        ev.to_acc(frame, updates, seg),
        p["dimension_numbers"],
        indices_are_sorted=p["indices_are_sorted"],
        unique_indices=p["unique_indices"],
        mode=p["mode"],
    )
    frame.write_rounded(eqn.outvars[0], out, seg)


def _common(ev: Evaluator, a: np.dtype, b: np.dtype) -> np.dtype:
    if a == b:
        return a
    try:
        return ev.p.promote(a, b)
    except PolicyError:  # no promotion under the policy: the wider, as JAX would need
        return a if a.itemsize >= b.itemsize else b


def _contraction(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    lhs, rhs = eqn.invars[:2]
    dl, dr, out = dtype_of(lhs), dtype_of(rhs), dtype_of(eqn.outvars[0])
    if (
        dl is None
        or dr is None
        or out is None
        or not all(D.kind(d) in "biuf" for d in (dl, dr, out))
    ):
        ev.bind_plain(frame, eqn)
        return
    common = _common(ev, dl, dr)
    acc_in, acc_out = ev.acc(common), ev.acc(out)
    acc = acc_in if acc_in == acc_out else _common(ev, acc_in, acc_out)
    # an operand with a float32 shadow of its own library call (``multi_dot``'s intermediate
    # product, attention's probabilities) enters at that value, as heddle's function computes it
    wide = ev.shadowed(frame, eqn, seg) or (ev.widen and _needs_wide_operands(frame, eqn))
    operand = contraction_operand_dtype(common, acc, wide)

    def feed(a: Any, d: np.dtype) -> Any:
        if operand == acc and is_narrow(d):
            return frame.wide(a, seg)  # exact twin (or the call's own float32 shadow)
        x = frame.read(a)
        return x if d == operand else cast(x, operand)

    params = dict(eqn.params)
    params["preferred_element_type"] = acc
    params["precision"] = runnable_precision(params.get("precision"))
    if operand == np.float32 and params.get("precision") is None:
        prec = PRECISION[ev.p.float32_matmul_precision]
        if prec is not None:
            params["precision"] = canonicalize_precision(prec)
    args = [feed(lhs, dl), feed(rhs, dr), *map(frame.read, eqn.invars[2:])]
    if not is_narrow(operand):
        ev.bind_wide(frame, eqn, seg, args, params)
        return
    differentiated = any(map(is_differentiated, args[:2]))
    if differentiated:  # the derivative reaches the float32 twins
        args = [frame.wide(lhs, seg), frame.wide(rhs, seg), *args[2:]]
    if ev.widen and has(eqn.primitive.name, Fact.DOT):
        args, params = _cpu_layout(args, params)
    if differentiated:
        out = _narrow_contraction(eqn.primitive, args, operand, params)
        frame.write_rounded(eqn.outvars[0], out, seg)
    else:
        ev.bind_wide(frame, eqn, seg, args, params)


def _narrow_contraction(prim: Any, args: list[Any], d: np.dtype, params: dict[str, Any]) -> Any:
    """A contraction (``dot_general``, ``conv_general_dilated``, ``ragged_dot_general``) of two
    float32 values that hold narrow (``d``) ones exactly: computed on the narrow values, at the
    narrow kernel's speed, with a derivative that reaches the float32 values unrounded. JAX's own
    derivative of a narrow contraction rounds each operand's cotangent to the narrow dtype before
    the cotangents of a value used twice are added; here every cotangent is float32 and the sum is
    rounded once (POLICY.md 7), as for every other op autocast evaluates. Further operands (a ragged
    dot's group sizes) are integers, read by both."""
    lw, rw, *rest = args
    bind_params = prim.get_bind_params(params)
    contraction = lambda lhs, rhs: prim.bind(lhs, rhs, *rest, **bind_params)
    narrow = lambda lw, rw: contraction(cast(lw, d), cast(rw, d))
    return on_twins(narrow, contraction, [lw, rw])


def _cpu_layout(args: list[Any], params: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``x @ w`` with a differentiated narrow weight, laid out as heddle.numpy's matmul lays it out
    on XLA:CPU (``matmul_on_cpu``): ``w`` enters transposed, so the dots of the backward pass stay
    on XLA:CPU's library path. The same float32-accumulated dot, the same value."""
    a, b = args[:2]
    if params["dimension_numbers"] != (((a.ndim - 1,), (0,)), ((), ())):
        return args, params
    if not transposes_weight_on_cpu(a, b):
        return args, params
    dn = (((a.ndim - 1,), (1,)), ((), ()))
    bt = lax.transpose(b, (1, 0))
    if not is_narrow(_value_dtype(b)):
        # a float32 twin: its gradient stays float32 on the way back, and the barrier keeps XLA
        # from folding the transpose back into the weight gradient's dot (off the library path)
        bt = lax.optimization_barrier(bt)
    return [a, bt, *args[2:]], {**params, "dimension_numbers": dn}


def _value_dtype(x: Any) -> np.dtype:
    return D.dtype(np.dtype(x.dtype))


def _needs_wide_operands(frame: Frame, eqn: Any) -> bool:
    """Whether a narrow contraction on CPU must widen its operands: a ``dot_general`` only where
    XLA:CPU has no narrow kernel for its dimension numbers, as bound (``jax.vmap`` around autocast
    adds dimensions; heddle.numpy's matmul and einsum decide the same way); convolutions and
    ragged dots always (as heddle.lax's do)."""
    if not has(eqn.primitive.name, Fact.DOT):
        return True
    lhs, rhs = (frame.read(v) for v in eqn.invars[:2])
    return dot_needs_widening(lhs, rhs, eqn.params["dimension_numbers"])


def _convert(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    (x,), (out,) = eqn.invars, eqn.outvars
    src, dst = dtype_of(x), dtype_of(out)
    p = eqn.params
    if src is None or dst is None or p.get("sharding") is not None or p.get("weak_type"):
        ev.bind_plain(frame, eqn)
        return
    if D.kind(D.dtype(src)) == "c" and D.kind(D.dtype(dst)) != "c":
        ev.bind_plain(frame, eqn)  # JAX's own: the real part (heddle's cast refuses to drop it)
        return
    if src == dst:
        frame.write(out, frame.read(x))
        if frame.has_twin(x):
            frame.pending_twins[out] = frame.twin_ref(x)
        s = frame.shadow(x, seg)
        if s is not None:
            frame.set_shadow(out, s, seg)
        return
    if is_narrow(src) and ev.acc(src) == dst:
        frame.write(out, frame.wide(x, seg))  # the shadow inside a call, else the exact twin
        return
    if _lattice.lossless(D.dtype(src), D.dtype(dst)):
        ev.bind_plain(frame, eqn)
        return
    s = frame.shadow(x, seg)
    source = s if s is not None else frame.read(x)
    if isinstance(source, (np.ndarray, np.generic, int, float, bool)):  # host: as a 1-d array
        source = np.asarray(source)
        frame.write(out, cast(source.reshape(-1), dst).reshape(source.shape))
        return
    if is_narrow(dst) and np.dtype(source.dtype) == ev.acc(dst):
        frame.write_rounded(out, source, seg)  # rounded once; the unrounded value is its shadow
        return
    frame.write(out, cast(source, dst))


def _index(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    d = dtype_of(eqn.invars[0]) if eqn.invars else None
    ordered = d is not None and D.kind(d) == "f" and order_dtype(d) != d  # float8_e8m0fnu
    if eqn.invars and (ordered or ev.shadowed(frame, eqn, seg)):
        ev.bind_wide(frame, eqn, seg, [frame.wide(a, seg) for a in eqn.invars])
    else:
        ev.bind_plain(frame, eqn)


def _higher_order(ev: Evaluator, frame: Frame, eqn: Any, seg: int) -> None:
    ev.higher.evaluate(ev, frame, eqn)


_HANDLERS: dict[Rule | None, Callable[[Evaluator, Frame, Any, int], None]] = {
    Rule.CONTRACTION: _contraction,
    Rule.REDUCTION: _accumulate,
    Rule.SCAN: _accumulate,
    Rule.WINDOW: _accumulate,
    Rule.COLLECTIVE: _accumulate,
    Rule.SCATTER: _scatter,
    Rule.CONVERT: _convert,
    Rule.FLOAT: _float,
    Rule.EXACT: _exact,
    Rule.INDEX: _index,
    Rule.HIGHER_ORDER: _higher_order,
    Rule.MONOID: _generic_reduce,
}
