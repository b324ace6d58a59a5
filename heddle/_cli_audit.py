"""``python -m heddle audit``: audit a function by name from the command line.

``python -m heddle audit package.module:function --args 'bf16[128,784]' 'f32[784,10]'`` imports the
function, traces it on arrays of those dtypes and shapes (nothing runs) and prints the audit table
(or JSON with ``--json``). Exit status: 0 when there is no finding of the kinds named by ``--fail-on``
(all kinds by default), 1 when there is, 2 for a usage error (a target that cannot be imported, a bad
argument spec, a function that fails to trace), with a message that says how to fix it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
from typing import Any

from heddle._cli_common import usage_error

HELP = "audit a function for narrow sums and cotangents, implicit promotion, lossy conversion"
"""The subcommand's line in ``python -m heddle --help``."""

KINDS: tuple[str, ...] = (
    "narrow_accumulation",
    "implicit_promotion",
    "lossy_conversion",
    "float64_unavailable",
    "unclassified_primitive",
    "narrow_cotangent",
)
"""``heddle.programs.KINDS``, spelled out so that building the parser (``audit --help``) does not
import JAX; a test keeps the two equal."""

_SPEC = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(?:\[\s*([^\]]*?)\s*\])?\s*$")
_USAGE = "Write each argument as DTYPE[D0,D1,...], e.g. bf16[128,784], or f32[] for a scalar"


class UsageError(Exception):
    """A command-line input the audit cannot use; the message says how to fix it."""


def parse_spec(text: str) -> Any:
    """Parses ``'bf16[128,784]'`` into a ``jax.ShapeDtypeStruct``, or a JSON pytree of such specs.

    Args:
      text: a dtype name or alias of heddle's policy, then the shape in brackets (``f32[]`` or just
        ``f32`` for a scalar); or a JSON object/array whose strings are specs, for a pytree argument
        (``'{"w": "bf16[784,256]", "b": "bf16[256]"}'``).

    Returns:
      The ``jax.ShapeDtypeStruct`` (or the pytree of them: dicts and lists).

    Raises:
      argparse.ArgumentTypeError: the text is not a spec, names no dtype, or asks for a 64-bit dtype
        while ``jax_enable_x64`` is off; the message says what to write instead.

    Examples:
      >>> from heddle._cli_audit import parse_spec
      >>> parse_spec("bf16[128,784]")
      ShapeDtypeStruct(shape=(128, 784), dtype=bfloat16)
      >>> parse_spec('{"b": "f32[2]"}')
      {'b': ShapeDtypeStruct(shape=(2,), dtype=float32)}
    """
    import jax

    if re.match(r"\s*(\{|\[\s*[\"\[{])", text):  # a JSON object, or an array of specs
        return _parse_tree(text)

    from heddle import policy
    from heddle.policy import _dtypes
    from heddle.policy._errors import message

    m = _SPEC.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            message(f"--args {text!r}", "that is not an argument spec", _USAGE + ".")
        )
    name, dims = m.group(1), m.group(2) or ""
    shape = []
    for part in filter(None, (p.strip() for p in dims.split(","))):
        if not part.isdigit():
            raise argparse.ArgumentTypeError(
                message(
                    f"--args {text!r}",
                    f"{part!r} is not a dimension (a non-negative integer)",
                    _USAGE + ".",
                )
            )
        shape.append(int(part))
    try:
        d = policy.dtype(name)
        _dtypes.require_available(d, f"--args {text!r}")
    except policy.PolicyError as e:
        hint = " From the shell: JAX_ENABLE_X64=1 python -m heddle audit ..."
        raise argparse.ArgumentTypeError(
            str(e) + (hint if isinstance(e, policy.PrecisionError) else "")
        ) from None
    return jax.ShapeDtypeStruct(tuple(shape), d)


def _parse_tree(text: str) -> Any:
    from heddle.policy._errors import message

    try:
        tree = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            message(
                f"--args {text!r}",
                f"it starts like a JSON pytree but is not JSON ({e.msg} at character {e.pos})",
                'Write a JSON object or array of specs, e.g. \'{"w": "bf16[784,256]"}\'',
            )
        ) from None

    def leaf(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: leaf(v) for k, v in x.items()}
        if isinstance(x, list):
            return [leaf(v) for v in x]
        if isinstance(x, str):
            return parse_spec(x)
        raise argparse.ArgumentTypeError(
            message(
                f"--args {text!r}",
                f"{x!r} is not a spec string",
                'Every leaf of the JSON pytree is a spec such as "bf16[128,784]".',
            )
        )

    return leaf(tree)


def load_args(target: str) -> tuple[Any, ...]:
    """The positional arguments a ``module:make_args`` factory returns (a tuple, or one value).

    Args:
      target: ``package.module:function`` of a function taking no arguments.

    Returns:
      The arguments, as a tuple (arrays or ``jax.ShapeDtypeStruct`` pytrees).

    Raises:
      UsageError: the factory cannot be imported or fails.
    """
    from heddle.policy._errors import message

    make = load_target(target)
    try:
        out = make()
    except Exception as e:
        raise UsageError(
            message(
                f"audit --args-from {target!r}",
                f"calling it failed with {type(e).__name__}: {e}",
                "Give a function of no arguments that returns the audited function's positional "
                "arguments as a tuple, e.g. def make_args(): return (params, x)",
            )
        ) from None
    return tuple(out) if isinstance(out, tuple) else (out,)


