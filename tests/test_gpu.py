"""GPU checks (``pytest -m gpu``): heddle's guarantees on an NVIDIA GPU's own arithmetic.

Each ``gpu`` test runs on the first GPU JAX sees and skips cleanly without one. Set
``HEDDLE_GPU_TESTS_ON_CPU=1`` to run them on the CPU instead (to check the tests themselves on a
machine without a GPU; ``bash benchmarks/gpu.sh --dry-run`` does). References are exact: Python
``Fraction`` sums, float64 products of narrow values, and the formats' own values from ml_dtypes.

The tests not marked ``gpu`` check that ``benchmarks/bench_gpu.py`` and ``benchmarks/gpu.sh`` behave
on a machine without a GPU.
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import re
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import heddle
import heddle.lax as hlax
import heddle.nn as hnn
import heddle.numpy as hnp
from heddle import autodiff, scaling

ROOT = pathlib.Path(__file__).resolve().parents[1]
ON_CPU = os.environ.get("HEDDLE_GPU_TESTS_ON_CPU") == "1"


def gpu() -> jax.Device | None:
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.fixture
def device():
    """The GPU (or, with HEDDLE_GPU_TESTS_ON_CPU=1 and no GPU, the CPU), as JAX's default device."""
    d = gpu()
    if d is None:
        if not ON_CPU:
            pytest.skip(
                "no GPU: JAX sees no NVIDIA GPU (HEDDLE_GPU_TESTS_ON_CPU=1 runs this on CPU)"
            )
        d = jax.devices("cpu")[0]
    with jax.default_device(d):
        yield d


def nearest(value: Fraction, dtype) -> float:
    """The value of ``dtype`` nearest ``value``, ties to even, chosen by exact comparison."""
    dtype = np.dtype(dtype)
    guess = np.array([float(value)]).astype(np.float32).astype(dtype)
    bits = guess.view(np.uint16).astype(np.int64)[0]
    candidates = np.array([bits - 1, bits, bits + 1], np.uint16).view(dtype)
    finite = [c for c in candidates if np.isfinite(np.float64(c))]
    best = min(finite, key=lambda c: (abs(Fraction(float(c)) - value), int(c.view(np.uint16)) & 1))
    return float(best)


def on(x, device) -> jax.Array:
    return jax.device_put(x, device)


# ---- accumulation ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_sums_of_100k_tenths_round_once(device, dtype):
    x = on(jnp.full(100_000, 0.1, dtype), device)
    want = nearest(100_000 * Fraction(float(x[0])), dtype)
    got = jax.jit(lambda v: [hnp.sum(v), hnp.cumsum(v)[-1], hlax.reduce_sum(v, (0,))])(x)
    assert [float(g) for g in got] == [want] * 3
    assert all(g.dtype == dtype for g in got)


@pytest.mark.gpu
def test_bfloat16_matmul_long_inner_dimension_within_one_rounding(device):
    rng = np.random.default_rng(0)
    k = 2**16
    a = rng.random((4, k)).astype(ml_dtypes.bfloat16)
    b = rng.random((k, 4)).astype(ml_dtypes.bfloat16)
    exact = a.astype(np.float64) @ b.astype(np.float64)  # products exact; 2**16 terms of 16 bits
    got = jax.jit(hnp.matmul)(on(a, device), on(b, device))
    assert got.dtype == jnp.bfloat16
    rel = np.abs(np.asarray(got, np.float64) - exact) / exact
    assert rel.max() <= 2.0**-8 * 1.01, rel.max()  # one rounding to bfloat16 (unit roundoff 2**-8)


