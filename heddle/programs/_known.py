"""Known library calls: JAX functions that ``autocast`` evaluates with heddle's own implementation.

jax.numpy, jax.nn and jax.scipy build some constants in the input's dtype before any primitive
exists (``jnp.log10`` of bfloat16 multiplies by ``1/ln 10`` as the bfloat16 0.43359375, ``jax.nn.selu``
by its scale as 1.046875), and heddle's namespaces replace some of JAX's float32 formulas by
accurate ones (``sinc``, ``squareplus``, the subnormal tails of ``gelu``, ``arcsin``, ...,
heddle/ops/_formulas.py). Evaluating the traced program primitive by primitive in float32 then
computes with the rounded constant or with JAX's formula, and differs from heddle's namespace.

``KNOWN_CALLS`` lists such functions as data: for each, the JAX function, heddle's function of
the same name and the keyword arguments it is recognised with. A call is recognised when the
equations of one library call (one call key, ``_audit_source``) are exactly, up to the names of
variables, what the JAX function traces to on the same input aval (traced again here, cached),
its one input is a narrow float, and no equation outside them reads their intermediates. The
equations are then evaluated as heddle's function of that input: on its float32 value (the call's
shadow, or the exact twin) at float32, rounded once to the outputs' dtypes, the bits
heddle's namespace gives. Anything else (another keyword value, an array hyper-parameter, a
float32 input, a function called inside another library call) traces to other equations and is
evaluated primitive by primitive as before.

A call is first looked at without tracing anything: the entry of its call key (the JAX function
its caller called, None for a jitted one) and its first equation's primitive must be a
candidate's (``first_look``); only then is the candidate traced on the call's aval and compared
equation by equation. A program without narrow float inputs is never looked at.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import linear_util as lu
from jax._src import source_info_util
from jax.extend import core as jcore

from heddle.policy import _dtypes as D
from heddle.programs._audit_source import SiteCache
from heddle.programs._frame import Frame, dtype_of, is_narrow
from heddle.programs._table import Body, kind


@dataclasses.dataclass(frozen=True)
class Known:
    """A JAX function evaluated by heddle's function of the same name (``"nn.gelu"`` is
    ``jax.nn.gelu`` and ``heddle.nn.gelu``), with each of ``variants`` as keyword arguments."""

    name: str
    variants: tuple[tuple[tuple[str, Any], ...], ...] = ((),)

    def functions(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return _resolve(f"jax.{self.name}"), _resolve(f"heddle.{self.name}")


KNOWN_CALLS: tuple[Known, ...] = (
    # constants built in the input dtype (1/ln 10, pi/180, 180/pi, 2 pi)
    *map(Known, "numpy.log10 numpy.deg2rad numpy.radians numpy.rad2deg numpy.degrees".split()),
    Known("numpy.unwrap"),
    # heddle's formulas (heddle/ops/_formulas.py), pi in sinc
    *map(
        Known,
        "numpy.sinc numpy.i0 numpy.arcsin numpy.asin numpy.exp2 numpy.cosh numpy.sinh".split(),
    ),
    # sqrt(2/pi) and 0.044715; 1/sqrt 2 (and heddle's tails)
    Known("nn.gelu", ((("approximate", True),), (("approximate", False),))),
    # the selu scale and alpha, 0.01, 1/6, b = 4 (and heddle's formulas)
    *map(
        Known,
        "nn.selu nn.leaky_relu nn.hard_sigmoid nn.hard_silu nn.squareplus nn.mish nn.silu".split(),
    ),
    *map(
        Known, "scipy.special.i0 scipy.special.i1 scipy.special.erfcx scipy.special.erfinv".split()
    ),
    # heddle's formulas accurate near the zeros of lgamma and digamma, gamma's series
    *map(
        Known,
        (
            "scipy.special.gammaln scipy.special.loggamma scipy.special.digamma "
            "scipy.special.gamma lax.lgamma lax.digamma"
        ).split(),
    ),
    # two outputs: a narrow one computed in float32 as a whole (sici's series, frexp's subnormals)
    *map(Known, "scipy.special.sici numpy.frexp".split()),
    # log(2 pi) (and heddle's logpdf), the logistic's constants
    *map(Known, "scipy.stats.norm.pdf scipy.stats.norm.logpdf scipy.stats.logistic.pdf".split()),
    # pi and 1/pi, Euler's gamma and log 2, Poisson's entropy series
    *map(
        Known,
        (
            "scipy.stats.cauchy.pdf scipy.stats.cauchy.logpdf scipy.stats.cauchy.cdf "
            "scipy.stats.cauchy.logcdf scipy.stats.cauchy.sf scipy.stats.cauchy.logsf "
            "scipy.stats.cauchy.ppf scipy.stats.cauchy.isf scipy.stats.gumbel_l.pdf "
            "scipy.stats.gumbel_l.cdf scipy.stats.gumbel_l.sf scipy.stats.gumbel_l.ppf "
            "scipy.stats.gumbel_r.pdf scipy.stats.gumbel_r.cdf scipy.stats.gumbel_r.logsf "
            "scipy.stats.gumbel_r.ppf scipy.stats.poisson.entropy"
        ).split(),
    ),
)
"""The known calls; ``docs/autocast.md`` gives the inputs each one changed."""


def _resolve(path: str) -> Callable[..., Any]:
    """``jax.numpy.log10``, ``heddle.scipy.stats.norm.pdf``: the module's attribute."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj  # type: ignore[no-any-return]
    raise ImportError(path)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """One known function with one set of keyword arguments."""

    jax_fn: Callable[..., Any]
    heddle_fn: Callable[..., Any]
    kwargs: tuple[tuple[str, Any], ...]

    def traced(self, x: Any) -> Any:
        return self.jax_fn(x, **dict(self.kwargs))

    def evaluate(self, x: Any) -> Any:
        return self.heddle_fn(x, **dict(self.kwargs))