def load_target(target: str) -> Any:
    """Imports ``package.module:function`` (or ``path/to/file.py:function``; dots reach attributes).

    Args:
      target: the target as written on the command line.

    Returns:
      The callable.

    Raises:
      UsageError: no ``:``, the module cannot be imported, the attribute is missing or not callable.
    """
    from heddle.policy._errors import message

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            message(
                f"audit {target!r}",
                "the target names no function",
                "Write it as package.module:function (or path/to/file.py:function), "
                "e.g. python -m heddle audit mymodel.train:loss --args 'bf16[128,784]'",
            )
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise FileNotFoundError(f"no such file: {module_name}")
            spec = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(module_name))[0], module_name
            )
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(module_name)
    except Exception as e:
        raise UsageError(
            message(
                f"audit {target!r}",
                f"importing {module_name} failed with {type(e).__name__}: {e}",
                "Run from the directory that holds the package (or add it to PYTHONPATH), check "
                "the spelling, or give a file path: python -m heddle audit path/to/file.py:function",
            )
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(
                n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))
            )
            raise UsageError(
                message(
                    f"audit {target!r}",
                    f"{module_name} has no attribute {attr!r}",
                    f"Name one of its callables: {', '.join(names[:20]) or '(none)'}",
                )
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(
            message(
                f"audit {target!r}",
                f"{attr} is a {type(obj).__name__}, not a function",
                "Name the function that computes with the arrays, e.g. module:loss",
            )
        )
    return obj


def run(args: argparse.Namespace) -> int:
    """Runs ``audit`` for parsed arguments.

    Usage errors are printed to stderr with their fix, not raised.

    Args:
      args: the namespace ``add_audit_parser``'s parser produced.

    Returns:
      The exit status: 0 no finding of the ``--fail-on`` kinds, 1 some, 2 a usage error.
    """
    from heddle.policy._errors import message
    from heddle.programs._audit import audit

    try:
        fn = load_target(args.target)
        specs = list(args.args or [])
        if args.args_from:
            specs += load_args(args.args_from)
    except UsageError as e:
        return usage_error(str(e))
    if args.autocast:
        from heddle.programs import autocast

        fn = autocast(fn)
    try:
        report = audit(
            fn,
            *specs,
            include_backward=args.include_backward,
            include_explicit=args.include_explicit,
        )
    except Exception as e:
        shown = " ".join(repr(_spec_text(s)) for s in specs) or "(none)"
        last = str(e).strip().splitlines()[-1].rstrip(".") if str(e).strip() else ""
        return usage_error(
            message(
                f"audit {args.target} --args {shown}",
                f"tracing it failed with {type(e).__name__}: {last}",
                "Give one --args spec per positional argument, in order, with the shapes and "
                "dtypes the function expects; run the function once on such arrays to see the "
                "full traceback",
            )
        )
    fail_on = KINDS if args.fail_on is None else tuple(k for k in args.fail_on if k != "none")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report)
    return 1 if report.of_kind(*fail_on) and fail_on else 0


def _spec_text(s: Any) -> str:
    import jax

    from heddle.policy import _dtypes
    from heddle.programs._audit_ir import short

    def one(x: Any) -> str:
        return f"{short(_dtypes.dtype(x.dtype))}[{','.join(map(str, x.shape))}]"

    leaves = jax.tree.leaves(s)
    return one(s) if len(leaves) == 1 and leaves[0] is s else str(jax.tree.map(one, s))


def add_audit_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``audit`` subcommand on ``subparsers`` (from ``add_subparsers``).

    Args:
      subparsers: the object ``ArgumentParser.add_subparsers()`` returned.

    Returns:
      The subcommand's parser; its defaults set ``run`` to the function that executes it.

    Examples:
      >>> import argparse
      >>> from heddle._cli_audit import add_audit_parser
      >>> parser = argparse.ArgumentParser(prog="python -m heddle")
      >>> _ = add_audit_parser(parser.add_subparsers(dest="command"))
      >>> parser.parse_args(["audit", "m:f", "--args", "f32[2]"]).args
      [ShapeDtypeStruct(shape=(2,), dtype=float32)]
    """
    p = subparsers.add_parser(
        "audit",
        help=HELP,
        description=(
            "Trace package.module:function on arrays of the given dtypes and shapes (nothing runs) "
            "and list where it departs from heddle's dtype policy. Exit status: 0 clean, 1 findings "
            "of the --fail-on kinds, 2 usage error."
        ),
    )
    p.add_argument("target", help="package.module:function, or path/to/file.py:function")
    p.add_argument(
        "--args",
        nargs="*",
        type=parse_spec,
        default=[],
        metavar="SPEC",
        help="one spec per positional argument: DTYPE[D0,D1,...], e.g. bf16[128,784] f32[], or "
        'a JSON pytree of specs for a pytree argument: \'{"w": "bf16[784,256]"}\'',
    )
    p.add_argument(
        "--args-from",
        default=None,
        metavar="MODULE:FUNCTION",
        help="a function of no arguments returning the positional arguments (arrays, "
        "ShapeDtypeStructs, pytrees such as a params dict), after any --args",
    )
    p.add_argument(
        "--autocast",
        action="store_true",
        help="audit heddle.autocast(function): what is left once the policy is applied",
    )
    p.add_argument(
        "--include-backward",
        action="store_true",
        help="also audit the backward pass (the VJP), its narrow cotangents included",
    )
    p.add_argument(
        "--include-explicit",
        action="store_true",
        help="also list lossy conversions the code asks for explicitly (astype)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--fail-on",
        nargs="+",
        choices=(*KINDS, "none"),
        default=None,
        metavar="KIND",
        help=f"kinds that make the exit status 1 (default: all): {', '.join(KINDS)}, or none",
    )
    p.set_defaults(run=run)
    return p
