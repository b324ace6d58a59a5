"""Drop-in names of heddle.numpy: the array API metadata, astype's signature, the ufunc methods.

References: the array API standard's names and heddle's documented defaults; for the ufunc methods,
NumPy's own ufunc methods in float64 rounded once to the narrow dtype (``_round.round_once``).
"""

from __future__ import annotations

import inspect
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _round import round_once, same_bits  # tests/ops is on sys.path

import heddle
import heddle.numpy as hnp
from heddle.ops import _ufunc

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
TRANSFORMS = [lambda f: f, jax.jit]
IDS = ["eager", "jit"]

# --- the array API metadata ----------------------------------------------------------------------


def test_array_api_version_is_jax_numpys():
    assert hnp.__array_api_version__ == jnp.__array_api_version__
    assert isinstance(hnp.__array_api_version__, str)


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_namespace_info_reports_heddles_defaults(x64):
    with jax.enable_x64(x64):
        info = hnp.__array_namespace_info__()
        want = {
            "real floating": np.dtype("float32"),
            "complex floating": np.dtype("complex64"),
            "integral": np.dtype("int32"),
            "indexing": np.dtype("int32"),
        }
        assert info.default_dtypes() == want
        assert info.default_dtypes(device=jax.devices()[0]) == want
        # the rest is the array API's: JAX's dtypes, devices and capabilities
        assert info.dtypes() == jnp.__array_namespace_info__().dtypes()
        assert info.capabilities() == jnp.__array_namespace_info__().capabilities()
        assert None in info.devices() and info.default_device() is None


def test_namespace_info_follows_the_active_policy():
    with heddle.policy.default_dtypes(float="bfloat16"):
        assert hnp.__array_namespace_info__().default_dtypes()["real floating"] == BF16
        # the default it reports is the one heddle uses
        assert hnp.asarray(1.0).dtype == BF16


# --- astype ----------------------------------------------------------------------------------------


def test_astype_has_jax_numpys_signature():
    ours, theirs = inspect.signature(hnp.astype), inspect.signature(jnp.astype)
    for name in ("copy", "device"):
        assert ours.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert ours.parameters[name].default == theirs.parameters[name].default
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.parameters.values())
    assert heddle.astype is hnp.astype


def test_astype_refuses_an_unknown_keyword():
    x = jnp.ones(3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'copyy'"):
        hnp.astype(x, "bfloat16", copyy=True)
    assert hnp.astype(x, "bfloat16", copy=True).dtype == BF16  # the keyword meant


def test_astype_copy_and_device():
    x = jnp.arange(3.0)
    assert hnp.astype(x, "float32") is x  # copy=False: may return the input
    y = hnp.astype(x, "float32", copy=True)
    assert y is not x and np.array_equal(y, x)
    d = jax.devices()[0]
    z = hnp.astype(x, "float16", device=d)
    assert z.dtype == F16 and z.devices() == {d}
    with pytest.raises(TypeError):
        hnp.astype(x, "float16", "copy-as-positional")  # copy and device are keyword-only


# --- the ufunc methods -----------------------------------------------------------------------------

UFUNCS = _ufunc.ufunc_names()


def test_every_binary_jax_numpy_ufunc_has_the_methods():
    assert {"add", "multiply", "maximum", "logaddexp", "subtract"} <= set(UFUNCS)
    for name in UFUNCS:
        op, theirs = getattr(hnp, name), getattr(jnp, name)
        for method in ("outer", "reduce", "accumulate", "reduceat", "at"):
            ours = inspect.signature(getattr(op, method))
            want = inspect.signature(getattr(theirs, method))
            assert list(ours.parameters) == list(want.parameters), (name, method)
            assert getattr(op, method).__doc__, (name, method)
        assert (op.nin, op.nout) == (theirs.nin, theirs.nout) == (2, 1)
        assert op.identity == theirs.identity or (
            np.isnan(op.identity) and np.isnan(theirs.identity)
        )


FLOAT_UFUNCS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
                "maximum": np.maximum, "minimum": np.minimum, "logaddexp": np.logaddexp,
                "logaddexp2": np.logaddexp2}  # fmt: skip


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
@pytest.mark.parametrize("name", sorted(FLOAT_UFUNCS))
def test_outer_is_the_op_on_every_pair_rounded_once(name, transform):
    rng = np.random.default_rng(0)
    a = rng.normal(size=5).astype(BF16)
    b = rng.normal(size=(2, 3)).astype(BF16)
    got = np.asarray(transform(getattr(hnp, name).outer)(a, b))
    ref = FLOAT_UFUNCS[name].outer(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == (5, 2, 3)
    assert same_bits(got, round_once(ref, BF16))


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
def test_logaddexp_reduce_and_accumulate_in_float32(transform):
    x = np.zeros(1000, BF16)
    acc = np.asarray(transform(hnp.logaddexp.accumulate)(x))
    want = round_once(np.log(np.arange(1, 1001, dtype=np.float64)), BF16)
    # float32 running values rounded once: within one bfloat16 ulp of log(k) (the running float32
    # sum differs from log(k) by far less than an ulp, so only ties could round the other way)
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64) * 2**16
    assert np.all(np.abs(acc.astype(np.float64) - np.log(np.arange(1, 1001))) <= ulp / 2 + 1e-6)
    assert np.mean(acc == want) > 0.99
    red = transform(hnp.logaddexp.reduce)(x)
    assert same_bits(np.asarray(red), round_once(np.float64(math.log(1000)), BF16))


