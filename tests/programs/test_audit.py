"""The dtype audit: hand-counted findings, nested bodies, the backward pass, models, the report."""

from __future__ import annotations

import json
import warnings

import _models as M  # tests/programs is on sys.path (pytest rootdir-less import)
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from heddle import autocast, autodiff, policy
from heddle.programs import _audit

audit = _audit.audit
NA, IP, LC, F64, UNC, NC = _audit.KINDS

BF, F32 = jnp.bfloat16, jnp.float32
X = jax.ShapeDtypeStruct((16, 32), BF)  # bf16 activations
W = jax.ShapeDtypeStruct((32, 8), BF)
Y = jax.ShapeDtypeStruct((32,), F32)
I32 = jax.ShapeDtypeStruct((32,), jnp.int32)
I8 = jax.ShapeDtypeStruct((32,), jnp.int8)
U8 = jax.ShapeDtypeStruct((32,), jnp.uint8)
F16 = jax.ShapeDtypeStruct((32,), jnp.float16)
B16 = jax.ShapeDtypeStruct((32,), BF)
IMG = jax.ShapeDtypeStruct((2, 3, 8, 8), BF)
KER = jax.ShapeDtypeStruct((4, 3, 3, 3), BF)


@pytest.fixture
def standard():
    """JAX's standard promotion (the suite runs strict), so mixed-dtype code traces."""
    with jax.numpy_dtype_promotion("standard"):
        yield


def counts(report, **want):
    """The report's counts, and the expected ones with unnamed kinds zero."""
    expected = dict.fromkeys(_audit.KINDS, 0)
    expected.update(
        {{"na": NA, "ip": IP, "lc": LC, "f64": F64, "nc": NC}[k]: v for k, v in want.items()}
    )
    return report.counts, expected


