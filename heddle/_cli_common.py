"""What the subcommands of ``python -m heddle`` share: how a usage error reaches the user."""

from __future__ import annotations

import sys


def usage_error(text: str) -> int:
    """Prints ``error: <text>`` to stderr, without a traceback.

    Args:
      text: the message; it says what was wrong and how to fix it.

    Returns:
      2, the exit status of a usage error.

    Examples:
      >>> import contextlib, io
      >>> from heddle._cli_common import usage_error
      >>> err = io.StringIO()
      >>> with contextlib.redirect_stderr(err):
      ...     status = usage_error("demo --steps 0: need at least 1 step")
      >>> status
      2
      >>> print(err.getvalue(), end="")
      error: demo --steps 0: need at least 1 step
    """
    print(f"error: {text}", file=sys.stderr)
    return 2