@pytest.mark.gpu
def test_float32_matmul_runs_at_full_float32_precision(device):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((512, 2048)).astype(np.float32)
    b = rng.standard_normal((2048, 512)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(jax.jit(hnp.matmul)(on(a, device), on(b, device)), np.float64)
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert err < 2e-5, err  # float32 sums: about 2e-6; inputs rounded to TF32 give 3.3e-4


@pytest.mark.gpu
def test_float16_softmax_and_logsumexp_of_100k_zeros(device):
    z = on(jnp.zeros(100_000, jnp.float16), device)
    soft, lse = jax.jit(lambda v: (hnn.softmax(v), hnn.logsumexp(v)))(z)
    assert soft.dtype == lse.dtype == jnp.float16
    assert np.all(np.asarray(soft, np.float64) == nearest(Fraction(1, 100_000), np.float16))
    assert float(lse) == nearest(Fraction(math.log(100_000)), np.float16) == 11.515625


# ---- gradients and loss scaling ----------------------------------------------------------------


@pytest.mark.gpu
def test_bias_gradient_over_65536_rows_is_exact_and_float32(device):
    x = on(jnp.ones((65_536, 1), jnp.bfloat16).at[:62].set(0), device)
    b = on(jnp.zeros((1,), jnp.bfloat16), device)
    g = jax.jit(autodiff.grad(lambda b, x: hnp.sum(hnp.multiply(hnp.add(x, b), x))))(b, x)
    assert g.dtype == jnp.float32 and float(g[0]) == 65_474.0


@pytest.mark.gpu
def test_dynamic_loss_scale_skips_a_nonfinite_step_on_device(device):
    opt = scaling.dynamic_loss_scale(optax.sgd(0.1), init_scale=2.0**10, growth_interval=2)
    params = {"w": on(jnp.ones(3, jnp.float32), device)}
    state = opt.init(params)

    @jax.jit
    def step(params, state, g):
        updates, state = opt.update({"w": g}, state, params)
        return optax.apply_updates(params, updates), state

    bad = on(jnp.array([1.0, jnp.inf, 0.0], jnp.float32), device)
    p1, s1 = step(params, state, bad)
    assert np.array_equal(np.asarray(p1["w"]), np.ones(3, np.float32))
    assert float(scaling.loss_scale(s1)) == 2.0**9
    good = on(jnp.ones(3, jnp.float32), device)
    p2, s2 = step(p1, s1, good)
    p3, s3 = step(p2, s2, good)
    assert np.allclose(np.asarray(p3["w"]), 1 - 2 * 0.1)
    assert float(scaling.loss_scale(s3)) == 2.0**10  # doubled after two finite steps


# ---- casts round once, on the device's own arithmetic -------------------------------------------

CASES = [  # (value, numpy source dtype, target, correctly rounded result)
    (1 + 2**-8 + 2**-30, np.float64, jnp.bfloat16, 1 + 2**-7),
    (1 + 2**-11 + 2**-30, np.float64, jnp.float16, 1 + 2**-10),
    (2**24 + 2**16 + 1, np.int32, jnp.bfloat16, 2**24 + 2**17),
    (1 + 2**-4 + 2**-30, np.float64, jnp.float8_e4m3fn, 1.125),
    (2.0**-133, np.float64, jnp.bfloat16, 2.0**-133),  # the smallest bfloat16 subnormal
]


@pytest.mark.gpu
@pytest.mark.parametrize("value, src, dst, want", CASES, ids=lambda v: getattr(v, "__name__", None))
def test_casts_round_once(device, value, src, dst, want):
    with jax.enable_x64(True):
        x = on(jnp.asarray(np.array([value, -value]).astype(src)), device)
        got = jax.jit(lambda a: heddle.astype(a, dst))(x)
        assert got.dtype == dst
        assert [float(v) for v in np.asarray(got).astype(np.float64)] == [want, -want]


@pytest.mark.gpu
def test_float32_subnormals_survive_a_cast_to_bfloat16(device):
    tiny = np.array([1e-40, -(2.0**-130), 3 * 2.0**-133, 2.0**-134], np.float32)  # subnormals
    want = tiny.astype(ml_dtypes.bfloat16)  # ml_dtypes rounds float32 -> bfloat16 once, on the host
    got = jax.jit(lambda a: heddle.astype(a, jnp.bfloat16))(on(tiny, device))
    assert np.array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))
    assert np.all(np.asarray(got, np.float32)[:3] != 0)  # 2**-134 ties to even: 0


@pytest.mark.gpu
def test_the_device_is_a_gpu_unless_asked_to_run_on_cpu(device):
    assert device.platform == ("cpu" if ON_CPU and gpu() is None else "gpu")


# ---- float32 cotangents (POLICY.md 7) ------------------------------------------------------------