@functools.cache
def _candidates() -> tuple[_Candidate, ...]:
    """The candidates of ``KNOWN_CALLS``; a name that JAX or heddle does not define here is none
    (``tests/programs/test_autocast_constants.py`` requires every one)."""
    seen: set[tuple[int, tuple]] = set()
    out = []
    for known in KNOWN_CALLS:
        try:
            jfn, hfn = known.functions()
        except (ImportError, AttributeError):
            continue
        for kw in known.variants:
            if (id(jfn), kw) not in seen:  # aliases (jax.nn.swish is jax.nn.silu) once
                seen.add((id(jfn), kw))
                out.append(_Candidate(jfn, hfn, kw))
    return tuple(out)


# -- what a candidate traces to ---------------------------------------------------------------------

_Aval = tuple[tuple[int, ...], np.dtype, bool]


@dataclasses.dataclass(frozen=True)
class _Trace:
    """A candidate's jaxpr on one input aval."""

    jaxpr: Any  # ClosedJaxpr
    entry: Any  # the first element of its equations' call key (``_entry``)


_CACHE_SIZE = 512
_CACHE: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
_SITES = SiteCache()


def _aval_of(v: Any) -> _Aval:
    a = v.aval
    return (tuple(a.shape), np.dtype(a.dtype), bool(getattr(a, "weak_type", False)))


def _cached(kind: str, c: _Candidate, aval: _Aval, make: Callable[[Any], Any]) -> Any:
    """``make`` of the input ``aval``'s spec, once per (kind, candidate, aval, x64); the last 512
    kept. An exception (a function that refuses the dtype) is None: never a known call."""
    key = (kind, c, aval, D.x64_enabled())
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    shape, dtype, weak = aval
    try:
        with _own_tracebacks(), warnings.catch_warnings():  # JAX's (sici's float16 constants)
            warnings.simplefilter("ignore")
            hit = make(jax.ShapeDtypeStruct(shape, dtype, weak_type=weak))
    except Exception:
        hit = None
    _CACHE[key] = hit
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return hit


@contextlib.contextmanager
def _own_tracebacks() -> Iterator[None]:
    """Equations traced here get tracebacks of their own, as where the program was traced, not
    the one of the equation being evaluated (``user_context`` can only replace it)."""
    state = source_info_util._source_info_context
    before = state.context
    state.context = source_info_util.new_source_info()
    try:
        yield
    finally:
        state.context = before


