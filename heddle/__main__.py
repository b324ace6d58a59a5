"""The ``python -m heddle`` command line: ``table`` (and more subcommands as they land)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _table(args: argparse.Namespace) -> int:
    from heddle import policy

    p = policy.JAX if args.policy == "jax" else policy.HEDDLE
    print(policy.table(args.dtypes or None, fmt=args.format, policy=p))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m heddle``."""
    parser = argparse.ArgumentParser(
        prog="python -m heddle", description="heddle: mixed precision for JAX."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="print the pairwise promotion table")
    t.add_argument("dtypes", nargs="*", help="rows/columns to show (default: every dtype)")
    t.add_argument("--format", choices=("markdown", "html", "csv"), default="markdown")
    t.add_argument("--policy", choices=("heddle", "jax"), default="heddle")
    t.set_defaults(run=_table)
    from heddle._cli_audit import add_audit_parser
    from heddle._cli_demo import add_demo_parser

    add_demo_parser(sub)
    add_audit_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
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
