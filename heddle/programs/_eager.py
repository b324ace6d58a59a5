"""Eager ``autocast``: the function runs as eager JAX does, its equations evaluated as it goes.

An eager ``autocast(f)(x)`` (concrete inputs, no trace around it) runs ``f`` on tracers of a trace
of its own, ``_Trace``. Each primitive ``f`` binds is staged, exactly as ``jax.make_jaxpr`` would
stage it, by an inner ``DynamicJaxprTrace`` (the recorder), so the equations, their parameters and
source information are the ones the jitted path evaluates. The recorded equations are evaluated
by the same ``Evaluator`` as a traced program, with one ``Frame`` for the whole call, whenever a
concrete value is asked for and when ``f`` returns:

- a tracer has a concrete value (``to_concrete_value``), as a JVP tracer of an eager ``jax.jvp``
  has: Python control flow on values (``if x.sum() > 0``), ``float()``, ``int()``, ``.item()``,
  ``.tolist()``, ``np.asarray``, ``print``, boolean masks and shapes that depend on values
  (``x[x > 0]``, ``jnp.nonzero`` without ``size=``) work as in eager JAX;
- a value that leaves ``f`` other than by ``return`` (a generator's ``yield``, an attribute of an
  object, a list the caller holds) is such a tracer: it behaves as the concrete array it holds,
  during the call and after it (``full_lower``);
- a variable's value, twin and shadow are freed once no tracer holds it and no recorded equation
  reads it: memory is what eager JAX holds, plus the float32 twins of live narrow values.

Evaluating in batches keeps the rules of a traced program: the rounding segments, the float32
shadows inside one library call and the known library calls (``_known``) see the equations in the
order and with the source information ``jax.make_jaxpr`` gives them. A batch is cut where a
concrete value is needed; a library call that asks for one of its own intermediates (a
data-dependent shape) is then evaluated in the parts before and after the cut, as jit could not
run it at all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from jax._src import core, source_info_util
from jax._src.interpreters import partial_eval as pe
from jax._src.interpreters import pxla
from jax.extend import core as jcore

from heddle.policy._errors import message
from heddle.programs._higher import _conform

# When a run evaluates what it has recorded without being asked (``Run.bound``): (equations,
# bytes of constants) past which it does so where a library call ends, and at once.
SOFT = (512, 16 * 2**20)
HARD = (4096, 64 * 2**20)


class _Batch:
    """Recorded equations evaluated together, the recorder's constants they read (what a jaxpr's
    ``constvars`` are: a known call reads a closed-over scalar from them) and the variables still
    read after them."""

    __slots__ = ("constvars", "eqns", "outvars")

    def __init__(self, eqns: list[Any], constvars: list[Any], outvars: list[Any]) -> None:
        self.eqns = eqns
        self.constvars = constvars
        self.outvars = outvars


class Run:
    """One eager call (or block) under autocast: its recorder, evaluator and frame of values."""

    def __init__(self, ev: Any, parent: core.Trace) -> None:
        self.ev = ev
        self.parent = parent
        self.frame = ev.frame()
        self.recorder = pe.DynamicJaxprTrace(None, parent_trace=parent)
        self.trace = EagerTrace(self)
        self.live: dict[Any, int] = {}  # variable -> how many tracers of this run hold it
        self.released: list[Any] = []  # no tracer holds them; freed after the next batch
        self.open = True
        self._flushing = False
        self.failed: BaseException | None = None  # what a batch raised: its values are gone

    # -- tracers ---------------------------------------------------------------------------------

    def arg(self, x: Any) -> _Tracer:
        """A tracer for the concrete input ``x``."""
        inner = self.recorder.new_arg(core.typeof(x), source_info_util.current())
        self.frame.write(inner.val, x)
        return _Tracer(self.trace, inner)

    def wrap(self, out: Any) -> Any:
        """The recorder's results (a tracer, a sequence, a FlatTree) as tracers of this run."""
        if isinstance(out, pe.DynamicJaxprTracer):
            return _Tracer(self.trace, out)
        if isinstance(out, (list, tuple)):
            return type(out)(self.wrap(o) for o in out)
        if hasattr(out, "map"):  # shard_map's FlatTree
            return out.map(self.wrap)
        return out

    def lower(self, x: Any) -> Any:
        """What the recorder is given for ``x``: a tracer of this run's recorder for its own
        tracers, the concrete value for another run's tracer, ``x`` itself otherwise."""
        while isinstance(x, _Tracer) and x._trace is not self.trace:
            x = x._trace.run.value(x)  # a block's inside this one: its value, one level down
        if isinstance(x, _Tracer) and x._trace is self.trace:
            return x.inner
        return x

    def hold(self, var: Any) -> None:
        self.live[var] = self.live.get(var, 0) + 1

    def release(self, var: Any) -> None:
        n = self.live.get(var, 0) - 1
        if n > 0:
            self.live[var] = n
            return
        self.live.pop(var, None)
        if self.recorder.frame.tracing_eqns or self._flushing:
            self.released.append(var)  # a recorded equation may still read it
        else:
            self.frame.free(var)

    # -- evaluation ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Evaluates every equation recorded so far."""
        if self._flushing:
            return
        recorded = self.recorder.frame.tracing_eqns
        if not recorded:
            return
        self._flushing = True
        try:
            taken = [e for e in (r() if callable(r) else r for r in recorded) if e is not None]
            recorded.clear()
            eqns = [
                jcore.JaxprEqn(
                    [t.val for t in e.in_tracers],
                    e.outvars,
                    e.primitive,
                    e.params,
                    e.effects,
                    e.source_info,
                    e.ctx,
                )
                for e in taken
            ]
            constvars = self._constants(
                eqns
            )  # before their tracers go (a constant lives as long as it)
            for e in taken:
                e.in_tracers = []  # a live result no longer holds what it was computed from
            del taken
            with core.set_current_trace(self.parent):
                try:
                    self.ev.run(self.frame, _Batch(eqns, constvars, list(self.live)))
                except BaseException as e:
                    self.failed = e
                    raise
        finally:
            self._flushing = False
            released, self.released = self.released, []
            for v in released:
                if v not in self.live:
                    self.frame.free(v)

    def _constants(self, eqns: Sequence[Any]) -> list[Any]:
        """Writes the recorder's constants that ``eqns`` read into the frame; returns them."""
        consts = self.recorder.frame.constvar_to_val
        read = {a: None for e in eqns for a in e.invars if isinstance(a, jcore.Var) and a in consts}
        for a in read:
            self._constant(a)
        return list(read)

    def _constant(self, a: Any) -> None:
        """Writes ``a`` into the frame if it is a constant of the recorder the frame lacks."""
        frame = self.frame
        consts = self.recorder.frame.constvar_to_val
        if frame.has_value(a) or a not in consts:
            return
        c = consts[a]
        if isinstance(c, _Tracer) and c._trace is self.trace:
            # a tracer of this call that a staged body closed over: the same variable
            frame.inherit(a, frame, c.inner.val)
        else:
            frame.write(a, c)

    def _read(self, atom: Any) -> Any:
        """An atom's value after every recorded equation is evaluated (a constant the call made,
        ``jnp.array([1, 2])``, is its own value)."""
        if isinstance(atom, jcore.Literal):
            return atom.val
        self.flush()
        self._constant(atom)
        if not self.frame.has_value(atom) and self.failed is not None:
            raise RuntimeError(
                message(
                    f"a {atom.aval.str_short()} value of an eager heddle.autocast call or block",
                    f"it was to be computed by operations that raised {self.failed!r}",
                    "Fix the error that operation raised (it is chained below); the values "
                    "computed before it are kept",
                )
            ) from self.failed
        with core.set_current_trace(self.parent):  # a lazy rounding is computed on read
            return self.frame.read(atom)

    def value(self, t: _Tracer) -> Any:
        """The tracer's value, computed: a concrete array, or a tracer of the trace around the
        run (a block nested in another)."""
        return self._read(t.inner.val)

    def result(self, x: Any) -> Any:
        """An output leaf of the call: a tracer of this run as its value, with its own aval."""
        if not isinstance(x, _Tracer) or x._trace is not self.trace:
            return x
        atom = x.inner.val
        return _conform(self._read(atom), atom.aval)

    def bound(self) -> None:
        """Evaluates what is recorded once it is large (a loop that never asks for a value, each
        step's batch a new constant): past ``SOFT`` equations or constant bytes, where a library
        call ends (the equation about to be recorded comes from another call than the last one
        recorded, so no call is cut in two); past ``HARD``, at once (a loop of one statement is
        one call to the end)."""
        frame = self.recorder.frame
        recorded = frame.tracing_eqns
        if not recorded or callable(last := recorded[-1]):
            return
        n = len(recorded)
        held = sum(getattr(c, "nbytes", 0) for c in frame.constvar_to_val.values())
        soft, hard = SOFT, HARD
        if n <= soft[0] and held <= soft[1]:
            return
        if n <= hard[0] and held <= hard[1]:
            sites = self.ev.sites
            now = source_info_util.current().traceback
            if sites.site(now).key == sites.site(last.source_info.traceback).key:
                return
        self.flush()

    def close(self) -> None:
        """Ends the call: what is recorded is evaluated; the tracers still held keep their
        values, and behave as them."""
        try:
            self.flush()
        finally:
            self.open = False


