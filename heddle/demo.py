"""The demo behind ``python -m heddle demo``: one small model, five precision regimes, two namespaces.

A 64-128-10 MLP learns scikit-learn's handwritten digits (bundled with the package, no download)
with momentum SGD, in each regime of ``REGIMES``, once written with heddle (``heddle.numpy``,
``heddle.nn``, ``heddle.autodiff``, ``heddle.scaling``, ``Precision`` casts) and once with plain
``jax.numpy``/``jax.nn``/``jax.value_and_grad`` and hand-written loss scaling (jmp's algorithm). Both
see the same initial weights and the same batches. Steps run in ``jax.lax.scan`` chunks, so the
progress callback costs nothing per step.

Examples:
  >>> from heddle import demo
  >>> results = demo.run(demo.Config(steps=20), regimes=["bf16-mixed"], backends=["heddle"])
  >>> r = results[0]
  >>> (r.regime, r.backend, len(r.losses), r.nonfinite)
  ('bf16-mixed', 'heddle', 20, 0)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from heddle.policy._precision import Precision


@dataclasses.dataclass(frozen=True)
class Regime:
    """One precision regime of the demo.

    Attributes:
      name: the short name used on the command line and in the table.
      precision: a ``Precision.parse`` string.
      scaled: whether the step uses dynamic loss scaling.
      description: one line for ``--help`` and the table's legend.
    """

    name: str
    precision: str
    scaled: bool
    description: str


REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime("float32", "float32", False, "float32 everywhere"),
        Regime("bf16-params", "bfloat16", False, "bfloat16 parameters, momentum and compute"),
        Regime("bf16-mixed", "mixed_bfloat16", False, "float32 masters, bfloat16 compute"),
        Regime("f16-mixed", "mixed_float16", False, "float32 masters, float16, no loss scaling"),
        Regime("f16-scaled", "mixed_float16", True, "float32 masters, float16, dynamic loss scale"),
    )
}
"""The regimes, in the order the demo runs them."""

BACKENDS: tuple[str, ...] = ("heddle", "jax")
"""``heddle``: heddle's namespaces; ``jax``: plain jax.numpy, jax.nn and jax.value_and_grad."""


@dataclasses.dataclass(frozen=True)
class Config:
    """The demo's hyperparameters (the defaults run in well under two minutes on 2 CPU cores).

    Attributes:
      steps: training steps per run.
      seed: seeds the initial weights and the batch order (the train/test split is fixed).
      batch: images per step.
      lr: SGD learning rate.
      momentum: SGD momentum.
      hidden: width of the hidden layer.
      chunk: steps per compiled ``lax.scan`` call (the progress granularity).
      init_scale: the first loss scale of the scaled regime.
      growth_interval: finite steps before the loss scale doubles.
    """

    steps: int = 2000
    seed: int = 0
    batch: int = 64
    lr: float = 0.005
    momentum: float = 0.9
    hidden: int = 128
    chunk: int = 100
    init_scale: float = 2.0**15
    growth_interval: int = 200


