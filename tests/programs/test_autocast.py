"""``heddle.autocast``: the values POLICY.md promises, for code that never calls heddle, against
float64/Fraction references; dtypes kept; every transformation and higher-order primitive."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import heddle
from heddle import autocast, autodiff

BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32


def _round(x64: np.ndarray, dtype) -> np.ndarray:
    """float64 values rounded once to ``dtype`` (ml_dtypes rounds float32 exactly; every value
    here is exact in float32 first, or compared with a tolerance)."""
    return np.asarray(x64, np.float64).astype(np.float32).astype(dtype)


def test_cumsum_method_accumulates_in_float32(transform):
    x = jnp.full(100_000, 0.1, F16)
    out = transform(autocast(lambda x: x.cumsum()))(x)
    assert out.dtype == F16
    assert float(out[-1]) == 10000.0
    exact = np.cumsum(np.full(100_000, float(np.float16(0.1))))
    # every element is the float32 running sum rounded once: within one float16 ulp of exact
    err = np.abs(np.asarray(out, np.float64) - exact)
    assert np.all(err <= np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64))
    assert float(x.cumsum()[-1]) != 10000.0  # JAX's own: float16 partial sums


def test_softmax_and_logsumexp_of_float16_zeros(transform):
    z = jnp.zeros(100_000, F16)
    sm = transform(autocast(jax.nn.softmax))(z)
    assert sm.dtype == F16
    assert np.all(np.asarray(sm) == np.float16(1e-5))  # 1.0014e-05
    assert float(np.float16(1e-5)) == pytest.approx(1.0014e-05, rel=1e-4)
    lse = transform(autocast(jax.nn.logsumexp))(z)
    assert lse.dtype == F16 and float(lse) == float(np.float16(np.log(1e5)))  # 11.51
    assert float(jax.nn.softmax(z)[0]) == 0.0  # JAX: the float32 sum stored as float16 inf


def test_raw_lax_reduce_sum(transform):
    x = jnp.full(10_000, 0.1, BF16)
    out = transform(autocast(lambda x: jax.lax.reduce_sum(x, (0,))))(x)
    exact = Fraction(float(ml_dtypes.bfloat16(0.1))) * 10_000
    assert out.dtype == BF16 and float(out) == float(_round(float(exact), BF16)) == 1000.0


def test_matmul_accumulates_in_float32_and_rounds_once(transform):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(8, 4096)), BF16)
    b = jnp.asarray(rng.normal(size=(4096, 8)), BF16)
    out = transform(autocast(lambda a, b: a @ b))(a, b)
    ref = jnp.matmul(a.astype(F32), b.astype(F32), precision="highest").astype(BF16)
    assert out.dtype == BF16 and bool(jnp.array_equal(out, ref))


def test_scatter_add_at_repeated_indices(transform):
    y = jnp.full(10_000, 0.1, BF16)
    idx = jnp.zeros(10_000, jnp.int32)
    out = transform(autocast(lambda a, i, y: a.at[i].add(y)))(jnp.zeros(4, BF16), idx, y)
    assert float(out[0]) == 1000.0 and out.dtype == BF16
    assert float(jnp.zeros(4, BF16).at[idx].add(y)[0]) == 32.0  # JAX's own


def test_bias_gradient_over_65536_rows_through_autodiff():
    rng = np.random.default_rng(1)
    n = 65_536
    x = jnp.asarray(rng.normal(size=(n, 4)), BF16)
    w = jnp.asarray(rng.uniform(0, 2, size=(n, 4)), BF16)
    b = jnp.zeros(4, BF16)

    def loss(b, x, w):
        return ((x + b) * w).sum().astype(F32)

    g = jax.jit(autodiff.grad(autocast(loss)))(b, x, w)
    exact = [sum(Fraction(float(v)) for v in np.asarray(w[:, j], np.float64)) for j in range(4)]
    total = np.asarray(w, np.float64).sum(0)
    bound = np.log2(n) * 2.0**-24 * total  # float32 pairwise (tree) sums of non-negative terms
    assert g.dtype == F32
    assert np.all(np.abs(np.asarray(g, np.float64) - np.array([float(e) for e in exact])) <= bound)
    plain = jax.jit(jax.grad(loss))(b, x, w)  # JAX's: bfloat16 products, sums and gradient
    assert np.max(np.abs(np.asarray(plain, np.float64) - total)) > 100 * np.max(bound)


def test_narrowing_conversions_round_once():
    # int32 -> bfloat16 through float32 rounds twice in XLA; autocast uses heddle's cast
    x = jnp.asarray([2**24 + 2**16 + 1], jnp.int32)  # halfway after the first rounding
    ours = autocast(lambda x: x.astype(BF16))(x)
    assert ours.dtype == BF16
    exact = Fraction(2**24 + 2**16 + 1)
    lo, hi = 2**24, 2**24 + 2**17  # bfloat16 neighbours
    assert float(ours[0]) == (hi if exact - lo > hi - exact else lo)


# -- dtypes and shapes are never changed -------------------------------------------------------


_PROGRAMS = {
    "int8 matmul": (lambda a: a @ a, jnp.ones((4, 4), jnp.int8)),
    "int8 cumsum": (lambda a: jax.lax.cumsum(a), jnp.full(300, 1, jnp.int8)),
    "argmax": (lambda a: jnp.argmax(a), jnp.arange(6.0, dtype=BF16)),
    "bf16 mean": (lambda a: a.mean(), jnp.ones(8, BF16)),
    "f16 var": (lambda a: jnp.var(a), jnp.ones(8, F16)),
    "mixed dot": (lambda a: jax.lax.dot(a, a.astype(F32)), jnp.ones((4, 4), BF16)),
    "sum int8": (lambda a: a.sum(), jnp.ones(4, jnp.int8)),
    "weak": (lambda a: a * 2 + 1.5, jnp.ones(3, BF16)),
}


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_every_output_keeps_jaxs_aval(name, transform):
    f, x = _PROGRAMS[name]
    theirs = jax.eval_shape(f, x)
    ours = transform(autocast(f))(x)
    assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype)


def test_integer_results_keep_jaxs_dtype_and_wrap_as_it_does():
    a = jnp.full((2, 64), 3, jnp.int8)
    ours = autocast(lambda a: a @ a.T)(a)
    assert ours.dtype == jnp.int8
    assert int(ours[0, 0]) == np.int8(np.int64(9 * 64) - 512)  # 576 wraps to 64
    # the audit of the result still reports the narrowing store of the int32 accumulator
    (f,) = heddle.audit(autocast(lambda a: a @ a.T), a)
    assert (f.kind, f.dtypes, f.out_dtype) == ("lossy_conversion", ("i32",), "i8")


def test_index_results_keep_jaxs_dtype_under_x64():
    with jax.enable_x64(True):
        x = jnp.arange(5.0, dtype=BF16)
        assert autocast(jnp.argmax)(x).dtype == jnp.argmax(x).dtype == jnp.int64


def test_float32_program_under_jit_gets_no_extra_equations():
    def f(w, x):
        return jax.nn.relu(x @ w).sum()

    w, x = jnp.ones((8, 8), F32), jnp.ones((4, 8), F32)
    plain = jax.make_jaxpr(jax.jit(f))(w, x)
    ours = jax.make_jaxpr(jax.jit(autocast(f)))(w, x)
    count = lambda j: len(j.eqns[0].params["jaxpr"].eqns)
    assert count(ours) == count(plain)


# -- transformations and higher-order primitives -----------------------------------------------

X = jnp.full(4096, 0.1, BF16)
CUMSUM_LAST = float(_round(4096 * float(ml_dtypes.bfloat16(0.1)), BF16))  # 409.6 -> 410


def _last(y):
    return float(jnp.ravel(y)[-1])


def test_inside_scan_while_cond_remat_custom_rules():
    @jax.custom_jvp
    def cj(x):
        return x.cumsum()

    cj.defjvp(lambda p, t: (cj(p[0]), t[0].cumsum()))

    @jax.custom_vjp
    def cv(x):
        return x.cumsum()

    cv.defvjp(lambda x: (x.cumsum(), None), lambda _, g: (g[::-1].cumsum()[::-1],))

    def f(x):
        _, ys = jax.lax.scan(lambda c, a: (c, a.cumsum()), 0.0, x[None])
        w = jax.lax.while_loop(lambda s: s[0] < 1, lambda s: (s[0] + 1, s[1].cumsum()), (0, x))[1]
        k = jax.lax.cond(x[0] > 0, lambda: x.cumsum(), lambda: x)
        r = jax.checkpoint(lambda x: x.cumsum())(x)
        j = jax.jit(lambda x: x.cumsum())(x)
        return ys, w, k, r, j, cj(x), cv(x)

    for out in jax.jit(autocast(f))(X):
        assert _last(out) == CUMSUM_LAST
    assert _last(f(X)[0]) != CUMSUM_LAST  # JAX's own


def test_composes_with_grad_vjp_jvp_vmap():
    def f(x):
        return x.cumsum()

    def loss(x):
        return autocast(f)(x)[-1].astype(F32)

    assert jax.grad(loss)(X).dtype == BF16
    _, t = jax.jvp(autocast(f), (X,), (jnp.ones_like(X),))
    assert _last(t) == 4096.0  # the tangent's cumsum accumulates in float32 too
    out, pull = jax.vjp(autocast(f), X)
    (ct,) = pull(jnp.ones_like(out))
    assert float(ct[0]) == 4096.0  # JAX's own bfloat16 reverse cumsum stalls at 256
    vm = jax.vmap(autocast(f))(jnp.stack([X, X]))
    assert _last(vm) == CUMSUM_LAST
    inner = autocast(jax.grad(lambda x: x.cumsum()[-1].astype(F32) * 0 + x.sum().astype(F32)))
    assert inner(X).dtype == BF16


def test_autocast_of_grad_sums_cotangents_in_float32():
    b = jnp.zeros(4, BF16)
    ones = jnp.ones((8192, 4), BF16)
    grad = jax.grad(lambda b, x: (x + b).sum().astype(F32))
    g = autocast(grad)(b, ones)
    assert float(g[0]) == 8192.0 and g.dtype == BF16
    # the backward pass's broadcast transpose is a bfloat16 reduce_sum in JAX, float32 here
    assert heddle.audit(grad, b, ones).counts["narrow_accumulation"] > 0
    assert heddle.audit(autocast(grad), b, ones).counts["narrow_accumulation"] == 0


def test_shard_map_and_pure_callback():
    mesh = jax.make_mesh((1,), ("d",))
    sm = jax.shard_map(
        lambda x: jax.lax.psum(x.cumsum(), "d"), mesh=mesh, in_specs=P(), out_specs=P()
    )
    assert _last(jax.jit(autocast(sm))(X)) == CUMSUM_LAST

    def cb(x):
        return jax.pure_callback(
            lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x
        )

    assert bool(jnp.array_equal(autocast(cb)(X), X * 2))


def test_precision_argument_casts_inputs_and_outputs():
    f = autocast(lambda x: x * 3, precision="params=float32,compute=bfloat16,output=float32")
    x = jnp.full(3, 0.1, F32)
    out = f(x)
    assert out.dtype == F32
    assert float(out[0]) == float((jnp.asarray(0.1, BF16) * 3).astype(F32))


def test_policy_argument_sets_the_accumulation_floor():
    pol = dataclasses.replace(heddle.policy.HEDDLE, min_float_acc="float64")
    with jax.enable_x64(True):
        x = jnp.full(3, 0.1, BF16)
        jaxpr = jax.make_jaxpr(autocast(lambda x: x.cumsum(), policy=pol))(x)
        assert any(str(e.outvars[0].aval.dtype) == "float64" for e in jaxpr.eqns)


def test_decorator_form_and_pytrees():
    @autocast()
    def f(tree):
        return {"s": tree["a"].cumsum(), "n": tree["n"]}

    out = f({"a": X, "n": 3})
    assert out["n"] == 3 and _last(out["s"]) == CUMSUM_LAST


def test_an_unknown_primitive_passes_through():
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("heddle_test_double")
    prim.def_impl(lambda x: x * 2)
    prim.def_abstract_eval(lambda x: x)
    mlir.register_lowering(prim, mlir.lower_fun(lambda x: x * 2, multiple_results=False))
    f = lambda x: prim.bind(x).cumsum()
    assert _last(jax.jit(autocast(f))(X)) == float(
        _round(2 * 4096 * float(ml_dtypes.bfloat16(0.1)), BF16)
    )
    report = heddle.audit(f, X)
    assert report.counts["unclassified_primitive"] == 1


# --- constants, complex parts and bad arguments -----------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_constant_arrays_are_narrowed_whatever_their_size(mode):
    run = jax.jit if mode == "jit" else (lambda f: f)
    scale = np.array([1.0, 2.0, 3.0, 1 + 2**-8 + 2**-30])  # float64 host data, the last past a tie
    f = run(autocast(lambda x: x * jnp.asarray(scale, F32).astype(BF16)))
    got = np.asarray(f(jnp.ones(4, BF16)), np.float64)
    # the program asks for float32 first: 1 + 2**-8 + 2**-30 rounds to 1 + 2**-8 there (2**-30 is
    # under float32's half ulp), exactly bfloat16's tie between 1 and 1 + 2**-7: to even, 1.0
    assert got.tolist() == [1.0, 2.0, 3.0, 1.0]
    h = run(autocast(lambda c: c.astype(F16)))
    assert np.asarray(h(np.arange(3, dtype=np.float32))).tolist() == [0.0, 1.0, 2.0]


def test_complex_to_real_keeps_the_real_part_as_jax_does():
    c = jnp.asarray([1 + 2j, 3 - 4j], jnp.complex64)
    with pytest.warns(np.exceptions.ComplexWarning):  # as plain JAX warns
        plain = jax.lax.convert_element_type(c, F32)
    with pytest.warns(np.exceptions.ComplexWarning):
        out = autocast(lambda z: jax.lax.convert_element_type(z, F32))(c)
    assert np.asarray(plain).tolist() == [1.0, 3.0]
    assert out.dtype == F32 and np.asarray(out).tolist() == [1.0, 3.0]


def test_bad_arguments_are_refused_when_wrapping_with_the_fix():
    with pytest.raises(TypeError, match=r"autocast\(3\).*not callable.*heddle.autocast\(loss\)"):
        autocast(3)
    assert autocast(lambda x: x + 1)(jnp.ones(2, BF16)).dtype == BF16  # the fix: a function
    with pytest.raises(TypeError, match=r"policy takes a heddle.policy.Policy.*precision="):
        autocast(lambda x: x, policy="bfloat16")
    out = autocast(lambda x: x.sum(), precision="mixed_bfloat16")(jnp.ones(4, F32))  # the fix
    assert out.dtype == F32 and float(out) == 4.0


def test_eager_calls_round_once_per_library_call_like_jit():
    """A jitted library function calling another (jnp.std -> jnp.var) rounds once, at its output,
    eagerly as under jit and as heddle.numpy.std (reference: float64, rounded once)."""
    import heddle.numpy as hnp

    x = (jax.random.normal(jax.random.key(0), (16, 256)) * 3).astype(BF16)
    eager = autocast(lambda v: jnp.std(v, axis=1))(x)
    jitted = jax.jit(autocast(lambda v: jnp.std(v, axis=1)))(x)
    assert np.array_equal(np.asarray(eager), np.asarray(jitted))
    assert np.array_equal(np.asarray(eager), np.asarray(hnp.std(x, axis=1)))
    ref = np.asarray(x, np.float64).std(axis=1)
    err = np.abs(np.asarray(eager, np.float64) - ref)
    half_ulp = 2.0 ** (np.floor(np.log2(ref)) - 8)  # bfloat16: 8 significant bits
    assert np.all(err <= half_ulp * 1.001)


def test_outputs_that_are_not_jax_values_come_back_as_the_plain_function_returns_them():
    x = jnp.ones(3, BF16)
    out = autocast(lambda v: (v.sum(), "tag", 3, None))(x)
    assert out[1:] == ("tag", 3, None) and type(out[2]) is int
    assert out[0].dtype == BF16 and float(out[0]) == 3.0
    plain = jax.jit(lambda v: (v.sum(), 3))(x)  # under jit, as jax.jit itself returns it
    ours = jax.jit(autocast(lambda v: (v.sum(), 3)))(x)
    assert ours[1].dtype == plain[1].dtype and int(ours[1]) == 3


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_a_weight_every_scan_step_reads_gets_its_gradient_summed_in_float32(mode):
    """1000 steps of w * bf16(0.1): the cotangent of w is a sum over the steps. JAX sums it in
    bfloat16 (32); under autocast it is float32 (reference: exact, 1000 * bf16(0.1))."""
    run = jax.jit if mode == "jit" else (lambda f: f)
    xs = jnp.full((1000,), 0.1, BF16)
    tenth = Fraction(float(xs[0]))

    def loss(w, xs):
        return jax.lax.scan(lambda c, x: (c, w * x), 0.0, xs)[1].astype(F32).sum()

    def loop(w, xs):
        return jax.lax.fori_loop(0, 1000, lambda i, c: c + (w * xs[i]).astype(F32), 0.0)

    assert float(jax.grad(loss)(BF16(1), xs)) == 32.0  # JAX's own bfloat16 sum stalls
    for f in (loss, loop):
        g = run(autodiff.grad(autocast(f)))(BF16(1), xs)
        assert g.dtype == F32 and Fraction(float(g)) == 1000 * tenth
        assert float(run(jax.grad(autocast(f)))(BF16(1), xs)) == 100.0  # 100.098 rounded once
    assert heddle.audit(jax.grad(autocast(loss)), BF16(1), xs).counts["narrow_accumulation"] == 0


# ---- a value used twice: its cotangents are summed in float32, rounded once -------------------


def _dyadic(rng, shape, dtype):
    """Multiples of 1/8 in [-2, 2]: every product and sum below is exact in float32."""
    return jnp.asarray((rng.integers(-16, 17, size=shape) / 8).astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_value_used_twice_sums_its_dot_cotangents_in_float32(dtype, jit):
    """A narrow dot's operand got its cotangent rounded to bfloat16 before the value's other uses
    were added (tied embeddings, residual streams, q/k/v projections): 30 of 320 elements of a
    shared weight's gradient were one ulp off the exact gradient rounded once."""
    rng = np.random.default_rng(0)
    x, y = _dyadic(rng, (6, 8), dtype), _dyadic(rng, (6, 8), dtype)
    w, g = _dyadic(rng, (40, 8), dtype), _dyadic(rng, (6, 40), dtype)
    f64 = lambda a: np.asarray(a, np.float64)

    def shared(w):  # two dots with one weight
        return ((x @ w.T).astype(F32) * g.astype(F32)).sum() + (
            (y @ w.T).astype(F32) * g.astype(F32)
        ).sum()

    def residual(x):  # x + x @ v: the input feeds a dot and an add
        v = w[:8]
        return ((x + x @ v).astype(F32) * y.astype(F32)).sum()

    cases = [
        (shared, w, f64(g).T @ f64(x) + f64(g).T @ f64(y)),
        (residual, x, f64(y) + f64(y) @ f64(w[:8]).T),
    ]
    for loss, at, exact in cases:
        step = jax.grad(autocast(loss))
        got = np.asarray((jax.jit(step) if jit else step)(at), np.float64)
        want = np.asarray(jnp.asarray(exact, dtype), np.float64)  # exact, rounded once
        assert (got == want).all(), f"{loss.__name__}: {int((got != want).sum())} elements off"


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, str]]:
    return [
        (str(e.invars[0].aval.dtype), str(e.invars[1].aval.dtype))
        for e in jaxpr.eqns
        if e.primitive.name == "dot_general"
    ]