def _trace(c: _Candidate, aval: _Aval) -> _Trace | None:
    """What ``c``'s JAX function traces to on ``aval``: a jaxpr of equations, outputs variables."""

    def make(spec: Any) -> _Trace | None:
        closed = jax.make_jaxpr(c.traced)(spec)
        jaxpr = closed.jaxpr
        if not jaxpr.eqns or not all(isinstance(v, jcore.Var) for v in jaxpr.outvars):
            return None
        return _Trace(closed, _entry(jaxpr.eqns[0]))

    return _cached("trace", c, aval, make)  # type: ignore[no-any-return]


def _fits(c: _Candidate, aval: _Aval, outs: Sequence[Any]) -> bool:
    """Whether heddle's function of an ``aval`` input gives outputs of the avals ``outs``."""

    def make(spec: Any) -> tuple:
        return tuple(
            (tuple(o.shape), np.dtype(o.dtype))
            for o in jax.tree.leaves(jax.eval_shape(c.evaluate, spec))
        )

    mine = _cached("fits", c, aval, make)
    return mine == tuple((tuple(o.aval.shape), np.dtype(o.aval.dtype)) for o in outs)


def _entry(eqn: Any) -> Any:
    """The first element of an equation's call key: the code of the JAX function its caller called
    (None for a jitted function, whose Python body is not on the stack when its equations are)."""
    return _SITES.site(eqn.source_info.traceback).key[0]


# An equation at first look: the kind of its bodies (``_table.Body``) or, for a primitive without
# any, its name; and the function's name for a ``jit``.
_Look = tuple[Body | str, str | None]


def _look(eqn: Any) -> _Look:
    """An equation at first look: the kind of its bodies, or its primitive, and, for a ``jit``, the
    function's name."""
    name = eqn.params.get("name")
    primitive = eqn.primitive.name
    return kind(primitive) or primitive, name if isinstance(name, str) else None


_BFLOAT16 = np.dtype(jax.numpy.bfloat16)


def first_look(c: _Candidate) -> tuple[Any, _Look | None] | None:
    """The entry of ``c``'s call (``_entry``) and the look of its first equation (None: any), the
    first look at a call before ``c`` is traced on its aval; None where ``c`` does not trace. Told
    by the kind of function where it can be: a Python function is its own entry; a jitted one has
    none (its body is not on the stack), and unless it is inlined it is one ``jit`` equation of its
    name; a ``custom_jvp``/``custom_vjp`` function is one call of its kind. An inlined jit
    (``jnp.log10``) is traced once, on bfloat16."""
    fn = c.jax_fn
    if isinstance(fn, jax.custom_jvp | jax.custom_vjp):
        body = Body.CUSTOM_JVP if isinstance(fn, jax.custom_jvp) else Body.CUSTOM_VJP
        return None, (body, None)
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if not hasattr(fn, "lower") and code is not None:
        return code, None
    info = getattr(fn, "_jit_info", None)
    if hasattr(fn, "lower") and getattr(info, "inline", None) is False:
        return None, (Body.JIT, fn.__name__)
    t = _trace(c, ((2,), _BFLOAT16, False))
    return None if t is None else (t.entry, _look(t.jaxpr.jaxpr.eqns[0]))


@functools.cache
def _by_entry() -> dict[Any, list[tuple[_Candidate, _Look | None]]]:
    """The candidates by the entry of their call, each with the look of its first equation."""
    out: dict[Any, list[tuple[_Candidate, _Look | None]]] = {}
    for c in _candidates():
        seen = first_look(c)
        if seen is not None:
            out.setdefault(seen[0], []).append((c, seen[1]))
    return out


# -- equal up to names -------------------------------------------------------------------------------


