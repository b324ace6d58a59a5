"""Test-wide setup: JAX's own implicit promotion is strict, so heddle cannot lean on it."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import jax
import pytest

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_CACHE_OWNER = "HEDDLE_TEST_XLA_CACHE_OWNER"
_CACHE_SETTINGS = {  # JAX option: (its environment variable, the run's value)
    "jax_compilation_cache_dir": (_CACHE_ENV, None),
    "jax_persistent_cache_min_compile_time_secs": ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 0),
    "jax_persistent_cache_min_entry_size_bytes": ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", 0),
}
_saved: dict[str, object] = {}


def pytest_configure(config):
    """One XLA compilation cache for the run, new and empty at its start, shared by the xdist
    workers and by the subprocesses the tests start.

    Most of the suite's time is XLA compiling small programs, and many tests compile the same
    program from a new Python function (a lambda per case); JAX's persistent cache is keyed on the
    program and the compile options, so an identical program is compiled once per run. The cache
    never outlives the run (it is made here, in the process that starts the run, and removed in
    its ``pytest_unconfigure``), so a run's time is always a cold one. A caller's own
    ``JAX_COMPILATION_CACHE_DIR`` is left as it is, with the caller's settings.
    """
    if os.environ.get(_CACHE_OWNER) is None and _CACHE_ENV in os.environ:
        return  # the caller's cache
    if _CACHE_OWNER not in os.environ:  # the run's first process: the workers inherit the env
        _saved.update(
            (k, (os.environ.get(env), jax.config.values[k]))
            for k, (env, _) in _CACHE_SETTINGS.items()
        )
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="heddle-tests-xla-cache-")
        os.environ[_CACHE_OWNER] = str(os.getpid())
    for option, (env, value) in _CACHE_SETTINGS.items():
        value = os.environ[_CACHE_ENV] if value is None else value
        os.environ[env] = str(value)
        jax.config.update(option, value)


def pytest_unconfigure(config):
    """Removes the run's compilation cache and restores the settings, in the process that made
    it (a later ``pytest.main`` in the same process starts from the caller's settings again)."""
    if os.environ.get(_CACHE_OWNER) != str(os.getpid()):
        return
    shutil.rmtree(os.environ[_CACHE_ENV], ignore_errors=True)
    del os.environ[_CACHE_OWNER]
    for option, (env, _) in _CACHE_SETTINGS.items():
        before, value = _saved.pop(option)
        if before is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = before
        jax.config.update(option, value)


_SLOW_CASES = pathlib.Path(__file__).with_name("slow_cases.txt")


def _listed_slow_cases() -> frozenset[str]:
    """The node ids of tests/slow_cases.txt (made by tests/_slow_cases.py)."""
    if not _SLOW_CASES.exists():
        return frozenset()
    lines = _SLOW_CASES.read_text().splitlines()
    return frozenset(line.split(None, 1)[1] for line in lines if line and line[0] != "#")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config, items):
    """Marks the cases tests/slow_cases.txt lists ``slow``: the longer cases of a test function,
    whose cheapest case stays in the default run."""
    listed = _listed_slow_cases()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _strict_jax_promotion():
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture(params=["eager", "jit"])
def transform(request):
    """Runs a function eagerly and under ``jax.jit`` (weak types differ between the two)."""
    return (lambda f: f) if request.param == "eager" else jax.jit


def run_on_8_devices(script: pathlib.Path, *args: str, timeout: int = 900) -> dict:
    """Runs ``script`` in a fresh Python with 8 host CPU devices; returns its last stdout line as JSON.

    Multi-device checks need ``XLA_FLAGS`` set before JAX starts, hence the subprocess. The repository
    root goes first on ``PYTHONPATH`` so that the script imports this checkout's heddle.
    """
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    root = pathlib.Path(__file__).parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def on_8_devices():
    """``run_on_8_devices``, for tests: ``on_8_devices(path_of_script, *args)``."""
    return run_on_8_devices


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def printed_as_shown(printed: str, shown: str, tolerance: float) -> bool:
    """Whether a docs block printed what its page shows: the same text, each number within
    ``tolerance`` of the page's (a measured accuracy may differ by a test sample on another CPU)."""
    a, b = printed.rstrip("\n").splitlines(), shown.rstrip("\n").splitlines()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if _NUMBER.sub("#", x) != _NUMBER.sub("#", y):
            return False
        pairs = zip(_NUMBER.findall(x), _NUMBER.findall(y), strict=True)
        if any(abs(float(p) - float(q)) > tolerance for p, q in pairs):
            return False
    return True


@pytest.fixture
def prints_as_shown():
    """``check(printed, shown, tolerance)``: asserts ``printed_as_shown``, showing both."""

    def check(printed: str, shown: str, tolerance: float = 0.5) -> None:
        assert printed_as_shown(printed, shown, tolerance), (
            f"printed\n{printed}\nwhere the page shows\n{shown}"
        )

    return check
