"""The audit of ``heddle.autocast(f)``: autocast's own conversions are not lossy conversions.

autocast computes each narrow value in float32 and rounds it once to the dtype JAX gave it, reads
it through its exact float32 twin, and feeds a narrow dot the twins narrowed back (exact). In the
backward pass the transposes of those conversions round each cotangent once to its primal's
dtype, the dtype JAX's own cotangent has there. None of these is an implicit narrowing; a real
one (``bf16.at[i].set(f32)``) still is. A mixed-dtype op is the policy's own promotion under
autocast, and the bfloat16 gradient ``jax.vjp`` gives it is reported as a narrow cotangent.
"""

from __future__ import annotations

import pathlib
import runpy

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from heddle import autocast
from heddle.programs import _audit

audit = _audit.audit
NA, IP, LC, F64, UNC, NC = _audit.KINDS
BF, F32 = jnp.bfloat16, jnp.float32


def _square_mean(w, x):
    return jnp.mean((x @ w) ** 2)


class _LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32, dtype=BF, param_dtype=F32)(x))
        return nn.Dense(10, dtype=BF, param_dtype=F32)(x)


def _labels():
    return jax.nn.one_hot(jnp.zeros(8, jnp.int32), 10, dtype=BF)


def _linen_case():
    model, x = _LinenMLP(), jnp.ones((8, 16), BF)

    def loss(params, x, y):
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(model.apply(params, x)) * y, -1))

    return loss, (model.init(jax.random.key(0), x), x, _labels())


def _equinox_case():
    mlp = eqx.nn.MLP(16, 10, 32, 2, key=jax.random.key(0))
    mlp = jax.tree.map(lambda a: a.astype(BF) if eqx.is_inexact_array(a) else a, mlp)

    def loss(model, x, y):
        logits = jax.vmap(model)(x)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1)).astype(F32)

    return loss, (mlp, jnp.ones((8, 16), BF), _labels())


def _nnx_case():
    linear = nnx.Linear(16, 10, dtype=BF, param_dtype=F32, rngs=nnx.Rngs(0))

    def loss(model, x, y):
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(model(x)) * y, -1))

    return loss, (linear, jnp.ones((8, 16), BF), _labels())


DOCS_MLP = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" / "mlp.py"


def _plain_mlp_case():
    loss = runpy.run_path(str(DOCS_MLP))["loss"]  # the docs' own model, as docs/audit.md shows it
    s = lambda *shape: jax.ShapeDtypeStruct(shape, BF)
    return loss, ([(s(64, 32), s(32)), (s(32, 10), s(10))], s(8, 64), s(8, 10))


CASES = {
    "matmul": lambda: (_square_mean, (jnp.ones((16, 8), BF), jnp.ones((4, 16), BF))),
    "linen": _linen_case,
    "equinox": _equinox_case,
    "nnx": _nnx_case,
    "docs mlp": _plain_mlp_case,
}


