"""Builds the ``heddle.scipy`` modules from the classification in ``heddle/scipy/_table.py``.

``namespace(path)`` gives the names of ``heddle.scipy.<path>``: ``Compute`` rules become
``float_op`` wrappers of JAX's function, ``Own`` rules take the object of ``heddle/scipy/_own.py``,
``Pass`` rules JAX's own object. ``distribution(dist)`` gives the functions of
``heddle.scipy.stats.<dist>``. A name the installed JAX lacks is left out (an older JAX).
``export(globals(), names)`` puts such names into a module and gives its ``__all__``: a module of
functions (``heddle.scipy.linalg``, ``heddle.scipy.stats.beta``, ...) is its docstring and that line.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import jax.scipy.stats as _jst

from heddle.ops import _logprob
from heddle.ops._float_op import float_op
from heddle.policy._rules import OpClass
from heddle.scipy import _own, _table
from heddle.scipy._table import Compute, Own, Pass

HOW: dict[OpClass, str] = {
    OpClass.FLOAT_ONLY: (
        "a float input keeps its dtype (complex outputs: the narrowest complex holding it; "
        "integer outputs: the index dtype, int32); an integer or bool input gives the policy's "
        "default float; JAX's implementation runs in the accumulation dtype (float32 for narrow "
        "floats) and every output is rounded once"
    ),
    OpClass.REDUCTION: (
        "float: the promotion of the inputs; integer/bool: their accumulation dtype (int8 gives "
        "int32); JAX's implementation runs in the accumulation dtype, so every sum accumulates "
        "there (float32 for narrow floats), and the output is rounded once"
    ),
    OpClass.ARITHMETIC: (
        "the promotion of the inputs; computed in float32 for narrow floats, rounded once"
    ),
    OpClass.SELECTION: (
        "the input dtype, values copied bit-exactly (from the exact float32 copy of a narrow "
        "float, so a gradient sums repeated entries in float32)"
    ),
}
"""The ``Dtypes:`` line of a ``Compute`` function, by op class."""


def doc(qualname: str, how: str, jobj: Any) -> str:
    """The docstring of ``heddle.<qualname>``: what it does about dtypes, then JAX's own.

    Args:
      qualname: the name below ``heddle``, e.g. ``"scipy.linalg.inv"``.
      how: the ``Dtypes:`` line.
      jobj: JAX's function or class.

    Returns:
      The docstring.
    """
    kind = "class" if inspect.isclass(jobj) else "function"
    return (
        f"heddle's policy version of ``jax.{qualname}``.\n\n"
        f"Dtypes: {how} (POLICY.md 4-5).\n\n"
        f"Args:\n  *args: as for jax.{qualname}.\n  **kwargs: as for jax.{qualname}.\n\n"
        f"Returns:\n  The result of jax.{qualname} under heddle's dtype policy.\n\n"
        f"Examples:\n  >>> import heddle.scipy\n  >>> heddle.{qualname}  # doctest: +ELLIPSIS\n"
        f"  <{kind} ...>\n\n"
        f"Original documentation follows.\n\n{jobj.__doc__ or ''}"
    )


def _compute(
    jfn: Callable[..., Any],
    qualname: str,
    rule: Compute,
    fn: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """JAX's ``jfn`` (or heddle's formula ``fn`` of it) under ``rule``, with ``jfn``'s docs."""
    op = float_op(
        jfn if fn is None else fn,
        qualname,
        op_class=rule.op_class,
        values=rule.values,
        params=rule.params,
        matmul=rule.matmul,
    )
    op.__doc__ = doc(qualname, HOW[rule.op_class], jfn)
    return op


def namespace(path: str) -> dict[str, Any]:
    """The public names of ``heddle.scipy.<path>`` (``"linalg"``, ``"cluster.vq"``, ...).

    Args:
      path: the module's path below ``jax.scipy``, a key of ``_table.TABLES``.

    Returns:
      name -> heddle's object.
    """
    src = importlib.import_module(f"jax.scipy.{path}")
    names: dict[str, Any] = {}
    for name, rule in _table.TABLES[path].items():
        jobj = getattr(src, name, None)
        if jobj is None:
            continue
        qualname = f"scipy.{path}.{name}"
        if isinstance(rule, Pass):
            names[name] = jobj
        elif isinstance(rule, Own):
            obj = _own.OWN[f"{path}.{name}"]
            obj.__doc__ = doc(qualname, rule.how, jobj)
            names[name] = obj
        else:
            names[name] = _compute(jobj, qualname, rule)
    return names


def distribution(dist: str) -> dict[str, Any]:
    """The functions of ``heddle.scipy.stats.<dist>``, by name.

    Each function's value operands are its parameters named in ``_table.DISTRIBUTIONS[dist]``;
    it is float-only, computed in the accumulation dtype, its output rounded once.

    Args:
      dist: a key of ``_table.DISTRIBUTIONS``.

    Returns:
      name -> heddle's function.
    """
    src = getattr(_jst, dist)
    known = _table.DISTRIBUTIONS[dist]
    names: dict[str, Any] = {}
    for name in sorted(n for n in dir(src) if not n.startswith("_")):
        jfn = getattr(src, name)
        if not callable(jfn) or inspect.isclass(jfn):
            continue
        values = tuple(n for n in inspect.signature(jfn).parameters if n in known)
        rule = Compute(values, matmul=dist in _table.DISTRIBUTION_MATMUL)
        own = _logprob.STATS.get(dist, {}).get(name)
        names[name] = _compute(jfn, f"scipy.stats.{dist}.{name}", rule, own)
    return names


def export(module_globals: dict[str, Any], names: dict[str, Any]) -> list[str]:
    """Puts ``names`` into a module's namespace and gives the module's ``__all__``.

    Args:
      module_globals: the module's ``globals()``.
      names: name -> object, as ``namespace`` or ``distribution`` gives them.

    Returns:
      The names, sorted: the module's ``__all__``.

    Examples:
      >>> from heddle.scipy import _build
      >>> ns: dict = {}
      >>> _build.export(ns, {"b": 2, "a": 1}), ns
      (['a', 'b'], {'b': 2, 'a': 1})
    """
    module_globals.update(names)
    return sorted(names)