def softmax_by_hand(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


# (id, function, arguments, expected counts). Each count is worked out from what the function
# computes, independently of the audit: e.g. jnp.sum of bfloat16 accumulates in float32 in JAX
# (clean), jnp.cumsum of bfloat16 accumulates in bfloat16 (one narrow accumulation).
ACCUMULATIONS = [
    ("jnp.sum upcasts", lambda x: jnp.sum(x), (X,), {}),
    ("jnp.mean upcasts", lambda x: jnp.mean(x, axis=0), (X,), {}),
    ("lax.reduce add", lambda x: lax.reduce(x, np.array(0, BF), lax.add, (0,)), (X,), {"na": 1}),
    ("lax.reduce mul", lambda x: lax.reduce(x, np.array(1, BF), lax.mul, (1,)), (X,), {"na": 1}),
    ("reduce over size 1", lambda x: lax.reduce(x[:1], np.array(0, BF), lax.add, (0,)), (X,), {}),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), (X,), {"na": 1}),
    ("cumprod", lambda x: jnp.cumprod(x, axis=1), (X,), {"na": 1}),
    ("cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=1), (X,), {"na": 1}),
    ("cumsum f32", lambda x: jnp.cumsum(x.astype(F32), axis=1), (X,), {}),
    ("cummax", lambda x: lax.cummax(x, axis=1), (X,), {}),
    ("argmax, max, min", lambda x: (jnp.argmax(x), jnp.max(x), jnp.min(x, 0)), (X,), {}),
    ("window sum", lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 2), (2, 2), "VALID"), (X,), {"na": 1}),
    ("window max", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID"), (X,), {}),
    ("matmul", lambda x, w: x @ w, (X, W), {"na": 1}),
    ("matmul preferred", lambda x, w: jnp.matmul(x, w, preferred_element_type=F32), (X, W), {}),
    ("einsum preferred", lambda x, w: jnp.einsum("ij,jk->ik", x, w, preferred_element_type=F32), (X, W), {}),
    ("dot_general preferred", lambda x, w: lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=F32), (X, W), {}),
    ("outer product adds nothing", lambda x: jnp.outer(x[0], x[1]), (X,), {}),
    ("int8 matmul", lambda a: jnp.matmul(a[None], a[:, None]), (I8,), {"na": 1}),
    ("int8 matmul into int32", lambda a: jnp.matmul(a[None], a[:, None], preferred_element_type=jnp.int32), (I8,), {}),
    ("conv", lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME"), (IMG, KER), {"na": 1}),
    ("conv preferred", lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME", preferred_element_type=F32), (IMG, KER), {}),
    ("softmax by hand", softmax_by_hand, (X,), {"na": 1}),
    ("softmax by hand f32", lambda x: softmax_by_hand(x.astype(F32)), (X,), {}),
    ("jax.nn.softmax", lambda x: jax.nn.softmax(x), (X,), {"na": 1}),
    ("jax.nn.logsumexp", lambda x: jax.nn.logsumexp(x, axis=-1), (X,), {"na": 1}),
    ("jax.nn.softmax f32", lambda x: jax.nn.softmax(x.astype(F32)), (X,), {}),
    ("segment_sum", lambda x: jax.ops.segment_sum(x[0], jnp.zeros(32, jnp.int32), 2), (X,), {"na": 1}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "args", "want"), [c[1:] for c in ACCUMULATIONS], ids=[c[0] for c in ACCUMULATIONS]
)
def test_accumulation_findings_have_the_hand_counted_number(fn, args, want):
    got, expected = counts(audit(fn, *args), **want)
    assert got == expected


PROMOTIONS = [
    ("bf16 + f32", lambda a, b: a + b, (X, Y), {"ip": 1}, [""]),
    ("bf16 * int32", lambda a, b: a * b, (X, I32), {"ip": 1, "lc": 1}, [""]),
    ("int32 * 0.5", lambda a: a * 0.5, (I32,), {"ip": 1, "lc": 1}, [""]),
    ("bf16 * 2.0 (scalar takes the dtype)", lambda a: a * 2.0, (X,), {}, []),
    ("where with a scalar", lambda a: jnp.where(a > 0, a, 0.0), (X,), {}, []),
    ("clip with ints", lambda a: jnp.clip(a, -1, 1), (X,), {}, []),
    ("int8 + uint8", lambda a, b: a + b, (I8, U8), {"ip": 1}, [""]),
    ("float16 + bfloat16", lambda a, b: a + b, (F16, B16), {"ip": 1}, [""]),
    ("uint32 + int32 without x64", lambda a, b: a + b, (jax.ShapeDtypeStruct((3,), jnp.uint32), jax.ShapeDtypeStruct((3,), jnp.int32)), {"ip": 1, "lc": 1}, ["int64"]),
    ("jnp.where mixes int8 and f32", lambda a, b: jnp.where(a > 0, a, b), (I8, Y), {"ip": 1}, [""]),
    ("jnp.var upcasts internally", lambda a: jnp.var(a, axis=0), (X,), {}, []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "args", "want", "expected"),
    [c[1:] for c in PROMOTIONS],
    ids=[c[0] for c in PROMOTIONS],
)
def test_promotion_findings_have_the_hand_counted_number(standard, fn, args, want, expected):
    report = audit(fn, *args)
    got, expected_counts = counts(report, **want)
    assert got == expected_counts
    assert [f.expected for f in report.of_kind(IP)] == expected
    assert all(f.origin == "implicit" for f in report.of_kind(IP, LC))


def test_promotion_finding_names_the_operand_dtypes(standard):
    (f,) = audit(lambda a, b: a + b, I8, U8).of_kind(IP)
    assert (f.primitive, f.dtypes, f.out_dtype) == ("add", ("i8", "u8"), "i16")
    assert f.shapes == ((32,), (32,))


def test_promotion_under_x64_with_a_pair_heddle_refuses(standard):
    u64 = jax.ShapeDtypeStruct((3,), jnp.uint64)
    i8 = jax.ShapeDtypeStruct((3,), jnp.int8)
    with jax.enable_x64(True):
        report = audit(lambda a, b: a + b, u64, i8)
        u32_i32 = audit(
            lambda a, b: a + b,
            jax.ShapeDtypeStruct((3,), jnp.uint32),
            jax.ShapeDtypeStruct((3,), jnp.int32),
        )
    (ip,) = report.of_kind(IP)
    assert ip.out_dtype == "f64" and ip.expected == "error (PromotionError)"
    assert [f.dtypes for f in report.of_kind(LC)] == [("u64",)]  # uint64 -> float64 loses values
    # With x64 JAX gives int64 like heddle: a promotion, exact, nothing else to say.
    assert u32_i32.counts == dict(counts(u32_i32, ip=1)[1])
    assert u32_i32[0].expected == ""


EXPLICIT = [
    ("astype widening", lambda a: a.astype(F32), (X,), 0),
    ("astype narrowing", lambda a: a.astype(BF), (Y,), 1),
    ("jnp.astype int to float", lambda a: jnp.astype(a, F32), (I32,), 1),
    ("asarray with dtype", lambda a: jnp.asarray(a, BF), (Y,), 1),
    ("lax.convert_element_type", lambda a: lax.convert_element_type(a, F32), (I32,), 1),
    ("scalar type call", lambda a: jnp.float32(a), (I32,), 1),
    ("int16 to float32 is exact", lambda a: a.astype(jnp.int16).astype(F32), (I8,), 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "args", "lossy"), [c[1:] for c in EXPLICIT], ids=[c[0] for c in EXPLICIT]
)
def test_explicit_conversions_are_listed_only_when_asked(fn, args, lossy):
    assert len(audit(fn, *args)) == 0
    report = audit(fn, *args, include_explicit=True)
    got, expected = counts(report, lc=lossy)
    assert got == expected
    assert all(f.origin == "explicit" for f in report)


def test_implicit_narrowing_of_an_operand_is_reported_with_jaxs_warning(standard):
    with pytest.warns(FutureWarning, match="scatter inputs have incompatible types"):
        report = audit(lambda a, b: a.at[0].set(b), X, Y)
    assert counts(report, ip=1, lc=1) == (report.counts, counts(report, ip=1, lc=1)[1])
    (lc,) = report.of_kind(LC)
    assert (lc.dtypes, lc.out_dtype, lc.origin) == (("f32",), "bf16", "implicit")
    assert "narrowing" in lc.note


def test_a_sum_rounding_its_own_float32_result_is_not_a_lossy_conversion():
    # jnp.sum(bf16) is convert -> reduce_sum in f32 -> convert back: the last convert is the
    # round-once store of POLICY.md 5, not a loss of the caller's data.
    report = audit(lambda a: (jnp.sum(a), jnp.mean(a), jnp.var(a)), X, include_backward=True)
    assert report.counts == counts(report, nc=1)[1]  # the bf16 gradient of the bf16 argument


def test_float64_unavailable_without_x64():
    report = audit(lambda a: a.astype(jnp.float64), Y)
    (f,) = report
    assert (f.kind, f.dtypes, f.out_dtype) == (F64, ("f64",), "f32")
    assert f.file == __file__ and "astype(jnp.float64)" in f.code
    (arg,) = audit(lambda a: a * 2, np.zeros(3))
    assert (arg.kind, arg.primitive, arg.dtypes) == (F64, "argument", ("f64",))
    with jax.enable_x64(True):
        assert len(audit(lambda a: a.astype(jnp.float64), Y)) == 0
        assert len(audit(lambda a: a * 2, np.zeros(3))) == 0


def test_finding_carries_primitive_dtypes_shapes_and_the_users_line():
    def layer(x, w):
        return jnp.cumsum(x, axis=1), x @ w

    report = audit(layer, X, W)
    cumsum, dot = report
    assert (cumsum.primitive, cumsum.dtypes, cumsum.out_dtype, cumsum.shapes) == (
        "cumsum",
        ("bf16",),
        "bf16",
        ((16, 32),),
    )
    assert (dot.primitive, dot.dtypes, dot.shapes) == (
        "dot_general",
        ("bf16", "bf16"),
        ((16, 32), (32, 8)),
    )
    assert cumsum.expected == dot.expected == "float32"
    for f in report:
        assert f.file == __file__ and f.function.endswith("layer") and not f.backward
        assert f.code == "return jnp.cumsum(x, axis=1), x @ w"
        assert f.source.endswith(f":{f.line} ({f.function})")
        with open(__file__) as fh:
            assert fh.read().splitlines()[f.line - 1].strip() == f.code


def test_same_finding_in_a_python_loop_is_counted_once_with_its_count():
    def f(x):
        for _ in range(3):
            x = jnp.cumsum(x, axis=1)
        return x

    (finding,) = audit(f, X)
    assert finding.count == 3 and "(3 times)" in str(audit(f, X))


# -- nested bodies ---------------------------------------------------------------------------------


@jax.custom_jvp
def _cj(x):
    return jnp.cumsum(x, axis=1)


_cj.defjvp(lambda primals, tangents: (_cj(*primals), tangents[0]))


@jax.custom_vjp
def _cv(x):
    return jnp.cumsum(x, axis=1)


_cv.defvjp(lambda x: (_cv(x), None), lambda _, g: (g,))


def _scan(x):
    return lax.scan(lambda c, r: (c, jnp.cumsum(r)), 0.0, x)[1]


def _while(x):
    return lax.while_loop(
        lambda v: v[0] < 3, lambda v: (v[0] + 1, jnp.cumsum(v[1], axis=1)), (0, x)
    )


def _cond(x):
    return lax.cond(x[0, 0] > 0, lambda: jnp.cumsum(x, axis=1), lambda: jnp.cumprod(x, axis=1))


def _shard_map(x):
    mesh = jax.make_mesh((1,), ("d",))
    f = jax.shard_map(
        lambda a: lax.psum(jnp.cumsum(a, axis=1), "d"), mesh=mesh, in_specs=P("d"), out_specs=P()
    )
    return f(x)


NESTED = [
    ("jit", jax.jit(lambda x: jnp.cumsum(x, axis=1)), 1, "jit"),
    ("custom_jvp", _cj, 1, "custom_jvp_call"),
    ("custom_vjp", _cv, 1, "custom_vjp_call"),
    ("scan", _scan, 1, "scan"),
    ("while", _while, 1, "while"),
    ("cond (both branches)", _cond, 2, "cond"),
]


@pytest.mark.parametrize(("fn", "n", "where"), [c[1:] for c in NESTED], ids=[c[0] for c in NESTED])
def test_audit_descends_into_nested_bodies(fn, n, where):
    report = audit(fn, X)
    got, expected = counts(report, na=n)
    assert got == expected
    assert all(f.path.startswith(where) or f" > {where}" in f.path for f in report)


def test_audit_descends_into_shard_map_and_reports_a_narrow_psum():
    mesh = jax.make_mesh((1,), ("d",))
    x = jax.ShapeDtypeStruct((16, 32), BF, sharding=NamedSharding(mesh, P("d")))
    report = audit(_shard_map, x)
    assert sorted(f.primitive for f in report) == ["cumsum", "psum_invariant"]
    assert all("shard_map" in f.path and f.kind == NA for f in report)


def test_jitted_and_eager_functions_audit_the_same(transform):
    report = audit(transform(lambda x, w: (jnp.cumsum(x, axis=1), x @ w, jnp.sum(x))), X, W)
    assert [(f.kind, f.primitive) for f in report] == [(NA, "cumsum"), (NA, "dot_general")]
    assert all(f.file == __file__ for f in report)


# -- backward --------------------------------------------------------------------------------------


def _bias_loss(b, x):
    return jnp.sum((x + b).astype(F32))


def test_backward_bias_gradient_sum_is_a_narrow_accumulation():
    assert len(audit(_bias_loss, B16, X)) == 0  # forward is clean
    for report in (
        audit(_bias_loss, B16, X, include_backward=True),
        audit(jax.grad(_bias_loss), B16, X),
    ):
        (f,) = report.of_kind(NA)
        assert (f.kind, f.primitive, f.backward, f.phase) == (NA, "reduce_sum", True, "backward")
        assert f.shapes == ((16, 32),) and f.code == "return jnp.sum((x + b).astype(F32))"
        # and x + b's cotangent, b's gradient, are bfloat16 in JAX
        (c,) = report.of_kind(NC)
        assert c.backward and c.out_dtype == "bf16" and c.code == f.code


def test_backward_of_heddle_style_bias_is_clean():
    def loss(b, x):
        return jnp.sum(x.astype(F32) + b.astype(F32))

    # No narrow sum; the one finding is the bfloat16 gradients JAX gives b and x (float32 sums
    # rounded to bfloat16), which heddle.autodiff keeps in float32.
    for report in (
        audit(loss, B16, X, include_backward=True),
        audit(jax.grad(loss, argnums=(0, 1)), B16, X),
    ):
        assert report.counts == counts(report, nc=1)[1]
        assert report[0].primitive == "convert_element_type" and report[0].dtypes == ("f32",)
    assert len(audit(autodiff.grad(loss, argnums=(0, 1)), B16, X)) == 0


def test_include_backward_with_integer_arguments_and_outputs():
    def f(x, n):
        return jnp.cumsum(x, axis=1) * n.astype(x.dtype), n + 1

    report = audit(f, X, jax.ShapeDtypeStruct((), jnp.int32), include_backward=True)
    assert {(f.kind, f.primitive, f.backward) for f in report} == {
        ("narrow_accumulation", "cumsum", False),
        ("narrow_accumulation", "cumsum", True),
        # the narrow output's cotangent, times n, then summed in reverse: all narrow
        ("narrow_cotangent", "mul,cumsum", True),
    }


# -- models ----------------------------------------------------------------------------------------


def _codes(report, **filters):
    return {
        (f.primitive, f.code) for f in report if all(getattr(f, k) == v for k, v in filters.items())
    }


def test_plain_bf16_mlp_lists_its_matmuls_and_softmax():
    params, x, labels = M.mlp_specs()
    report = audit(M.mlp_loss, params, x, labels)
    assert report.counts == counts(report, na=3)[1]
    assert _codes(report) == {
        ("dot_general", 'h = nn.relu(np.add(np.matmul(h, layer["w"]), layer["b"]))'),
        ("dot_general", 'return np.add(np.matmul(h, last["w"]), last["b"])'),
        ("exp+reduce_sum", "logp = nn.log_softmax(mlp(params, x, np, nn), axis=-1)"),
    }
    assert all(f.file == M.__file__ for f in report)


def test_plain_bf16_mlp_backward_lists_the_bias_gradient_sums():
    params, x, labels = M.mlp_specs()
    report = audit(M.mlp_loss, params, x, labels, include_backward=True)
    assert {f.kind for f in report} == {NA, NC}
    backward = _codes(report, backward=True)
    assert ("reduce_sum", 'h = nn.relu(np.add(np.matmul(h, layer["w"]), layer["b"]))') in backward
    assert ("reduce_sum", 'return np.add(np.matmul(h, last["w"]), last["b"])') in backward
    assert ("dot_general", 'return np.add(np.matmul(h, last["w"]), last["b"])') in backward
    # bias-gradient sums over the batch: [batch, width] -> [width]
    assert any(f.primitive == "reduce_sum" and f.shapes == ((32, 32),) for f in report)


def test_plain_bf16_transformer_block_lists_matmuls_and_softmax():
    params, x = M.block_specs()
    report = audit(M.block_loss, params, x)
    assert {f.kind for f in report} == {NA}
    codes = _codes(report)
    for line in (
        'q = np.matmul(h, p["wq"])',
        'k = np.matmul(h, p["wk"])',
        'v = np.matmul(h, p["wv"])',
        "scores = np.divide(np.matmul(q, np.transpose(k)), math.sqrt(q.shape[-1]))",
        'x = np.add(x, np.matmul(np.matmul(attn, v), p["wo"]))',
        'up = nn.gelu(np.add(np.matmul(h, p["w1"]), p["b1"]))',
        'return np.add(np.add(x, np.matmul(up, p["w2"])), p["b2"])',
    ):
        assert ("dot_general", line) in codes
    assert ("exp+reduce_sum", "attn = nn.softmax(scores, axis=-1)") in codes
    assert len([f for f in report if f.primitive == "dot_general"]) == 8


def test_plain_bf16_transformer_block_backward_lists_layer_norm_sums():
    params, x = M.block_specs()
    report = audit(M.block_loss, params, x, include_backward=True)
    assert (
        "reduce_sum",
        "return np.add(np.multiply(np.divide(np.subtract(x, mu), np.sqrt(np.add(var, 1e-5))), g), b)",
    ) in _codes(report, backward=True)


@pytest.mark.parametrize("include_backward", [False, True], ids=["forward", "forward+backward"])
def test_models_in_heddles_explicit_style_audit_clean(include_backward):
    # Clean but for the backward pass's narrow cotangents: the values rounded to bfloat16 (and the
    # bfloat16 arguments) have bfloat16 cotangents in jax.vjp, one finding per line.
    nc = 4 if include_backward else 0
    params, x, labels = M.mlp_specs()
    report = audit(M.mlp_explicit_loss, params, x, labels, include_backward=include_backward)
    assert report.counts == counts(report, nc=nc)[1], str(report)
    bparams, bx = M.block_specs()
    report = audit(M.block_explicit_loss, bparams, bx, include_backward=include_backward)
    assert report.counts == counts(report, nc=nc)[1], str(report)
    report = audit(jax.grad(M.block_explicit_loss), bparams, bx)
    assert report.counts == counts(report, nc=3)[1], str(report)
    assert len(audit(autodiff.grad(M.block_explicit_loss), bparams, bx)) == 0


def _heddle_modules():
    try:
        import heddle.nn as hnn
        import heddle.numpy as hnp
    except ImportError as e:  # pragma: no cover - depends on the tree's state
        pytest.skip(f"heddle.numpy / heddle.nn is missing: {e}")
    return hnp, hnn


@pytest.mark.parametrize("include_backward", [False, True], ids=["forward", "forward+backward"])
def test_same_models_with_heddle_numpy_audit_clean(include_backward):
    hnp, hnn = _heddle_modules()
    params, x, labels = M.mlp_specs()
    mlp = audit(M.mlp_loss, params, x, labels, np=hnp, nn=hnn, include_backward=include_backward)
    bparams, bx = M.block_specs()
    blk = audit(M.block_loss, bparams, bx, np=hnp, nn=hnn, include_backward=include_backward)
    # heddle's ops round each result to bfloat16 once; jax.vjp gives those values bfloat16
    # cotangents (one finding per line), which heddle.autodiff keeps in float32
    assert mlp.counts == counts(mlp, nc=4 if include_backward else 0)[1], str(mlp)
    assert blk.counts == counts(blk, nc=12 if include_backward else 0)[1], str(blk)
    assert len(audit(autodiff.grad(M.block_loss), bparams, bx, np=hnp, nn=hnn)) == 0


def test_heddle_numpy_models_round_explicitly():
    # Not vacuous: heddle's ops do convert (to float32 and back, once) and the audit sees them as
    # explicit conversions, listed when asked.
    hnp, hnn = _heddle_modules()
    params, x, labels = M.mlp_specs()
    report = audit(M.mlp_loss, params, x, labels, np=hnp, nn=hnn, include_explicit=True)
    assert len(report) > 0
    assert {(f.kind, f.origin, f.dtypes, f.out_dtype) for f in report} == {
        (LC, "explicit", ("f32",), "bf16")
    }


def test_models_compute_what_they_claim():
    # The explicit MLP is the plain one with float32 accumulation: both near a float64 reference.
    params, x, labels = M.mlp_specs(batch=8, sizes=(16, 8, 4))
    params, x, labels = M.materialise((params, x, labels))
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    h = np.asarray(x, np.float64)
    for layer in p64[:-1]:
        h = np.maximum(h @ layer["w"] + layer["b"], 0)
    logits = h @ p64[-1]["w"] + p64[-1]["b"]
    logp = (
        logits
        - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    ref = -np.mean(np.sum(logp * np.asarray(labels, np.float64), -1))
    explicit = float(jax.jit(M.mlp_explicit_loss)(params, x, labels))
    plain = float(jax.jit(M.mlp_loss)(params, x, labels))
    assert abs(explicit - ref) <= 2e-2 * max(1.0, abs(ref))
    assert abs(plain - ref) <= 5e-2 * max(1.0, abs(ref))


def test_equinox_model():
    # filter_eval_shape builds the models with ShapeDtypeStruct leaves: nothing is computed.
    bf16_mlp = eqx.filter_eval_shape(eqx.nn.MLP, 16, 4, 32, 2, key=jax.random.key(0), dtype=BF)
    f32_mlp = eqx.filter_eval_shape(eqx.nn.MLP, 16, 4, 32, 2, key=jax.random.key(0))

    def loss(model, x):
        return jnp.sum(model(x).astype(F32))

    x16 = jax.ShapeDtypeStruct((16,), BF)
    report = audit(loss, bf16_mlp, x16, include_backward=True)
    forward = [f for f in report if not f.backward]
    assert [(f.kind, f.primitive) for f in forward] == [(NA, "dot_general")] * 3
    assert {f.shapes for f in forward} == {((32, 16), (16,)), ((32, 32), (32,)), ((4, 32), (32,))}
    assert any(f.backward for f in report)
    # The line shown is the user's call into the model, not equinox's internals.
    assert all(
        f.file == __file__ and f.code == "return jnp.sum(model(x).astype(F32))" for f in report
    )
    assert len(audit(loss, f32_mlp, jax.ShapeDtypeStruct((16,), F32), include_backward=True)) == 0
    assert len(audit(eqx.filter_grad(loss), f32_mlp, jax.ShapeDtypeStruct((16,), F32))) == 0
    grads = audit(eqx.filter_grad(loss), bf16_mlp, x16)
    assert {f.phase for f in grads} == {"forward", "backward"}
    assert {f.kind for f in grads} == {NA, NC}  # and JAX's bf16 cotangents


# -- the report ------------------------------------------------------------------------------------


def _mixed(x, w, y):
    return jnp.cumsum(x, axis=1), x @ w, x + y


def test_report_is_iterable_indexable_and_counts_by_kind(standard):
    report = audit(_mixed, X, W, Y)
    assert len(report) == 3 and list(report) == [report[0], report[1], report[2]]
    assert report.counts == {NA: 2, IP: 1, LC: 0, F64: 0, UNC: 0, NC: 0}
    assert [f.kind for f in report.of_kind(IP)] == [IP]
    assert all(isinstance(f, _audit.Finding) for f in report)
    with pytest.raises(AttributeError):
        report[0].kind = "x"  # frozen


def test_report_prints_an_aligned_table(standard):
    text = str(audit(_mixed, X, W, Y))
    head, header, rule, *rows = text.splitlines()
    assert "3 finding(s)" in head and "narrow_accumulation 2" in head
    assert header.split() == ["kind", "pass", "primitive", "dtypes", "shapes", "source", "note"]
    assert len(rows) == 3
    for column in ("pass", "primitive", "dtypes", "shapes", "source", "note"):
        start = header.index(column)
        assert rule[start - 2 : start] == "  " and rule[start] == "-"
        for row in rows:
            assert row[start - 2 : start] == "  " and row[start] != " "
    assert (
        "dot_general" in rows[1] and "bf16,bf16 -> bf16" in rows[1] and "[16,32] [32,8]" in rows[1]
    )
    empty = str(audit(lambda x: x.astype(F32), X))
    assert "0 finding(s)" in empty and len(empty.splitlines()) == 1


def test_report_to_dict_is_json(standard):
    d = json.loads(json.dumps(audit(_mixed, X, W, Y, include_backward=True).to_dict()))
    assert d["function"] == "_mixed" and d["include_backward"] is True
    assert sum(d["counts"].values()) == len(d["findings"])
    first = d["findings"][0]
    assert (
        first["primitive"] == "cumsum"
        and first["shapes"] == [[16, 32]]
        and first["phase"] == "forward"
    )
    assert first["source"].endswith("(_mixed)")


def test_raise_if_any(standard):
    report = audit(_mixed, X, W, Y)
    with pytest.raises(policy.PolicyError) as e:
        report.raise_if_any()
    assert (
        "3 finding(s)" in str(e.value)
        and "dot_general" in str(e.value)
        and "heddle.autocast" in str(e.value)
    )
    with pytest.raises(policy.PolicyError, match="implicit_promotion") as e:
        report.raise_if_any(kinds=[IP])
    assert "dot_general" not in str(e.value)
    assert report.raise_if_any(kinds=[LC, F64]) is None
    assert audit(lambda x: jnp.sum(x), X).raise_if_any() is None


def test_raise_if_any_rejects_unknown_kinds_with_the_fix():
    report = audit(lambda x: jnp.cumsum(x, axis=1), X)
    with pytest.raises(ValueError, match="'narrow' is not a kind of finding") as e:
        report.raise_if_any(kinds=["narrow"])
    assert "raise_if_any(kinds=['narrow_accumulation'])" in str(e.value)
    with pytest.raises(policy.PolicyError):  # the suggested call works
        report.raise_if_any(kinds=["narrow_accumulation"])
    with pytest.raises(ValueError, match="not a kind of finding"):
        report.of_kind("lossy")


def test_static_arguments_pass_through():
    def f(x, scale, act=jax.nn.relu):
        return act(jnp.cumsum(x, axis=1) * scale)

    report = audit(f, X, 0.5, act=jnp.tanh)
    assert [f.primitive for f in report] == ["cumsum"]


def test_strict_promotion_mode_fails_the_trace():
    # The suite runs with jax_numpy_dtype_promotion='strict': mixed-dtype code cannot trace there.
    with pytest.raises(jax.dtypes.TypePromotionError, match="strict"):
        audit(lambda a, b: a + b, X, Y)


def test_other_warnings_pass_through():
    def warns(x):
        warnings.warn("from the model", UserWarning, stacklevel=1)
        return x

    with pytest.warns(UserWarning, match="from the model"):
        assert len(audit(warns, X)) == 0


def test_public_names():
    if not hasattr(policy, "audit"):
        pytest.skip("heddle.policy does not export audit/AuditReport/Finding yet")
    import heddle

    assert policy.audit is audit and heddle.audit is audit
    assert policy.AuditReport is _audit.AuditReport and policy.Finding is _audit.Finding
    for obj in (audit, _audit.AuditReport, _audit.Finding, _audit.AuditReport.raise_if_any):
        assert obj.__doc__ and obj.__doc__.strip()


def test_docs_show_the_real_audit_table(tmp_path, monkeypatch):
    import importlib.util
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "audit.md").read_text()
    source = re.search(r"`mlp.py`, a two-layer.*?```python\n(.*?)```", doc, re.S).group(1)
    shown = re.search(r"prints \(real output.*?```text\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "mlp.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("mlp", tmp_path / "mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    params = [
        (jax.ShapeDtypeStruct((784, 256), BF), jax.ShapeDtypeStruct((256,), BF)),
        (jax.ShapeDtypeStruct((256, 10), BF), jax.ShapeDtypeStruct((10,), BF)),
    ]
    x = jax.ShapeDtypeStruct((128, 784), BF)
    labels = jax.ShapeDtypeStruct((128, 10), BF)
    report = audit(mlp.loss, params, x, labels, include_backward=True)
    assert str(report) == shown.rstrip("\n")


# ---- narrow loop carries ----------------------------------------------------------------------


def _scan_sum(xs, init):
    return lax.scan(lambda c, x: (c + x, None), init, xs)[0]


def _fori_sum(x, init):
    return lax.fori_loop(0, 1000, lambda i, c: c + x.astype(c.dtype), init)


def _while_sum(x, init):
    return lax.while_loop(lambda v: v[0] < 10, lambda v: (v[0] + 1, v[1] + x), (0, init))[1]


def _running_max(xs, init):  # a carry that is not summed
    return lax.scan(lambda c, x: (jnp.maximum(c, x), c + x), init, xs)[0]


@jax.custom_jvp
def _plus(a, b):
    return a + b


_plus.defjvp(lambda p, t: (_plus(*p), t[0] + t[1]))


def _scatter_sum(xs, init):
    return lax.scan(lambda c, x: (c.at[0].add(x), None), jnp.stack([init, init]), xs)[0][0]


CARRIES = [
    ("scan", _scan_sum, 1000, "scan carry (add)"),
    ("fori_loop", _fori_sum, (), "scan carry (add)"),
    ("while_loop", _while_sum, (), "while carry (add)"),
    ("at[].add", _scatter_sum, 1000, "scan carry (scatter-add)"),
    ("jitted add", lambda xs, i: lax.scan(lambda c, x: (jax.jit(jnp.add)(c, x), None), i, xs)[0],
     1000, "scan carry (add)"),
    ("custom_jvp add", lambda xs, i: lax.scan(lambda c, x: (_plus(c, x), None), i, xs)[0], 1000,
     "scan carry (add)"),
]  # fmt: skip


@pytest.mark.parametrize("wrap", [lambda f: f, autocast], ids=["plain", "autocast"])
@pytest.mark.parametrize(
    ("fn", "shape", "primitive"), [c[1:] for c in CARRIES], ids=[c[0] for c in CARRIES]
)
def test_a_narrow_carry_summed_over_the_steps_is_a_narrow_accumulation(wrap, fn, shape, primitive):
    # autocast keeps the carry's dtype (a program stays valid), so the audit of its result still
    # reports it; its note says how to carry the sum in float32
    x = jnp.full(shape, 0.1, BF)
    found = [f for f in audit(wrap(fn), x, jnp.zeros((), BF)) if f.kind == "narrow_accumulation"]
    found = [f for f in found if "carry" in f.primitive]  # (plain: also the scatter-add itself)
    assert [f.primitive for f in found] == [primitive]
    assert "init.astype(jnp.float32)" in found[0].note and found[0].expected == "float32"
    # and the advice is right: 1000 steps of 0.1 summed in a bfloat16 carry stall, float32 does not
    if fn is _scan_sum:
        assert float(fn(x, jnp.zeros((), BF))) < 100 <= float(fn(x.astype(jnp.float32), 0.0))


def _residual_layers(xs, h):  # scan over layers: h + f(h) is a recurrence, not a sum
    return lax.scan(lambda h, w: (h + jnp.tanh(h * w), None), h, xs)[0]


def _ema(xs, c):
    return lax.scan(lambda c, x: (c * 0.999 + x * 0.001, None), c, xs)[0]


def _ema_lerp(xs, c):
    return lax.scan(lambda c, x: (c + 0.001 * (x - c), None), c, xs)[0]


@pytest.mark.parametrize("wrap", [lambda f: f, autocast], ids=["plain", "autocast"])
@pytest.mark.parametrize("fn", [_residual_layers, _ema, _ema_lerp], ids=lambda f: f.__name__)
def test_a_carry_whose_update_reads_the_carry_is_not_a_sum(wrap, fn):
    """Scanned residual layers were reported where the same layers unrolled were not, and one
    spelling of an average was reported and the other not: an update whose term depends on the
    carry is a recurrence, reported in neither form."""
    x = jnp.full(100, 0.1, BF)
    assert not [f for f in audit(wrap(fn), x, jnp.zeros((), BF)) if f.kind == "narrow_accumulation"]


@pytest.mark.parametrize(
    ("fn", "init"),
    [(_scan_sum, jnp.zeros((), jnp.float32)), (_running_max, jnp.zeros((), BF))],
    ids=["float32 carry", "bf16 max carry"],
)
def test_a_float32_or_unsummed_carry_is_not_reported(fn, init):
    x = jnp.full(1000, 0.1, init.dtype)
    assert not [f for f in audit(fn, x, init) if f.kind == "narrow_accumulation"]


@pytest.mark.parametrize(
    ("body", "length"),
    [
        (lambda c, x: (jnp.asarray(1.0, BF), None), 10),  # a constant carry (a literal output)
        (lambda c, x: (c + c, None), 3),  # doubling: nothing summed
        (lambda c, x: (c + x, None), 0),  # no steps
    ],
    ids=["literal carry", "c + c", "length 0"],
)
def test_carries_that_sum_nothing_are_neither_reported_nor_a_crash(body, length):
    xs = jnp.full(length, 0.1, BF)
    f = lambda c, xs: lax.scan(body, c, xs)[0]
    assert not [r for r in audit(f, jnp.zeros((), BF), xs) if r.kind == "narrow_accumulation"]


def test_prng_key_arguments_are_audited():
    """A typed PRNG key (jax.random.key, an nnx.Rngs stream) has no NumPy dtype: the audit's
    float64 check raised TypeError on it."""
    report = audit(
        lambda k, x: jax.random.normal(k, (3,), BF) + x,
        jax.random.key(0),
        jax.ShapeDtypeStruct((3,), BF),
    )
    assert report.counts["float64_unavailable"] == 0
