"""Where an equation of a jaxpr came from: the user's source line and the library call that made it.

Every equation JAX records carries the Python traceback of the moment it was traced. Read from the
innermost frame outwards, it passes through JAX's own modules (and heddle's, and third-party libraries
such as equinox) before reaching the user's code. Two facts are read off it:

- the user's line: the innermost frame outside JAX, heddle, the standard library and installed
  third-party packages (falling back to the innermost frame outside JAX);
- the entry: the outermost JAX function on the way in, i.e. the function that code outside JAX
  called (``astype``, ``sum``, ``_operator_add``, ...). It tells an explicit cast, which the code asked
  for, from a ``convert_element_type`` JAX inserted inside some other operation.

Equations that a single library call produced (one ``jnp.sum`` gives a convert, a ``reduce_sum`` and
a convert back) share a call ``key``; the audit's dataflow rules work within one call.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

import jax
from jax import lax

import heddle


def _package_dir(module: Any) -> str | None:
    """The directory of a package's ``__init__`` (with a trailing separator), or None."""
    file = getattr(module, "__file__", None) if module is not None else None
    return os.path.dirname(file) + os.sep if file else None


_JAX_DIRS = tuple(
    d for d in (_package_dir(m) for m in (jax, sys.modules.get("jaxlib"))) if d is not None
)
_HEDDLE_DIR = os.path.dirname(heddle.__file__) + os.sep
_STDLIB = tuple(
    p + os.sep
    for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    if p is not None
)
_THIRD_PARTY = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
# Eager autocast's trace (``_eager``) stages every primitive from inside its own frames: they are
# dispatch, as JAX's are, so an equation's site is the one ``jax.make_jaxpr`` would record.
_EAGER_TRACE = os.path.join(os.path.dirname(__file__), "_eager.py")

# JAX modules that only dispatch, trace or wrap: never the function a caller meant to call.
_PLUMBING = frozenset(
    {
        "api.py",
        "api_util.py",
        "core.py",
        "custom_derivatives.py",
        "linear_util.py",
        "partial_eval.py",
        "pjit.py",
        "source_info_util.py",
        "traceback_util.py",
        "util.py",
    }
)


def entry_name(fn: Callable[..., Any]) -> str:
    """The name a traceback gives the frame of the JAX function ``fn`` (what ``Site.entry`` holds
    when a caller called it): the qualified name of its code, under any wrappers."""
    return str(inspect.unwrap(fn).__code__.co_qualname)


# JAX functions whose ``convert_element_type`` is the conversion the caller asked for.
_CAST_ENTRIES = frozenset(
    {
        "astype",  # jnp.astype
        "_astype",  # x.astype
        "asarray",  # jnp.asarray(x, dtype)
        "array",  # jnp.array(x, dtype)
        entry_name(lax.convert_element_type),
        "_ScalarMeta.__call__",  # jnp.float32(x)
    }
)


@dataclasses.dataclass(frozen=True)
class Location:
    """One source location: file, line and function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{_short_path(self.file)}:{self.line} ({self.function})"


@dataclasses.dataclass(frozen=True)
class Site:
    """Where an equation came from.

    Attributes:
      key: identifies the library call that produced the equation (equal for all its equations).
      entry: the JAX function the caller called (``"sum"``, ``"_astype"``), or None.
      explicit: the conversion was asked for (a cast entry, or one of heddle's own ops).
      source: the user's line, or None when the traceback has no frame outside JAX.
      direct: the JAX function was called by the user's own code (not by a library such as flax),
        so its arguments are the user's to change.
    """

    key: Any
    entry: str | None
    explicit: bool
    source: Location | None
    direct: bool = False


LIBRARY_BODY = ("<library body>",)
"""The call key of equations traced inside a jitted library function (no caller frame)."""


def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith(".." + os.sep) else rel


def _in_jax(filename: str) -> bool:
    """JAX's own modules and the standard library (not packages installed under it)."""
    if filename.startswith(_JAX_DIRS) or filename == _EAGER_TRACE:
        return True
    return filename.startswith(_STDLIB) and not any(t in filename for t in _THIRD_PARTY)


def is_user(filename: str) -> bool:
    """Whether a file is the user's code: not JAX, heddle, the standard library or a package."""
    return not (
        _in_jax(filename)
        or filename.startswith(_HEDDLE_DIR)
        or any(t in filename for t in _THIRD_PARTY)
    )


def _plumbing(code: Any) -> bool:
    """Dispatch and forwarding frames (``x.astype`` reaches ``_astype`` through a closure)."""
    name = code.co_filename
    return (
        "<locals>" in code.co_qualname
        or os.path.basename(name) in _PLUMBING
        or name == _EAGER_TRACE
    )


def _location(code: Any, lasti: int) -> Location:
    line = None
    if lasti >= 0:
        for start, end, lineno in code.co_lines():
            if start <= lasti < end:
                line = lineno
                break
    return Location(code.co_filename, line or code.co_firstlineno, code.co_qualname)


class SiteCache:
    """Computes ``Site``s, once per traceback (the equations of one inlined call share it)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, Site]] = {}

    def site(self, traceback: Any) -> Site:
        """The ``Site`` of a traceback (None gives an empty site)."""
        if traceback is None:
            return Site(LIBRARY_BODY, None, False, None)
        hit = self._cache.get(id(traceback))
        if hit is not None and hit[0] is traceback:
            return hit[1]
        s = _site(traceback)
        self._cache[id(traceback)] = (traceback, s)  # keep it alive so the id stays unique
        return s


def _site(traceback: Any) -> Site:
    codes, lastis = traceback.raw_frames()  # innermost first
    n = len(codes)
    outside = next((i for i in range(n) if not _in_jax(codes[i].co_filename)), None)
    if outside is None:  # the body of a jitted library function: no caller in this traceback
        entry_i = next((i for i in range(n - 1, -1, -1) if not _plumbing(codes[i])), None)
        entry = codes[entry_i].co_qualname if entry_i is not None else None
        return Site(LIBRARY_BODY, entry, entry in _CAST_ENTRIES, None)
    entry_i = next((i for i in range(outside - 1, -1, -1) if not _plumbing(codes[i])), None)
    entry_code = codes[entry_i] if entry_i is not None else None
    entry = entry_code.co_qualname if entry_code is not None else None
    caller = codes[outside].co_filename
    explicit = entry in _CAST_ENTRIES or caller.startswith(_HEDDLE_DIR)
    user = next((i for i in range(outside, n) if is_user(codes[i].co_filename)), outside)
    source = _location(codes[user], lastis[user])
    key = (entry_code, *zip(codes[outside:], lastis[outside:], strict=True))
    return Site(key, entry, explicit, source, is_user(caller))


def source_line(frame: Location | None) -> str:
    """The stripped text of a source line, or ``""`` when it cannot be read."""
    if frame is None:
        return ""
    import linecache

    return linecache.getline(frame.file, frame.line).strip()
