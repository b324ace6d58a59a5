"""``Precision``: parsing, presets, errors whose fix works, and the pytree casts."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from fractions import Fraction

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import heddle.numpy as hnp
from heddle import autodiff, policy
from heddle.policy import Precision

F32, F16, BF16, F64 = (np.dtype(n) for n in ("float32", "float16", ml_dtypes.bfloat16, "float64"))
FLOATS = [d for d in policy.DTYPES if d.name.startswith(("float", "bfloat"))]


# ---- the value ------------------------------------------------------------------------------------


def test_fields_are_parsed_dtypes():
    p = Precision("f32", jnp.bfloat16, np.float16)
    assert (p.param_dtype, p.compute_dtype, p.output_dtype) == (F32, BF16, F16)
    assert all(isinstance(d, np.dtype) for d in dataclasses.astuple(p))
    assert Precision() == Precision("float32", "float32", "float32")


def test_frozen_and_hashable():
    p = Precision("float32", "bfloat16", "float32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.compute_dtype = F16
    q = Precision(F32, BF16, F32)
    assert p == q and hash(p) == hash(q) and p is not q
    assert len({p, q, Precision("float32", "float16", "float32")}) == 2


def test_static_argument_of_jit():
    f = jax.jit(lambda x, prec: prec.cast_to_compute(x), static_argnums=1)
    x = jnp.ones(3)
    assert f(x, Precision.parse("mixed_bfloat16")).dtype == BF16
    assert f(x, Precision.parse("mixed_float16")).dtype == F16


# ---- parse ------------------------------------------------------------------------------------------

PARSED = [
    ("params=float32,compute=bfloat16,output=float32", (F32, BF16, F32)),
    ("params=f32,compute=bf16,output=f32", (F32, BF16, F32)),
    ("p=f32,c=f16,o=f32", (F32, F16, F32)),
    ("param=float16, compute=float16 , out=float32", (F16, F16, F32)),
    ("  COMPUTE=BF16 ", (F32, BF16, F32)),
    ("output=bf16", (F32, F32, BF16)),
    ("compute=bf16,params=f16", (F16, BF16, F32)),
    ("c=e4m3fn", (F32, np.dtype(ml_dtypes.float8_e4m3fn), F32)),
    ("float32", (F32, F32, F32)),
    ("mixed_bfloat16", (F32, BF16, F32)),
    ("mixed_float16", (F32, F16, F32)),
    ("Mixed_BF16", (F32, BF16, F32)),
    ("mixed-f16", (F32, F16, F32)),
    ("bfloat16", (BF16, BF16, BF16)),
    ("f16", (F16, F16, F16)),
    ("float64", (F64, F64, F64)),
]


@pytest.mark.parametrize(("spec", "expected"), PARSED)
def test_parse(spec, expected):
    p = Precision.parse(spec)
    assert (p.param_dtype, p.compute_dtype, p.output_dtype) == expected


def test_parse_returns_a_precision_unchanged():
    p = Precision("float32", "float16", "float32")
    assert Precision.parse(p) is p


def test_presets():
    assert Precision.PRESETS == ("float32", "mixed_bfloat16", "mixed_float16")
    assert (
        str(Precision.parse("mixed_bfloat16")) == "params=float32,compute=bfloat16,output=float32"
    )
    assert str(Precision.parse("mixed_float16")) == "params=float32,compute=float16,output=float32"
    assert str(Precision.parse("float32")) == "params=float32,compute=float32,output=float32"


@settings(max_examples=60, deadline=None)
@given(st.tuples(*[st.sampled_from(FLOATS)] * 3))
def test_str_round_trips(dtypes):
    p = Precision(*dtypes)
    assert Precision.parse(str(p)) == p
    assert Precision.parse(str(p).upper().replace(",", " , ")) == p


# ---- errors: what was asked, why, and a fix that itself works --------------------------------------

BAD = [
    ("params=float33,compute=bf16", "'float33' is not a dtype"),
    ("paramz=float32,compute=bf16", "'paramz' is not a key"),
    ("params=f32,params=bf16", "params is given twice"),
    ("compute=int8", "int8 is not a real floating dtype"),
    ("compute=c64", "complex64 is not a real floating dtype"),
    ("float32,bfloat16", "is not of the form key=dtype"),
    ("params=f32,compute", "'compute' is not of the form key=dtype"),
    ("a=b=c", "'a' is not a key"),
    (",", "it names no dtype"),
    ("", "neither a preset"),
    ("mixd_bfloat16", "neither a preset"),
    ("mixed_int8", "int8 is not a real floating dtype"),
    ("bool", "bool is not a real floating dtype"),
    ("half", "platform-dependent in jmp"),
    ("mixed_half", "platform-dependent in jmp"),
    ("full", "jmp's name for float32"),
    ("p=full,c=half,o=full", "platform-dependent in jmp"),
]
FIX = re.compile(r"Precision\.parse\('([^']*)'\)")


def fixes(error: Exception) -> list[str]:
    """The ``Precision.parse('...')`` calls a message suggests (after the part that quotes the input)."""
    return FIX.findall(str(error).split(": ", 1)[1])


@pytest.mark.parametrize(("spec", "why"), BAD)
def test_bad_string_names_a_fix_that_works(spec, why):
    with pytest.raises(policy.UnknownDTypeError) as e:
        Precision.parse(spec)
    assert isinstance(e.value, ValueError) and isinstance(e.value, policy.PolicyError)
    text = str(e.value)
    assert text.startswith(f"Precision.parse({spec!r})")
    assert why in text
    suggested = fixes(e.value)
    assert suggested
    for fix in suggested:  # every call the message suggests works
        assert isinstance(Precision.parse(fix), Precision)


@pytest.mark.parametrize(
    ("spec", "meant"),
    [
        ("params=float33,compute=bf16", "params=float32,compute=bfloat16,output=float32"),
        ("paramz=float32,compute=bf16", "params=float32,compute=bfloat16,output=float32"),
        ("compute=bfloat61", "params=float32,compute=bfloat16,output=float32"),
        ("float32,bfloat16", "params=float32,compute=bfloat16,output=float32"),
        ("p=full,c=half,o=full", "params=float32,compute=bfloat16,output=float32"),
        ("mixd_bfloat16", "mixed_bfloat16"),
        ("mixed_flaot16", "mixed_float16"),
    ],
)
def test_suggested_fix_is_the_likely_intent(spec, meant):
    with pytest.raises(policy.UnknownDTypeError) as e:
        Precision.parse(spec)
    assert fixes(e.value)[0] == meant


def test_non_string_is_refused():
    with pytest.raises(policy.UnknownDTypeError, match=r"from a string, not a int") as e:
        Precision.parse(3)
    fix = fixes(e.value)[0]
    assert Precision.parse(fix) == Precision("float32", "bfloat16", "float32")


@pytest.mark.parametrize("bad", ["int8", "bool", "complex64", "float33", None])
def test_constructor_refuses_non_floats(bad):
    with pytest.raises(policy.UnknownDTypeError) as e:
        Precision("float32", bad, "float32")
    assert fixes(e.value)
    for fix in fixes(e.value):
        Precision.parse(fix)


# ---- casts -------------------------------------------------------------------------------------------

MIXED = Precision("float32", "bfloat16", "float16")


def mixed_tree():
    return {
        "f32": jnp.linspace(-1, 1, 5, dtype=jnp.float32),
        "bf16": jnp.ones((2, 3), jnp.bfloat16),
        "f16": np.full(3, 0.1, np.float16),
        "fp8": jnp.ones(4, ml_dtypes.float8_e4m3fn),
        "np_scalar": np.float32(2.5),
        "i8": jnp.arange(4, dtype=jnp.int8),
        "i32": np.arange(3, dtype=np.int32),
        "u8": jnp.ones(2, jnp.uint8),
        "b": jnp.array([True, False]),
        "c64": jnp.ones(2, jnp.complex64),
        "py_float": 0.1,
        "py_int": 3,
        "name": "layer",
        "fn": jax.nn.relu,
        "none": None,
        "nested": [(jnp.zeros(1, jnp.float32), jnp.zeros(1, jnp.int32))],
    }


FLOAT_KEYS = ("f32", "bf16", "f16", "fp8", "np_scalar")
KEPT_KEYS = ("i8", "i32", "u8", "b", "c64", "py_float", "py_int", "name", "fn", "none")


@pytest.mark.parametrize(
    ("method", "target"),
    [("cast_to_param", F32), ("cast_to_compute", BF16), ("cast_to_output", F16)],
)
def test_cast_every_leaf_of_a_mixed_tree(method, target):
    tree = mixed_tree()
    out = getattr(MIXED, method)(tree)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    for k in FLOAT_KEYS:
        assert np.dtype(out[k].dtype) == target, k
        assert np.shape(out[k]) == np.shape(tree[k])
    for k in KEPT_KEYS:
        assert out[k] is tree[k], k  # untouched: the very same object
    assert np.dtype(out["nested"][0][0].dtype) == target
    assert out["nested"][0][1] is tree["nested"][0][1]
    module_fn = getattr(policy, method)
    assert jax.tree.all(jax.tree.map(lambda a, b: a is b or bool(np.all(a == b)),
                                     module_fn(tree, str(MIXED)), out))  # fmt: skip


def test_leaf_already_at_dtype_is_returned_as_is():
    x = jnp.ones(3, jnp.bfloat16)
    assert MIXED.cast_to_compute({"x": x})["x"] is x


def test_values_of_exact_casts(transform):
    tree = {"w": jnp.asarray([0.5, -2.0, 3.0], jnp.float32), "n": jnp.asarray([1, 2], jnp.int32)}
    out = transform(MIXED.cast_to_compute)(tree)
    assert out["w"].dtype == BF16 and out["n"].dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out["w"], np.float64), [0.5, -2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(out["n"]), [1, 2])


def test_shape_dtype_structs_get_the_dtype():
    tree = {
        "w": jax.ShapeDtypeStruct((2, 3), jnp.float32),
        "i": jax.ShapeDtypeStruct((2,), jnp.int8),
    }
    out = MIXED.cast_to_compute(tree)
    assert out["w"].shape == (2, 3) and out["w"].dtype == BF16
    assert out["i"] is tree["i"]


class _Net(eqx.Module):
    layers: list  # [(weight, bias), ...]
    activation: Callable
    name: str = eqx.field(static=True)

    def __call__(self, x):
        for w, b in self.layers[:-1]:
            x = self.activation(hnp.add(hnp.matmul(x, w), b))
        w, b = self.layers[-1]
        return hnp.add(hnp.matmul(x, w), b)


def test_equinox_module():
    rng = np.random.default_rng(0)
    layers = [
        (jnp.asarray(rng.standard_normal((4, 8)), jnp.float32), jnp.zeros(8, jnp.float32)),
        (jnp.asarray(rng.standard_normal((8, 3)), jnp.float32), jnp.zeros(3, jnp.float32)),
    ]
    model = _Net(layers, jax.nn.relu, "net")
    out = MIXED.cast_to_compute(model)
    assert isinstance(out, _Net)
    arrays = jax.tree.leaves(eqx.filter(out, eqx.is_array))
    assert len(arrays) == 4 and all(a.dtype == BF16 for a in arrays)
    assert out.activation is jax.nn.relu and out.name == "net"
    y = eqx.filter_jit(out)(jnp.ones(4, jnp.bfloat16))
    assert y.dtype == BF16 and y.shape == (3,)
    back = MIXED.cast_to_param(out)
    assert all(a.dtype == F32 for a in jax.tree.leaves(eqx.filter(back, eqx.is_array)))
    # bfloat16 holds these weights to 8 bits: the round trip is the bfloat16 rounding of each
    for w0, w1 in zip(jax.tree.leaves(model), jax.tree.leaves(back), strict=True):
        if eqx.is_array(w0):
            ref = np.asarray(w0).astype(ml_dtypes.bfloat16).astype(np.float32)  # f32 -> bf16: once
            np.testing.assert_array_equal(np.asarray(w1), ref)


class _WithInts(eqx.Module):
    weight: jax.Array
    table: jax.Array  # int32 indices: never cast
    flag: bool


def test_equinox_module_integer_fields_untouched():
    m = _WithInts(jnp.ones(2), jnp.arange(3), True)
    out = MIXED.cast_to_compute(m)
    assert out.weight.dtype == BF16 and out.table is m.table and out.flag is True


# ---- correct rounding ----------------------------------------------------------------------------------


def _round_reference(x: float, dtype: np.dtype) -> float:
    """``x`` rounded once to the nearest finite value of ``dtype``, ties to even, from Fractions."""
    info = ml_dtypes.finfo(dtype)
    mant = info.nmant
    v = Fraction(x)
    if v == 0:
        return 0.0
    sign, v = (-1 if v < 0 else 1), abs(v)
    e = max(v.numerator.bit_length() - v.denominator.bit_length(), int(info.minexp))
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    e = max(e, int(info.minexp))
    ulp = Fraction(2) ** (e - mant)
    q, r = divmod(v, ulp)
    if r > ulp / 2 or (r == ulp / 2 and q % 2 == 1):
        q += 1
    return sign * float(q * ulp)


def _halfway_values() -> np.ndarray:
    rng = np.random.default_rng(0)
    base = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 0.75 + 2**-10]  # exact ties
    nudged = [b + s * 2**-30 for b in base for s in (-1, 1)]  # just off a tie: one rounding decides
    sub = [2**-140 + 2**-150, 3 * 2**-134, 2**-25 + 2**-40]  # bfloat16 / float16 subnormal range
    rand = rng.standard_normal(64) * 2.0 ** rng.integers(-20, 10, 64)
    vals = np.asarray([*base, *nudged, *sub, *rand], np.float64)
    return np.concatenate([vals, -vals])


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_float64_master_rounds_once_like_heddle_astype(target, transform):
    dst = np.dtype(getattr(ml_dtypes, target, target))
    with jax.enable_x64(True):
        master = jnp.asarray(_halfway_values(), jnp.float64)
        prec = Precision("float64", target, "float64")
        got = transform(prec.cast_to_compute)({"w": master})["w"]
        assert got.dtype == dst
        bits = np.asarray(got).view(np.uint16)
        np.testing.assert_array_equal(
            bits, np.asarray(jax.jit(hnp.astype, static_argnums=1)(master, dst)).view(np.uint16)
        )
        ref = np.asarray([_round_reference(float(v), dst) for v in np.asarray(master)])
        np.testing.assert_array_equal(np.asarray(got, np.float64), ref)
        # the values do discriminate: a cast through float32 rounds some of them twice
        twice = np.asarray(master).astype(np.float32).astype(dst).astype(np.float64)
        assert np.any(twice != ref)


def test_host_float64_leaf_without_x64():
    vals = _halfway_values()
    got = MIXED.cast_to_compute({"w": vals})["w"]  # NumPy float64 on the host, x64 off
    ref = np.asarray([_round_reference(float(v), BF16) for v in vals])
    assert got.dtype == BF16
    np.testing.assert_array_equal(np.asarray(got, np.float64), ref)


def test_float64_precision_without_x64_is_a_precision_error():
    prec = Precision.parse("float64")  # the value is metadata: building it is fine
    with jax.enable_x64(False):
        with pytest.raises(policy.PrecisionError, match="jax_enable_x64"):
            prec.cast_to_param({"w": jnp.ones(2)})
    with jax.enable_x64(True):  # the fix the message names
        assert prec.cast_to_param({"w": jnp.ones(2)})["w"].dtype == F64


# ---- gradients through the casts -------------------------------------------------------------------


def _loss(prec):
    def loss(params, x):
        p = prec.cast_to_compute(params)
        y = hnp.matmul(prec.cast_to_compute(x), p["w"])
        return hnp.sum(prec.cast_to_output(y))

    return loss


@pytest.mark.parametrize("grad", [jax.grad, autodiff.grad], ids=["jax", "heddle"])
def test_gradient_of_float32_master_is_float32(grad, transform):
    prec = Precision.parse("mixed_bfloat16")
    params = {"w": jnp.full((3, 2), 0.5, jnp.float32)}
    x = jnp.asarray([[1.0, 2.0, 3.0]], jnp.float32)
    g = transform(grad(_loss(prec)))(params, x)
    assert g["w"].dtype == F32
    # d/dw sum(x @ w) = x^T 1: exact in bfloat16
    np.testing.assert_array_equal(np.asarray(g["w"]), [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])


@pytest.mark.parametrize("grad", [jax.grad, autodiff.grad], ids=["jax", "heddle"])
def test_gradient_through_the_correctly_rounded_float64_cast(grad, transform):
    # float64 -> bfloat16 takes the bit-exact rounding path; its derivative is still the identity
    with jax.enable_x64(True):
        prec = Precision("float64", "bfloat16", "float64")
        params = {"w": jnp.full((3, 2), 1 + 2**-8 + 2**-30, jnp.float64)}
        x = jnp.asarray([[1.0, 2.0, 3.0]], jnp.float64)
        g = transform(grad(_loss(prec)))(params, x)
        assert g["w"].dtype == F64
        np.testing.assert_array_equal(np.asarray(g["w"]), [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])


# ---- loss-scale states are left alone ---------------------------------------------------------


@pytest.mark.parametrize("cast", ["cast_to_param", "cast_to_compute", "cast_to_output"])
@pytest.mark.parametrize("spec", ["float16", "bfloat16", "mixed_float16"])
def test_casts_leave_loss_scale_states_alone(cast, spec, transform):
    """A whole train state cast to float16 used to turn the float32 loss scale into float16."""
    import optax

    from heddle import scaling

    opt = scaling.dynamic_loss_scale(optax.sgd(0.1, momentum=0.9))
    params = {"w": jnp.ones(3, F32)}
    train = {
        "params": params,
        "opt": opt.init(params),
        "static": scaling.StaticLossScale.create(2.0**10),
    }
    out = transform(lambda t: getattr(Precision.parse(spec), cast)(t))(train)
    p = Precision.parse(spec)
    want = {"cast_to_param": p.param_dtype, "cast_to_compute": p.compute_dtype}.get(
        cast, p.output_dtype
    )
    assert out["params"]["w"].dtype == want  # the rest of the tree is still cast
    assert out["opt"].inner_state[0].trace["w"].dtype == F32  # optax's state keeps its dtypes
    for kept, orig in (
        (out["opt"].loss_scale, train["opt"].loss_scale),
        (out["static"], train["static"]),
    ):
        assert type(kept) is type(orig)
        for a, b in zip(kept, orig, strict=True):
            assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert scaling.loss_scale(out["opt"]).dtype == F32


@pytest.mark.parametrize("spec", ["float16", "mixed_float16", "bfloat16"])
def test_casts_leave_optax_states_alone(spec, transform):
    """A train state cast to float16 used to turn Adam's eps=1e-8 into 0 and an injected
    hyperparameter of 2**24 into inf; optimiser states keep the optimiser's dtypes."""
    import optax

    from heddle import scaling

    params = {"w": jnp.ones(3, F32)}
    opts = [
        optax.adam(1e-3),
        optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, eps=1e-8),
        optax.inject_hyperparams(scaling.dynamic_loss_scale)(
            optax.sgd(0.1), init_scale=2.0**15, max_scale=2.0**24
        ),
        optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3, mu_dtype=jnp.bfloat16)),
    ]
    p = Precision.parse(spec)
    for opt in opts:
        state = opt.init(params)
        out = transform(lambda s: p.cast_to_compute((params, s)))(state)
        assert out[0]["w"].dtype == p.compute_dtype
        before, after = jax.tree.leaves(state), jax.tree.leaves(out[1])
        assert [a.dtype for a in after] == [b.dtype for b in before]
        for a, b in zip(after, before, strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
