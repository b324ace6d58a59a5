"""``autocast``: heddle's policy for any JAX function, operators, methods and library layers included."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as _jcore

from heddle.policy._errors import UnknownDTypeError, message
from heddle.policy._policy import Policy, active, use
from heddle.policy._precision import Precision, _one_float, _readings
from heddle.programs import _eager
from heddle.programs._evaluate import Evaluator
from heddle.programs._higher import _conform


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def autocast(
    fn: Callable[..., Any] | None = None,
    *,
    policy: Policy | None = None,
    precision: Precision | str | None = None,
) -> Any:
    """Runs any JAX function with every primitive inside it under heddle's dtype policy.

    ``autocast(fn)`` has ``fn``'s signature and output structure. Each call evaluates the
    equations ``fn`` traces to under the rule ``heddle/programs/_table.py`` gives each primitive,
    whichever code produced it (operators, array methods, jax.numpy, jax.nn, jax.lax, flax,
    equinox, optax). Under a JAX transformation ``fn`` is traced to a jaxpr first; called eagerly
    it runs as eager JAX does, on values that are concrete (Python control flow on them,
    ``float()``, boolean masks), its equations evaluated as they are recorded (``_eager``), and
    every value it leaves is a concrete array. The rules:

    - contractions (``dot_general``, convolutions, ragged dots) accumulate in ``acc_dtype``
      (float32 for narrow floats) through ``preferred_element_type`` and round once; float32
      contractions run at the policy's ``float32_matmul_precision`` (full float32 by default);
    - reductions, window sums, scans (``cumsum``...), scatter-add/-mul, segment sums and
      cross-device sums accumulate in ``acc_dtype``;
    - narrow float arithmetic is computed in float32 and rounded once; inside one library call
      (``jax.nn.softmax``, ``jnp.var``, an operator) intermediates stay float32 and only the call's
      outputs are rounded, as heddle.numpy and heddle.nn compute the same call;
    - every conversion that can change a value (``float32 -> bfloat16``, ``int32 -> bfloat16``,
      ``float64 -> float16``) is heddle's correctly rounded cast, the ones JAX inserted included.

    No value changes shape or dtype: outputs, loop carries and every intermediate keep the avals
    JAX gave them, only how each is computed changes. Higher-order primitives (nested ``jit``,
    ``scan``, ``while``, ``cond``, ``custom_jvp``/``custom_vjp`` functions, ``jax.checkpoint``,
    ``shard_map``) are descended into; ``pure_callback`` and the primitives listed as
    pass-throughs in the table are bound unchanged. It composes with ``jax.jit``, ``jax.grad``,
    ``jax.vjp``/``jvp``, ``jax.vmap``, ``shard_map`` and ``heddle.autodiff.grad`` in either order.

    Args:
      fn: the function; its array arguments (JAX or NumPy arrays) are traced, every other
        argument (Python scalars, modules' static fields, functions) is passed as it is. A flax
        linen Module that is not bound is taken as its ``apply``: ``autocast(module)(variables,
        x)`` runs ``module.apply(variables, x)``. A callable pytree (an equinox or flax nnx
        Module) is traced with its arrays as inputs, so ``precision=`` casts them too.
        Omitted, ``autocast(policy=..., precision=...)`` returns a decorator, which is also a
        block: ``with heddle.autocast():`` runs its statements eagerly under the policy (without
        ``precision=``, outside any JAX transformation).
      policy: the policy to apply (its accumulation floor, matmul precision); the active one by
        default.
      precision: a ``heddle.policy.Precision`` (or its string form, ``"mixed_bfloat16"``,
        ``"params=float32,compute=bfloat16,output=float32"``): floating inputs are cast to its
        compute dtype and floating outputs to its output dtype, as
        ``Precision.cast_to_compute``/``cast_to_output``. A dtype alone (``jnp.bfloat16``) is
        refused: it could mean ``"mixed_bfloat16"`` or ``"bfloat16"`` throughout.

    Returns:
      The transformed function (or a decorator, when ``fn`` is omitted).

    Raises:
      TypeError: ``fn`` is not callable, ``policy`` is not a ``Policy``, or the decorator is used
        as a context manager.
      UnknownDTypeError: ``precision`` names no precision preset or dtype, or is a dtype alone.
      Exception: whatever ``fn`` raises while being traced.

    Examples:
      >>> import jax.numpy as jnp
      >>> import heddle
      >>> x = jnp.full(10_000, 0.1, jnp.bfloat16)
      >>> float(x.cumsum()[-1]), float(heddle.autocast(lambda x: x.cumsum())(x)[-1])
      (1008.0, 1000.0)
      >>> heddle.autocast(lambda a: a @ a)(x).dtype
      dtype(bfloat16)
    """
    if policy is not None and not isinstance(policy, Policy):
        raise TypeError(
            message(
                f"autocast(..., policy={policy!r})",
                "policy takes a heddle.policy.Policy (a dtype belongs in precision=)",
                "Pass e.g. policy=heddle.policy.HEDDLE, or precision='mixed_bfloat16'.",
            )
        )
    prec = _precision(precision)
    if fn is None:
        return _Decorator(policy, precision)
    if not callable(fn):
        raise TypeError(
            message(
                f"autocast({fn!r})",
                "it transforms a function, and this is not callable",
                "Pass the function itself: heddle.autocast(loss), or use @heddle.autocast.",
            )
        )
    target, lead = _target(fn)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        scope = use(policy) if policy is not None else contextlib.nullcontext()
        args = (*lead, *args)
        with scope:
            graph = _graph_nodes(args, kwargs)
            if graph is not None:
                return _call_on_graph(target, active(), prec, graph)
            if prec is not None:
                args, kwargs = prec.cast_to_compute((args, kwargs))
            out = _call(target, active(), args, kwargs)
            return out if prec is None else prec.cast_to_output(out)

    return wrapped


def _precision(precision: Any) -> Precision | None:
    """``precision=`` read as ``Precision.parse`` reads it; a lone dtype is refused in autocast's
    words, since it could mean narrow compute or that dtype throughout."""
    if precision is None:
        return None
    one = _one_float(precision)
    if one is not None:
        raise UnknownDTypeError(
            message(
                f"heddle.autocast(fn, precision={precision!r})",
                "precision names three dtypes (params, compute, output), and a dtype alone could "
                "mean narrow compute with float32 params and outputs, or that dtype throughout",
                "Say which: "
                + " or ".join(f"heddle.autocast(fn, precision={r!r})" for r in _readings(one)),
            )
        )
    return Precision.parse(precision)


def _kwargs_text(policy: Policy | None, precision: Any) -> str:
    given = {"policy": policy, "precision": precision}
    return ", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)


class _Decorator:
    """What ``autocast(policy=...)`` gives without a function: a decorator, and a block.

    ``@heddle.autocast(policy=...)`` decorates a function. ``with heddle.autocast(policy=...):``
    runs the block eagerly under the policy (``_eager.Block``): every operation in it is evaluated
    by autocast's rules, and the values it leaves behave as the concrete arrays they hold. The
    block form takes no ``precision=`` (a block has no inputs or outputs to cast) and runs only
    eagerly: inside ``jax.jit``, ``jax.grad`` or ``jax.vmap``, a value leaving the block would not
    be one of their traced values, so the wrapping form is the one there.
    """

    __slots__ = ("_open", "policy", "precision")

    def __init__(self, policy: Policy | None, precision: Any) -> None:
        self.policy = policy
        self.precision = precision
        self._open: list[tuple[Any, Any]] = []

    def __call__(self, fn: Callable[..., Any]) -> Any:
        return autocast(fn, policy=self.policy, precision=self.precision)

    def __repr__(self) -> str:
        return f"heddle.autocast({_kwargs_text(self.policy, self.precision)})"

    def __enter__(self) -> None:
        kw = _kwargs_text(self.policy, self.precision)
        sep = ", " if kw else ""
        if self.precision is not None:
            raise TypeError(
                message(
                    f"with heddle.autocast({kw}):",
                    "precision= casts a function's inputs and outputs, and a block has neither",
                    f"Wrap the function and call it: heddle.autocast(fn{sep}{kw})(*args), or "
                    "leave precision= out of the block and cast its inputs with "
                    "Precision.cast_to_compute",
                )
            )
        if not isinstance(_jcore.trace_ctx.trace, _jcore.EvalTrace | _eager.EagerTrace):
            raise TypeError(
                message(
                    f"with heddle.autocast({kw}):",
                    "the block form runs eagerly, and this is inside a JAX transformation "
                    "(jax.jit, jax.grad, jax.vmap...): the values leaving the block would not be "
                    "its traced values",
                    f"Wrap the function instead: heddle.autocast(fn{sep}{kw})(*args) inside the "
                    f"transformation, or jax.jit(heddle.autocast(fn{sep}{kw}))",
                )
            )
        scope = use(self.policy) if self.policy is not None else contextlib.nullcontext()
        scope.__enter__()
        try:
            block = _eager.Block(Evaluator(active(), eager=True))
            block.__enter__()
        except BaseException:
            scope.__exit__(None, None, None)
            raise
        self._open.append((scope, block))

    def __exit__(self, *exc: Any) -> None:
        scope, block = self._open.pop()
        try:
            block.__exit__(*exc)
        finally:
            scope.__exit__(*exc)


def _invoke(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _target(fn: Callable[..., Any]) -> tuple[Callable[..., Any], tuple]:
    """The function autocast traces and the arguments it puts first.

    A flax linen Module that is not bound cannot be called; it is taken as its ``apply``
    (``autocast(module)(variables, x)`` is ``module.apply(variables, x)`` under the policy). A
    callable that is a pytree with leaves (an equinox Module, a flax nnx Module,
    ``jax.tree_util.Partial``) goes in as the first argument, so its arrays are traced as inputs
    and ``precision=`` casts its floating leaves as it casts the other arguments.
    """
    apply = linen_apply(fn)
    if apply is not None:
        return apply, ()
    graph = sys.modules.get("flax.nnx.graph")
    if (graph is not None and graph.is_graph_node(fn)) or not jax.tree_util.treedef_is_leaf(
        jax.tree.structure(fn)
    ):
        return _invoke, (fn,)
    return fn, ()


def linen_apply(fn: Any) -> Callable[..., Any] | None:
    """``fn.apply`` where ``fn`` is a flax linen Module that is not bound, else ``None``.

    flax is not imported for the check: a linen Module exists only once flax.linen is.
    """
    linen = sys.modules.get("flax.linen")
    if linen is None or not isinstance(fn, linen.Module) or fn.scope is not None:
        return None
    return fn.apply


def _graph_nodes(args: tuple, kwargs: dict[str, Any]) -> tuple | None:
    """Where flax nnx objects (modules, ``Rngs``) are among the arguments: (nnx, leaves with them
    as leaves, the tree, their positions); ``None`` without any (or without flax loaded)."""
    graph = sys.modules.get("flax.nnx.graph")
    if graph is None:
        return None
    leaves, tree = jax.tree.flatten((args, kwargs), is_leaf=graph.is_graph_node)
    where = [i for i, leaf in enumerate(leaves) if graph.is_graph_node(leaf)]
    return (sys.modules["flax.nnx"], leaves, tree, where) if where else None


def _call_on_graph(fn: Callable[..., Any], p: Policy, prec: Precision | None, graph: tuple) -> Any:
    """``_call`` for arguments holding flax nnx objects, the way ``nnx.jit`` calls a function: their
    state goes in as arrays, and what the function writes into it (BatchNorm statistics, RNG counts,
    new variables) is written back to the caller's objects afterwards. With ``precision=``, their
    ``nnx.Param`` variables go in as compute-dtype copies and come back as ``_masters_after`` says
    (what the call did not change: the master, bit for bit); the other variables go in as they
    are."""
    nnx, leaves, tree, where = graph
    nodes = tuple(leaves[i] for i in where)
    graphdef, masters, state = nnx.split(nodes, nnx.Param, ...)
    rest = [None if i in where else leaf for i, leaf in enumerate(leaves)]

    def pure(params: Any, rest: list, state: Any) -> tuple[Any, Any, Any]:
        merged = nnx.merge(graphdef, params, state)
        full = list(rest)
        for i, node in zip(where, merged, strict=True):
            full[i] = node
        a, k = jax.tree.unflatten(tree, full)
        out = fn(*a, **k)
        return out, nnx.state(merged, nnx.Param), nnx.state(merged, nnx.Not(nnx.Param))

    copies, rest = (masters, rest) if prec is None else prec.cast_to_compute((masters, rest))
    out, params, others = _call(pure, p, (copies, rest, state), {})
    if prec is not None:
        params = _masters_after(masters, copies, params)
    nnx.update(nodes, params, others)
    return out if prec is None else prec.cast_to_output(out)


def _masters_after(masters: Any, copies: Any, params: Any) -> Any:
    """The Params after a call that read compute-dtype ``copies`` of the ``masters`` and left
    ``params``: each element the call did not change is its master, bit for bit; an element it
    assigned is the assigned value in the master's dtype; a Param it created, or changed in shape,
    is what the call left."""
    by_path = {
        jax.tree_util.keystr(k): (m, c)
        for (k, m), c in zip(
            jax.tree_util.tree_flatten_with_path(masters)[0],
            jax.tree.leaves(copies),
            strict=True,
        )
    }
    flat, tree = jax.tree_util.tree_flatten_with_path(params)
    return jax.tree.unflatten(
        tree,
        [_master_or_assigned(*by_path.get(jax.tree_util.keystr(k), (x, x)), x) for k, x in flat],
    )


def _master_or_assigned(master: Any, copy: Any, new: Any) -> Any:
    if new is copy:
        return master
    if np.shape(new) != np.shape(master) or not jnp.issubdtype(master.dtype, jnp.floating):
        return new
    kept = (new == copy) | (jnp.isnan(new) & jnp.isnan(copy))
    return jnp.where(kept, master, lax.convert_element_type(new, master.dtype))


def _call(fn: Callable[..., Any], p: Policy, args: tuple, kwargs: dict[str, Any]) -> Any:
    leaves, treedef = jax.tree.flatten((args, kwargs))
    dynamic = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    out_tree: list[Any] = []

    def flat(*values: Any) -> list[Any]:
        full = list(leaves)
        for i, v in zip(dynamic, values, strict=True):
            full[i] = v
        a, k = jax.tree.unflatten(treedef, full)
        outs, tree = jax.tree.flatten(fn(*a, **k))
        # leaves that are not JAX values (a string tag, a Python number the function returns as it
        # is) come back unchanged, as from the plain function
        static = {
            i: o for i, o in enumerate(outs) if not isinstance(o, jax.Array | jax.core.Tracer)
        }
        out_tree.append((tree, static, len(outs)))
        return [o for i, o in enumerate(outs) if i not in static]

    values = [_eager.settled(leaves[i]) for i in dynamic]
    eager = _eager.is_eager(values)
    ev = Evaluator(p, eager=eager)
    if eager:
        computed = iter(_eager.call(ev, flat, values))
        tree, static, n = out_tree[-1]
        return jax.tree.unflatten(
            tree, [static[i] if i in static else next(computed) for i in range(n)]
        )
    closed = jax.make_jaxpr(flat)(*values)
    frame = ev.frame()
    jaxpr = closed.jaxpr
    for v, c in zip(jaxpr.constvars, closed.consts, strict=True):
        frame.write(v, c)
    for v, x in zip(jaxpr.invars, values, strict=True):
        frame.write(v, x)
    ev.run(frame, jaxpr)
    computed = iter(_conform(frame.read(v), v.aval) for v in jaxpr.outvars)
    tree, static, n = out_tree[-1]
    return jax.tree.unflatten(
        tree, [static[i] if i in static else next(computed) for i in range(n)]
    )
