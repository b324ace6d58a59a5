"""The correctly rounded cast (POLICY.md 6), checked bit for bit against an exact reference.

The reference (``_reference.py``) decodes bit patterns to exact integers and rounds with integer
and ``fractions.Fraction`` arithmetic on the host: no XLA, no ml_dtypes, no float arithmetic that a
backend could flush to zero. Every test compares ``astype`` with it, never with ``astype`` itself.
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

import _reference as ref  # tests/policy is on sys.path (pytest rootdir-less import)
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from heddle.policy._casts import _ROUTES, astype, route
from heddle.policy._dtypes import DTYPES, kind
from heddle.policy._errors import PrecisionError, PromotionError, UnknownDTypeError

REAL = [d for d in DTYPES if kind(d) != "c"]
NARROW = [d for d in REAL if not (d.itemsize == 8)]  # available without x64
WIDE = [d for d in REAL if d.itemsize == 8]
FLOATS = [d for d in REAL if kind(d) == "f"]
SMALL_FLOATS = [np.dtype(getattr(ml_dtypes, n, None) or n) for n in ref.SMALL]
SMALL_INTS = [d for d in REAL if kind(d) in "biu" and d.itemsize <= 2]


def dt(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


# one program per (target, saturate) for the one-value tests (eager casts compile every primitive)
cast = jax.jit(astype, static_argnums=1, static_argnames="saturate")


def _raw(r: jax.Array) -> jax.Array:
    """The bits of a result as an unsigned word (exact: a bitcast, or an integer's two's complement)."""
    d = np.dtype(r.dtype)
    word = jnp.uint64 if d.itemsize == 8 else jnp.uint32
    if kind(d) == "f":
        r = jax.lax.bitcast_convert_type(
            r,
            jnp.uint4 if d.itemsize * 8 > ref.FORMATS[d.name].nbits else np.dtype(f"u{d.itemsize}"),
        )
    return jax.lax.convert_element_type(r, word)


def _unraw(w: np.ndarray, d: np.dtype) -> np.ndarray:
    if kind(d) == "f":
        return w.astype(f"u{d.itemsize}").view(d)
    return (
        w.view(f"i{w.dtype.itemsize}").astype(np.int64).astype(d) if kind(d) == "i" else w.astype(d)
    )


def compare(x: np.ndarray, d: np.dtype, saturate: bool, got) -> None:
    """Fails with examples unless ``got`` is the reference cast of ``x`` to ``d``."""
    got = np.asarray(got)
    assert got.dtype == d, (x.dtype, d, got.dtype)
    want = ref.reference_cast(x, d.name, saturate=saturate)
    bad = ref.mismatches(got, want)
    if bad.any():
        i = np.flatnonzero(bad)[:6]
        pytest.fail(
            f"{x.dtype} -> {d} (saturate={saturate}, path {route(x.dtype, d)}): "
            f"{bad.sum()} of {bad.size} wrong, e.g. {x[i]!r} -> {got[i]!r}, want {want[i]!r}"
        )


Job = tuple[int, np.dtype, bool]  # input index, target, saturate


def verify(inputs: list[np.ndarray], jobs: list[Job]) -> None:
    """Runs every cast in one jitted program and compares each result with the reference.

    Results are stacked four at a time as raw words, so that XLA fuses each group into one kernel:
    compiling a kernel per cast would dominate the test time.
    """
    groups: list[list[Job]] = []
    for wide in (False, True):  # one word width per stack
        same = [j for j in jobs if (j[1].itemsize == 8) == wide]
        groups += [same[i : i + 4] for i in range(0, len(same), 4)]

    def run(*xs):
        return [jnp.stack([_raw(astype(xs[i], d, saturate=s)) for i, d, s in g]) for g in groups]

    n = max(len(x) for x in inputs)  # one length, so that any results stack
    outs = jax.jit(run)(*(jnp.asarray(np.resize(x, n)) for x in inputs))
    for g, words in zip(groups, outs, strict=True):
        words = np.asarray(words)
        for k, (i, d, s) in enumerate(g):
            compare(inputs[i], d, s, _unraw(words[k][: len(inputs[i])], d))


def check(x: np.ndarray, targets: list[np.dtype], *, saturate: bool = False, fn=None) -> None:
    """Casts ``x`` to every target (in one jitted program unless ``fn`` is given) and compares."""
    if fn is None:
        verify([x], [(0, d, saturate) for d in targets])
        return
    for d, got in zip(targets, fn(jnp.asarray(x)), strict=True):
        compare(x, d, saturate, got)


def check_each(pairs: list[tuple[np.ndarray, np.dtype]], *, saturate: bool = False) -> None:
    """Casts each input to its own target, all in one jitted program, and compares each."""
    verify([x for x, _ in pairs], [(i, d, saturate) for i, (_, d) in enumerate(pairs)])


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ---------------------------------------------------------------------------------------------
# The reference itself


def test_reference_formats_match_their_definitions():
    for name, fmt in ref.FORMATS.items():
        fi = ml_dtypes.finfo(dt(name))
        assert (fmt.ebits, fmt.mbits, fmt.nbits) == (fi.nexp, fi.nmant, fi.bits), name
        assert float(fmt.max_value) == float(fi.max), name
        if fmt.nbits <= 16:  # every decoded value equals ml_dtypes' value (exact in float64)
            x = ref.all_patterns(fmt)
            cls, sign, m, q = ref.decode_array(ref.bits_of(x), fmt)
            with np.errstate(invalid="ignore"):
                theirs = x.astype(np.float64)
            ours = np.where(sign == 1, -1.0, 1.0) * np.ldexp(m.astype(np.float64), q)
            fin = cls == ref.FINITE
            np.testing.assert_array_equal(np.isnan(theirs), cls == ref.NAN, err_msg=name)
            np.testing.assert_array_equal(np.isinf(theirs), cls == ref.INF, err_msg=name)
            np.testing.assert_array_equal(ours[fin], theirs[fin], err_msg=name)


def _fraction_rounding(x: np.ndarray, fmt: ref.Format, saturate: bool) -> np.ndarray:
    out = []
    for v in x.ravel():
        if x.dtype.kind in "iu":
            val, neg = Fraction(int(v)), False
        else:
            src = ref.FORMATS[x.dtype.name]
            b = int(ref.bits_of(np.asarray([v]))[0])
            val, neg = ref.value_scalar(b, src), ref.decode_scalar(b, src)[0] == 1
        out.append(ref.round_scalar(val, fmt, saturate, negative_zero=neg))
    return np.array(out, np.uint64)


@pytest.mark.parametrize("saturate", [False, True])
def test_reference_array_rounding_matches_fraction_rounding(saturate):
    rng = np.random.default_rng(1)
    sources = [ref.all_patterns(ref.FORMATS[n]) for n in ref.SMALL if ref.FORMATS[n].nbits <= 8]
    sources = [rng.choice(x, min(len(x), 64 if saturate else 128), replace=False) for x in sources]
    sources += [
        rng.choice(ref.float32_cases(0), 400),
        rng.choice(ref.float64_cases(64), 400),
        rng.choice(ref.int_cases(np.int64, 4), 200),
        rng.choice(ref.int_cases(np.uint64, 4), 200),
    ]
    for x in sources:
        for name, fmt in ref.FORMATS.items():
            fast = ref.bits_of(ref.reference_cast(x, name, saturate))
            slow = _fraction_rounding(x, fmt, saturate)
            bad = (fast != slow) & ~(ref.is_nan_bits(fast, fmt) & ref.is_nan_bits(slow, fmt))
            assert not bad.any(), (x.dtype, name, x[bad][:5], fast[bad][:5], slow[bad][:5])


# ---------------------------------------------------------------------------------------------
# Exhaustive and near-halfway sources, every target, under jit


@pytest.mark.parametrize("src", SMALL_FLOATS, ids=str)
def test_every_small_float_pattern_to_every_target(src):
    x = ref.all_patterns(ref.FORMATS[src.name])
    verify([x], [(0, d, False) for d in NARROW] + [(0, d, True) for d in saturating(src)])


def saturating(src: np.dtype) -> list[np.dtype]:
    """Float targets where saturation can change a cast from ``src``: those with a smaller largest
    value, or without the infinities ``src`` has, and the two formats without NaN or zero."""
    s = ref.FORMATS[src.name]
    return [
        d
        for d in FLOATS
        if d.itemsize < 8
        and (
            ref.FORMATS[d.name].max_value < s.max_value
            or (s.has_inf and not ref.FORMATS[d.name].has_inf)
            or d.name in ("float4_e2m1fn", "float8_e8m0fnu")
        )
    ]


def test_every_small_float_pattern_to_64_bit_targets(x64):
    inputs = [ref.all_patterns(ref.FORMATS[src.name]) for src in SMALL_FLOATS]
    verify(inputs, [(i, d, False) for i in range(len(inputs)) for d in WIDE])


def _all_values(src: np.dtype) -> np.ndarray:
    lo, hi = (0, 1) if src == np.bool_ else (ml_dtypes.iinfo(src).min, ml_dtypes.iinfo(src).max)
    return np.arange(int(lo), int(hi) + 1).astype(src)


@pytest.mark.parametrize("src", SMALL_INTS, ids=str)
def test_every_small_integer_to_every_target(src):
    x = _all_values(src)
    few_floats = [dt("float4_e2m1fn"), dt("float8_e4m3fn"), dt("float8_e8m0fnu")]
    narrower = [d for d in NARROW if kind(d) in "iu" and ref.INT_BITS[d.name] < 8 * src.itemsize]
    if src.itemsize == 1 and kind(src) != "b":  # sub-byte and 8-bit sources: every integer target
        narrower = [d for d in NARROW if kind(d) in "iu"]
    verify([x], [(0, d, False) for d in NARROW] + [(0, d, True) for d in narrower + few_floats])


def _int_rows(src: str, per_binade: int) -> list[tuple[np.ndarray, np.dtype]]:
    extremes = ref.int_cases(dt(src), per_binade=0)
    return [
        (np.concatenate([extremes, ref.int_near(dt(src), d.name, per_binade)]), d)
        for d in FLOATS
        if d.itemsize < 8 or jax.config.jax_enable_x64
    ]


@pytest.mark.parametrize("src", ["int32", "uint32"])
def test_32_bit_integers_near_every_halfway_point(src):
    rows = _int_rows(src, per_binade=32)
    check_each(rows)
    check_each(rows, saturate=True)
    sample = np.concatenate([x[::9] for x, _ in rows])
    check(sample, [d for d in NARROW if kind(d) != "f"])
    check(sample, [d for d in NARROW if kind(d) in "iu"], saturate=True)


@pytest.mark.parametrize("src", ["int64", "uint64"])
def test_64_bit_integers_near_every_halfway_point(src, x64):
    rows = _int_rows(src, per_binade=6)
    check_each(rows)
    check_each([(x[::5], d) for x, d in rows], saturate=True)
    sample = np.concatenate([x[::17] for x, _ in rows])
    check(sample, [d for d in REAL if kind(d) != "f"])
    check(sample, [d for d in REAL if kind(d) in "iu"], saturate=True)


def test_float32_halfway_points_and_random_patterns():
    """Every halfway point of every narrower format with neighbours 1 and 2 ulps either side, and
    2**24 random float32 patterns spread over those formats."""
    targets = [d for d in FLOATS if d.itemsize < 4]
    rng = np.random.default_rng(2)
    randoms = rng.integers(0, 2**32, 2**24, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = ref.special_floats(np.float32)
    near = {d: np.concatenate([specials, ref.float32_near(d.name)]) for d in targets}
    chunks = np.array_split(randoms, len(targets))
    check_each([(np.concatenate([near[d], c]), d) for d, c in zip(targets, chunks, strict=True)])
    check_each([(near[d], d) for d in targets], saturate=True)
    sample = np.concatenate([specials, *(x[::16] for x in near.values()), randoms[: 2**16]])
    check(sample, [d for d in NARROW if kind(d) != "f"])


def test_float32_to_64_bit_targets(x64):
    x = np.concatenate([ref.float32_cases(2**16)[::4], ref.special_floats(np.float32)])
    check(x, WIDE)


def test_float64_halfway_points_every_target(x64):
    """Halfway points of every narrower float format, neighbours 1 and 2 ulps away, relative
    perturbations 2**-30 .. 2**-52 either side, underflow and overflow boundaries, zeros, NaNs with
    payloads, infinities."""
    specials = ref.special_floats(np.float64)
    rows = [(np.concatenate([specials, ref.float64_near(d.name)]), d) for d in FLOATS[:-1]]
    check_each(rows)
    check_each([(x[::4], d) for x, d in rows], saturate=True)
    sample = np.concatenate([specials, *(x[::32] for x, _ in rows)])
    check(sample, [d for d in REAL if kind(d) != "f"] + [dt("float64")])


# ---------------------------------------------------------------------------------------------
# Eager, jit and vmap; host data


def _sample(src: np.dtype, n: int = 256) -> np.ndarray:
    """A fixed-size sample of interesting values of ``src`` (one shape, so eager ops compile once)."""
    if src.name in ref.FORMATS and ref.FORMATS[src.name].nbits <= 16:
        x = ref.all_patterns(ref.FORMATS[src.name])
    elif src == np.float32:
        x = ref.float32_cases(0)
    elif src == np.float64:
        x = ref.float64_cases(16)
    elif src in SMALL_INTS:
        x = _all_values(src)
    else:
        x = ref.int_cases(src, per_binade=1)
    return np.resize(np.random.default_rng(3).permutation(x), n)


MODES = {
    "eager": lambda f: f,
    "jit": jax.jit,
    "vmap": jax.vmap,
    "jit_vmap": lambda f: jax.jit(jax.vmap(f)),
}

# one pair per path and per kind of source (eager mode compiles every primitive: keep it short)
PAIRS = [
    ("float64", "bfloat16"),  # round, float64 word
    ("float64", "float32"),  # round, 64-bit word
    ("float32", "bfloat16"),  # convert
    ("float32", "float64"),  # round, widening with subnormals normalised
    ("bfloat16", "float8_e8m0fnu"),  # round from a narrow float
    ("float16", "float4_e2m1fn"),  # round, format without NaN
    ("int32", "bfloat16"),  # round from an integer
    ("uint64", "float16"),  # convert from a 64-bit integer
    ("float8_e4m3fn", "int8"),  # truncate
    ("float32", "bool"),  # nonzero
    ("int64", "uint4"),  # wrap
]
SATURATING = [("float32", "float8_e4m3fn"), ("float64", "float16"), ("int32", "int8")]


@pytest.mark.parametrize("mode", MODES)
def test_eager_jit_and_vmap_agree_with_the_reference(mode, x64):
    pairs = PAIRS if mode in ("jit", "jit_vmap") else PAIRS[:3]  # eager compiles every primitive
    for src, name in pairs:
        target = dt(name)
        fn = MODES[mode](lambda a, target=target: [astype(a, target)])
        check(_sample(dt(src), 64), [target], fn=fn)
    for src, name in SATURATING if mode in ("jit", "jit_vmap") else SATURATING[:1]:
        target = dt(name)
        fn = MODES[mode](lambda a, target=target: [astype(a, target, saturate=True)])
        check(_sample(dt(src), 64), [target], saturate=True, fn=fn)


def test_numpy_float64_input_rounds_once_with_x64_off():
    assert not jax.config.jax_enable_x64
    x = ref.float64_cases(per_target=64)[::3]
    for d in NARROW:
        got = astype(x, d)
        assert isinstance(got, jax.Array) and got.dtype == d
        bad = ref.mismatches(np.asarray(got), ref.reference_cast(x, d.name))
        assert not bad.any(), (d, x[bad][:5])
    for d in (dt("bfloat16"), dt("float8_e4m3fn"), dt("int8")):
        got = astype(x[:4096], d, saturate=True)
        want = ref.reference_cast(x[:4096], d.name, saturate=True)
        assert not ref.mismatches(np.asarray(got), want).any(), d


def test_numpy_64_bit_integers_with_x64_off():
    for src in ("int64", "uint64"):
        x = ref.int_cases(dt(src), per_binade=1)[::2]
        for d in NARROW:
            got = np.asarray(astype(x, d))
            assert not ref.mismatches(got, ref.reference_cast(x, d.name)).any(), (src, d)


def test_python_scalars_are_float64_and_int64_values():
    # 1 + 2**-8 + 2**-30 lies just above a bfloat16 halfway point: once rounded it goes up;
    # through float32 it would tie down to 1.0
    v = 1 + 2**-8 + 2**-30
    assert float(astype(v, "bfloat16")) == 1 + 2**-7
    assert np.asarray(astype([v, -v], "bf16")).tolist() == [1 + 2**-7, -(1 + 2**-7)]
    big = 2**40 + 2**32 + 1  # an int64 just above a bfloat16 halfway point
    assert int(float(astype(big, "bfloat16"))) == 2**40 + 2**33
    assert float(astype(0.1, "bfloat16")) == float(ml_dtypes.bfloat16(0.1))


def test_float64_device_array_with_x64_turned_off_afterwards():
    with jax.enable_x64(True):
        x = jnp.asarray(np.array([1 + 2**-8 + 2**-30, 4.4e-39]))
    got = np.asarray(astype(x, "bfloat16"))
    want = ref.reference_cast(np.array([1 + 2**-8 + 2**-30, 4.4e-39]), "bfloat16")
    assert not ref.mismatches(got, want).any()


# ---------------------------------------------------------------------------------------------
# Documented behaviour, one value at a time


def bits(x) -> int:
    return int(ref.bits_of(np.asarray(x).reshape(1))[0])


SPECIAL_CASES = [  # value, target, saturate, expected
    (
        464.0,
        "float8_e4m3fn",
        False,
        np.nan,
    ),  # max + ulp/2 overflows though max's significand is even
    (464.0, "float8_e4m3fn", True, 448.0),
    (-464.0, "float8_e4m3fn", False, np.nan),
    (463.0, "float8_e4m3fn", False, 448.0),
    (465.0, "float8_e4m3fn", False, np.nan),
    (1e6, "float8_e4m3fn", True, 448.0),
    (np.inf, "float8_e4m3fn", False, np.nan),
    (np.inf, "float8_e4m3fn", True, 448.0),
    (-np.inf, "float8_e5m2fnuz", True, -57344.0),
    (65520.0, "float16", False, np.inf),  # max + ulp/2 in an IEEE format: overflow
    (65520.0, "float16", True, 65504.0),
    (np.inf, "float16", True, np.inf),  # infinities stay infinite where the format has them
    (np.nan, "float4_e2m1fn", False, 0.0),  # no NaN in float4_e2m1fn: +0
    (np.inf, "float4_e2m1fn", False, 6.0),  # no inf: saturates
    (-7.0, "float4_e2m1fn", False, -6.0),
    (0.0, "float8_e8m0fnu", False, np.nan),  # no zero
    (-2.0, "float8_e8m0fnu", False, np.nan),  # no sign
    (3.0, "float8_e8m0fnu", False, 4.0),  # a tie goes to the larger power of two
    (1e-40, "float8_e8m0fnu", False, 2.0**-127),  # the smallest value is the nearest
    (-0.0, "float8_e4m3fnuz", False, 0.0),  # no -0
    # a bfloat16 subnormal (XLA CPU flushes it to 0): 4.4e-39 = 47.9 * 2**-133, nearest 48 * 2**-133
    (4.4e-39, "bfloat16", False, 3 * 2.0**-129),
]


def _check_special(got, value, target, saturate, expected) -> None:
    want = ref.reference_cast(np.array([value]), target, saturate=saturate)
    assert bits(got) == bits(want) or np.isnan(np.float64(want[0])), (value, target, got)
    if np.isnan(expected):
        assert np.isnan(np.float64(got)) and np.isnan(np.float64(want[0])), (value, target)
    else:
        assert np.float64(got) == np.float64(want[0]) == expected, (value, target, got)
        assert np.signbit(np.float64(got)) == np.signbit(expected), (value, target)


def test_documented_special_cases_on_device(x64):
    fn = jax.jit(
        lambda v: [astype(v[i], t, saturate=s) for i, (_, t, s, _) in enumerate(SPECIAL_CASES)]
    )
    results = fn(jnp.asarray(np.array([c[0] for c in SPECIAL_CASES])))
    for got, case in zip(results, SPECIAL_CASES, strict=True):
        _check_special(got, *case)


def test_documented_special_cases_on_host():
    for value, target, saturate, expected in SPECIAL_CASES:  # NumPy float64 with x64 off: host
        _check_special(astype(np.float64(value), target, saturate=saturate), value, target,
                       saturate, expected)  # fmt: skip


def test_float_to_integer_truncates_clamps_and_maps_nan_to_zero():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 2.9, -2.9, 3e9, -3e9, 1e-45, -0.0], np.float32)
    assert np.asarray(cast(x, "int32")).tolist() == [
        0, 0, 2**31 - 1, -(2**31), 2, -2, 2**31 - 1, -(2**31), 0, 0,
    ]  # fmt: skip
    assert np.asarray(cast(x, "uint8")).tolist() == [0, 0, 255, 0, 2, 0, 255, 0, 0, 0]
    assert np.asarray(cast(x, "int4")).astype(int).tolist() == [0, 0, 7, -8, 2, -2, 7, -8, 0, 0]
    six = np.array([6.0, -6.0], ml_dtypes.float4_e2m1fn)  # XLA's convert reads these as +-inf
    assert np.asarray(cast(six, "int8")).tolist() == [6, -6]


def test_integer_to_narrower_integer_wraps_unless_saturating():
    x = np.array([300, -200, 127, 128, -129], np.int32)
    assert np.asarray(cast(x, "int8")).tolist() == [44, 56, 127, -128, 127]
    assert np.asarray(cast(x, "int8", saturate=True)).tolist() == [127, -128, 127, 127, -128]
    assert np.asarray(cast(x, "uint4")).astype(int).tolist() == [12, 8, 15, 0, 15]
    assert np.asarray(cast(x, "uint8", saturate=True)).tolist() == [255, 0, 127, 128, 0]


def test_bool_target_is_nonzero_including_subnormals_and_nan():
    x = np.array([0.0, -0.0, 1e-45, -1e-45, np.nan, np.inf], np.float32)
    for mode in (lambda f: f, jax.jit):
        got = mode(lambda a: astype(a, "bool"))(jnp.asarray(x))
        assert np.asarray(got).tolist() == [False, False, True, True, True, True]


def test_float_casts_differentiate_like_a_conversion(x64):
    """The ``round`` path is integer arithmetic; its derivative is still a conversion's."""
    x = np.array([1.0, 2.5, 1e-3, -7.0, 3e5])
    pairs = [("float64", "bfloat16"), ("float64", "float32"), ("float32", "float8_e8m0fnu"),
             ("bfloat16", "float4_e2m1fn"), ("float32", "float16"), ("float64", "complex64")]  # fmt: skip

    def through(cast_fn, d):
        return lambda v: jnp.sum(
            jnp.real(cast_fn(v, d)).astype(jnp.float32) * jnp.arange(5, dtype=jnp.float32)
        )

    for src, name in pairs:
        v, d = jnp.asarray(x.astype(dt(src))), dt(name)
        ours = jax.jit(jax.grad(through(astype, d)))(v)
        theirs = jax.grad(through(jax.lax.convert_element_type, d))(v)
        same = np.array_equal(np.asarray(ours), np.asarray(theirs), equal_nan=True)
        assert ours.dtype == v.dtype and same, name  # e8m0 tangents: NaN at 0, as in JAX
        vmapped = jax.vmap(jax.grad(lambda s, d=d: jnp.real(astype(s, d)).astype(jnp.float32)))
        assert np.all(np.asarray(vmapped(v)) == 1), name


