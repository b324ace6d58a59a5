"""Writes ``tests/slow_cases.txt``: the test cases that run only under ``pytest -m slow``.

The default run keeps every test case that took at most ``--seconds`` (1.0 by default) in a timed
run of it, and, of each test function whose cases all took longer, its cheapest case, and its
cheapest eager and cheapest jitted case where its ids say ``eager`` or ``jit``: every check runs in
the default run at least once, eagerly and under ``jax.jit`` where it has both, and its longer cases
in the slow run. ``tests/conftest.py``
marks the listed cases ``slow`` at collection. A case already listed that the timed run did not run
(the default run leaves it out) stays listed, with the seconds it was listed with; one it ran is
decided again.

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
HEADER = """\
# Test cases the default run leaves to `pytest -m slow` (tests/conftest.py marks them), with the
# seconds each took in the timed run this list was made from. Made by tests/_slow_cases.py:
# every case over {seconds} s, except the cheapest case of each test function (and its cheapest
# eager and jitted case where it has both), which stays;
# cases listed before that the timed run left out stay, with their earlier seconds.
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


def family(node: str) -> str:
    """The test function of a case, with ``eager`` or ``jit`` where its parameter ids hold one."""
    ids = re.search(r"\[(.*)\]$", node)
    modes = [m for m in ("eager", "jit") if ids and m in ids.group(1).split("-")]
    return re.sub(r"\[.*\]$", "", node) + "|" + ",".join(modes)


def slow_cases(times: dict[str, float], seconds: float) -> dict[str, float]:
    """The cases over ``seconds``, less the cheapest case of each ``family``."""
    families: dict[str, list[str]] = collections.defaultdict(list)
    for node in times:
        families[family(node)].append(node)
    out = {}
    for cases in families.values():
        cheapest = min(cases, key=times.__getitem__)
        out.update({c: times[c] for c in cases if c != cheapest and times[c] > seconds})
    return out


def listed() -> dict[str, float]:
    """Node id -> seconds, of the cases ``slow_cases.txt`` lists now."""
    if not LIST.exists():
        return {}
    lines = [line.split(None, 1) for line in LIST.read_text().splitlines()]
    return {node: float(t) for t, node in (x for x in lines if x and not x[0].startswith("#"))}


def merged(before: dict[str, float], times: dict[str, float], seconds: float) -> dict[str, float]:
    """The cases ``before`` listed that ``times`` did not run, and ``slow_cases(times, seconds)``."""
    kept = {node: t for node, t in before.items() if node not in times}
    return {**kept, **slow_cases(times, seconds)}


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
