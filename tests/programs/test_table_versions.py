"""Every row of the table of primitive rules, and every name its facts, kinds of bodies, monoids and
index operands give, names a primitive of the installed JAX, or one of another JAX version that
``_table.OTHER_VERSIONS`` dates.

The primitives are enumerated in a fresh interpreter that imports every module of ``jax._src`` that
imports (the experimental ones too: shard_map, multihost_utils, pallas and its backends, sparse), so
a primitive defined in a module no test loads still counts, and this process's modules stay as they
are (``test_table.py`` classifies the primitives of the modules loaded here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from heddle.programs import _table

_ENUMERATE = """
import importlib, json, pkgutil, sys, warnings
warnings.simplefilter("ignore")
import jax, jax._src
from jax._src import core
for m in ("jax.experimental.shard_map", "jax.experimental.multihost_utils",
          "jax.experimental.pallas", "jax.experimental.pallas.tpu",
          "jax.experimental.pallas.triton", "jax.experimental.pallas.mosaic_gpu",
          "jax.experimental.sparse", "jax.experimental.custom_partitioning",
          "jax.experimental.checkify", "jax.experimental.compute_on"):
    try:
        importlib.import_module(m)
    except Exception:
        pass
for info in pkgutil.walk_packages(jax._src.__path__, "jax._src.", onerror=lambda name: None):
    try:
        importlib.import_module(info.name)
    except Exception:
        pass
names = set()
for m in list(sys.modules.values()):
    if m is None or not getattr(m, "__name__", "").startswith("jax"):
        continue
    for v in list(vars(m).values()):
        if isinstance(v, core.Primitive):
            names.add(v.name)
print(json.dumps(sorted(names)))
"""


@pytest.fixture(scope="module")
def installed() -> frozenset[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", _ENUMERATE],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=600,
    )
    names = frozenset(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"dot_general", "jit", "scan", "shard_map", "pallas_call"} <= names  # it saw them
    return names


def test_every_row_names_a_primitive_of_the_installed_jax_or_of_a_dated_version(installed):
    unknown = sorted(set(_table.RULES) - installed - set(_table.OTHER_VERSIONS))
    assert not unknown, (
        f"rows of heddle/programs/_table.py that name no primitive of jax {_jax_version()}: "
        f"{unknown}; remove them, or date them in OTHER_VERSIONS"
    )


def test_the_dated_names_are_rows_the_installed_jax_does_not_define(installed):
    assert set(_table.OTHER_VERSIONS) <= set(_table.RULES)
    current = sorted(set(_table.OTHER_VERSIONS) & installed)
    assert not current, f"jax {_jax_version()} defines these after all: {current}"
    assert all(note.strip() for note in _table.OTHER_VERSIONS.values())


def test_every_fact_names_a_primitive_of_the_installed_jax_or_of_a_dated_version(installed):
    named = set().union(
        *_table.FACTS.values(),
        _table.BODIES,
        _table.MONOIDS,
        _table.INDEX_OPERANDS,
        _table.HEDDLE_FUNCTIONS,
        (m.value for m in _table.Monoid),
    )
    unknown = sorted(named - installed - set(_table.OTHER_VERSIONS))
    assert not unknown, (
        f"facts of heddle/programs/_table.py that name no primitive of jax {_jax_version()}: "
        f"{unknown}; remove them, or date them in OTHER_VERSIONS"
    )


def _jax_version() -> str:
    import jax

    return jax.__version__
