"""The ``python -m heddle`` command line (also the ``heddle`` console script): ``table``, ``demo``,
``audit``.

Only the subcommand being run has its parser built in full; the others are registered by name and
help line, so that ``--help`` and ``audit --help`` do not import JAX (each subcommand's handler
imports what it needs when it runs).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Collection, Sequence
from typing import Any

TABLE_HELP = "print the pairwise promotion table"
DEMO_HELP = "train a small model in several precision regimes, with heddle and with jax.numpy"

_SUBCOMMANDS = ("table", "demo", "audit")


def _table(args: argparse.Namespace) -> int:
    from heddle import policy

    p = policy.JAX if args.policy == "jax" else policy.HEDDLE
    print(policy.table(args.dtypes or None, fmt=args.format, policy=p))
    return 0


def _add_table_parser(sub: Any) -> argparse.ArgumentParser:
    t = sub.add_parser("table", help=TABLE_HELP)
    t.add_argument("dtypes", nargs="*", help="rows/columns to show (default: every dtype)")
    t.add_argument("--format", choices=("markdown", "html", "csv"), default="markdown")
    t.add_argument("--policy", choices=("heddle", "jax"), default="heddle")
    t.set_defaults(run=_table)
    return t


def _add_full(sub: Any, name: str) -> None:
    if name == "table":
        _add_table_parser(sub)
    elif name == "demo":
        importlib.import_module("heddle._cli_demo").add_demo_parser(sub)
    else:
        importlib.import_module("heddle._cli_audit").add_audit_parser(sub)


def _help_line(name: str) -> str:
    if name == "audit":
        return importlib.import_module("heddle._cli_audit").HELP
    return {"table": TABLE_HELP, "demo": DEMO_HELP}[name]


def prog_name(argv0: str | None = None) -> str:
    """How the command was called, for the usage line: ``heddle`` or ``python -m heddle``.

    Args:
      argv0: ``sys.argv[0]`` by default.

    Returns:
      ``"heddle"`` when ``argv0`` is the console script (``.../bin/heddle``, ``heddle.exe``),
      else ``"python -m heddle"``.

    Examples:
      >>> from heddle.__main__ import prog_name
      >>> prog_name("/venv/bin/heddle"), prog_name("/src/heddle/__main__.py")
      ('heddle', 'python -m heddle')
    """
    if argv0 is None:
        argv0 = sys.argv[0] if sys.argv else ""
    stem = os.path.basename(argv0).removesuffix(".exe").removesuffix("-script.py")
    return "heddle" if stem == "heddle" else "python -m heddle"


def build_parser(
    commands: Collection[str] | None = None, prog: str | None = None
) -> argparse.ArgumentParser:
    """The argument parser of ``python -m heddle``.

    Args:
      commands: the subcommands whose parsers are built in full (their options, their ``run``);
        the others are listed by name and help line only. Every one by default.
      prog: the program name of the usage line; ``prog_name()`` by default.

    Returns:
      The parser.
    """
    parser = argparse.ArgumentParser(
        prog=prog or prog_name(), description="heddle: mixed precision for JAX."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _SUBCOMMANDS:
        if commands is None or name in commands:
            _add_full(sub, name)
        else:
            sub.add_parser(name, help=_help_line(name))
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs: its first word that is not an option (the top level has no
    option taking a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(commands=(_command(argv),)).parse_args(argv)
    try:
        return args.run(args)
    except Exception as e:  # policy errors carry their own fix; show them without a traceback
        from heddle.policy import PolicyError

        if isinstance(e, PolicyError):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