# ---------------------------------------------------------------------------------------------
# Complex


def test_complex_to_real_is_refused_and_the_suggested_fix_works():
    z = jnp.asarray(np.array([1.5 + 2j], np.complex64))
    with pytest.raises(PromotionError, match=r"astype\(<complex64 array>, bfloat16\)") as info:
        astype(z, "bfloat16")
    assert isinstance(info.value, TypeError)
    assert "imaginary part" in str(info.value)
    fix = re.search(r"heddle\.astype\((x\.real), '(\w+)'\)", str(info.value))
    assert fix is not None and fix.group(2) == "bfloat16"
    assert np.asarray(cast(z.real, fix.group(2))).tolist() == [1.5]


def test_real_to_complex_and_complex_to_complex_round_each_part_once(x64):
    v = 1 + 2**-24 + 2**-50  # just above a float32 halfway point
    z = np.array([complex(v, -v), complex(np.inf, np.nan)], np.complex128)
    got = np.asarray(cast(z, "complex64"))
    assert got.dtype == np.complex64
    up = np.float32(1 + 2**-23)
    assert got[0] == complex(up, -up)
    assert np.isinf(got[1].real) and np.isnan(got[1].imag)
    r = np.asarray(astype(np.array([v]), "complex64"))
    assert r.tolist() == [complex(up, 0)]
    with jax.enable_x64(False):
        assert np.asarray(astype(z[:1], "complex64")).tolist() == [complex(up, -up)]


