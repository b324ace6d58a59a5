"""GPU benchmarks: heddle against what a JAX user runs otherwise, on an NVIDIA GPU, same process.

Run: ``python benchmarks/bench_gpu.py`` (on a machine where ``jax.devices("gpu")`` is not empty;
``benchmarks/gpu.sh`` runs it with the GPU tests). Without a GPU it prints ``no GPU: skipped`` and
exits 0, so ``python benchmarks/run.py`` stays usable on CPU. ``--dry-run`` runs every benchmark at
toy sizes on whatever device JAX has (the CPU included) to check the code, and records nothing.

What it measures (medians after warm-up, heddle and the alternative alternating):

1. bfloat16 reduction throughput against the device's copy bandwidth: ``heddle.numpy.sum`` of a
   bfloat16 vector (float32 accumulation) reads N * 2 bytes; the copy is a jitted elementwise kernel
   (``y = -x``) that reads and writes N * 2 bytes each. Target: reduction read bandwidth >= 80% of the
   copy's (read + write) bandwidth.
2. bfloat16 matmul with float32 accumulation (``heddle.numpy.matmul``) against ``jnp.matmul``'s default
   bfloat16 matmul. Target: heddle's throughput >= 0.95x.
3. float32 matmul error against float64: heddle's default ``Precision.HIGHEST`` against the backend's
   default (TF32 on NVIDIA GPUs), with the time each takes.
4. Training-step throughput of an MLP in float32, bfloat16 (float32 masters) and float16 (float32
   masters, dynamic loss scaling), heddle against the same step in plain JAX.
5. The narrow-contraction matrix of ``benchmarks/bench_contractions.py`` (the same shapes, dtypes
   and passes as on CPU): heddle against jax.numpy's defaults and hand-written float32
   accumulation. Target: every row <= 1.05x the faster of the two, the median row <= 1.0.
6. The backward pass with float32 cotangents: ``heddle.autodiff.grad`` with its default
   ``contractions="float32"`` (float32 backward matmuls) and with ``contractions="scaled"``
   (bfloat16/float16 backward matmuls on a scaled copy of the cotangent) against ``jax.grad`` of
   the same bfloat16 and float16 transformer block and MLP, written with heddle.numpy and with
   jax.numpy. Target: scaled / jax.grad <= 1.05. Section 4 has the training step of each.

Results go to ``benchmarks/RESULTS-gpu.md`` (``--out`` to change), with the machine and versions.
``--sections 6`` runs only section 6 (any subset, in the order given); ``--append`` adds the sections
to the file instead of replacing it. Each section is printed as soon as it is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from _harness import interleaved_ratio, machine, median_seconds, table  # noqa: E402

import heddle  # noqa: E402
import heddle.nn as hnn  # noqa: E402
import heddle.numpy as hnp  # noqa: E402
from heddle import autodiff, scaling  # noqa: E402

SIZES = {  # full run on a GPU / --dry-run on anything
    "reduce_n": (2**30, 2**16),
    "matmul": ([(8192, 8192, 8192), (4096, 4096, 16384)], [(64, 64, 128)]),
    "f32_matmul": (4096, 64),
    "mlp": (((2048, 4096, 4096, 2048, 1000), 2048), ((32, 64, 64, 10), 16)),
    "steps": (20, 2),
    # transformer block (d, hidden, batch, seq) and MLP (sizes, batch) of the backward-pass rows
    "block": ((1024, 4096, 8, 1024), (32, 64, 2, 16)),
    "grad_mlp": (((4096, 8192, 8192, 4096), 4096), ((32, 64, 64, 10), 16)),
}


def gpu_devices() -> list[jax.Device]:
    """The NVIDIA GPUs JAX sees (empty without a CUDA backend)."""
    try:
        return [d for d in jax.devices("gpu") if d.platform == "gpu"]
    except RuntimeError:
        return []


def _timer(dry: bool) -> dict[str, int]:
    return {"warmup": 1, "runs": 3, "rounds": 1} if dry else {"warmup": 3, "runs": 15, "rounds": 5}


def _ratio(a: Callable[[], Any], b: Callable[[], Any], dry: bool) -> tuple[float, float, float]:
    t = _timer(dry)
    return interleaved_ratio(a, b, rounds=t["rounds"], warmup=t["warmup"], runs=t["runs"])


# ---- 1. reduction against copy bandwidth -------------------------------------------------------


def bench_reduction(dry: bool) -> tuple[list[list[Any]], str]:
    """bfloat16 sum (heddle, and jnp.sum) against the elementwise copy's bandwidth."""
    n = SIZES["reduce_n"][dry]
    x = jax.random.uniform(jax.random.key(0), (n,), jnp.float32).astype(jnp.bfloat16)
    copy = jax.jit(lambda a: -a)
    ours = jax.jit(hnp.sum)
    theirs = jax.jit(jnp.sum)
    rows = jnp.reshape(x, (-1, 1024))
    ours_rows = jax.jit(lambda a: hnp.sum(a, axis=-1))
    t = _timer(dry)
    kw = {"warmup": t["warmup"], "runs": t["runs"]}
    t_copy = median_seconds(lambda: copy(x), **kw)
    copy_bw = 4 * n / t_copy  # read 2 bytes, write 2 bytes per element
    out = []
    for name, fn, arg, written in (
        ("heddle.numpy.sum (all)", ours, x, 4),
        ("jnp.sum (all)", theirs, x, 2),
        ("heddle.numpy.sum (rows of 1024)", ours_rows, rows, 2 * n // 1024),
    ):
        sec = median_seconds(lambda fn=fn, arg=arg: fn(arg), **kw)
        bw = (2 * n + written) / sec
        out.append([name, f"{n * 2 / 2**30:.2f}", f"{sec * 1e3:.3f}", f"{bw / 1e9:.0f}",
                    f"{bw / copy_bw:.2f}"])  # fmt: skip
    note = (
        f"Copy (`y = -x`, bfloat16, {n} elements): {t_copy * 1e3:.3f} ms, "
        f"{copy_bw / 1e9:.0f} GB/s (read + write). Target: heddle's ratio >= 0.80."
    )
    return out, note


# ---- 2. bfloat16 matmul ------------------------------------------------------------------------


def bench_matmul(dry: bool) -> list[list[Any]]:
    """heddle.numpy.matmul (float32 accumulator, rounded once) against jnp.matmul, bfloat16."""
    out = []
    for m, n, k in SIZES["matmul"][dry]:
        ka, kb = jax.random.split(jax.random.key(1))
        a = jax.random.normal(ka, (m, k), jnp.float32).astype(jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.float32).astype(jnp.bfloat16)
        ours, theirs = jax.jit(hnp.matmul), jax.jit(jnp.matmul)
        t_ours, t_theirs, ratio = _ratio(lambda: ours(a, b), lambda: theirs(a, b), dry)
        flops = 2 * m * n * k
        out.append([f"{m}x{k} @ {k}x{n}", f"{flops / t_ours / 1e12:.1f}",
                    f"{flops / t_theirs / 1e12:.1f}", f"{1 / ratio:.3f}"])  # fmt: skip
    return out


# ---- 3. float32 matmul error -------------------------------------------------------------------


def bench_f32_error(dry: bool) -> list[list[Any]]:
    """Error against float64 of heddle's float32 matmul (HIGHEST) and jnp.matmul's default."""
    size = SIZES["f32_matmul"][dry]
    ka, kb = jax.random.split(jax.random.key(2))
    a = jax.random.normal(ka, (size, size), jnp.float32)
    b = jax.random.normal(kb, (size, size), jnp.float32)
    with jax.enable_x64(True):
        exact = jnp.matmul(a.astype(jnp.float64), b.astype(jnp.float64), precision="highest")
        exact = np.asarray(exact)
    scale = np.abs(exact).max()

    def err(c: jax.Array) -> float:
        return float(np.abs(np.asarray(c, np.float64) - exact).max() / scale)

    ours, theirs = jax.jit(hnp.matmul), jax.jit(jnp.matmul)
    e_ours, e_theirs = err(ours(a, b)), err(theirs(a, b))
    t_ours, t_theirs, ratio = _ratio(lambda: ours(a, b), lambda: theirs(a, b), dry)
    return [
        ["heddle.numpy.matmul (Precision.HIGHEST)", f"{e_ours:.2e}", f"{t_ours * 1e3:.2f}",
         f"{ratio:.2f}"],
        ["jnp.matmul (backend default)", f"{e_theirs:.2e}", f"{t_theirs * 1e3:.2f}", "1.00"],
    ]  # fmt: skip


# ---- 4. training steps -------------------------------------------------------------------------


def _init(sizes: tuple[int, ...]) -> dict[str, jax.Array]:
    params, key = {}, jax.random.key(3)
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        key, sub = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(sub, (m, n), jnp.float32) * np.float32(np.sqrt(2 / m))
        params[f"b{i}"] = jnp.zeros((n,), jnp.float32)
    return params


def _loss(xp: Any, nn: Any, cast: Callable[[Any, Any], Any], compute: Any) -> Callable:
    def loss(params, x, y):
        p = jax.tree.map(lambda a: cast(a, compute), params)
        h = cast(x, compute)
        n = len(p) // 2
        for i in range(n):
            h = xp.add(xp.matmul(h, p[f"w{i}"]), p[f"b{i}"])
            if i < n - 1:
                h = nn.relu(h)
        logp = nn.log_softmax(cast(h, jnp.float32))
        return -xp.mean(xp.take_along_axis(logp, y[:, None], axis=1))

    return loss


def _heddle_step(
    compute: Any, scaled: bool, contractions: str = "float32"
) -> tuple[Callable, optax.GradientTransformation]:
    loss = _loss(hnp, hnn, heddle.astype, compute)
    how = {"contractions": contractions}
    sgd = optax.sgd(1e-3, momentum=0.9)
    if scaled:
        opt = scaling.dynamic_loss_scale(sgd)

        def step(params, state, x, y):
            value, grads, _ = scaling.backward_scaled(loss, scaling.loss_scale(state), **how)(
                params, x, y
            )
            updates, state = opt.update(grads, state, params, value=value)
            return optax.apply_updates(params, updates), state, value

        return step, opt

    def plain(params, state, x, y):
        value, grads = autodiff.value_and_grad(loss, **how)(params, x, y)
        updates, state = sgd.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return plain, sgd


def _jax_step(
    compute: Any, scaled: bool, contractions: str = "float32"
) -> tuple[Callable, optax.GradientTransformation]:
    del contractions  # plain JAX has one backward pass
    loss = _loss(jnp, jax.nn, lambda a, d: a.astype(d), compute)
    sgd = optax.sgd(1e-3, momentum=0.9)
    if not scaled:

        def plain(params, state, x, y):
            value, grads = jax.value_and_grad(loss)(params, x, y)
            updates, state = sgd.update(grads, state, params)
            return optax.apply_updates(params, updates), state, value

        return plain, sgd

    def init(params):
        return (sgd.init(params), jnp.float32(2**15), jnp.int32(0))

    def step(params, state, x, y):  # dynamic loss scaling as a plain-JAX user writes it
        inner, s, good = state
        value, grads = jax.value_and_grad(lambda p: loss(p, x, y) * s)(params)
        grads = jax.tree.map(lambda g: g / s, grads)
        finite = jnp.all(jnp.asarray([jnp.isfinite(g).all() for g in jax.tree.leaves(grads)]))
        updates, new_inner = sgd.update(grads, inner, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        good = jnp.where(finite, good + 1, 0)
        s = jnp.where(finite, jnp.where(good >= 2000, s * 2, s), jnp.maximum(s / 2, 1.0))
        good = jnp.where(good >= 2000, 0, good)
        return keep(new_params, params), (keep(new_inner, inner), s, good), value / s

    return step, optax.GradientTransformation(init, None)


REGIMES = (("float32", jnp.float32, False, "float32"),
           ("bfloat16", jnp.bfloat16, False, "float32"),
           ('bfloat16, contractions="scaled"', jnp.bfloat16, False, "scaled"),
           ("float16 + loss scaling", jnp.float16, True, "float32"),
           ('float16 + loss scaling, contractions="scaled"', jnp.float16, True, "scaled"))  # fmt: skip


def bench_training(dry: bool) -> list[list[Any]]:
    """Steps per second of one MLP training step, heddle against plain JAX, per regime."""
    sizes, batch = SIZES["mlp"][dry]
    steps = SIZES["steps"][dry]
    kx, ky = jax.random.split(jax.random.key(4))
    x = jax.random.normal(kx, (batch, sizes[0]), jnp.float32)
    y = jax.random.randint(ky, (batch,), 0, sizes[-1], jnp.int32)
    out = []
    for name, compute, scaled, contractions in REGIMES:
        runners = []
        for make in (_heddle_step, _jax_step):
            step, opt = make(compute, scaled, contractions)
            step = jax.jit(step)
            carry = [_init(sizes)]
            carry.append(opt.init(carry[0]))

            def run(step=step, carry=carry):
                for _ in range(steps):
                    carry[0], carry[1], value = step(carry[0], carry[1], x, y)
                return value

            runners.append(run)
        t_ours, t_theirs, ratio = _ratio(runners[0], runners[1], dry)
        out.append([name, f"{steps / t_ours:.1f}", f"{steps / t_theirs:.1f}", f"{1 / ratio:.3f}"])
    return out


def bench_backward(dry: bool) -> list[list[Any]]:
    """jax.grad against heddle.autodiff.grad (float32 and scaled contractions), jitted."""
    from heddle import examples

    rng = np.random.default_rng(6)
    d, hidden, batch, seq = SIZES["block"][dry]
    sizes, mlp_batch = SIZES["grad_mlp"][dry]
    block_p = examples.init_block(rng, d, hidden)
    mlp_p = examples.init_mlp(rng, sizes)
    x_block = rng.standard_normal((batch, seq, d))
    x_mlp = rng.standard_normal((mlp_batch, sizes[0]))
    models = [
        (f"transformer block d={d}, {batch} x {seq}", examples.block, block_p, x_block),
        (f"MLP {'-'.join(map(str, sizes))}, batch {mlp_batch}", examples.mlp, mlp_p, x_mlp),
    ]
    out = []
    cases = itertools.product(models, (hnp, jnp), (jnp.bfloat16, jnp.float16))
    for (name, model, p64, x64), xp, dtype in cases:
        params = {k: jnp.asarray(v, jnp.float32).astype(dtype) for k, v in p64.items()}
        x = jnp.asarray(x64, jnp.float32).astype(dtype)

        def loss(p, x, model=model, xp=xp):
            y = model(xp, p, x)
            return xp.mean(xp.multiply(y, y))

        theirs = jax.jit(jax.grad(loss))
        ours = jax.jit(autodiff.grad(loss))
        scaled = jax.jit(autodiff.grad(loss, contractions="scaled"))
        base = lambda: theirs(params, x)
        _, _, r_ours = _ratio(lambda: ours(params, x), base, dry)
        t_scaled, t_theirs, r_scaled = _ratio(lambda: scaled(params, x), base, dry)
        row = [f"{name}, {xp.__name__}, {jnp.dtype(dtype).name}", f"{t_theirs * 1e3:.3g}"]
        out.append([*row, f"{t_scaled * 1e3:.3g}", f"{r_ours:.3f}", f"**{r_scaled:.3f}**"])
    return out


def bench_contraction_matrix(dry: bool) -> list[str]:
    """The CPU matrix of ``bench_contractions.py`` on this device (dry: two cases, one round)."""
    import bench_contractions as C

    names = ["square 256", "vmapped 32x[32x64] @ W 64x256"] if dry else None
    rows = C.matrix(quick=dry, rounds=2 if dry else 8, budget_s=0.01 if dry else 0.04, names=names)
    return [
        C.table(C.HEADERS, rows),
        "",
        C.summary(rows, -2, "Wall time"),
        "",
        "heddle / best: median over the odd interleaved rounds of heddle's time over that "
        "round's time of the faster of jax.numpy's defaults and the explicit float32-accumulation "
        "code (the faster: the lower median over the even rounds).",
    ]


# ---- the report --------------------------------------------------------------------------------


def _section_1(dry: bool) -> list[str]:
    red, red_note = bench_reduction(dry)
    headers = ["reduction", "GiB read", "ms", "GB/s (read + write)", "/ copy"]
    return [
        "## 1. bfloat16 reduction against copy bandwidth",
        "",
        table(headers, red),
        "",
        red_note,
    ]


def _section_2(dry: bool) -> list[str]:
    headers = ["shape", "heddle TFLOP/s", "jnp.matmul TFLOP/s", "heddle / jnp"]
    return [
        "## 2. bfloat16 matmul, float32 accumulation",
        "",
        table(headers, bench_matmul(dry)),
        "",
        "Target: heddle / jnp >= 0.95 (heddle asks for a float32 accumulator and rounds once).",
    ]


def _section_3(dry: bool) -> list[str]:
    headers = ["matmul", "max error / max abs(exact)", "ms", "time / jnp.matmul's"]
    return [
        "## 3. float32 matmul: error against float64",
        "",
        table(headers, bench_f32_error(dry)),
        "",
        "heddle runs float32 contractions at `Precision.HIGHEST` unless the policy says otherwise "
        "(`Policy.float32_matmul_precision`); the backend default on NVIDIA GPUs is TF32.",
    ]


def _section_4(dry: bool) -> list[str]:
    headers = ["regime", "heddle steps/s", "plain JAX steps/s", "heddle / JAX"]
    return [
        "## 4. Training steps (MLP, momentum SGD)",
        "",
        table(headers, bench_training(dry)),
        "",
        f"MLP {SIZES['mlp'][dry][0]}, batch {SIZES['mlp'][dry][1]}. float32 masters in the "
        "bfloat16 and float16 regimes; heddle's float32 regime runs its matmuls at "
        "Precision.HIGHEST, plain JAX's at the backend default (TF32 on NVIDIA GPUs).",
    ]


def _section_5(dry: bool) -> list[str]:
    return ["## 5. Narrow contractions (the matrix of bench_contractions.py)", "",
            *bench_contraction_matrix(dry)]  # fmt: skip


def _section_6(dry: bool) -> list[str]:
    headers = ["model, namespace, dtype", "jax.grad ms", "scaled ms", "float32 / jax.grad",
               "scaled / jax.grad (target <= 1.05)"]  # fmt: skip
    return [
        "## 6. Backward pass: float32 cotangents, float32 or scaled backward contractions",
        "",
        table(headers, bench_backward(dry)),
        "",
        "Jitted gradients of the same forward pass, written with heddle.numpy and with jax.numpy: "
        "`jax.grad` (narrow cotangents where the forward pass is narrow, narrow gradients), "
        "`heddle.autodiff.grad` (float32 cotangents and gradients) with "
        '`contractions="float32"` (the default) and `contractions="scaled"`.',
    ]


SECTIONS: dict[str, Callable[[bool], list[str]]] = {
    "1": _section_1, "2": _section_2, "3": _section_3,
    "4": _section_4, "5": _section_5, "6": _section_6,
}  # fmt: skip


def report(
    dry: bool, sections: str = "123456", emit: Callable[[str], None] = print, title: bool = True
) -> None:
    """Runs the benchmarks of ``sections`` (in that order), giving the markdown report to ``emit``
    piece by piece: a head (the title unless ``title`` is False, the machine), each section as
    soon as it is measured (a run stopped part-way keeps what it measured), the command."""
    start = time.perf_counter()
    head = ["# GPU benchmark results" + (" (dry run: toy sizes, not a measurement)" if dry else "")]
    emit("\n".join([*head, ""] if title else []))
    emit(f"Recorded {datetime.date.today().isoformat()} on {machine()}.\n")
    for key in sections:
        emit("\n".join(SECTIONS[key](dry)) + "\n")
    flag = (" --dry-run" if dry else "") + (
        f" --sections {sections}" if sections != "123456" else ""
    )
    emit(
        f"Command: `python benchmarks/bench_gpu.py{flag}` ({time.perf_counter() - start:.0f} s); "
        "`bash benchmarks/gpu.sh` runs every section with the GPU tests.\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="toy sizes on any device (the CPU included); records nothing by default")  # fmt: skip
    ap.add_argument("--out", default=None,
                    help="markdown file to write (default: benchmarks/RESULTS-gpu.md on a GPU)")  # fmt: skip
    ap.add_argument("--sections", default="123456",
                    help="which sections to run, in that order, e.g. 6 or 6124 (default: all)")  # fmt: skip
    ap.add_argument("--append", action="store_true",
                    help="add to the --out file instead of replacing it")  # fmt: skip
    args = ap.parse_args(argv)
    bad = sorted(set(args.sections) - set(SECTIONS))
    if bad or not args.sections:
        ap.error(
            f"--sections {args.sections!r}: each character is one of 1 to 6 (e.g. --sections 6)"
        )
    gpus = gpu_devices()
    if not gpus and not args.dry_run:
        print(
            "no GPU: skipped (JAX sees no NVIDIA GPU; on a GPU machine run "
            "pip install -e '.[cuda12,test]' then bash benchmarks/gpu.sh; "
            "python benchmarks/bench_gpu.py --dry-run checks this script on CPU)"
        )
        return 0
    out = args.out or (None if args.dry_run else os.path.join(HERE, "RESULTS-gpu.md"))
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(out, "a" if args.append else "w")) if out else None

        def emit(text: str) -> None:  # printed, and written to the file as it is measured
            print(text, flush=True)
            if sink is not None and text:
                sink.write(text + "\n")
                sink.flush()

        report(args.dry_run, args.sections, emit, title=not args.append)
    if out:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