def test_a_dot_reads_its_own_calls_float32_intermediate():
    """multi_dot's intermediate product stays float32 (one call: its second dot is float32, and the
    result is heddle's, the float64 product rounded once). The same statement repeated in a loop
    shares one call key: from the second iteration its dot reads the float32 value of the one
    before (docs/autocast.md), never less accurate than heddle.numpy's rounding per call."""
    bf = jnp.bfloat16
    rng = np.random.default_rng(0)
    a, b, c = (jnp.asarray(rng.standard_normal(s), bf) for s in ((4, 64), (64, 64), (64, 2)))
    multi = lambda a, b, c: jnp.linalg.multi_dot([a, b, c])
    assert sorted(_dot_operand_dtypes(jax.make_jaxpr(autocast(multi))(a, b, c).jaxpr)) == [
        ("bfloat16", "bfloat16"),
        ("float32", "float32"),
    ]
    wide = [np.asarray(m, np.float64) for m in (a, b, c)]
    exact = wide[0] @ wide[1] @ wide[2]
    got = jax.jit(autocast(multi))(a, b, c)
    want = jax.jit(heddle.numpy.linalg.multi_dot)([a, b, c])
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert np.all(np.abs(np.asarray(got, np.float64) - exact) <= 2.0**-8 * np.abs(exact) + 1e-3)

    def loop(x, ws):
        for w in ws:
            x = x @ w
        return x

    ws = [jnp.asarray(rng.standard_normal((64, 64)) / 8, bf) for _ in range(3)]
    exact = wide[0] @ np.asarray(ws[0], np.float64) @ np.asarray(ws[1], np.float64)
    exact = exact @ np.asarray(ws[2], np.float64)
    got = np.asarray(jax.jit(autocast(loop))(a, ws), np.float64)
    per_call = np.asarray(jax.jit(lambda x, ws: loop_h(x, ws))(a, ws), np.float64)
    assert np.abs(got - exact).max() <= np.abs(per_call - exact).max()