F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("contractions", ["float32", "scaled"])
def test_a_cotangent_below_float16s_range_survives_on_gpu(device, dtype, contractions):
    """h = x @ w with x of 1e-3 and the loss mean(h) * 1e-6: h's cotangent is 2.4e-10, below
    float16's smallest subnormal; w's gradient is 1e-9 (exact: x[0, 0] * 1e-6), jitted and eager."""
    x = on(jnp.full((4096, 256), 1e-3, dtype), device)
    p = {"w": on(jnp.full((256, 1), 0.01, F32), device)}

    def loss(p, x):
        return jnp.mean(jnp.matmul(x, p["w"].astype(x.dtype)).astype(F32)) * 1e-6

    exact = float(np.asarray(x[0, 0], np.float64)) * 1e-6
    grad = autodiff.grad(heddle.autocast(loss), contractions=contractions)
    for g in (jax.jit(grad)(p, x)["w"], grad(p, x)["w"]):
        assert g.dtype == F32
        np.testing.assert_allclose(np.asarray(g, np.float64), exact, rtol=0.01)
    if dtype == F16:  # the check can fail: JAX's own float16 cotangent flushes to 0
        assert not np.asarray(jax.jit(jax.grad(loss))(p, x)["w"]).any()


def _mlp_loss(dtype, scale):
    def loss(params, x, y):
        h = x.astype(dtype)
        for i in range(3):
            h = hnp.matmul(h, params[f"w{i}"].astype(dtype)) + params[f"b{i}"].astype(dtype)
            h = hnp.tanh(h) if i < 2 else h
        return hnp.mean((h.astype(F32) - y) ** 2) * scale

    return loss


def _mlp_case(device, sizes=(32, 64, 64, 8), batch=256):
    rng = np.random.default_rng(0)
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(m), F32)
        params[f"b{i}"] = jnp.asarray(rng.standard_normal(n) * 0.1, F32)
    x = jnp.asarray(rng.standard_normal((batch, sizes[0])), F32)
    y = jnp.asarray(rng.standard_normal((batch, sizes[-1])), F32)
    return jax.tree.map(lambda a: on(a, device), (params, x, y))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("contractions", ["float32", "scaled"])
def test_three_layer_mlp_gradients_within_1_percent_of_float32_on_gpu(device, dtype, contractions):
    """A float16/bfloat16 tanh MLP with its loss scaled by 1e-7, no loss scaling: every layer's
    gradient within 1% of the float32 model's, computed on the CPU (full float32 products)."""
    params, x, y = _mlp_case(device)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        ref = jax.grad(_mlp_loss(F32, 1e-7))(*jax.device_put((params, x, y), cpu))
    g = jax.jit(autodiff.grad(_mlp_loss(dtype, 1e-7), contractions=contractions))(params, x, y)
    for k, r in ref.items():
        r64, g64 = np.asarray(r, np.float64), np.asarray(g[k], np.float64)
        assert g[k].dtype == F32
        assert np.max(np.abs(g64 - r64)) <= 0.01 * np.max(np.abs(r64)), k


_INLINE_TYPE = re.compile(r"\b[a-z]+\d*\[[^\]]*\](\{[^}]*\})?\s*")
_DEF = re.compile(r"(%?[\w.\-]+) = \(?([a-z]+\d*)\[")


def _contraction_operand_dtypes(text: str) -> list[tuple[str, ...]]:
    """The operand dtypes of every dot and library matmul (cuBLAS / cuBLASLt custom call) in an
    HLO module's text; a dot inside a fusion (Triton's GEMMs) is listed with its own operands."""
    types = {m[1].lstrip("%"): m[2] for m in _DEF.finditer(text)}
    out = []
    for line in text.splitlines():
        library = "custom-call(" in line and ("$gemm" in line or "$lt$matmul" in line)
        if " dot(" not in line and not library:
            continue
        args = line.split(" dot(" if " dot(" in line else "custom-call(", 1)[1]
        args = _INLINE_TYPE.sub("", args.split(")", 1)[0])  # operands printed with their shapes
        names = re.findall(r"%?([\w.\-]+)", args)
        out.append(tuple(types.get(n, "?") for n in names[:2]))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_scaled_backward_matmuls_run_narrow_on_gpu(device, dtype):
    """contractions="scaled" keeps every matmul of the compiled gradient at the narrow dtype (tensor
    core speed); the default keeps float32 cotangents in float32 backward matmuls (the check can
    fail). On the CPU (HEDDLE_GPU_TESTS_ON_CPU=1) the program before XLA's passes is read."""
    params, x, y = _mlp_case(device, sizes=(256, 512, 512, 128), batch=1024)
    narrow = "f16" if dtype == F16 else "bf16"

    def dots(contractions):
        lowered = jax.jit(autodiff.grad(_mlp_loss(dtype, 1.0), contractions=contractions))
        lowered = lowered.lower(params, x, y)
        text = lowered.compile().as_text() if device.platform == "gpu" else lowered.as_text("hlo")
        return _contraction_operand_dtypes(text)

    scaled, default = dots("scaled"), dots("float32")
    assert len(scaled) >= 8, scaled  # 3 forward, 3 weight gradients, 2 activation cotangents
    assert all(t == (narrow, narrow) for t in scaled), scaled
    assert sum(t == ("f32", "f32") for t in default) >= 5, default


