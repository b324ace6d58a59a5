"""The audit reads the table of primitive rules: it reports a narrow use of every primitive whose
rule accumulates (a contraction, a reduction, a scan, a scatter-add, a window sum, a cross-device
sum), and its sets of such primitives follow the table when the table changes."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from heddle.programs import _audit, _audit_ir, _table
from heddle.programs._table import Rule

BF, F32 = jnp.bfloat16, jnp.float32
NA = "narrow_accumulation"

X = jax.ShapeDtypeStruct((4, 8), BF)
W = jax.ShapeDtypeStruct((8, 4), BF)
IMG, KER = jax.ShapeDtypeStruct((1, 1, 8, 8), BF), jax.ShapeDtypeStruct((1, 1, 3, 3), BF)
UPD = jax.ShapeDtypeStruct((6, 8), BF)
GROUPED = jax.ShapeDtypeStruct((2, 8, 4), BF)
_IDX = jnp.zeros((6, 1), jnp.int32)  # six updates of row 0: repeated indices accumulate
_DN = lax.ScatterDimensionNumbers((1,), (0,), (0,))
_MESH = jax.make_mesh((1,), ("d",))
SHARDED = jax.ShapeDtypeStruct((4, 8), BF, sharding=NamedSharding(_MESH, P("d")))


def _manual(body: Callable[[Any], Any], out: Any = None, check: bool = True) -> Callable[..., Any]:
    return jax.shard_map(
        body, mesh=_MESH, in_specs=P("d"), out_specs=P() if out is None else out, check_vma=check
    )


def _max_pool_grad(x: Any) -> Any:  # its transpose is select_and_scatter_add
    return jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID").astype(F32))


# Accumulating primitive -> (a program whose one narrow accumulation is that primitive, its
# arguments, whether the audit reads the backward pass).
SAMPLES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], bool]] = {
    "dot_general": (lambda x, w: x @ w, (X, W), False),
    "conv_general_dilated": (lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME"), (IMG, KER), False),
    "ragged_dot_general": (lambda x, w: lax.ragged_dot(x, w, jnp.array([2, 2], jnp.int32)), (X, GROUPED), False),
    "reduce_sum": (lambda x: lax.reduce_sum_p.bind(x, axes=(1,), out_sharding=None), (X,), False),
    "reduce_prod": (lambda x: lax.reduce_prod_p.bind(x, axes=(1,)), (X,), False),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), (X,), False),
    "cumprod": (lambda x: jnp.cumprod(x, axis=1), (X,), False),
    "cumlogsumexp": (lambda x: lax.cumlogsumexp(x, axis=1), (X,), False),
    "scatter-add": (lambda x, u: lax.scatter_add(x, _IDX, u, _DN), (X, UPD), False),
    "scatter-sub": (lambda x, u: lax.scatter_sub(x, _IDX, u, _DN), (X, UPD), False),
    "scatter-mul": (lambda x, u: lax.scatter_mul(x, _IDX, u, _DN), (X, UPD), False),
    "reduce_window_sum": (lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 2), (2, 2), "VALID"), (X,), False),
    "select_and_scatter_add": (_max_pool_grad, (X,), True),
    "psum": (_manual(lambda a: lax.psum(a, "d"), check=False), (SHARDED,), False),
    "psum_invariant": (_manual(lambda a: lax.psum(a, "d")), (SHARDED,), False),
    "reduce_scatter": (_manual(lambda a: lax.psum_scatter(a, "d", tiled=True), out=P("d")), (SHARDED,), False),
}  # fmt: skip

# Accumulating rows without a small program here, with why; the audit's set must still hold them.
NO_SAMPLE = {
    "unreduced_psum": "needs an operand of an Unreduced sharding type (explicit-sharding meshes)",
}


def test_every_accumulating_row_has_a_sample():
    rows = _table.names(*_table.ACCUMULATING)
    assert sorted(rows - set(SAMPLES) - set(NO_SAMPLE)) == []
    assert sorted((set(SAMPLES) | set(NO_SAMPLE)) - rows) == []


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_audit_reports_a_narrow_use_of_each_accumulating_primitive(name):
    fn, args, backward = SAMPLES[name]
    report = _audit.audit(fn, *args, include_backward=backward)
    assert [f.primitive for f in report.of_kind(NA)] == [name]
    wide = [
        jax.ShapeDtypeStruct(a.shape, F32, sharding=a.sharding) if a.dtype == BF else a
        for a in args
    ]
    assert _audit.audit(fn, *wide, include_backward=backward).counts[NA] == 0  # float32: clean


def test_the_rows_without_a_sample_are_in_the_audits_set():
    for name in NO_SAMPLE:
        assert name in _audit_ir.ACCUMULATIONS, name


def _fresh_audit_ir(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A new copy of ``_audit_ir`` executed against the table as patched now."""
    spec = importlib.util.spec_from_file_location("_audit_ir_probe", _audit_ir.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_audit_ir_probe", module)
    spec.loader.exec_module(module)
    return module


def test_the_audits_sets_are_computed_from_the_table(monkeypatch):
    rules = dict(_table.RULES)
    rules["cumsum"] = Rule.EXACT  # deliberately wrong: no longer accumulates
    rules["dot_general"] = Rule.FLOAT
    rules["made_up_sum"] = Rule.REDUCTION
    rules["made_up_dot"] = Rule.CONTRACTION
    monkeypatch.setattr(_table, "RULES", rules)
    probe = _fresh_audit_ir(monkeypatch)
    assert probe.CONTRACTIONS == _table.names(Rule.CONTRACTION)
    assert "made_up_dot" in probe.CONTRACTIONS and "dot_general" not in probe.CONTRACTIONS
    assert "made_up_sum" in probe.ACCUMULATIONS and "cumsum" not in probe.ACCUMULATIONS
    monkeypatch.undo()
    assert "cumsum" in _audit_ir.ACCUMULATIONS and "made_up_sum" not in _audit_ir.ACCUMULATIONS
