"""Writes ``tests/slow_cases.txt``: the test cases that run only under ``pytest -m slow``.

The default run keeps every test case that took at most ``--seconds`` (1.0 by default) in a timed
run of it; of each test function, its cheapest case; and of each test function whose ids say
``eager`` and ``jit``, its cheapest eager and its cheapest jitted case where that took at most
``MODE_SECONDS`` (1 s): every check runs in the default run at least once, eagerly and under
``jax.jit`` where that is cheap, and its longer cases in the slow run. ``tests/conftest.py`` marks the
listed cases ``slow`` at collection. A case already listed that the timed run did not run
(the default run leaves it out) keeps the seconds it was listed with, and every case is decided
again with the rest of its test function (so a cheapest eager or jitted case that an earlier list
left out returns).

Usage (a timed run of the default suite, then this script)::

    python -m pytest --junitxml=/tmp/suite.xml
    python tests/_slow_cases.py /tmp/suite.xml [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import xml.etree.ElementTree as ET

LIST = pathlib.Path(__file__).with_name("slow_cases.txt")
MODE_SECONDS = 1.0
"""The longest a test function's cheapest eager (or jitted) case may take and still stay."""
HEADER = """\
# Test cases the default run leaves to `pytest -m slow` (tests/conftest.py marks them), with the
# seconds each took in the timed run this list was made from. Made by tests/_slow_cases.py:
# every case over {seconds} s, except the cheapest case of each test function, and its cheapest
# eager and cheapest jitted case where it has both and that took at most 1 s, which stay;
# a case listed before that the timed run left out is decided again with its earlier seconds.
"""


def timings(junit: pathlib.Path) -> dict[str, float]:
    """Node id -> seconds, of every case a JUnit XML report ran (skipped ones left out)."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        if case.find("skipped") is not None:
            continue
        path = case.get("classname", "").replace(".", "/") + ".py"
        out[f"{path}::{case.get('name')}"] = float(case.get("time", 0))
    return out


def _function(node: str) -> str:
    return re.sub(r"\[.*\]$", "", node)


def _mode(node: str) -> str:
    """``eager`` or ``jit`` where a case's parameter ids hold one (as a whole id), else ``""``."""
    ids = re.search(r"\[(.*)\]$", node)
    parts = ids.group(1).split("-") if ids else []
    return next((m for m in ("eager", "jit") if m in parts), "")


def slow_cases(
    times: dict[str, float], seconds: float, mode_seconds: float = MODE_SECONDS
) -> dict[str, float]:
    """The cases over ``seconds``, less the cheapest case of each test function and, of each test
    function with eager and jitted cases, the cheapest eager and the cheapest jitted case that took
    at most ``mode_seconds``."""
    functions: dict[str, list[str]] = collections.defaultdict(list)
    modes: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for node in times:
        functions[_function(node)].append(node)
        if _mode(node):
            modes[_function(node), _mode(node)].append(node)
    stay = {min(cases, key=times.__getitem__) for cases in functions.values()}
    for cases in modes.values():
        cheapest = min(cases, key=times.__getitem__)
        if times[cheapest] <= mode_seconds:
            stay.add(cheapest)
    return {node: t for node, t in times.items() if node not in stay and t > seconds}


def listed() -> dict[str, float]:
    """Node id -> seconds, of the cases ``slow_cases.txt`` lists now."""
    if not LIST.exists():
        return {}
    lines = [line.split(None, 1) for line in LIST.read_text().splitlines()]
    return {node: float(t) for t, node in (x for x in lines if x and not x[0].startswith("#"))}


def merged(before: dict[str, float], times: dict[str, float], seconds: float) -> dict[str, float]:
    """``slow_cases`` of every case ``before`` listed or ``times`` ran, with the seconds of the
    timed run where it has them: a listed case the run left out keeps its earlier seconds, and is
    decided again with the rest of its test function."""
    return slow_cases({**before, **times}, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=pathlib.Path)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--about", default="", help="a line on the timed run (machine, load)")
    args = parser.parse_args()
    cases = merged(listed(), timings(args.junit), args.seconds)
    lines = [f"{t:7.2f}  {node}" for node, t in sorted(cases.items())]
    about = f"# The latest timed run: {args.about}\n" if args.about else ""
    LIST.write_text(HEADER.format(seconds=args.seconds) + about + "\n".join(lines) + "\n")
    print(f"{len(cases)} cases, {sum(cases.values()) / 60:.1f} min of the timed run -> {LIST}")


if __name__ == "__main__":
    main()