@dataclasses.dataclass
class Result:
    """What one run measured.

    Attributes:
      regime: the regime's name.
      backend: ``"heddle"`` or ``"jax"``.
      losses: float32[steps], the training loss of every step (NaN once training diverged).
      scales: float32[steps], the loss scale used at every step (1.0 without loss scaling).
      accuracy: test accuracy in percent.
      steps_per_s: training steps per second, compilation excluded.
      compile_s: seconds spent tracing and compiling.
      nonfinite: steps whose gradients were not finite (applied without scaling, skipped with it).
      skipped: steps skipped by the loss scaler (None without loss scaling).
      final_scale: the loss scale after the last step (None without loss scaling).
    """

    regime: str
    backend: str
    losses: np.ndarray
    scales: np.ndarray
    accuracy: float
    steps_per_s: float
    compile_s: float
    nonfinite: int
    skipped: int | None
    final_scale: float | None

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10% of the steps (at least one)."""
        return float(np.mean(self.losses[-max(1, len(self.losses) // 10) :]))


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 1797 digits, scaled to [0, 1], split in half (898 train, 899 test), fixed.

    Returns:
      ``(x_train, y_train, x_test, y_test)``: float32 images of 64 pixels and int32 labels.

    Raises:
      ImportError: scikit-learn, which ships the data, is not installed; the message says how to
        install it.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError(
            "the demo trains on scikit-learn's digits, and scikit-learn is not installed: "
            "pip install scikit-learn"
        ) from None

    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(images))
    x = (images[order] / 16.0).astype(np.float32)
    y = labels[order].astype(np.int32)
    return x[:898], y[:898], x[898:], y[898:]


def _init(seed: int, hidden: int) -> dict[str, np.ndarray]:
    """He-normal weights and zero biases, float32, drawn on the host (nothing to compile)."""
    rng = np.random.default_rng(seed)
    params = {}
    for i, (m, n) in enumerate(((64, hidden), (hidden, 10))):
        params[f"w{i}"] = (rng.standard_normal((m, n)) * np.sqrt(2 / m)).astype(np.float32)
        params[f"b{i}"] = np.zeros((n,), np.float32)
    return params


class _Namespace(NamedTuple):
    xp: Any  # heddle.numpy or jax.numpy
    nn: Any  # heddle.nn or jax.nn
    value_and_grad: Callable[..., Any]
    cast: Callable[[Any, np.dtype], Any]  # (tree, dtype) -> tree, floating leaves only


def _plain_cast(tree: Any, dtype: np.dtype) -> Any:
    """What a plain-JAX user writes: ``astype`` on every floating leaf."""
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
    )


def _namespace(backend: str) -> _Namespace:
    if backend == "heddle":
        import heddle.nn
        import heddle.numpy
        from heddle import autodiff
        from heddle.policy._precision import _cast_tree

        return _Namespace(heddle.numpy, heddle.nn, autodiff.value_and_grad, _cast_tree)
    return _Namespace(jnp, jax.nn, jax.value_and_grad, _plain_cast)


def _model(ns: _Namespace, params: dict, x: Any) -> Any:
    h = ns.nn.relu(ns.xp.add(ns.xp.matmul(x, params["w0"]), params["b0"]))
    return ns.xp.add(ns.xp.matmul(h, params["w1"]), params["b1"])


class _PlainScale(NamedTuple):
    scale: jax.Array  # float32[]
    good_steps: jax.Array  # int32[]
    skipped: jax.Array  # int32[]


def _plain_scaled_step(loss_fn, opt, cfg: Config):
    """Dynamic loss scaling written by hand in plain JAX (jmp's algorithm, as users write it)."""

    def step(params, opt_state, ls: _PlainScale, x, y):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(p, x, y) * ls.scale)(params)
        grads = jax.tree.map(lambda g: g / ls.scale.astype(g.dtype), grads)
        finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        updates, new_opt = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        good = jnp.where(finite, ls.good_steps + 1, 0)
        grow = good >= cfg.growth_interval
        scale = jnp.where(finite, jnp.where(grow, ls.scale * 2, ls.scale), ls.scale / 2)
        new_ls = _PlainScale(
            jnp.maximum(scale, jnp.float32(1)),
            jnp.where(grow, 0, good).astype(jnp.int32),
            ls.skipped + (~finite).astype(jnp.int32),
        )
        out = (loss / ls.scale, finite, ls.scale)
        return keep(new_params, params), keep(new_opt, opt_state), new_ls, out

    return step


def _make_step(regime: Regime, backend: str, cfg: Config):
    """``step(params, opt_state, scale_state, x, y) -> (params, opt_state, scale_state, out)``."""
    from heddle import scaling

    ns = _namespace(backend)
    prec = Precision.parse(regime.precision)

    def loss_fn(params, x, y):
        logits = _model(ns, ns.cast(params, prec.compute_dtype), ns.cast(x, prec.compute_dtype))
        logp = ns.nn.log_softmax(ns.cast(logits, prec.output_dtype))
        return -ns.xp.mean(ns.xp.take_along_axis(logp, y[:, None], axis=1))

    sgd = optax.sgd(cfg.lr, momentum=cfg.momentum)
    if regime.scaled and backend == "heddle":
        opt = scaling.dynamic_loss_scale(
            sgd, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval
        )

        def step(params, opt_state, ls, x, y):
            scale = scaling.loss_scale(opt_state)
            loss, grads, finite = scaling.backward_scaled(loss_fn, scale)(params, x, y)
            updates, opt_state = opt.update(grads, opt_state, params, value=loss)
            return optax.apply_updates(params, updates), opt_state, ls, (loss, finite, scale)

        return step, opt
    if regime.scaled:
        return _plain_scaled_step(loss_fn, sgd, cfg), sgd

    def plain(params, opt_state, ls, x, y):
        loss, grads = ns.value_and_grad(loss_fn)(params, x, y)
        grads = ns.cast(grads, prec.param_dtype)  # pure bfloat16: updates at the weights' dtype
        finite = scaling.grads_finite(grads)  # only counted: without scaling, steps are applied
        updates, opt_state = sgd.update(grads, opt_state, params)
        out = (loss.astype(jnp.float32), finite, jnp.float32(1))
        return optax.apply_updates(params, updates), opt_state, ls, out

    return plain, sgd