@pytest.mark.parametrize("include_backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("case", list(CASES))
def test_autocast_leaves_no_lossy_conversion_or_narrow_accumulation(case, include_backward):
    fn, args = CASES[case]()
    plain = audit(fn, *args, include_backward=include_backward)
    assert plain.counts[NA] > 0 and plain.counts[LC] == 0  # what autocast has to fix
    report = audit(autocast(fn), *args, include_backward=include_backward)
    assert report.counts[LC] == 0, str(report)
    assert report.counts[NA] == 0, str(report)
    # all that remains is jax.grad's narrow cotangents (heddle.autodiff.grad keeps them float32),
    # each at the user's line, never ``?`` (an argument's, stored by autocast's own conversion,
    # at the line its cotangent was computed)
    assert {f.kind for f in report.findings} <= {NC}, str(report)
    assert all(f.file and f.line for f in report.findings), str(report)


def _rnn(w, xs):
    def step(h, xt):
        h = jnp.tanh(h @ w + xt)  # w closed over: a constant of the scan
        return h, h

    _, hs = jax.lax.scan(step, jnp.zeros((16,), BF), xs)
    return jnp.sum(hs.astype(F32))


def _checkpointed(w, x):
    return jnp.sum(jax.checkpoint(lambda q: jax.nn.gelu(q @ w))(x).astype(F32))


_POSITIVE = jnp.linspace(0.5, 3, 16).astype(BF)

# Models where autocast's own conversions were reported as implicit narrowings: a loop constant it
# widens before the scan and narrows back inside (a round trip across the body's boundary), the
# seed cotangent of jax.checkpoint (ones, exact), copies autocast made and nothing reads (around a
# custom_jvp's operands, source ``?``), and a select_n between exact widenings (rel_entr's xlogx).
ROUND_TRIPS = {
    "scan with a closed-over weight": (_rnn, (jnp.full((16, 16), 0.1, BF), jnp.ones((8, 16), BF))),
    "checkpoint": (_checkpointed, (jnp.full((16, 16), 0.1, BF), jnp.ones((8, 16), BF))),
    "gamma.logpdf": (
        lambda x: jnp.sum(jax.scipy.stats.gamma.logpdf(x, 2.5).astype(F32)),
        (_POSITIVE,),
    ),
    "rel_entr": (
        lambda x: jnp.sum(jax.scipy.special.rel_entr(x, x[::-1]).astype(F32)),
        (_POSITIVE,),
    ),
}


@pytest.mark.parametrize("include_backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("case", list(ROUND_TRIPS))
def test_autocasts_round_trips_across_bodies_are_not_lossy(case, include_backward):
    fn, args = ROUND_TRIPS[case]
    report = audit(autocast(fn), *args, include_backward=include_backward)
    assert report.counts[LC] == 0, str(report)
    assert {f.kind for f in report.findings} <= {NC}, str(report)
    assert all(f.file and f.line for f in report.findings), str(report)


_W = jnp.asarray([0.123456789], F32)  # not a bfloat16

# float32 data the function is given, stored into bfloat16 by a library call: autocast reads the
# rounded value through its float32 copy, as it reads its own roundings, which hid these
GIVEN_DATA = {
    "full_like": lambda x, w: jnp.full_like(x, w[0]).astype(F32) - w[0],
    "pad": lambda x, w: jnp.pad(x, 1, constant_values=w[0]) * 2,
    "nan_to_num": lambda x, w: jnp.nan_to_num(x, nan=w[0]).astype(F32),
    "in a scan body": lambda x, w: jax.lax.scan(
        lambda c, _: (jnp.full_like(c, w[0]) + c, None), x, None, length=3
    )[0],
}


@pytest.mark.parametrize("case", list(GIVEN_DATA))
def test_given_float32_data_narrowed_is_reported_under_autocast_too(case):
    # before: audit(f) reported 1 lossy_conversion and audit(autocast(f)) 0 (x.at[i].set(f32) was
    # reported: test_a_real_implicit_narrowing_is_still_reported)
    fn, x = GIVEN_DATA[case], jnp.asarray([0.0, 1.0, 256.0, -3.0], BF)
    assert audit(fn, x, _W).counts[LC] == 1
    report = audit(autocast(fn), x, _W)
    assert report.counts[LC] == 1, str(report)
    (lc,) = report.of_kind(LC)
    assert (lc.dtypes, lc.out_dtype, lc.origin) == (("f32",), "bf16", "implicit")


def test_a_narrowing_of_a_computed_loop_constant_is_still_reported():
    # the round trip is followed out of a body only to an exact widening: a float32 value computed
    # outside and narrowed inside is the caller's own narrowing
    def f(w, xs):
        w32 = w.astype(F32) * 1.1  # float32, not an exact widening of a bfloat16

        def step(h, xt):
            return h + jnp.sum(w32.astype(BF) * xt), None

        return jax.lax.scan(step, jnp.zeros((), BF), xs)[0]

    report = audit(f, jnp.ones((16,), BF), jnp.ones((8, 16), BF), include_explicit=True)
    assert report.counts[LC] == 1, str(report)


def test_known_calls_audited_one_after_another_keep_their_own_sources():
    # (elu and leaky_relu select the input where x > 0: its float32 twin, an exact widening of the
    # bfloat16 value, narrowed back; it was read as an implicit narrowing of an input.)
    # heddle's gelu and silu share jitted helpers (``jnp.where``'s, ``jnp.clip``'s) whose bodies JAX
    # traces once and caches: traced under the first call's source information, the second call's
    # rounding read a value "from another call" and was reported as an implicit narrowing. A shape
    # no other test uses, so that these bodies are traced first here.
    from heddle import autodiff

    w = jax.ShapeDtypeStruct((7, 13), BF)
    x = jax.ShapeDtypeStruct((11, 7), BF)
    fns = [jax.nn.gelu, jax.nn.silu, jax.nn.mish, jax.nn.selu, jax.nn.elu, jax.nn.leaky_relu]
    for act in fns:

        def loss(w, x, act=act):
            return jnp.mean(act(x @ w) ** 2)

        report = audit(autodiff.grad(autocast(loss)), w, x)
        assert report.findings == (), (act.__name__, str(report))
        report = audit(autocast(loss), w, x, include_backward=True)
        assert {f.kind for f in report.findings} <= {NC}, (act.__name__, str(report))


_NOT_UNARY = {  # jax.nn names that are not an elementwise function of one array
    "initializers",
    "one_hot",
    "dot_product_attention",
    "scaled_matmul",
    "scaled_dot_general",
    "get_scaled_dot_general_config",
    "glu",
}
_JNP_UNARY = (
    "abs arccos arccosh arcsin arcsinh arctan arctanh cbrt ceil cos cosh deg2rad exp exp2 expm1 "
    "fabs floor log log10 log1p log2 negative positive rad2deg reciprocal rint sign sin sinc sinh "
    "sqrt square tan tanh trunc i0 nan_to_num real"
).split()
_SWEPT = [
    *(f"jax.nn.{n}" for n in dir(jax.nn) if not n.startswith("_") and n not in _NOT_UNARY),
    *(f"jnp.{n}" for n in _JNP_UNARY),
]


def test_every_activation_and_unary_function_audits_clean_under_autocast():
    # the class behind the cases above: for each function, in one process and one after another,
    # heddle.autodiff.grad(autocast(loss)) has no finding at all and autocast(loss) with its
    # jax.grad backward only jax.grad's narrow cotangents (a shape of its own: helpers traced here)
    from heddle import autodiff

    w = jax.ShapeDtypeStruct((5, 17), BF)
    x = jax.ShapeDtypeStruct((3, 5), BF)
    bad = {}
    for name in _SWEPT:
        fn = getattr(jax.nn if name.startswith("jax.nn.") else jnp, name.rsplit(".", 1)[1])
        if not callable(fn):
            continue

        def loss(w, x, fn=fn):
            return jnp.mean(fn(x @ w).astype(F32) ** 2)

        clean = audit(autodiff.grad(autocast(loss)), w, x)
        vjp = audit(autocast(loss), w, x, include_backward=True)
        found = [f.kind for f in clean.findings] + [f.kind for f in vjp.findings if f.kind != NC]
        if found:
            bad[name] = found
    assert len(_SWEPT) > 60
    assert bad == {}


def _narrow_carry_scan(w, xs):
    def step(c, x):
        c = jnp.tanh(c @ w + x)
        return c, c.sum()

    c, ys = jax.lax.scan(step, jnp.zeros((4,), BF), xs)
    return jnp.mean(ys).astype(F32) + c.astype(F32).sum()


def _cast_carry_scan(w, xs):
    """An RNN step that casts its carry explicitly: the transposed body rounds the carry's
    float32 cotangent to bfloat16 itself, as a result of the body."""

    def step(h, x):
        h = jnp.tanh((h.astype(F32) @ w.astype(F32)).astype(BF) + x)
        return h, h

    _, hs = jax.lax.scan(step, jnp.zeros(4, BF), xs)
    return jnp.sum(hs.astype(F32))


@pytest.mark.parametrize("fn", [_narrow_carry_scan, _cast_carry_scan], ids=["carry", "cast"])
def test_a_user_scans_narrow_carry_gives_narrow_cotangents_not_lossy_conversions(fn):
    # autocast computes the cotangents of the scan's bfloat16 outputs in float32 and rounds them
    # once for the transposed scan (outside it, or inside its body as the body's result), whose
    # carries are bfloat16 as in jax.grad of the plain program: the audit reports the scan's
    # narrow cotangents (and carry), not an implicit narrowing
    w, xs = jax.ShapeDtypeStruct((4, 4), BF), jax.ShapeDtypeStruct((5, 4), BF)
    report = audit(autocast(fn), w, xs, include_backward=True)
    assert report.counts[LC] == 0, str(report)
    assert report.counts[NC] > 0, str(report)


def test_the_exact_round_trip_of_a_widened_value_is_not_lossy():
    # autocast's narrow dot reads its operands' float32 twins narrowed back: exact
    w, x = jax.ShapeDtypeStruct((16, 8), BF), jax.ShapeDtypeStruct((4, 16), BF)
    report = audit(autocast(_square_mean), w, x, include_backward=True, include_explicit=True)
    assert [f for f in report.of_kind(LC) if f.origin == "implicit" and f.phase == "forward"] == []


X = jax.ShapeDtypeStruct((16, 32), BF)
Y = jax.ShapeDtypeStruct((32,), F32)


@pytest.fixture
def standard():
    with jax.numpy_dtype_promotion("standard"):
        yield


@pytest.mark.filterwarnings("ignore:scatter inputs have incompatible types")
@pytest.mark.parametrize("wrap", [lambda f: f, autocast], ids=["plain", "autocast"])
@pytest.mark.parametrize("include_backward", [False, True], ids=["forward", "forward+backward"])
def test_a_real_implicit_narrowing_is_still_reported(standard, wrap, include_backward):
    # bf16.at[i].set(f32) rounds the caller's float32 values into the bfloat16 buffer
    report = audit(wrap(lambda a, b: a.at[0].set(b)), X, Y, include_backward=include_backward)
    (lc,) = report.of_kind(LC)
    assert (lc.dtypes, lc.out_dtype, lc.origin, lc.phase) == (
        ("f32",),
        "bf16",
        "implicit",
        "forward",
    )
    # also when the program widens the stored buffer again afterwards
    widened = audit(lambda a, b: a.at[0].set(b).astype(F32), X, Y)
    assert widened.counts[LC] == 1


def test_the_bfloat16_gradient_of_a_mixed_dtype_op_is_still_an_implicit_narrowing(standard):
    report = audit(lambda a, b: jnp.sum(a + b), X, Y, include_backward=True)
    (lc,) = report.of_kind(LC)
    assert (lc.dtypes, lc.out_dtype, lc.phase) == (("f32",), "bf16", "backward")


def test_under_autocast_a_mixed_dtype_op_is_the_policys_and_its_gradient_a_narrow_cotangent(
    standard,
):
    # autocast promotes bf16 + f32 by heddle's lattice, explicitly: no implicit promotion. jax.vjp
    # still rounds the bfloat16 input's float32 cotangent to bfloat16: the narrow cotangent the
    # audit reports without autocast too, at the same line (heddle.autodiff keeps it float32)
    f = lambda a, b: jnp.sum(a + b)
    plain = audit(f, X, Y, include_backward=True)
    report = audit(autocast(f), X, Y, include_backward=True)
    assert (report.counts[IP], report.counts[LC], plain.counts[IP]) == (0, 0, 1)
    (nc,) = report.of_kind(NC)
    (plain_nc,) = plain.of_kind(NC)
    assert (nc.dtypes, nc.out_dtype, nc.phase) == (("f32",), "bf16", "backward")
    assert nc.source == plain_nc.source


def _gather_sum(x, idx):
    return jnp.sum(jnp.take_along_axis(x, idx, axis=1).astype(F32) * 0.1)


def _gather_then_scan(x, idx):
    def step(c, yt):
        return c + jnp.sum(yt.astype(F32) * 0.1), None

    return jax.lax.scan(step, F32(0), jnp.take_along_axis(x, idx, axis=1).T)[0]


_X1, _IDX = jnp.ones((2, 8), BF), jnp.zeros((2, 4096), jnp.int32)  # 4096 reads of x[:, 0]
_EXACT = 4096 * np.float64(np.float32(0.1))  # 409.6


def test_gather_gradient_under_autocast_sums_in_float32():
    # plain JAX scatter-adds the 4096 cotangents in bfloat16 (stalls at 32); autocast in float32
    assert float(jax.grad(_gather_sum)(_X1, _IDX)[0, 0]) == 32.0
    got = float(jax.grad(autocast(_gather_sum))(_X1, _IDX)[0, 0])
    assert got == float(jnp.asarray(_EXACT, F32).astype(BF)) == 410.0
    assert audit(autocast(_gather_sum), _X1, _IDX, include_backward=True).counts[NA] == 0


def test_gather_feeding_a_scan_sums_its_gradient_in_float32_under_autocast():
    got = float(jax.grad(autocast(_gather_then_scan))(_X1, _IDX)[0, 0])
    assert abs(got - _EXACT) <= 1.0  # today 32.0, as plain JAX
    assert audit(autocast(_gather_then_scan), _X1, _IDX, include_backward=True).counts[NA] == 0
