"""Repeated eager calls take a cached path (one lookup, one kernel); it must answer exactly as the
first call, which resolves everything, would. Each test makes the same call shape twice or more,
the later calls on the cached path, and checks them against independent expectations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import heddle.numpy as hnp
from heddle import policy

BF16 = ml_dtypes.bfloat16


def test_repeated_calls_agree_with_exact_values():
    a = jnp.asarray([1.0, 2.5, -3.0], BF16)
    for _ in range(3):
        out = hnp.multiply(a, 3.0)
        assert out.dtype == BF16
        assert np.asarray(out, np.float64).tolist() == [3.0, 7.5, -9.0]


def test_signed_zero_scalars_are_not_confused():
    a = jnp.asarray([1.0, 2.0], BF16)
    for _ in range(2):
        assert not np.signbit(np.asarray(hnp.multiply(a, 0.0), np.float32)).any()
        assert np.signbit(np.asarray(hnp.multiply(a, -0.0), np.float32)).all()


@pytest.mark.parametrize("order", [(0.0, -0.0), (-0.0, 0.0)], ids=["plus-first", "minus-first"])
def test_signed_zero_hyper_parameters_do_not_share_a_kernel(order):
    # a float_op's non-array arguments key its kernels: 0.0 == -0.0 in Python, not in its bits
    import heddle.nn

    x = jnp.asarray([-1.0, -2.0], BF16)
    for slope in (*order, *order):
        got = np.signbit(np.asarray(heddle.nn.leaky_relu(x, slope), np.float32))
        want = np.signbit(np.float64(-1.0) * slope)  # float64: -1 * 0.0 = -0.0
        assert (got == want).all(), (order, slope)


def test_scalar_range_errors_every_time():
    a = jnp.zeros(3, jnp.uint8)
    assert hnp.add(a, 2).dtype == jnp.uint8  # the call shape is cached by now
    assert hnp.add(a, 2).dtype == jnp.uint8
    for _ in range(2):
        with pytest.raises(policy.ScalarRangeError, match="-2"):
            hnp.add(a, -2)
    assert np.asarray(hnp.add(a, 255)).tolist() == [255] * 3


def test_bool_int_and_float_scalars_of_equal_value_keep_their_kinds():
    a = jnp.zeros(2, jnp.int8)
    assert hnp.add(a, 1).dtype == jnp.int8
    assert hnp.add(a, True).dtype == jnp.int8
    assert hnp.add(a, 1.0).dtype == jnp.float32  # an integer array and a float: the default float
    assert hnp.add(a, 1).dtype == jnp.int8


def test_a_policy_switch_between_calls_is_seen():
    a, b = jnp.ones(2, jnp.int32), jnp.ones(2, jnp.uint32)
    with policy.use(policy.JAX):  # JAX's lattice: int32 with uint32 is int32 (x64 off)
        assert hnp.add(a, b).dtype == jnp.int32
        assert hnp.add(a, b).dtype == jnp.int32
    with pytest.raises(policy.PrecisionError):  # heddle: int64 holds both, and needs x64
        hnp.add(a, b)
    with policy.use(policy.JAX):
        assert hnp.add(a, b).dtype == jnp.int32


def test_x64_switch_between_calls_is_seen():
    with jax.enable_x64(True):
        a = jnp.ones(2, jnp.float64)
        assert hnp.add(a, a).dtype == jnp.float64
        assert hnp.add(a, a).dtype == jnp.float64
    with pytest.raises(policy.PrecisionError):  # a float64 array kept past the x64 context
        hnp.add(a, a)


def test_static_arguments_are_part_of_the_call_shape():
    x = jnp.asarray([[1.0, 2.0], [3.0, 4.0]], BF16)
    for _ in range(2):
        assert np.asarray(hnp.sum(x, 0), np.float32).tolist() == [4.0, 6.0]
        assert np.asarray(hnp.sum(x, 1), np.float32).tolist() == [3.0, 7.0]
        assert np.asarray(hnp.sum(x, axis=1, keepdims=True), np.float32).tolist() == [[3.0], [7.0]]
        assert hnp.sum(x, dtype=jnp.float32).dtype == jnp.float32
        assert float(hnp.sum(x)) == 10.0


def test_weak_typed_and_host_operands_still_checked():
    a = jnp.zeros(2, jnp.uint8)
    weak = jnp.asarray(-2)  # a weak-typed array: the range check needs its value
    assert weak.weak_type
    for _ in range(2):
        with pytest.raises(policy.ScalarRangeError):
            hnp.add(a, weak)
        host = hnp.add(np.ones(2, np.float16), np.ones(2, np.float16))
        assert host.dtype == jnp.float16 and np.asarray(host).tolist() == [2.0, 2.0]


def test_traced_calls_after_eager_ones():
    a = jnp.asarray([1.0, 2.0], BF16)
    hnp.exp(a)
    hnp.exp(a)
    jaxpr = jax.make_jaxpr(hnp.exp)(a)
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names == ["convert_element_type", "exp", "convert_element_type"], names


def test_out_of_range_ints_wrap_like_jax_under_the_jax_policy():
    a = jnp.asarray([0, 1], jnp.uint8)
    with policy.use(policy.JAX):  # no range checks: JAX's own behaviour, two's complement
        for _ in range(2):
            got = hnp.add(a, -2)
            assert got.dtype == jnp.uint8 and np.asarray(got).tolist() == [254, 255]
            assert np.asarray(hnp.add(jnp.asarray([0], jnp.int8), 130)).tolist() == [-126]
    with pytest.raises(policy.ScalarRangeError):
        hnp.add(a, -2)


def test_call_shapes_differing_only_in_dtype_or_weak_type_do_not_share_a_kernel():
    b = jnp.asarray([1.0, 2.5], BF16)
    h = jnp.asarray([1.0, 2.5], jnp.float16)
    strong = jnp.asarray([1.0, 2.5], jnp.float32)
    weak = jnp.asarray(2.5)  # weakly typed float32: takes the other operand's dtype
    assert weak.weak_type
    for _ in range(2):
        for x, d in ((b, BF16), (h, np.float16)):
            out = hnp.multiply(x, 3.0)
            assert out.dtype == d and np.asarray(out, np.float64).tolist() == [3.0, 7.5]
        assert hnp.add(b, weak).dtype == BF16
        assert hnp.add(b, strong).dtype == np.float32  # float32 holds bfloat16


def test_narrow_matmul_operands_reach_the_dot_unwidened():
    from heddle.ops import lowering

    assert not lowering.widens_narrow_contractions("matmul")
    assert not lowering.widens_narrow_contractions("tensordot")  # decided dot by dot
    assert lowering.widens_narrow_contractions("convolve") == (jax.default_backend() == "cpu")
    a = jnp.asarray([[1.0, 2.0]], BF16)
    eqns = jax.make_jaxpr(lambda x: hnp.matmul(x, x.T))(a).jaxpr.eqns
    (dot,) = [e for e in eqns if e.primitive.name == "dot_general"]
    assert [v.aval.dtype for v in dot.invars] == [BF16] * 2
    assert dot.outvars[0].aval.dtype == np.float32