def train(
    regime: Regime | str,
    backend: str,
    cfg: Config = Config(),
    data: tuple[np.ndarray, ...] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Result:
    """Trains the demo's MLP in one regime with one namespace.

    Args:
      regime: a ``Regime`` or the name of one in ``REGIMES``.
      backend: ``"heddle"`` or ``"jax"``.
      cfg: hyperparameters.
      data: ``load_digits_split()``'s output (loaded if None).
      progress: called with the number of steps done after each chunk.

    Returns:
      The ``Result``.

    Raises:
      ValueError: an unknown regime or backend.
    """
    from heddle import scaling

    regime = _regime(regime)
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    x_train, y_train, x_test, y_test = data if data is not None else load_digits_split()
    prec = Precision.parse(regime.precision)
    step, opt = _make_step(regime, backend, cfg)
    ns = _namespace(backend)
    params = ns.cast(jax.tree.map(jnp.asarray, _init(cfg.seed, cfg.hidden)), prec.param_dtype)
    opt_state = opt.init(params)
    ls = _PlainScale(jnp.float32(cfg.init_scale), jnp.int32(0), jnp.int32(0))
    xs, ys = jnp.asarray(x_train), jnp.asarray(y_train)

    def chunk(carry, idx, active):
        def body(c, a):
            i, on = a
            params, opt_state, ls, out = step(*c, xs[i], ys[i])
            # a padding step (past cfg.steps, in the last chunk) leaves everything as it was
            c = jax.tree.map(lambda n, o: jnp.where(on, n, o), (params, opt_state, ls), c)
            return c, out

        return jax.lax.scan(body, carry, (idx, active))

    rng = np.random.default_rng(cfg.seed)
    size = max(1, min(cfg.chunk, cfg.steps))
    n_chunks = -(-cfg.steps // size)
    idx = np.stack([rng.choice(len(x_train), cfg.batch, replace=False) for _ in range(cfg.steps)])
    idx = np.concatenate([idx, np.zeros((n_chunks * size - cfg.steps, cfg.batch), idx.dtype)])
    active = np.arange(n_chunks * size) < cfg.steps
    carry = (params, opt_state, ls)
    t0 = time.perf_counter()
    compiled = jax.jit(chunk).lower(carry, idx[:size], active[:size]).compile()
    compile_s = time.perf_counter() - t0
    outs = []
    t0 = time.perf_counter()
    for k in range(n_chunks):
        carry, out = compiled(
            carry, idx[k * size : (k + 1) * size], active[k * size : (k + 1) * size]
        )
        jax.block_until_ready(out)
        outs.append(out)
        if progress is not None:
            progress(min((k + 1) * size, cfg.steps))
    elapsed = time.perf_counter() - t0
    losses, finite, scales = (
        np.concatenate([np.asarray(o[j]) for o in outs])[: cfg.steps] for j in range(3)
    )
    params, opt_state, ls = carry

    @jax.jit
    def predict(params, x):
        logits = _model(ns, ns.cast(params, prec.compute_dtype), ns.cast(x, prec.compute_dtype))
        return ns.xp.argmax(logits, axis=1)

    accuracy = float(np.mean(np.asarray(predict(params, x_test)) == y_test)) * 100
    skipped = final_scale = None
    if regime.scaled and backend == "heddle":
        state = scaling.loss_scale_state(opt_state)
        skipped, final_scale = int(state.skipped), float(state.scale)
    elif regime.scaled:
        skipped, final_scale = int(ls.skipped), float(ls.scale)
    return Result(
        regime.name, backend, losses.astype(np.float32), scales.astype(np.float32), accuracy,
        cfg.steps / elapsed, compile_s, int(np.sum(~finite)), skipped, final_scale,
    )  # fmt: skip


def _regime(regime: Regime | str) -> Regime:
    if isinstance(regime, Regime):
        return regime
    if regime not in REGIMES:
        raise ValueError(f"regime {regime!r} is not one of: {', '.join(REGIMES)}")
    return REGIMES[regime]


def run(
    cfg: Config = Config(),
    regimes: Sequence[str] | None = None,
    backends: Sequence[str] = BACKENDS,
    progress: Callable[[str, str, int, int], None] | None = None,
) -> list[Result]:
    """Runs every (regime, backend) pair; see ``train``.

    Args:
      cfg: hyperparameters.
      regimes: names from ``REGIMES`` (default: all, in order).
      backends: from ``BACKENDS``.
      progress: called as ``progress(regime, backend, done, total)`` after each chunk.

    Returns:
      One ``Result`` per pair, regime-major.
    """
    data = load_digits_split()
    results = []
    for name in regimes or list(REGIMES):
        for backend in backends:
            report = None
            if progress is not None:
                report = lambda done, n=name, b=backend: progress(n, b, done, cfg.steps)
            results.append(train(name, backend, cfg, data, report))
    return results