def loop_h(x, ws):
    for w in ws:
        x = heddle.numpy.matmul(x, w)
    return x


@pytest.mark.parametrize(
    "reader",
    [
        lambda h: jnp.var(h, axis=-1, keepdims=True),  # a jitted library function, inlined
        lambda h: jnp.linalg.norm(h, axis=-1, keepdims=True),
    ],
    ids=["var", "norm"],
)
def test_a_value_read_inside_and_outside_a_library_call_has_one_twin(reader):
    """h feeds a jitted library call (which widens it itself) and a multiplication after it: both
    read one float32 twin, so the backward pass adds h's two cotangents in float32 (before, the
    call made a twin of its own, and jax.grad added the two contributions in bfloat16)."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 32)), jnp.bfloat16)

    def f(x):
        h = jnp.tanh(x)
        return jnp.sum(h * reader(h))

    jaxpr = jax.make_jaxpr(autocast(f))(x).jaxpr
    tanh_out = next(e.outvars[0] for e in jaxpr.eqns if e.primitive.name == "tanh")
    rounded = next(
        e.outvars[0]
        for e in jaxpr.eqns
        if e.primitive.name == "convert_element_type" and e.invars[0] is tanh_out
    )
    widened = [
        e
        for e in jaxpr.eqns
        if e.primitive.name == "convert_element_type" and e.invars[0] is rounded
    ]
    assert len(widened) == 1
    _, vjp = jax.vjp(autocast(f), x)
    back = jax.make_jaxpr(vjp)(jnp.ones((), jnp.bfloat16)).jaxpr
    narrow_adds = [
        e
        for e in back.eqns
        if e.primitive.name == "add_any" and e.outvars[0].aval.dtype == jnp.bfloat16
    ]
    assert narrow_adds == []


# --- tie-counting selections: the value on the narrow operand, the tie count in float32 ---------

_SELECTIONS = {
    "max": lambda x: jnp.max(x),
    "min": lambda x: jnp.min(x),
    "reduce_window_max": lambda x: jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (x.size,), (1,), "VALID"
    )[0],
    "cummax": lambda x: jax.lax.cummax(x)[-1],
}


@pytest.mark.parametrize("name", sorted(_SELECTIONS))
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_a_selection_counts_its_ties_in_float32(transform, dtype, name):
    # 300 equal maxima: the derivative is float32 JAX's on the same values (max and min split
    # the cotangent over their ties, 1/300 each, where a bfloat16 count stops at 256)
    n = 300
    x = jnp.ones(n, dtype)

    def loss(x):
        return _SELECTIONS[name](x).astype(F32)

    g = transform(jax.grad(autocast(loss)))(x)
    want = np.asarray(jax.jit(jax.grad(loss))(x.astype(F32))).astype(dtype)
    assert g.dtype == dtype
    np.testing.assert_array_equal(np.asarray(g, np.float32), want.astype(np.float32))
    assert float(transform(autocast(loss))(x)) == 1.0


def _all_eqns(jaxpr):
    """Every equation of ``jaxpr`` and of the bodies its equations hold."""
    for e in jaxpr.eqns:
        yield e
        for p in e.params.values():
            inner = getattr(p, "jaxpr", p)
            if isinstance(inner, jax.extend.core.Jaxpr):
                yield from _all_eqns(inner)


def test_logsumexp_selects_its_max_from_the_narrow_operand():
    # the max of a bfloat16 row is the max of its exact float32 widening: taken from the bfloat16
    # values, XLA keeps no float32 copy of the input for it (autocast was 2.3x jax.nn.logsumexp's
    # time on a 1024x4096 input, heddle.nn.logsumexp's 1.0x; benchmarks/bench_ops.py logsumexp)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 256)), BF16)
    f = autocast(lambda x: jax.nn.logsumexp(x, axis=-1))
    maxes = [e for e in _all_eqns(jax.make_jaxpr(f)(x).jaxpr) if e.primitive.name == "reduce_max"]
    assert [e.invars[0].aval.dtype for e in maxes] == [BF16]
    want = jax.jit(lambda x: heddle.nn.logsumexp(x, axis=-1))(x)
    got = np.asarray(jax.jit(f)(x))
    np.testing.assert_array_equal(got.view(np.uint16), np.asarray(want).view(np.uint16))
    x64 = np.asarray(x, np.float64)
    ref = np.log(np.sum(np.exp(x64 - x64.max(-1, keepdims=True)), -1)) + x64.max(-1)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x), np.float64), ref, rtol=2**-8)