def _same_literal(a: Any, b: Any) -> bool:
    if not isinstance(a, jcore.Literal) or a.aval != b.aval:
        return False
    x, y = np.asarray(a.val), np.asarray(b.val)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _same_value(x: Any, y: Any) -> bool:
    """Two constants with the same bits (a traced value is never known to be one)."""
    if isinstance(x, jax.core.Tracer) or isinstance(y, jax.core.Tracer):
        return False
    try:
        a, b = np.asarray(x), np.asarray(y)
    except Exception:
        return False
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_fun(a: Any, b: Any) -> bool:
    """Two derivative rules (``custom_jvp``'s ``jvp``, ``custom_vjp``'s ``fwd``/``bwd``): the same
    object, or wrapping functions from the same source location."""
    if a is b:
        return True
    da, db = getattr(a, "debug_info", None), getattr(b, "debug_info", None)
    if da is None or db is None:
        return False
    src = ("traced_for", "func_src_info", "arg_names")
    return all(getattr(da, k, None) == getattr(db, k, None) for k in src)


def _same_param(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, (jcore.ClosedJaxpr, jcore.Jaxpr)):
        return isinstance(b, type(a)) and _same_jaxpr(a, b)
    if isinstance(a, (tuple, list)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_same_param(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _same_value(a, b)
    if isinstance(a, lu.WrappedFun) or (callable(a) and not isinstance(a, type)):
        return _same_fun(a, b)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _same_jaxpr(a: Any, b: Any) -> bool:
    """Two (closed) jaxprs equal up to the names of their variables, constants by value."""
    if a is b:
        return True
    ja, jb = getattr(a, "jaxpr", a), getattr(b, "jaxpr", b)
    ca, cb = getattr(a, "consts", ()), getattr(b, "consts", ())
    if (len(ja.invars), len(ja.constvars), len(ja.eqns), len(ja.outvars)) != (
        len(jb.invars),
        len(jb.constvars),
        len(jb.eqns),
        len(jb.outvars),
    ) or len(ca) != len(cb):
        return False
    if not all(_same_value(x, y) for x, y in zip(ca, cb, strict=True)):
        return False
    names: dict[Any, Any] = {}
    for x, y in zip((*ja.constvars, *ja.invars), (*jb.constvars, *jb.invars), strict=True):
        if x.aval != y.aval:
            return False
        names[x] = y
    for ea, eb in zip(ja.eqns, jb.eqns, strict=True):
        if not _same_eqn(ea, eb, names, lambda v, w: False):
            return False
    return all(
        _same_atom(x, y, names, lambda v, w: False)
        for x, y in zip(ja.outvars, jb.outvars, strict=True)
    )


def _same_atom(
    mine: Any, theirs: Any, names: dict[Any, Any], free: Callable[[Any, Any], bool]
) -> bool:
    """Whether ``mine`` (of the candidate) is ``theirs`` (of the program); a variable the candidate
    has not defined yet (its input or a constant) is bound to ``theirs`` where ``free`` allows."""
    if isinstance(mine, jcore.Literal):
        return _same_literal(theirs, mine)
    if isinstance(theirs, jcore.Literal) or mine.aval != theirs.aval:
        return False
    if mine in names:
        return names[mine] is theirs
    if not free(mine, theirs):
        return False
    names[mine] = theirs
    return True


def _same_eqn(
    mine: Any, theirs: Any, names: dict[Any, Any], free: Callable[[Any, Any], bool]
) -> bool:
    if mine.primitive is not theirs.primitive:
        return False
    if len(mine.invars) != len(theirs.invars) or len(mine.outvars) != len(theirs.outvars):
        return False
    if mine.params.keys() != theirs.params.keys():
        return False
    if not all(
        _same_atom(a, b, names, free) for a, b in zip(mine.invars, theirs.invars, strict=True)
    ):
        return False
    if not all(_same_param(mine.params[k], theirs.params[k]) for k in mine.params):
        return False
    for a, b in zip(mine.outvars, theirs.outvars, strict=True):
        dropped = isinstance(a, jcore.DropVar)
        if dropped != isinstance(b, jcore.DropVar) or a.aval != b.aval:
            return False
        if not dropped:
            names[a] = b
    return True


# -- recognising calls in a program ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """A recognised call: ``candidate`` of the program's ``x``, giving its ``outs``; ``eqn`` is its
    first equation (for source information)."""

    candidate: _Candidate
    x: Any
    outs: tuple[Any, ...]
    eqn: Any


def _input(eqns: Sequence[Any]) -> Any | None:
    """The first narrow float variable that ``eqns`` read and do not define."""
    defined: set[Any] = set()
    for e in eqns:
        for a in e.invars:
            if isinstance(a, jcore.Var) and a not in defined and is_narrow(dtype_of(a)):
                return a
        defined.update(e.outvars)
    return None


def _match(
    trace: _Trace, eqns: Sequence[Any], start: int, x: Any, frame: Frame
) -> tuple[Any, ...] | None:
    """The program variables for the candidate's outputs where ``eqns[start:]`` begins with the
    candidate's equations, reading ``x`` for its input; None where it does not."""
    jaxpr, consts = trace.jaxpr.jaxpr, trace.jaxpr.consts
    n = len(jaxpr.eqns)
    if start + n > len(eqns):
        return None
    (xin,) = jaxpr.invars
    const_of = dict(zip(jaxpr.constvars, consts, strict=True))
    defined: set[Any] = set()

    def free(mine: Any, theirs: Any) -> bool:
        if theirs in defined:
            return False
        if mine is xin:
            return theirs is x
        if mine in const_of:  # a constant of the function: the program's holds the same bits
            value = frame.computed(theirs)
            return value is not None and _same_value(value, const_of[mine])
        return False

    names: dict[Any, Any] = {}
    for mine, theirs in zip(jaxpr.eqns, eqns[start : start + n], strict=True):
        if not _same_eqn(mine, theirs, names, free):
            return None
        defined.update(theirs.outvars)
    if names.get(xin) is not x:
        return None
    outs = tuple(names.get(v) for v in jaxpr.outvars)
    if any(o is None for o in outs):
        return None
    return outs


def _read_after(eqns: Sequence[Any], end: int, outvars: Sequence[Any], vs: set[Any]) -> bool:
    """Whether any of ``vs`` is read by ``eqns[end:]`` or is an output of the jaxpr."""
    if any(v in vs for v in outvars if isinstance(v, jcore.Var)):
        return True
    return any(a in vs for e in eqns[end:] for a in e.invars if isinstance(a, jcore.Var))


def calls(
    key_of: Callable[[Any], Any], frame: Frame, jaxpr: Any, start: int
) -> tuple[int, list[Call]] | None:
    """Where ``jaxpr.eqns[start]`` begins a library call (its call key, ``key_of``, differs from the
    previous equation's) whose equations are known calls end to end (the same statement in a loop
    makes several): (the index after them, the calls); None otherwise."""
    eqns = jaxpr.eqns
    key = key_of(eqns[start])
    if start > 0 and key_of(eqns[start - 1]) == key:
        return None
    end = start + 1
    while end < len(eqns) and key_of(eqns[end]) == key:
        end += 1
    x = _input(eqns[start:end])
    if x is None:  # no narrow float input: nothing to recognise
        return None
    entry = key[0]
    group = _by_entry().get(entry)
    if group is None:
        return None
    found: list[Call] = []
    i = start
    while i < end:
        x = x if i == start else _input(eqns[i:end])
        if x is None:
            return None
        aval = _aval_of(x)
        look = _look(eqns[i])
        for c, want in group:
            if want is not None and want != look:
                continue
            t = _trace(c, aval)
            if t is None or t.entry != entry or i + len(t.jaxpr.jaxpr.eqns) > end:
                continue
            outs = _match(t, eqns, i, x, frame)
            if outs is None or not _fits(c, aval, outs):
                continue
            n = len(t.jaxpr.jaxpr.eqns)
            inside = {v for e in eqns[i : i + n] for v in e.outvars} - set(outs)
            if _read_after(eqns, i + n, jaxpr.outvars, inside):
                continue
            found.append(Call(c, x, outs, eqns[i]))
            i += n
            break
        else:
            return None
    return end, found


def evaluate(frame: Frame, call: Call, segment: int) -> None:
    """A recognised call: heddle's function of the input's float32 value, rounded once."""
    out = call.candidate.evaluate(frame.wide(call.x, segment))
    for v, o in zip(call.outs, jax.tree.leaves(out), strict=True):
        frame.write_rounded(v, o, segment)
