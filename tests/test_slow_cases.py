"""tests/slow_cases.txt and its generator: the default run keeps a case of every test function."""

from __future__ import annotations

import importlib.util
import pathlib
import re

TESTS = pathlib.Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_slow_cases", TESTS / "_slow_cases.py")
assert _spec is not None and _spec.loader is not None
slow = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slow)


def test_the_cheapest_case_of_each_function_stays_and_longer_ones_move():
    times = {
        "tests/a.py::test_f[x]": 5.0,
        "tests/a.py::test_f[y]": 3.0,
        "tests/a.py::test_f[z]": 0.5,
        "tests/a.py::test_g[x]": 4.0,
        "tests/a.py::test_g[y]": 2.0,
        "tests/a.py::test_h": 9.0,
    }
    assert slow.slow_cases(times, 1.0) == {
        "tests/a.py::test_f[x]": 5.0,
        "tests/a.py::test_f[y]": 3.0,
        "tests/a.py::test_g[x]": 4.0,  # test_g[y], its cheapest, stays; test_h is its only case
    }
    assert slow.slow_cases(times, 3.5) == {
        "tests/a.py::test_f[x]": 5.0,
        "tests/a.py::test_g[x]": 4.0,
    }


def test_the_cheapest_eager_and_the_cheapest_jitted_case_both_stay():
    times = {
        "tests/a.py::test_f[eager-bf16]": 0.9,
        "tests/a.py::test_f[eager-f16]": 0.7,
        "tests/a.py::test_f[jit-bf16]": 2.0,
        "tests/a.py::test_f[jit-f16]": 0.5,
        "tests/a.py::test_g[jitter-x]": 4.0,  # "jitter" is not "jit"
        "tests/a.py::test_g[jitter-y]": 3.0,
        "tests/a.py::test_h[eager]": 5.0,  # over 1 s: only the function's cheapest case stays
        "tests/a.py::test_h[jit]": 0.2,
    }
    assert slow.slow_cases(times, 0.1) == {
        "tests/a.py::test_f[eager-bf16]": 0.9,  # test_f[eager-f16] stays: the cheapest eager case
        "tests/a.py::test_f[jit-bf16]": 2.0,
        "tests/a.py::test_g[jitter-x]": 4.0,
        "tests/a.py::test_h[eager]": 5.0,
    }


def test_a_listed_case_that_is_now_its_functions_cheapest_eager_case_returns():
    before = {"tests/a.py::test_f[eager-a]": 0.8, "tests/a.py::test_f[eager-b]": 0.6}
    times = {"tests/a.py::test_f[jit-a]": 0.2, "tests/a.py::test_f[jit-b]": 0.1}
    assert slow.merged(before, times, 0.05) == {
        "tests/a.py::test_f[eager-a]": 0.8,
        "tests/a.py::test_f[jit-a]": 0.2,
    }


def test_a_case_listed_before_stays_unless_the_timed_run_ran_it():
    before = {"tests/a.py::test_f[x]": 5.0, "tests/a.py::test_f[y]": 3.0}
    # a default run leaves the listed ones out; a run with -m '' times them again
    times = {
        "tests/a.py::test_f[z]": 0.5,
        "tests/a.py::test_g[x]": 2.0,
        "tests/a.py::test_g[y]": 0.1,
    }
    assert slow.merged(before, times, 1.0) == {**before, "tests/a.py::test_g[x]": 2.0}
    rerun = {**times, "tests/a.py::test_f[x]": 0.4, "tests/a.py::test_f[y]": 3.0}
    assert slow.merged(before, rerun, 1.0) == {
        "tests/a.py::test_f[y]": 3.0,
        "tests/a.py::test_g[x]": 2.0,
    }


def test_every_listed_case_names_a_test_function_of_its_file():
    listed = [
        line.split(None, 1)[1]
        for line in slow.LIST.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert listed, "tests/slow_cases.txt lists no case"
    sources: dict[str, str] = {}
    for node in listed:
        path, name = node.split("::", 1)
        file = TESTS.parent / path
        assert file.exists(), node
        text = sources.setdefault(path, file.read_text())
        function = re.sub(r"\[.*\]$", "", name.split("::")[-1])
        assert re.search(rf"^\s*def {re.escape(function)}\(", text, flags=re.M), node
        assert "[" in name, f"{node}: only parametrized cases are listed"