# ---------------------------------------------------------------------------------------------
# Errors


def test_unknown_target_dtype():
    with pytest.raises(UnknownDTypeError, match="float8_e4m3fn"):
        astype(np.float32(1.0), "float7")
    with pytest.raises(UnknownDTypeError):
        astype(np.array(["a"]), "float32")


def test_64_bit_target_without_x64_says_how_and_the_fix_works():
    assert not jax.config.jax_enable_x64
    with pytest.raises(PrecisionError, match=r"astype asked for float64") as info:
        astype(np.float32(1.0), "float64")
    msg = str(info.value)
    assert "jax_enable_x64" in msg
    fix = re.search(r"heddle\.astype\(x, '(\w+)'\)", msg)
    assert fix is not None
    assert astype(np.float32(1.5), fix.group(1)).dtype == dt(fix.group(1))
    with jax.enable_x64(True):
        assert astype(np.float32(1.5), "float64").dtype == np.float64


# ---------------------------------------------------------------------------------------------
# The path table


def test_every_pair_has_a_path_and_the_table_names_real_dtypes():
    names = {d.name for d in DTYPES}
    for sources, targets, path, why in _ROUTES:
        assert set(sources) <= names and set(targets) <= names and why
        assert path in ("nonzero", "truncate", "round", "convert")
    for s in DTYPES:
        for d in DTYPES:
            assert route(s, d) in ("identity", "nonzero", "truncate", "round", "convert")
    assert route(dt("float32"), dt("bfloat16")) == "convert"  # XLA is right there: same path
    assert route(dt("float64"), dt("bfloat16")) == "round"
    assert route(dt("int32"), dt("bfloat16")) == "round"