def test_jax_numpys_bfloat16_accumulate_drifts_where_heddles_does_not():
    x = np.zeros(1000, BF16)
    err = np.abs(np.asarray(jnp.logaddexp.accumulate(x))[-1].astype(float) - math.log(1000))
    ours = np.abs(np.asarray(hnp.logaddexp.accumulate(x))[-1].astype(float) - math.log(1000))
    assert ours <= 2**-5 / 2 < err  # half a bfloat16 ulp at 6.9 for heddle; JAX's is larger


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
def test_add_and_multiply_reduce_like_sum_and_prod(transform):
    x = np.full(4096, 0.1, BF16)
    total = float(transform(hnp.add.reduce)(x))
    assert total == float(round_once(np.float64(4096 * float(x[0])), BF16))
    run = np.asarray(transform(hnp.add.accumulate)(x))
    k = np.arange(1, 4097, dtype=np.float64) * float(x[0])
    assert same_bits(run, round_once(k, BF16))
    small = np.array([100, 100, 100], np.int8)
    assert int(hnp.add.reduce(small)) == 300 and hnp.add.reduce(small).dtype == np.int32
    assert hnp.multiply.reduce(np.array([1.5, 2.0], F16)) == 3.0


def test_reduce_arguments_and_other_ufuncs():
    x = np.arange(6, dtype=F16).reshape(2, 3)
    assert np.array_equal(hnp.maximum.reduce(x, axis=1), np.array([2, 5], F16))
    assert hnp.maximum.reduce(x, axis=None, keepdims=True).shape == (1, 1)
    assert float(hnp.add.reduce(x, axis=None, initial=10.0)) == 25.0
    assert bool(hnp.logical_and.reduce(np.array([True, False]))) is False
    assert int(hnp.bitwise_or.reduce(np.array([1, 2, 4], np.uint8))) == 7
    assert np.array_equal(hnp.add.reduceat(np.arange(6, dtype=F16), np.array([0, 2])), [1, 14])
    assert hnp.logaddexp.reduce(np.zeros(3, np.int32)).dtype == np.float32  # int: default float


def test_out_is_refused_with_the_fix():
    x = np.ones(3, F16)
    with pytest.raises(NotImplementedError, match=r"use the returned array: y = heddle.numpy"):
        hnp.add.reduce(x, out=np.empty((), F16))
    y = hnp.add.reduce(x)  # the fix the message gives
    assert float(y) == 3.0


@pytest.mark.parametrize("transform", TRANSFORMS, ids=IDS)
def test_at_combines_repeated_indices_in_float32(transform):
    # 4096 additions of 0.1 at one index: float32 running sum, rounded once to bfloat16
    a = np.zeros(2, BF16)
    idx = np.zeros(4096, np.int32)
    b = np.full(4096, 0.1, BF16)
    got = np.asarray(transform(lambda a, b: hnp.add.at(a, idx, b, inplace=False))(a, b))
    assert got.dtype == BF16
    want = round_once(np.array([4096 * float(b[0]), 0.0]), BF16)
    assert same_bits(got, want)
    narrow = np.asarray(jnp.add.at(jnp.asarray(a), idx, b, inplace=False))
    assert not same_bits(narrow, want)  # jax.numpy's bfloat16 scatter-add stalls


def test_at_in_place_is_refused_with_the_fix():
    a = np.zeros(3, F16)
    with pytest.raises(NotImplementedError, match=r"pass inplace=False and use the result"):
        hnp.add.at(a, 0, 1.0)
    assert float(hnp.add.at(a, 0, 1.0, inplace=False)[0]) == 1.0  # the fix the message gives