# ---- the GPU scripts without a GPU (not marked gpu: these run everywhere) -----------------------


def _run(args: list[str], env: dict[str, str] | None = None, timeout: int = 600):
    full = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    return subprocess.run(args, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def test_bench_gpu_without_a_gpu_says_skipped_and_exits_0():
    r = _run([sys.executable, "benchmarks/bench_gpu.py"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("no GPU: skipped")


@pytest.mark.slow
def test_bench_gpu_dry_run_runs_every_benchmark_on_cpu(tmp_path):
    out = tmp_path / "gpu.md"
    r = _run([sys.executable, "benchmarks/bench_gpu.py", "--dry-run", "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    text = out.read_text()
    assert "dry run" in text
    for section in ("1. bfloat16 reduction", "2. bfloat16 matmul", "3. float32 matmul",
                    "4. Training steps", "5. Narrow contractions"):  # fmt: skip
        assert f"## {section}" in text, section
    for row in ("heddle.numpy.sum (all)", "float32 |", "bfloat16 |", "float16 + loss scaling |",
                "| vmapped 32x[32x64] @ W 64x256 | bfloat16 | fwd+bwd |"):  # fmt: skip
        assert row in text, row
    assert (
        not (ROOT / "benchmarks" / "RESULTS-gpu.md")
        .read_text()
        .startswith("# GPU benchmark results (dry run")
    )  # a dry run never overwrites the recorded results


def test_gpu_sh_is_valid_bash_and_refuses_to_run_without_a_gpu():
    assert subprocess.run(["bash", "-n", "benchmarks/gpu.sh"], cwd=ROOT).returncode == 0
    r = _run(["bash", "benchmarks/gpu.sh"], env={"PYTHON": sys.executable})
    assert r.returncode == 1
    assert "no NVIDIA GPU" in r.stdout + r.stderr and "--dry-run" in r.stdout + r.stderr


@pytest.mark.gpu
def test_narrow_contractions_reach_the_gpu_dot_unwidened_without_highest(device):
    """On GPU a bfloat16 matmul, einsum and lax.dot_general feed bfloat16 operands to one
    float32-result dot (no widening, no Precision.HIGHEST), forward and backward."""
    rng = np.random.default_rng(0)
    a = on(jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16), device)
    b = on(jnp.asarray(rng.standard_normal((128, 32)), jnp.bfloat16), device)
    for f in (
        lambda x, y: hnp.matmul(x, y),
        lambda x, y: hnp.einsum("ij,jk->ik", x, y),
        lambda x, y: hlax.dot_general(x, y, (((1,), (0,)), ((), ()))),
    ):
        eqns = jax.make_jaxpr(f)(a, b).jaxpr.eqns
        (dot,) = [e for e in eqns if e.primitive.name == "dot_general"]
        assert [v.aval.dtype for v in dot.invars] == [jnp.bfloat16] * 2
        assert dot.outvars[0].aval.dtype == np.float32
        assert dot.params["precision"] in (None, (None, None))
        got = np.asarray(jax.jit(f)(a, b), np.float64)
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        bound = 128 * 2.0**-24 * (np.abs(a64) @ np.abs(b64)) + np.abs(a64 @ b64) * 2.0**-8
        assert (np.abs(got - a64 @ b64) <= bound).all()
        g = jax.jit(jax.grad(lambda x, y: f(x, y).astype(jnp.float32).sum(), argnums=(0, 1)))(a, b)
        assert [x.dtype for x in g] == [jnp.bfloat16] * 2