# ---------------------------------------------------------------------------------------------
# Long sweeps, by hand: pytest -m slow tests/policy/test_casts.py


@pytest.mark.slow
@pytest.mark.parametrize("target", [d for d in FLOATS if d.itemsize < 4], ids=str)
def test_every_float32_pattern(target):
    """All 2**32 float32 patterns, against ``Float32Sweep`` (runs between halfway points), which the
    normal suite checks against the exact reference."""
    fmt = ref.FORMATS[target.name]
    sweep = ref.Float32Sweep(target.name)
    fn = jax.jit(lambda a: astype(a, target))
    start, step = time.perf_counter(), 2**24
    for lo in range(0, 2**32, step):
        x = np.arange(lo, lo + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        got = ref.bits_of(np.asarray(fn(jnp.asarray(x))))
        want = sweep.run(lo, step).astype(np.uint64)
        bad = np.flatnonzero(got != want)
        bad = bad[~(ref.is_nan_bits(got[bad], fmt) & ref.is_nan_bits(want[bad], fmt))]
        assert not bad.size, (target, x[bad][:5], got[bad][:5], want[bad][:5])
    print(f"all 2**32 float32 patterns -> {target}: {time.perf_counter() - start:.0f} s")


def test_float32_sweep_reference_matches_the_exact_reference():
    """The table-lookup reference of the slow sweep agrees with ``round_array``."""
    rng = np.random.default_rng(7)
    for name in ref.SMALL:
        sweep = ref.Float32Sweep(name)
        for start in (
            0,
            0x3F7FF000,
            0x7F7FF000,
            0x80000000,
            0xFF7FF000,
            *rng.integers(0, 2**32 - 4096, 2),
        ):
            start = int(start) if (int(start) >> 31) == ((int(start) + 4095) >> 31) else 0
            x = np.arange(start, start + 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
            want = ref.reference_cast(x, name)
            got = (
                sweep.run(start, 4096).astype(want.view(f"u{want.itemsize}").dtype).view(want.dtype)
            )
            assert not ref.mismatches(got, want).any(), (name, start)


@pytest.mark.gpu
def test_gpu_matches_the_reference_on_every_small_pattern():
    gpus = [dev for dev in jax.devices() if dev.platform == "gpu"] if _has_gpu() else []
    if not gpus:
        pytest.skip("no NVIDIA GPU")
    with jax.default_device(gpus[0]):
        for src in SMALL_FLOATS:
            check(ref.all_patterns(ref.FORMATS[src.name]), NARROW)
        check(ref.float32_cases(2**20), [d for d in FLOATS if d.itemsize < 4])
        with jax.enable_x64(True):
            check(ref.float64_cases(256), FLOATS)
            check(ref.int_cases(np.int64, 2), FLOATS)


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False