class EagerTrace(core.Trace):
    """Stages every primitive on the run's recorder; its results are the run's tracers."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run
        self.requires_low = False

    def _lower(self, xs: Sequence[Any]) -> list[Any]:
        return [self.run.lower(x) for x in xs]

    def process_primitive(self, primitive: Any, tracers: Any, params: Any, /) -> Any:
        self.run.bound()
        args = self._lower(tracers)
        avals = [core.typeof(a) for a in args]
        out = self.run.wrap(primitive.bind_with_trace(self.run.recorder, args, avals, params))
        recorded = self.run.recorder.frame.tracing_eqns
        if recorded and getattr(recorded[-1], "effects", None):
            self.run.flush()  # a callback, a print: it happens now, as in eager JAX
        return out

    def process_call(self, primitive: Any, f: Any, tracers: Any, params: Any, /) -> Any:
        return self.run.wrap(
            self.run.recorder.process_call(primitive, f, self._lower(tracers), params)
        )

    def process_custom_jvp_call(
        self, primitive: Any, fun: Any, jvp: Any, tracers: Any, /, *, symbolic_zeros: Any
    ) -> Any:
        out = self.run.recorder.process_custom_jvp_call(
            primitive, fun, jvp, self._lower(tracers), symbolic_zeros=symbolic_zeros
        )
        return self.run.wrap(out)

    def process_custom_vjp_call(
        self,
        primitive: Any,
        fun: Any,
        fwd: Any,
        bwd: Any,
        tracers: Any,
        /,
        *,
        out_trees: Any,
        symbolic_zeros: Any,
    ) -> Any:
        out = self.run.recorder.process_custom_vjp_call(
            primitive,
            fun,
            fwd,
            bwd,
            self._lower(tracers),
            out_trees=out_trees,
            symbolic_zeros=symbolic_zeros,
        )
        return self.run.wrap(out)

    def process_shard_map(self, primitive: Any, fun: Any, args: Any, **params: Any) -> Any:
        out = self.run.recorder.process_shard_map(  # type: ignore[attr-defined]
            primitive, fun, self._lower(args), **params
        )
        return self.run.wrap(out)

    def stage_value(self, val: Any) -> Any:
        return self.run.wrap(self.run.recorder.stage_value(self.run.lower(val)))

    def cur_qdd(self, x: Any) -> Any:
        return self.run.recorder.cur_qdd(self.run.lower(x))


def _concrete(method: str) -> Callable[..., Any]:
    """A method of the concrete value, called on it (the tracer's own where there is none)."""

    def call(self: _Tracer, *args: Any, **kwargs: Any) -> Any:
        v = self._forced()
        if v is None:
            return getattr(core.Tracer, method)(self, *args, **kwargs)
        return getattr(v, method)(*args, **kwargs)

    call.__name__ = method
    return call


def _concrete_attribute(name: str) -> property:
    def get(self: _Tracer) -> Any:
        v = self._forced()
        if v is None:
            return getattr(super(_Tracer, self), name)
        return getattr(v, name)

    return property(get)


# JAX's functions that ask ``core.is_concrete(x)`` only to take a faster path where a value happens to
# be known (``jnp.array`` of a known array, an integer power, a static slice, a scan for known loop
# bounds): a tracer of an eager call answers them as a traced value does under ``jit``, so eager
# autocast stages what ``jit`` stages and gives the same bits. Every other request for the value
# (``bool``, ``int``, a shape, a boolean mask, ``jnp.nonzero``) computes it, as eager JAX has it.
_OPPORTUNISTIC = frozenset(
    {
        ("numpy/array_constructors.py", "array"),
        ("numpy/ufuncs.py", "power"),
        ("numpy/indexing.py", "_is_slice_element_none_or_constant_or_symbolic"),
        ("lax/lax.py", "_convert_element_type"),
        ("lax/lax.py", "_get_monoid_reducer"),
        ("lax/windowed_reductions.py", "_get_monoid_window_reducer"),
        ("lax/control_flow/loops.py", "fori_loop"),
    }
)
_TO_CONCRETE = core.to_concrete_value.__code__
_IS_CONCRETE = core.is_concrete.__code__
_ASKS_IN_PASSING: dict[Any, bool] = {}


def _in_passing(code: Any) -> bool:
    """Whether ``code`` (the caller of ``core.is_concrete``) is one of ``_OPPORTUNISTIC``."""
    hit = _ASKS_IN_PASSING.get(code)
    if hit is None:
        path = code.co_filename.replace("\\", "/")
        hit = _ASKS_IN_PASSING[code] = any(
            path.endswith("/jax/_src/" + f) and code.co_qualname == q for f, q in _OPPORTUNISTIC
        )
    return hit


class _Tracer(core.Tracer):
    """A value of an eager autocast call: the recorder's tracer, with a concrete value."""

    __slots__ = ("inner",)

    def __init__(self, trace: EagerTrace, inner: Any) -> None:
        super().__init__(trace, inner.aval)
        self.inner = inner
        if isinstance(inner.val, jcore.Var):
            trace.run.hold(inner.val)

    def __del__(self) -> None:
        try:
            if isinstance(self.inner.val, jcore.Var):
                self._trace.run.release(self.inner.val)
        except Exception:  # interpreter shutdown
            pass

    def to_concrete_value(self) -> Any:
        if self._trace.run.open:  # while the call records: as a traced value, where JAX asks
            f = sys._getframe(1)  # only for a faster path
            if f.f_code is _TO_CONCRETE and (f := f.f_back) is not None:  # type: ignore[assignment]
                if f.f_code is _IS_CONCRETE and f.f_back and _in_passing(f.f_back.f_code):
                    return None
        return self._forced()

    def _forced(self) -> Any:
        """The concrete value (None where there is none)."""
        v = self._trace.run.value(self)
        return core.to_concrete_value(v) if isinstance(v, core.Tracer) else v

    def full_lower(self) -> Any:
        v = self._trace.run.value(self)
        return v.full_lower() if isinstance(v, _Tracer) else v

    def _short_repr(self) -> str:
        v = self._forced()
        return repr(v) if v is not None else f"AutocastTracer({self.aval.str_short()})"

    def __repr__(self) -> str:
        return self._short_repr()

    def __str__(self) -> str:
        v = self._forced()
        return str(v) if v is not None else self._short_repr()

    def __format__(self, spec: str) -> str:
        v = self._forced()
        return format(v, spec) if v is not None else format(self._short_repr(), spec)

    # what a jax.Array answers and a tracer refuses (or answers only when concrete through
    # ``core.is_concrete``, which JAX's fast paths also ask): the concrete value's answer
    __bool__ = _concrete("__bool__")
    __int__ = _concrete("__int__")
    __index__ = _concrete("__index__")
    __float__ = _concrete("__float__")
    __complex__ = _concrete("__complex__")
    __array__ = _concrete("__array__")
    __reduce__ = _concrete("__reduce__")
    item = _concrete("item")
    tolist = _concrete("tolist")
    tobytes = _concrete("tobytes")
    __dlpack__ = _concrete("__dlpack__")
    __dlpack_device__ = _concrete("__dlpack_device__")
    addressable_data = _concrete("addressable_data")
    delete = _concrete("delete")
    is_deleted = _concrete("is_deleted")
    on_device_size_in_bytes = _concrete("on_device_size_in_bytes")
    unsafe_buffer_pointer = _concrete("unsafe_buffer_pointer")
    sharding = _concrete_attribute("sharding")
    device = _concrete_attribute("device")
    committed = _concrete_attribute("committed")
    addressable_shards = _concrete_attribute("addressable_shards")
    global_shards = _concrete_attribute("global_shards")
    is_fully_addressable = _concrete_attribute("is_fully_addressable")
    is_fully_replicated = _concrete_attribute("is_fully_replicated")

    def devices(self) -> Any:
        v = self._forced()
        return self.aval.devices(self) if v is None else v.devices()  # type: ignore[attr-defined]

    def block_until_ready(self) -> _Tracer:
        self._forced()
        return self

    def copy_to_host_async(self) -> None:
        self._forced()


class Block:
    """``with heddle.autocast():``: the block's operations recorded by a ``Run`` and evaluated
    under the rules whenever a value is asked for, and when the block ends. Values from before
    the block are its constants; values it leaves are the run's tracers, which behave as the
    concrete arrays they hold."""

    def __init__(self, ev: Any) -> None:
        self.run = Run(ev, core.trace_ctx.trace)
        self._scope: Any = None

    def __enter__(self) -> None:
        self._scope = core.set_current_trace(self.run.trace)
        self._scope.__enter__()

    def __exit__(self, *exc: Any) -> None:
        interleaved = core.trace_ctx.trace is not self.run.trace
        self._scope.__exit__(*exc)
        if exc[0] is None:
            self.run.close()  # an error leaves what it recorded to be evaluated when asked
        else:
            self.run.open = False
        while isinstance(t := core.trace_ctx.trace, EagerTrace) and not t.run.open:
            core.trace_ctx.set_trace(t.run.parent)  # not back into a block that has ended
        if interleaved and exc[0] is None:
            raise RuntimeError(
                message(
                    "with heddle.autocast(): ... (ending)",
                    "another block began inside this one and had not ended: an await or a "
                    "yield inside the block let other code run under it (a block belongs to "
                    "the code that runs it, as JAX's own trace contexts do)",
                    "Keep await and yield out of the block, or wrap the function instead: "
                    "heddle.autocast(fn)(*args)",
                )
            )


def _shard_concrete(xs: Sequence[_Tracer], *rest: Any) -> Any:
    """Puts a value an eager call left on devices (``jax.device_put``, a jitted call's argument)
    as its concrete array is put."""
    values = [x.full_lower() for x in xs]
    return pxla.shard_arg_handlers[type(values[0])](values, *rest)


pxla.shard_arg_handlers[_Tracer] = _shard_concrete


def settled(x: Any) -> Any:
    """``x``, or the concrete array it holds where it is a value an eager call or block has
    left (its run has ended)."""
    if isinstance(x, _Tracer) and not x._trace.run.open:
        return x.full_lower()
    return x


def is_eager(values: Sequence[Any]) -> bool:
    """Whether a call on ``values`` runs eagerly (``call``): outside any JAX transformation, or
    inside an eager call or block, with no traced value among them but that call's own."""
    trace = core.trace_ctx.trace
    if not isinstance(trace, core.EvalTrace | EagerTrace):
        return False
    return all(not isinstance(v, core.Tracer) or isinstance(v, _Tracer) for v in values)


def call(ev: Any, fn: Callable[..., list[Any]], values: Sequence[Any]) -> list[Any]:
    """``fn`` (a function of flat arrays returning a flat list) run eagerly under ``ev``'s rules on
    the concrete ``values``: its outputs, concrete arrays of the avals ``jax.make_jaxpr`` gives."""
    run = Run(ev, core.trace_ctx.trace)
    try:
        with source_info_util.reset_name_stack(), pe.TracebackScope():
            args = [run.arg(x) for x in values]
            del values
            with core.set_current_trace(run.trace):
                outs = fn(*args)
            del args
        return [run.result(o) for o in outs]
    finally:
        run.close()
