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
heddle's namespace gives. A call of a candidate with ``scalars`` (``leaky_relu``'s slope, a
distribution's ``loc`` and ``scale``) given other values is recognised with the values read back
from the program where they are exact (``_with_scalars``, ``_scalar``): it is traced once with
sentinels to find where they go, the program's scalars there are read, and it is traced again with
them and compared as a whole. Anything else (another keyword value, an array hyper-parameter, a
traced scalar, a float32 input, a function called inside another library call) traces to other
equations and is evaluated primitive by primitive as before.

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
import itertools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src import linear_util as lu
from jax._src import source_info_util
from jax.extend import core as jcore

from heddle.policy import _dtypes as D
from heddle.programs._audit_source import SiteCache
from heddle.programs._frame import Frame, dtype_of, is_narrow
from heddle.programs._interpret import plain_jit
from heddle.programs._table import Body, kind


@dataclasses.dataclass(frozen=True)
class Known:
    """A JAX function evaluated by heddle's function of the same name (``"nn.gelu"`` is
    ``jax.nn.gelu`` and ``heddle.nn.gelu``), with each of ``variants`` as keyword arguments.

    ``scalars`` names the arguments that may also be any scalar constant (``leaky_relu``'s
    ``negative_slope``, a distribution's ``loc`` and ``scale``): their values are read back from
    the program (``_with_scalars``). ``rounded``: heddle rounds those scalars to the input's dtype
    itself (a distribution's ``loc`` and ``scale`` are value operands, heddle/scipy/_table.py), so
    a narrow literal JAX built from one is the value heddle computes with; otherwise (a
    hyper-parameter, computed with at float32) only a value JAX passed on unrounded is read."""

    name: str
    variants: tuple[tuple[tuple[str, Any], ...], ...] = ((),)
    scalars: tuple[str, ...] = ()
    rounded: bool = False
    operand: str | None = None  # the input's parameter, where it is not the first (expn's x)
    inputs: tuple[int, ...] = (1,)  # the rank of each leading array argument, for samples
    axes: tuple[str, ...] = ()  # ``axis`` (and ``keepdims``): tried at each axis of the input

    def functions(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return _resolve(f"jax.{self.name}"), _resolve(f"heddle.{self.name}")


def _each(
    names: str, scalars: tuple[str, ...] = (), rounded: bool = False, inputs: tuple[int, ...] = (1,)
) -> Iterator[Known]:
    """A ``Known`` of each of the space-separated ``names``, with the default variant."""
    return (Known(n, scalars=scalars, rounded=rounded, inputs=inputs) for n in names.split())


_LOC_SCALE = ("loc", "scale")
_COV_VARIANTS = ((), (("ddof", 0),), (("bias", True),), (("ddof", 2),), (("rowvar", False),))


KNOWN_CALLS: tuple[Known, ...] = (
    # constants built in the input dtype (1/ln 10, pi/180, 180/pi, 2 pi)
    *_each("numpy.log10 numpy.deg2rad numpy.radians numpy.rad2deg numpy.degrees"),
    Known("numpy.unwrap", scalars=("discont", "period"), axes=("axis",)),
    # heddle's formulas (heddle/ops/_formulas.py), pi in sinc
    *_each("numpy.sinc numpy.i0 numpy.arcsin numpy.asin numpy.exp2 numpy.cosh numpy.sinh"),
    *_each("lax.asin lax.exp2 lax.sinh lax.cosh lax.erf_inv"),
    # sqrt(2/pi) and 0.044715; 1/sqrt 2 (and heddle's tails)
    Known("nn.gelu", ((("approximate", True),), (("approximate", False),))),
    # the selu scale and alpha, 0.01, 1/6, b = 4 (and heddle's formulas)
    *_each("nn.selu"),
    Known("nn.leaky_relu", scalars=("negative_slope",)),
    Known("nn.elu", scalars=("alpha",)),
    Known("nn.celu", scalars=("alpha",)),
    *_each("nn.hard_sigmoid nn.hard_silu"),
    Known("nn.squareplus", scalars=("b",)),
    *_each("nn.mish nn.silu"),
    *_each("scipy.special.i0 scipy.special.i1 scipy.special.erfcx scipy.special.erfinv"),
    # heddle's formulas accurate near the zeros of lgamma and digamma, gamma's series
    *_each(
        "scipy.special.gammaln scipy.special.loggamma scipy.special.digamma "
        "scipy.special.gamma lax.lgamma lax.digamma"
    ),
    # counts and divisors built in the input dtype: N - 1 of cov (and corrcoef), logmeanexp's N
    *_each("numpy.corrcoef"),
    Known("nn.logmeanexp", axes=("axis", "keepdims")),
    # var/std: ddof and the N - ddof > 0 test built in the input dtype (float8_e8m0fnu has no 0)
    Known("numpy.var", ((), (("ddof", 1),)), axes=("axis", "keepdims")),
    Known("numpy.std", ((), (("ddof", 1),)), axes=("axis", "keepdims")),
    # cov's divisor N - ddof, for each of its common arguments, of one array and of two
    Known("numpy.cov", _COV_VARIANTS),
    Known("numpy.cov", _COV_VARIANTS, inputs=(2, 2)),
    # two outputs: a narrow one computed in float32 as a whole (sici's series, frexp's subnormals)
    *_each("scipy.special.sici numpy.frexp"),
    # log(2 pi) (and heddle's logpdf), the logistic's constants
    *_each(
        "scipy.stats.norm.pdf scipy.stats.norm.logpdf scipy.stats.logistic.pdf",
        _LOC_SCALE,
        rounded=True,
    ),
    # pi and 1/pi, Euler's gamma and log 2, Poisson's entropy series
    *_each(
        "scipy.stats.cauchy.pdf scipy.stats.cauchy.logpdf scipy.stats.cauchy.cdf "
        "scipy.stats.cauchy.logcdf scipy.stats.cauchy.sf scipy.stats.cauchy.logsf "
        "scipy.stats.cauchy.ppf scipy.stats.cauchy.isf scipy.stats.gumbel_l.pdf "
        "scipy.stats.gumbel_l.cdf scipy.stats.gumbel_l.sf scipy.stats.gumbel_l.ppf "
        "scipy.stats.gumbel_r.pdf scipy.stats.gumbel_r.cdf scipy.stats.gumbel_r.logsf "
        "scipy.stats.gumbel_r.ppf",
        _LOC_SCALE,
        rounded=True,
    ),
    # heddle's log tails (log1p(-exp(-x)) and -exp(x) where JAX's float32 log(cdf) is -inf)
    *_each("scipy.stats.expon.logcdf scipy.stats.gumbel_l.logcdf", _LOC_SCALE, rounded=True),
    # heddle's log tails of distributions with shape parameters (JAX's float32 log(cdf): -inf)
    Known("scipy.stats.gamma.logsf", scalars=("a", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.gamma.logcdf", scalars=("a", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.chi2.logsf", scalars=("df", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.chi2.logcdf", scalars=("df", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.beta.logcdf", scalars=("a", "b", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.t.logpdf", scalars=("df", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.t.pdf", scalars=("df", *_LOC_SCALE), rounded=True),
    Known("scipy.stats.vonmises.pdf", scalars=("kappa",), rounded=True),
    Known("scipy.stats.vonmises.logpdf", scalars=("kappa",), rounded=True),
    Known("scipy.special.hyp1f1", scalars=("a", "b"), rounded=True, operand="x"),
    # heddle's series and asymptotic branches (JAX's float32 series: NaN or 1-ulp differences)
    *_each("scipy.special.exp1 scipy.special.expi"),
    Known("scipy.stats.poisson.entropy", scalars=("loc",), rounded=True),
    # an order that JAX rounds to the input's dtype, and JAX's E_n(0) and E_n(inf)
    Known("scipy.special.expn", scalars=("n",), operand="x"),
    # two array inputs: 1/ln 2 in the inputs' dtype
    *_each("numpy.logaddexp2", inputs=(1, 1)),
    # default cut-offs from the input dtype's eps (bfloat16's 0.0078 times the size drops most
    # singular values: lstsq and polyfit returned zeros, pinv had no output correctly rounded)
    *(
        Known(name, ((), (("hermitian", True),)), inputs=(2,))
        for name in ("numpy.linalg.pinv", "numpy.linalg.matrix_rank")
    ),
    *_each("numpy.linalg.lstsq", inputs=(2, 1)),
    Known("numpy.polyfit", tuple((("deg", d),) for d in range(16)), inputs=(1, 1)),
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


@dataclasses.dataclass(frozen=True, eq=False)
class _Candidate:
    """One known function with one set of keyword arguments; ``scalars``, ``rounded`` and
    ``inputs`` and ``axes`` as in ``Known`` (a candidate with scalars read from a program has none)."""

    jax_fn: Callable[..., Any]
    heddle_fn: Callable[..., Any]
    kwargs: tuple[tuple[str, Any], ...]
    scalars: tuple[str, ...] = ()
    rounded: bool = False
    operand: str | None = None
    inputs: tuple[int, ...] = (1,)
    axes: tuple[str, ...] = ()

    def call(self, fn: Callable[..., Any], *xs: Any, **more: Any) -> Any:
        """``fn`` of the inputs ``xs`` with the candidate's keyword arguments and ``more``."""
        kw = {**dict(self.kwargs), **more}
        return fn(*xs, **kw) if self.operand is None else fn(**{self.operand: xs[0]}, **kw)

    def traced(self, *xs: Any) -> Any:
        return self.call(self.jax_fn, *xs)

    def evaluate(self, *xs: Any) -> Any:
        return self.call(self.heddle_fn, *xs)

    def given(self, values: dict[str, Any]) -> _Candidate:
        """The same function with ``values`` as further keyword arguments (and no scalars)."""
        return dataclasses.replace(self, kwargs=(*self.kwargs, *values.items()), scalars=())

    def along(self, ndim: int) -> Iterator[_Candidate]:
        """The candidate, then, for a function with ``axes``, the candidate at each axis of an
        input of ``ndim`` axes (with ``keepdims`` both ways where it takes one)."""
        yield self
        if not self.axes:
            return
        name, *keep = self.axes
        for k in range(ndim):
            for kd in (False, True) if keep else (None,):
                kw = {name: k} if kd is None else {name: k, keep[0]: kd}
                yield dataclasses.replace(self, kwargs=(*self.kwargs, *kw.items()), axes=())

    def sample(self, n: int, dtype: np.dtype) -> _Avals:
        """Input avals of size ``n`` along every axis, of ``dtype``: what it is first traced on."""
        return tuple(((n,) * rank, dtype, False) for rank in self.inputs)

    @functools.cached_property
    def key(self) -> tuple:
        """What tells candidates apart: the functions and each argument by type and bits (``0.0``
        and ``-0.0``, ``1.0`` and ``float32(1.0)`` are equal in Python, not here)."""
        kw = tuple((k, _value_key(v)) for k, v in self.kwargs)
        return (self.jax_fn, self.heddle_fn, kw, self.operand, self.inputs, self.axes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Candidate) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def _value_key(v: Any) -> Any:
    """A keyword value by its type and bits (a number or an array), else itself."""
    if isinstance(v, bool | int | float | complex | np.generic | np.ndarray | jax.Array):
        a = np.asarray(v)
        return type(v), a.dtype.str, a.shape, a.tobytes()
    return v


@functools.cache
def _candidates() -> tuple[_Candidate, ...]:
    """The candidates of ``KNOWN_CALLS``; a name that JAX or heddle does not define here is none
    (``tests/programs/test_autocast_constants.py`` requires every one)."""
    seen: set[tuple[int, tuple, tuple]] = set()
    out = []
    for known in KNOWN_CALLS:
        try:
            jfn, hfn = known.functions()
        except (ImportError, AttributeError):
            continue
        for kw in known.variants:
            if (id(jfn), kw, known.inputs) not in seen:  # aliases (jax.nn.swish is silu) once
                seen.add((id(jfn), kw, known.inputs))
                more = (known.scalars, known.rounded, known.operand, known.inputs, known.axes)
                out.append(_Candidate(jfn, hfn, kw, *more))
    return tuple(out)


@functools.cache
def _vmapped(
    c: _Candidate, k: int, axis: int = 0, batched: tuple[bool, ...] | None = None
) -> _Candidate:
    """``c`` under ``k`` ``jax.vmap``s, the outermost over ``axis``, the others over leading axes:
    what ``jax.vmap(jax.nn.selu)(x)`` (or a function calling ``jax.nn.selu`` under ``jax.vmap``,
    equinox's ``jax.vmap(model)``) traces to, evaluated as heddle's function under the same
    ``vmap``s. ``batched`` (one ``vmap``): which inputs it maps, the others passed whole
    (``in_axes=(0, None)``); every input where it is None."""
    mapped = batched if batched is not None else (True,) * len(c.inputs)
    at: list[Any] = [axis if level == k - 1 else 0 for level in range(k)]
    if batched is not None:
        at = [tuple(a if m else None for m in mapped) for a in at]

    def lift(fn: Callable[..., Any]) -> Callable[..., Any]:
        def f(*xs: Any, **kw: Any) -> Any:  # ``kw``: the scalars read back, outside the vmaps
            g = lambda *ys: c.call(fn, *ys, **kw)
            for a in at:
                g = jax.vmap(g, in_axes=a)
            return g(*xs)

        return f

    ranks = tuple(rank + k * m for rank, m in zip(c.inputs, mapped, strict=True))
    return _Candidate(lift(c.jax_fn), lift(c.heddle_fn), (), c.scalars, c.rounded, inputs=ranks)


@functools.cache
def _batched_looks() -> list[tuple[_Candidate, _Look | None]]:
    """Every candidate with the look of its first equation under ``jax.vmap`` (a jitted or
    custom-derivative function's own look; a Python function's traced once, on bfloat16)."""
    out: list[tuple[_Candidate, _Look | None]] = []
    for group in _by_entry().values():
        for c, look in group:
            if look is None:
                t = _trace(_vmapped(c, 1), _vmapped(c, 1).sample(2, _BFLOAT16))
                if t is None:
                    continue
                look = _look(t.jaxpr.jaxpr.eqns[0])
            out.append((c, look))
    return out


def _batching(entry: Any) -> bool:
    """Whether a call's entry is a frame of JAX's batching (``jax.vmap``): the traceback of an
    equation traced under ``vmap`` ends there, not at the JAX function the caller called."""
    return getattr(entry, "co_filename", "").endswith(_BATCHING_FILE)


_BATCHING_FILE = "/interpreters/batching.py"


# -- what a candidate traces to ---------------------------------------------------------------------

_Aval = tuple[tuple[int, ...], np.dtype, bool]
_Avals = tuple[_Aval, ...]  # one for each input


@dataclasses.dataclass(frozen=True)
class _Trace:
    """A candidate's jaxpr on one input aval."""

    jaxpr: Any  # ClosedJaxpr
    entry: Any  # the first element of its equations' call key (``_entry``)


_CACHE_SIZE = 512
_CACHE: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
_SITES = SiteCache()


def _aval_of(v: Any) -> _Aval:
    """A variable's aval as a key."""
    return _aval_of_value(v.aval)


def _aval_of_value(a: Any) -> _Aval:
    """The aval of a value or an aval, as a key."""
    a = jax.typeof(a) if not isinstance(a, jax_core.AbstractValue) else a
    return (tuple(a.shape), np.dtype(a.dtype), bool(getattr(a, "weak_type", False)))


def _specs(avals: _Avals) -> tuple[jax.ShapeDtypeStruct, ...]:
    return tuple(jax.ShapeDtypeStruct(shape, d, weak_type=weak) for shape, d, weak in avals)


def _cached(kind: str, c: _Candidate, avals: _Avals, make: Callable[..., Any]) -> Any:
    """``make`` of the inputs' specs, once per (kind, candidate, avals, x64); the last 512 kept.
    An exception (a function that refuses the dtype) is None: never a known call."""
    key = (kind, c, avals, D.x64_enabled())
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    try:
        with _own_tracebacks(), warnings.catch_warnings():  # JAX's (sici's float16 constants)
            warnings.simplefilter("ignore")
            hit = make(*_specs(avals))
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


def _trace(c: _Candidate, avals: _Avals) -> _Trace | None:
    """What ``c``'s JAX function traces to on ``avals``: a jaxpr of equations, outputs variables."""

    def make(*specs: Any) -> _Trace | None:
        closed = jax.make_jaxpr(c.traced)(*specs)
        jaxpr = closed.jaxpr
        if not jaxpr.eqns or not all(isinstance(v, jcore.Var) for v in jaxpr.outvars):
            return None
        return _Trace(closed, _entry(jaxpr.eqns[0]))

    return _cached("trace", c, avals, make)  # type: ignore[no-any-return]


def _fits(c: _Candidate, avals: _Avals, outs: Sequence[Any]) -> bool:
    """Whether heddle's function of inputs of ``avals`` gives outputs of the avals ``outs``."""

    def make(*specs: Any) -> tuple:
        return tuple(
            (tuple(o.shape), np.dtype(o.dtype))
            for o in jax.tree.leaves(jax.eval_shape(c.evaluate, *specs))
        )

    mine = _cached("fits", c, avals, make)
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
    t = _trace(c, c.sample(2, _BFLOAT16))
    return None if t is None else (t.entry, _look(t.jaxpr.jaxpr.eqns[0]))


@functools.cache
def _by_entry() -> dict[Any, list[tuple[_Candidate, _Look | None]]]:
    """The candidates by the entry of their call, each with the look of its first equation."""
    out: dict[Any, list[tuple[_Candidate, _Look | None]]] = {}
    for c in _candidates():
        seen = first_look(c)
        if seen is not None:
            out.setdefault(seen[0], []).append((c, seen[1]))
            broadcast = _broadcast_look(c, seen)
            if broadcast is not None:
                out[seen[0]].append((c, broadcast))
    return out


def _broadcast_look(c: _Candidate, seen: tuple[Any, _Look | None]) -> _Look | None:
    """The look of a traced candidate with several inputs whose inputs broadcast against each
    other (the first one a rank higher: JAX broadcasts the others first), where it differs from
    ``seen``'s: ``logaddexp2`` of ``(64, 1)`` and ``(50,)`` begins with a ``broadcast_in_dim``."""
    if len(c.inputs) < 2 or seen[1] is None:
        return None
    first, *rest = c.sample(2, _BFLOAT16)
    t = _trace(c, ((first[0] + (1,), _BFLOAT16, False), *rest))
    if t is None or t.entry != seen[0]:
        return None
    look = _look(t.jaxpr.jaxpr.eqns[0])
    return None if look == seen[1] else look


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
    if mine.aval != theirs.aval:
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
    """A recognised call: ``candidate`` of the program's ``xs``, giving its ``outs``; ``eqn`` is its
    first equation (for source information), ``size`` the number of its equations."""

    candidate: _Candidate
    xs: tuple[Any, ...]
    outs: tuple[Any, ...]
    eqn: Any
    size: int = 1  # its equations


def _input(eqns: Sequence[Any]) -> Any | None:
    """The first narrow float variable that ``eqns`` read and do not define."""
    defined: set[Any] = set()
    for e in eqns:
        for a in e.invars:
            if isinstance(a, jcore.Var) and a not in defined and is_narrow(dtype_of(a)):
                return a
        defined.update(e.outvars)
    return None


_MOST_INPUTS = 4  # the free variables of a call tried as a candidate's several inputs
_MOST_SCALARS = 2  # and the scalar literals


def _arguments(c: _Candidate, eqns: Sequence[Any], x: Any) -> Iterator[tuple[Any, ...]]:
    """The program variables to try as ``c``'s inputs, ``x`` (the call's first narrow input) among
    them: ``(x,)`` for one input; for several, each tuple of the call's first free variables
    (read and not defined by ``eqns``) that holds ``x``, a variable repeated included, and of the
    scalar literals its equations read (a Python scalar passed as an input: ``logaddexp2(x, 1.0)``).
    """
    if len(c.inputs) == 1:
        yield (x,)
        return
    defined: set[Any] = set()
    free: list[Any] = []
    scalars: list[Any] = []
    for e in eqns:
        for a in e.invars:
            if isinstance(a, jcore.Literal):
                if getattr(a.aval, "shape", None) == () and not any(a is b for b in scalars):
                    scalars.append(a)
            elif a not in defined and a not in free:
                free.append(a)
        defined.update(e.outvars)
    tried = free[:_MOST_INPUTS] + scalars[:_MOST_SCALARS]
    for xs in itertools.product(tried, repeat=len(c.inputs)):
        if any(v is x for v in xs):  # the same variable twice too: logaddexp2(x, x)
            yield xs


def _match(
    trace: _Trace, eqns: Sequence[Any], start: int, xs: tuple[Any, ...], frame: Frame
) -> tuple[Any, ...] | None:
    """The program variables for the candidate's outputs where ``eqns[start:]`` begins with the
    candidate's equations, reading ``xs`` for its inputs; None where it does not."""
    jaxpr, consts = trace.jaxpr.jaxpr, trace.jaxpr.consts
    n = len(jaxpr.eqns)
    if start + n > len(eqns):
        return None
    bound = dict(zip(jaxpr.invars, xs, strict=True))
    const_of = dict(zip(jaxpr.constvars, consts, strict=True))
    defined: set[Any] = set()

    def free(mine: Any, theirs: Any) -> bool:
        if isinstance(theirs, jcore.Literal):  # a scalar the program wrote: only as an input
            return mine in bound and theirs is bound[mine]
        if theirs in defined:
            return False
        if mine in bound:
            return theirs is bound[mine]
        if mine in const_of:  # a constant of the function: the program's holds the same bits
            value = frame.computed(theirs)
            return value is not None and _same_value(value, const_of[mine])
        return False

    names: dict[Any, Any] = {}
    for mine, theirs in zip(jaxpr.eqns, eqns[start : start + n], strict=True):
        if not _same_eqn(mine, theirs, names, free):
            return None
        defined.update(theirs.outvars)
    if any(names.get(v) is not x for v, x in bound.items()):
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
    makes several): (the index after them, the calls); None otherwise. Each call is first tried as
    each candidate with its own keyword arguments, then, where none is it, as each candidate with
    scalars read from the program (``_with_scalars``)."""
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
    batched = group is None and _batching(entry)
    if batched:  # under jax.vmap: every candidate, by the look of its first batched equation
        group = _batched_looks()
    if group is None:
        return None
    found: list[Call] = []
    i = start
    while i < end:
        x = x if i == start else _input(eqns[i:end])
        if x is None:
            return None
        look = _look(eqns[i])
        here = [c for c, want in group if want is None or want == look]
        hit = None
        if batched:
            hit = _batched(here, jaxpr, i, end, x, frame)
            if hit is None:
                return None
            found.append(hit)
            i += hit.size
            continue
        for c in here:
            hit = next(_hits(c, False, entry, jaxpr, i, end, x, frame), None)
            if hit is not None:
                if _ambiguous(hit, here, entry, jaxpr, i, end, frame):
                    return None
                break
        else:
            hit = next(
                (h for c in here for h in _hits(c, True, entry, jaxpr, i, end, x, frame)), None
            )
        if hit is None:  # a Python or jitted function under jax.vmap keeps its own entry (lstsq)
            own = [c for c, want in group if want is None or (want == look and want[1])]
            hit = _batched(own, jaxpr, i, end, x, frame)
        if hit is None:
            return None
        found.append(hit)
        i += hit.size
    return end, found


def _hits(
    c: _Candidate, scalars: bool, entry: Any, jaxpr: Any, i: int, end: int, x: Any, frame: Frame
) -> Iterator[Call]:
    """The calls of ``c`` that ``jaxpr.eqns[i:end]`` begins with, reading ``x`` among its inputs:
    with ``c``'s own keyword arguments, or (``scalars``) with scalars read from the program."""
    for xs in _arguments(c, jaxpr.eqns[i:end], x):
        avals = tuple(map(_aval_of, xs))
        for a in c.along(len(avals[0][0])):
            tries = _with_scalars(a, avals, entry, jaxpr, i, end, frame) if scalars else (a,)
            for given in tries:
                hit = _recognise(given, _trace(given, avals), entry, jaxpr, i, end, xs, frame)
                if hit is not None:
                    yield hit


def _ambiguous(
    hit: Call, here: Sequence[_Candidate], entry: Any, jaxpr: Any, i: int, end: int, frame: Frame
) -> bool:
    """Whether another variant of the ``hit``'s function traces to the same equations on its
    inputs: a constant JAX built in the input dtype can hide the argument that made it
    (``jnp.cov`` of a float16 ``(16, 3000)`` input divides by 3000 for ``ddof=1`` and ``ddof=0``
    alike: 2999 is no float16), and the call is then not known, evaluated primitive by primitive.
    A call the program cannot tell from the function's default is taken for the default (tried
    first): most calls are, and the variants then differ by less than the input dtype's rounding
    of the constant that hides them (``N - ddof``), which primitive by primitive computes with."""
    c, xs = hit.candidate, hit.xs
    if not c.kwargs:
        return False
    avals = tuple(map(_aval_of, xs))
    others = [o for o in here if o.jax_fn is c.jax_fn and o != c]
    mine = _heddle_text(c, avals)
    return any(
        _recognise(o, _trace(o, avals), entry, jaxpr, i, end, xs, frame) is not None
        and _heddle_text(o, avals) != mine  # ``bias=True`` is ``ddof=0``: not ambiguous
        for o in others
    )


def _heddle_text(c: _Candidate, avals: _Avals) -> str | None:
    """heddle's function of ``c`` traced on ``avals``, as text (two variants that compute alike
    print alike), or None."""
    closed = _heddle_jaxpr(c, avals)
    return None if closed is None else str(closed)


def _batched(
    here: Sequence[_Candidate], jaxpr: Any, i: int, end: int, x: Any, frame: Frame
) -> Call | None:
    """The call of a candidate under one ``jax.vmap`` over any axis or two over leading axes that
    ``jaxpr.eqns[i:]`` begins with (its entry is a batching frame, whichever vmap made it, so
    candidates are not told apart by it): the longest (``cauchy.logcdf``, not the ``cauchy.cdf``
    its equations begin with)."""
    best: Call | None = None
    for c in here:
        for xs in _arguments(c, jaxpr.eqns[i:end], x):
            avals = tuple(map(_aval_of, xs))
            ndim = len(avals[0][0])
            # one vmap over any axis, two over leading axes (every input along the same), and
            # the function at each of its own axes; with several inputs, one vmap of some of
            # them (``in_axes=(0, None)``)
            maps: list[tuple[int, int, tuple[bool, ...] | None]]
            maps = [(k, axis, None) for k, axis in _levels(ndim)]
            if len(xs) > 1:
                some = [m for m in itertools.product((True, False), repeat=len(xs)) if 0 < sum(m)]
                maps += [(1, axis, m) for m in some[1:] for axis in range(_rank(avals, m))]
            for k, axis, mapped in maps:
                for a in c.along(ndim - k):
                    vc = _vmapped(a, k, axis, mapped)
                    read = _with_scalars(vc, avals, None, jaxpr, i, end, frame)
                    for given in (vc, *read):  # with scalars read back from the program
                        t = _trace(given, avals)
                        if t is None:
                            continue
                        hit = _recognise(given, t, t.entry, jaxpr, i, end, xs, frame)
                        if hit is not None and (best is None or hit.size > best.size):
                            best = hit
    return best


def _levels(ndim: int) -> list[tuple[int, int]]:
    """(vmaps, axis of the outermost) to try on an input of ``ndim`` axes: one over any axis, two
    over leading axes."""
    return [*((1, a) for a in range(ndim)), *([(2, 0)] if ndim >= 2 else [])]


def _rank(avals: _Avals, mapped: tuple[bool, ...]) -> int:
    """The axes of the first mapped input (the axes its ``vmap`` may map)."""
    return next(len(shape) for (shape, _, _), m in zip(avals, mapped, strict=True) if m)


def _recognise(
    c: _Candidate,
    t: _Trace | None,
    entry: Any,
    jaxpr: Any,
    i: int,
    end: int,
    xs: tuple[Any, ...],
    frame: Frame,
) -> Call | None:
    """The call of ``c`` (traced to ``t``) that ``jaxpr.eqns[i:]`` begins with, reading ``xs``;
    None where they are not its equations, or another equation reads their intermediates."""
    if t is None or t.entry != entry or i + len(t.jaxpr.jaxpr.eqns) > end:
        return None
    eqns = jaxpr.eqns
    outs = _match(t, eqns, i, xs, frame)
    if outs is None or not _fits(c, tuple(map(_aval_of, xs)), outs):
        return None
    n = len(t.jaxpr.jaxpr.eqns)
    inside = {v for e in eqns[i : i + n] for v in e.outvars} - set(outs)
    if _read_after(eqns, i + n, jaxpr.outvars, inside):
        return None
    return Call(c, xs, outs, eqns[i], n)


# -- scalars read from the program -----------------------------------------------------------------

# Values for the scalars while looking for where they go: exact in bfloat16 and float16, and not
# among the constants of the known functions.
_SENTINELS = (1.4453125, 1.7265625, 1.1796875)

# A sentinel's place in a candidate's equations: (equation, operand), and whether JAX passed the
# Python scalar on as it is there (a weak-typed operand: a jitted function's argument) or
# converted it to the input's dtype (an inlined body's narrow literal). The equation is a path:
# its index, then (parameter, index) into the bodies of the equations that hold it (a
# ``custom_jvp`` closes over its ``nondiff_argnums``: expn's order is a literal in its body).
_Path = tuple[Any, ...]
_Place = tuple[_Path, int, bool]


def _equations(jaxpr: Any, path: _Path = ()) -> Iterator[tuple[_Path, Any]]:
    """Every equation of ``jaxpr`` and of the bodies its equations hold, with its path."""
    for e, eqn in enumerate(jaxpr.eqns):
        here = (*path, e) if not path else (*path[:-1], (path[-1], e))
        yield here, eqn
        for name, body in eqn.params.items():
            inner = getattr(body, "jaxpr", body)
            if isinstance(inner, jcore.Jaxpr):
                yield from _equations(inner, (*here, name))


def _at(eqns: Sequence[Any], i: int, path: _Path) -> Any:
    """The equation at ``path`` in ``eqns[i:]``; None where the program has none there."""
    try:
        eqn = eqns[i + path[0]]
        for name, e in path[1:]:
            eqn = getattr(eqn.params[name], "jaxpr", eqn.params[name]).eqns[e]
    except (IndexError, KeyError, AttributeError):
        return None
    return eqn


@dataclasses.dataclass(frozen=True)
class _Template:
    """A candidate traced with sentinels for some of its scalars: where each one goes."""

    n: int  # its equations
    shape: tuple[tuple[Any, int], ...]  # each one's primitive and number of operands
    places: tuple[tuple[str, tuple[_Place, ...]], ...]


def _template(c: _Candidate, names: tuple[str, ...], avals: _Avals) -> _Template | None:
    """Where each of ``names`` goes when ``c`` is traced on ``avals`` with a sentinel for it; None
    where one goes nowhere to be seen (its value could not be read back)."""
    sentinels = dict(zip(names, _SENTINELS, strict=False))

    def make(*specs: Any) -> _Template | None:
        jaxpr = jax.make_jaxpr(lambda *xs: c.call(c.jax_fn, *xs, **sentinels))(*specs).jaxpr
        found: dict[str, list[_Place]] = {n: [] for n in names}
        for e, eqn in _equations(jaxpr):
            for k, a in enumerate(eqn.invars):
                if not isinstance(a, jcore.Literal) or np.shape(a.val) != ():
                    continue
                for n, s in sentinels.items():
                    if D.kind(np.asarray(a.val).dtype) == "f" and float(a.val) == s:
                        found[n].append((e, k, bool(getattr(a.aval, "weak_type", False))))
        if not all(found.values()):
            return None
        return _Template(
            len(jaxpr.eqns),
            tuple((eqn.primitive, len(eqn.invars)) for eqn in jaxpr.eqns),
            tuple((n, tuple(found[n])) for n in names),
        )

    return _cached(f"template {names}", c, avals, make)  # type: ignore[no-any-return]


def _with_scalars(
    c: _Candidate, avals: _Avals, entry: Any, jaxpr: Any, i: int, end: int, frame: Frame
) -> Iterator[_Candidate]:
    """``c`` with the values of its scalars read from ``jaxpr.eqns[i:]``: for all of them, then
    for fewer (``jnp.unwrap``'s ``discont`` is None unless given), each where every value read
    is the one the program's caller gave (``_scalar``). Only candidates; ``_recognise`` decides."""
    if not c.scalars:
        return
    eqns = jaxpr.eqns
    consts = set(jaxpr.constvars)
    names = c.scalars
    subsets = [s for r in range(len(names), 0, -1) for s in itertools.combinations(names, r)]
    for subset in subsets:
        t = _template(c, subset, avals)
        if t is None or i + t.n > end:
            continue
        if any(
            eqns[i + e].primitive is not p or len(eqns[i + e].invars) != m
            for e, (p, m) in enumerate(t.shape)
        ):
            continue
        forms: list[tuple[Any, ...]] = []
        for _, places in t.places:
            at = [(_at(eqns, i, e), k, passed) for e, k, passed in places]
            if any(eqn is None or k >= len(eqn.invars) for eqn, k, _ in at):
                break
            seen = [_scalar(c, eqn, k, passed, avals, consts, frame) for eqn, k, passed in at]
            read = [s for s in seen if s is not None]
            if len(read) < len(seen) or len({_value_key(s[0]) for s in read}) != 1:
                break  # one cannot be read back, or they differ: not this subset
            forms.append(read[0])
        else:
            for values in itertools.product(*forms):
                yield c.given(dict(zip(subset, values, strict=True)))


_PYTHON: dict[str, type] = {"b": bool, "i": int, "u": int, "f": float}


def _scalar(
    c: _Candidate, eqn: Any, k: int, passed: bool, avals: _Avals, consts: set[Any], frame: Frame
) -> tuple[Any, ...] | None:
    """The value the caller gave for a scalar, operand ``k`` of ``eqn``, in the forms to trace it
    with (a Python scalar first); None where it cannot be read back exactly:

    - a literal where JAX passed the Python scalar on as it is (``passed``: a jitted function's
      weak-typed argument): a weak one is a Python scalar's value (a Python float's float32, all
      that JAX's function and heddle's, which computes at float32, ever see of it; for a scalar
      heddle rounds to the input's dtype, ``rounded``, not one halfway between two of its values,
      which float32 may have rounded either way), any other the NumPy scalar the caller gave;
    - a narrow literal JAX converted the scalar to (an inlined body's): for a ``rounded`` scalar
      the value heddle computes with (both round the Python value once to the input's dtype);
      for a hyper-parameter nothing, its value before rounding is lost;
    - a constant of the jaxpr (an array the caller closed over): that array.

    An input of the program (a traced argument) is never read: it has no value when jitted."""
    a = eqn.invars[k]
    if not isinstance(a, jcore.Literal):
        value = frame.computed(a) if a in consts else None
        if value is None or isinstance(value, jax.core.Tracer) or np.shape(value) != ():
            return None
        return (value,) if D.kind(np.asarray(value).dtype) in ("b", "i", "u", "f") else None
    v = np.asarray(a.val)
    of = _PYTHON.get(D.kind(v.dtype))
    if v.shape != () or of is None:
        return None
    scalar = of(v)
    if not passed:
        return (scalar, v[()]) if c.rounded and of is float else None
    if not getattr(a.aval, "weak_type", False):
        return (v[()],)
    if c.rounded and of is float and _halfway(scalar, avals[0][1]):
        return None
    return (scalar,)


def _halfway(v: float, d: np.dtype) -> bool:
    """Whether ``v`` lies halfway between two neighbouring values of ``d``, or rounds to an
    infinity from a finite value."""
    r = float(np.asarray(v, d))
    if math.isinf(r) and not math.isinf(v):
        return True
    other = 2 * v - r  # the other neighbour if v is halfway (exact for these formats)
    return r != v and math.isfinite(other) and float(np.asarray(other, d)) == other


def evaluate(frame: Frame, call: Call, segment: int) -> None:
    """A recognised call: heddle's function of the inputs' float32 values, rounded once.

    heddle's function is traced once per input aval and policy, with tracebacks of its own, and its
    equations (the bodies of the jitted helpers it calls, such as ``jnp.where``'s, included) are
    bound here, under the call's source information: every equation the call gives is the call's.
    Calling it directly would trace a helper's body under the first call's source information,
    which JAX then caches and hands to every later call (``gelu`` then ``silu``, say). On values
    (an eager call) it is called directly, as eager heddle.numpy runs it."""
    xs = [frame.wide(x, segment) for x in call.xs]
    traced = not isinstance(jax_core.trace_ctx.trace, jax_core.EvalTrace)
    closed = _heddle_jaxpr(call.candidate, tuple(map(_aval_of_value, xs))) if traced else None
    if closed is None:  # on values (an eager call: no program to read), heddle's function itself
        outs = jax.tree.leaves(call.candidate.evaluate(*xs))
    else:
        outs = _bind_inlined(closed.jaxpr, closed.consts, xs)
    for v, o in zip(call.outs, outs, strict=True):
        frame.write_rounded(v, o, segment)


def _heddle_jaxpr(c: _Candidate, avals: _Avals) -> Any:
    """heddle's function of ``c`` traced on ``avals`` (once per policy), or None."""
    from heddle.policy import _policy

    return _cached(f"heddle {_policy.current()!r}", c, avals, jax.make_jaxpr(c.evaluate))


def _bind_inlined(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """``jaxpr`` evaluated by binding its equations under the current source information, the
    bodies of plain jits inline (``jax.core.eval_jaxpr`` without ``propagate_source_info``)."""
    env: dict[Any, Any] = {}

    def read(a: Any) -> Any:
        return a.val if isinstance(a, jcore.Literal) else env[a]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        ins = [read(a) for a in eqn.invars]
        if plain_jit(eqn):
            body = eqn.params["jaxpr"]
            outs = _bind_inlined(body.jaxpr, body.consts, ins)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with eqn.ctx.manager:
                ans = eqn.primitive.bind(*ins, **params)
            outs = ans if eqn.primitive.multiple_results else [ans]
        for v, o in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jcore.DropVar):
                env[v] = o
    return [read(a) for a in jaxpr.outvars]
