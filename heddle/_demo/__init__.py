"""The demo behind ``python -m heddle demo``: where plain JAX in bf16/f16 fails and heddle does not.

The training code of the demo; only the command line (``heddle._cli_demo``) imports it, so it is
no part of the library that ``import heddle`` loads. (``heddle.demo`` re-exports it for the
notebooks that call it.)

Two models, each trained with momentum SGD in several precision regimes, every regime on the same
initial weights and the same batches:

- ``char`` (the default): a character-level language model (Bengio et al.'s neural probabilistic
  language model) that predicts the next character of Python source code from the 32 before it,
  through an embedding table of 96 characters, a 256-64 ReLU layer and a 64-96 softmax layer. The
  text is the Python standard library's own ``*.py`` files, which ship with Python (no download).
  A batch of 16,384 windows looks up 524,288 embedding rows, so the embedding's gradient is a
  scatter-add of ~140,000 contributions into the row of ``' '`` alone: plain ``jax.numpy`` adds them
  in the row's dtype (bfloat16: a sum stops growing at about 2^8 times a contribution), heddle in
  float32, rounded once.
- ``mlp``: a 64-128-10 MLP on scikit-learn's handwritten digits (bundled with scikit-learn). On CPU,
  XLA already accumulates dots in float32, so this dense model trains alike with both namespaces.

A regime is data (``Regime``: a precision, loss scaling or not); a *run* is a regime with a
backend (``BACKENDS``: heddle's namespaces, or plain ``jax.numpy``/``jax.nn``/
``jax.value_and_grad``), and each model's runs are a tuple of ``(regime, backend)`` pairs
(``MODELS[name].runs``); the ``char`` model also runs the unchanged jax.numpy model under
``heddle.autocast`` (the pair ``("bf16", "autocast")``). The model code is one function of the namespace, the same text for
every backend. Steps run in ``jax.lax.scan`` chunks; the first chunk of every run is its warm-up
and is not timed.

Examples:
  >>> from heddle import _demo as demo
  >>> r = demo.train("bf16", "heddle", demo.Config.defaults("char", steps=4, batch=256, chunk=2))
  >>> (r.regime, r.backend, len(r.losses), r.nonfinite)
  ('bf16', 'heddle', 4, 0)
"""

from __future__ import annotations

import dataclasses
import pathlib
import sysconfig
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from heddle._demo_catalog import CATALOG
from heddle.policy import Precision


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


def _regimes(*regimes: Regime) -> dict[str, Regime]:
    return {r.name: r for r in regimes}


REGIMES: dict[str, Regime] = _regimes(
    Regime("float32", "float32", False, "float32 everywhere"),
    Regime("bf16-params", "bfloat16", False, "bfloat16 parameters, momentum and compute"),
    Regime("bf16-mixed", "mixed_bfloat16", False, "float32 masters, bfloat16 compute"),
    Regime("f16-mixed", "mixed_float16", False, "float32 masters, float16, no loss scaling"),
    Regime("f16-scaled", "mixed_float16", True, "float32 masters, float16, dynamic loss scale"),
)
"""The regimes of the ``mlp`` model, in the order the demo runs them."""

CHAR_REGIMES: dict[str, Regime] = _regimes(
    Regime("float32", "float32", False, "float32 parameters and compute (the reference)"),
    Regime("bf16", "mixed_bfloat16", False, "float32 masters, bfloat16 copy for the step"),
    Regime("f16", "mixed_float16", False, "float32 masters, float16 copy, no loss scaling"),
    Regime(
        "f16-scaled", "mixed_float16", True, "float32 masters, float16 copy, dynamic loss scale"
    ),
)
"""The regimes of the ``char`` model."""

BACKENDS: dict[str, str] = {
    "heddle": "heddle.numpy, heddle.nn, heddle.autodiff, heddle.scaling",
    "jax": "jax.numpy, jax.nn, jax.value_and_grad, loss scaling by hand (jmp's algorithm)",
    "autocast": "the jax.numpy model unchanged, heddle.autocast(jax.value_and_grad(loss))",
}
"""The backends a run can use, and what each means (``autocast`` needs ``heddle.autocast``)."""


class _Namespace(NamedTuple):
    xp: Any  # heddle.numpy or jax.numpy
    nn: Any  # heddle.nn or jax.nn
    value_and_grad: Callable[[Callable[..., Any]], Callable[..., Any]]
    cast: Callable[[Any, Precision, str], Any]  # (tree, precision, "param"/"compute"/"output")


def _plain_cast(tree: Any, prec: Precision, role: str) -> Any:
    """What a plain-JAX user writes: ``astype`` on every floating leaf."""
    dtype = getattr(prec, f"{role}_dtype")
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
    )


def _heddle_cast(tree: Any, prec: Precision, role: str) -> Any:
    return getattr(prec, f"cast_to_{role}")(tree)


def _heddle() -> _Namespace:
    import heddle.nn
    import heddle.numpy
    from heddle import autodiff

    return _Namespace(heddle.numpy, heddle.nn, autodiff.value_and_grad, _heddle_cast)


def _jax() -> _Namespace:
    return _Namespace(jnp, jax.nn, jax.value_and_grad, _plain_cast)


def _autocast() -> _Namespace:
    import heddle  # heddle.autocast: the unchanged jax.numpy model, rewritten to heddle's policy

    return _Namespace(jnp, jax.nn, lambda f: heddle.autocast(jax.value_and_grad(f)), _plain_cast)


_NAMESPACES: dict[str, Callable[[], _Namespace]] = {
    "heddle": _heddle,
    "jax": _jax,
    "autocast": _autocast,
}


@dataclasses.dataclass(frozen=True)
class Config:
    """The demo's hyperparameters; ``Config.defaults(model)`` gives each model's own.

    Attributes:
      model: ``"char"`` or ``"mlp"`` (a key of ``MODELS``).
      steps: training steps per run.
      seed: seeds the initial weights and the batch order (the train/test split is fixed).
      batch: examples per step.
      lr: SGD learning rate.
      momentum: SGD momentum.
      hidden: width of the hidden layer.
      context: characters the ``char`` model reads before the one it predicts.
      embed: width of the ``char`` model's embedding.
      chunk: steps per compiled ``lax.scan`` call (the progress granularity; the first: warm-up).
      init_scale: the first loss scale of the scaled regime.
      growth_interval: finite steps before the loss scale doubles.
    """

    model: str = "mlp"
    steps: int = 2000
    seed: int = 0
    batch: int = 64
    lr: float = 0.005
    momentum: float = 0.9
    hidden: int = 128
    context: int = 32
    embed: int = 8
    chunk: int = 100
    init_scale: float = 2.0**15
    growth_interval: int = 200

    @classmethod
    def defaults(cls, model: str = "char", **overrides: Any) -> Config:
        """The defaults of one model, with ``overrides`` applied.

        Args:
          model: a key of ``MODELS``.
          **overrides: fields to change.

        Returns:
          The ``Config``.

        Raises:
          ValueError: an unknown model.

        Examples:
          >>> from heddle import _demo as demo
          >>> demo.Config.defaults("char").batch, demo.Config.defaults("mlp", steps=5).steps
          (16384, 5)
        """
        return dataclasses.replace(_model(model).config, **overrides)


@dataclasses.dataclass
class Result:
    """What one run measured.

    Attributes:
      regime: the regime's name.
      backend: a key of ``BACKENDS``.
      losses: float32[steps], the training loss of every step (NaN once training diverged).
      scales: float32[steps], the loss scale used at every step (1.0 without loss scaling).
      accuracy: held-out accuracy in percent (the next character, or the digit).
      eval_loss: held-out loss in nats (cross-entropy, the regime's own forward pass).
      steps_per_s: training steps per second after the warm-up chunk (compilation excluded).
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
    eval_loss: float
    steps_per_s: float
    compile_s: float
    nonfinite: int
    skipped: int | None
    final_scale: float | None

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10% of the steps (at least one)."""
        return float(np.mean(self.losses[-max(1, len(self.losses) // 10) :]))


# --- data ----------------------------------------------------------------------------------------

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
"""The ``char`` model's 96 characters: newline and printable ASCII; any other one reads as ``?``."""

TEXT_CHARS = 3_000_000
"""How much of the standard library's source the ``char`` model reads (the last 10% is held out)."""


def load_text(limit: int = TEXT_CHARS) -> tuple[np.ndarray, np.ndarray]:
    """The Python standard library's own source, as indices into ``VOCAB``, split 90/10.

    The top-level ``*.py`` files of the running Python's standard library, in name order,
    concatenated and cut at ``limit`` characters; the held-out part is the last 10% (other files).

    Args:
      limit: characters to read.

    Returns:
      ``(train, test)``: uint8 arrays of character indices.

    Raises:
      FileNotFoundError: this Python ships no standard-library sources (some minimal installs keep
        only ``.pyc`` files); the message says what to use instead.
    """
    folder = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(folder.glob("*.py")):
        chunks.append(path.read_bytes())
        size += len(chunks[-1])
        if size >= limit:
            break
    if size < limit // 10:
        raise FileNotFoundError(
            f"the char demo reads the standard library's *.py files, and {folder} has "
            f"{size} bytes of them: use python -m heddle demo --model mlp"
        )
    data = np.frombuffer(b"".join(chunks)[:limit], np.uint8)
    table = np.full(256, VOCAB.index("?"), np.uint8)
    for i, c in enumerate(VOCAB):
        table[ord(c)] = i
    ids = table[data]
    cut = len(ids) * 9 // 10
    return ids[:cut], ids[cut:]


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
            "the demo's mlp model trains on scikit-learn's digits, and scikit-learn is not "
            "installed: pip install scikit-learn"
        ) from None

    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(images))
    x = (images[order] / 16.0).astype(np.float32)
    y = labels[order].astype(np.int32)
    return x[:898], y[:898], x[898:], y[898:]


# --- models --------------------------------------------------------------------------------------


def char_model(ns: Any, params: dict, tokens: Any) -> Any:
    """The ``char`` model's logits for ``tokens``: embed, concatenate, ReLU, linear.

    Args:
      ns: anything with ``xp`` (``heddle.numpy`` or ``jax.numpy``) and ``nn`` (``heddle.nn`` or
        ``jax.nn``) attributes; the code is the same for both.
      params: ``embed`` [96, embed], ``w1`` [context * embed, hidden], ``b1``, ``w2``, ``b2``.
      tokens: int32[batch, context], indices into ``VOCAB``.

    Returns:
      The logits, [batch, 96], at the parameters' dtype.
    """
    e = ns.xp.take(params["embed"], tokens, axis=0)
    h = ns.xp.reshape(e, (tokens.shape[0], -1))
    h = ns.nn.relu(ns.xp.add(ns.xp.matmul(h, params["w1"]), params["b1"]))
    return ns.xp.add(ns.xp.matmul(h, params["w2"]), params["b2"])


def mlp_model(ns: Any, params: dict, x: Any) -> Any:
    """The ``mlp`` model's logits: 64-128-10, ReLU (``ns`` as for ``char_model``).

    Args:
      ns: the namespaces, as for ``char_model``.
      params: ``w0``, ``b0``, ``w1``, ``b1``.
      x: float[batch, 64] images.

    Returns:
      The logits, [batch, 10].
    """
    h = ns.nn.relu(ns.xp.add(ns.xp.matmul(x, params["w0"]), params["b0"]))
    return ns.xp.add(ns.xp.matmul(h, params["w1"]), params["b1"])


def _init_char(cfg: Config) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    n_in, v = cfg.context * cfg.embed, len(VOCAB)
    return {
        "embed": (rng.standard_normal((v, cfg.embed)) / np.sqrt(cfg.embed)).astype(np.float32),
        "w1": (rng.standard_normal((n_in, cfg.hidden)) / np.sqrt(n_in)).astype(np.float32),
        "b1": np.zeros((cfg.hidden,), np.float32),
        "w2": (rng.standard_normal((cfg.hidden, v)) / np.sqrt(cfg.hidden)).astype(np.float32),
        "b2": np.zeros((v,), np.float32),
    }


def _init_mlp(cfg: Config) -> dict[str, np.ndarray]:
    """He-normal weights and zero biases, float32, drawn on the host (nothing to compile)."""
    rng = np.random.default_rng(cfg.seed)
    params = {}
    for i, (m, n) in enumerate(((64, cfg.hidden), (cfg.hidden, 10))):
        params[f"w{i}"] = (rng.standard_normal((m, n)) * np.sqrt(2 / m)).astype(np.float32)
        params[f"b{i}"] = np.zeros((n,), np.float32)
    return params


class _Data(NamedTuple):
    train: Any  # what a step's batch is gathered from, on device
    sample: Callable[[np.random.Generator, int], np.ndarray]  # (rng, steps) -> int32[steps, batch]
    batch: Callable[[Any, Any], tuple[Any, Any]]  # (train, row of sample) -> (inputs, targets)
    test: tuple[Any, np.ndarray]  # (inputs, targets) of the held-out set


def _char_data(cfg: Config, loaded: Any = None) -> _Data:
    train, test = loaded if loaded is not None else load_text()
    k = cfg.context
    offsets = np.arange(k + 1)
    starts = np.random.default_rng(12345).integers(0, len(test) - k - 1, 32768)
    held = test[starts[:, None] + offsets].astype(np.int32)

    def sample(rng, steps):
        return rng.integers(0, len(train) - k - 1, (steps, cfg.batch)).astype(np.int32)

    def batch(text, starts):
        w = jnp.take(text, starts[:, None] + offsets, axis=0).astype(jnp.int32)
        return w[:, :k], w[:, k]

    return _Data(jnp.asarray(train), sample, batch, (jnp.asarray(held[:, :k]), held[:, k]))


def _mlp_data(cfg: Config, loaded: Any = None) -> _Data:
    x_train, y_train, x_test, y_test = loaded if loaded is not None else load_digits_split()

    def sample(rng, steps):
        return np.stack([rng.choice(len(x_train), cfg.batch, replace=False) for _ in range(steps)])

    def batch(data, i):
        return data[0][i], data[1][i]

    return _Data((jnp.asarray(x_train), jnp.asarray(y_train)), sample, batch, (x_test, y_test))


@dataclasses.dataclass(frozen=True)
class Model:
    """One model of the demo: its code, its data, its regimes and the runs the demo makes.

    Attributes:
      name: the ``--model`` name.
      description: one line for ``--help`` and the output.
      forward: ``forward(ns, params, inputs) -> logits``, the same code for every backend.
      init: ``init(cfg) -> params``, float32 NumPy arrays drawn on the host.
      data: ``data(cfg, loaded) -> _Data``; ``loaded`` is ``load()``'s output or None.
      load: reads the data set once (shared by every run).
      regimes: the model's ``Regime`` s by name.
      runs: the ``(regime, backend)`` pairs ``python -m heddle demo`` runs, in order.
      config: the model's default ``Config``.
      grads_of_copy: differentiate with respect to the compute-dtype copy of the master weights
        (cast before the differentiated function) rather than the masters themselves.
    """

    name: str
    description: str
    forward: Callable[..., Any]
    init: Callable[[Config], dict]
    data: Callable[..., _Data]
    load: Callable[[], Any]
    regimes: dict[str, Regime]
    runs: tuple[tuple[str, str], ...]
    config: Config
    grads_of_copy: bool


MODELS: dict[str, Model] = {
    "char": Model(
        "char",
        CATALOG["char"].description,
        char_model,
        _init_char,
        _char_data,
        load_text,
        CHAR_REGIMES,
        (
            ("float32", "jax"),
            ("bf16", "jax"),
            ("bf16", "heddle"),
            ("bf16", "autocast"),
            ("f16", "jax"),
            ("f16", "heddle"),
            ("f16-scaled", "jax"),
            ("f16-scaled", "heddle"),
        ),
        Config("char", steps=150, batch=16384, lr=0.5, hidden=64, chunk=25, growth_interval=25),
        grads_of_copy=True,
    ),
    "mlp": Model(
        "mlp",
        CATALOG["mlp"].description,
        mlp_model,
        _init_mlp,
        _mlp_data,
        load_digits_split,
        REGIMES,
        tuple((r, b) for r in REGIMES for b in ("heddle", "jax")),
        Config(),
        grads_of_copy=False,
    ),
}
"""The demo's models by ``--model`` name; ``char`` is the default."""


def _model(name: str) -> Model:
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of: {', '.join(MODELS)}")
    return MODELS[name]


# --- training ------------------------------------------------------------------------------------


class _PlainScale(NamedTuple):
    scale: jax.Array  # float32[]
    good_steps: jax.Array  # int32[]
    skipped: jax.Array  # int32[]


def _loss_fn(model: Model, ns: _Namespace, prec: Precision):
    def loss_fn(params, inputs, targets):
        if not model.grads_of_copy:
            params = ns.cast(params, prec, "compute")
        logits = model.forward(ns, params, ns.cast(inputs, prec, "compute"))
        logp = ns.nn.log_softmax(ns.cast(logits, prec, "output"))
        return -ns.xp.mean(ns.xp.take_along_axis(logp, targets[:, None], axis=1))

    return loss_fn


def _plain_scaled_step(loss_fn, opt, ns: _Namespace, prec: Precision, model: Model, cfg: Config):
    """Dynamic loss scaling written by hand (jmp's algorithm, as users write it)."""

    def step(params, opt_state, ls: _PlainScale, x, y):
        args = ns.cast(params, prec, "compute") if model.grads_of_copy else params
        loss, grads = ns.value_and_grad(lambda p: loss_fn(p, x, y) * ls.scale)(args)
        grads = ns.cast(grads, prec, "param")
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


def _make_step(model: Model, regime: Regime, backend: str, cfg: Config):
    """``step(params, opt_state, scale_state, x, y) -> (params, opt_state, scale_state, out)``."""
    from heddle import scaling

    ns = _NAMESPACES[backend]()
    prec = Precision.parse(regime.precision)
    loss_fn = _loss_fn(model, ns, prec)
    copy = (lambda p: ns.cast(p, prec, "compute")) if model.grads_of_copy else (lambda p: p)

    sgd = optax.sgd(cfg.lr, momentum=cfg.momentum)
    if regime.scaled and backend == "heddle":
        opt = scaling.dynamic_loss_scale(
            sgd, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval
        )

        def step(params, opt_state, ls, x, y):
            scale = scaling.loss_scale(opt_state)
            loss, grads, finite = scaling.backward_scaled(loss_fn, scale)(copy(params), x, y)
            grads = ns.cast(grads, prec, "param")
            updates, opt_state = opt.update(grads, opt_state, params, value=loss)
            return optax.apply_updates(params, updates), opt_state, ls, (loss, finite, scale)

        return step, opt
    if regime.scaled:
        return _plain_scaled_step(loss_fn, sgd, ns, prec, model, cfg), sgd

    def plain(params, opt_state, ls, x, y):
        loss, grads = ns.value_and_grad(loss_fn)(copy(params), x, y)
        grads = ns.cast(grads, prec, "param")  # the masters' dtype (bfloat16 for pure bfloat16)
        finite = scaling.grads_finite(grads)  # only counted: without scaling, steps are applied
        updates, opt_state = sgd.update(grads, opt_state, params)
        out = (loss.astype(jnp.float32), finite, jnp.float32(1))
        return optax.apply_updates(params, updates), opt_state, ls, out

    return plain, sgd


def _resolve(cfg: Config, regime: Regime | str, backend: str) -> tuple[Model, Regime]:
    model = _model(cfg.model)
    if isinstance(regime, str):
        if regime not in model.regimes:
            raise ValueError(
                f"regime {regime!r} is not one of the {model.name} model's: "
                f"{', '.join(model.regimes)}"
            )
        regime = model.regimes[regime]
    if backend not in _NAMESPACES:
        raise ValueError(f"backend {backend!r} is not one of {tuple(_NAMESPACES)}")
    return model, regime


def train(
    regime: Regime | str,
    backend: str,
    cfg: Config = Config(),
    data: Any = None,
    progress: Callable[[int], None] | None = None,
) -> Result:
    """Trains ``cfg.model`` in one regime with one backend.

    Args:
      regime: a ``Regime`` or the name of one of the model's regimes.
      backend: a key of ``BACKENDS``.
      cfg: hyperparameters (``Config.defaults(model)``; ``Config()`` is the ``mlp`` model's).
      data: the model's ``load()`` output (``load_text()``, ``load_digits_split()``; None: loaded).
      progress: called with the number of steps done after each chunk.

    Returns:
      The ``Result``.

    Raises:
      ValueError: an unknown model, regime or backend.
    """
    from heddle import scaling

    model, regime = _resolve(cfg, regime, backend)
    d = model.data(cfg, data)
    prec = Precision.parse(regime.precision)
    step, opt = _make_step(model, regime, backend, cfg)
    ns = _NAMESPACES[backend]()
    params = ns.cast(jax.tree.map(jnp.asarray, model.init(cfg)), prec, "param")
    opt_state = opt.init(params)
    ls = _PlainScale(jnp.float32(cfg.init_scale), jnp.int32(0), jnp.int32(0))

    def chunk(carry, idx, active):
        def body(c, a):
            i, on = a
            params, opt_state, ls, out = step(*c, *d.batch(d.train, i))
            # a padding step (past cfg.steps, in the last chunk) leaves everything as it was
            c = jax.tree.map(lambda n, o: jnp.where(on, n, o), (params, opt_state, ls), c)
            return c, out

        return jax.lax.scan(body, carry, (idx, active))

    rng = np.random.default_rng(cfg.seed)
    size = max(1, min(cfg.chunk, cfg.steps))
    n_chunks = -(-cfg.steps // size)
    idx = d.sample(rng, cfg.steps)
    idx = np.concatenate([idx, np.zeros((n_chunks * size - cfg.steps, *idx.shape[1:]), idx.dtype)])
    active = np.arange(n_chunks * size) < cfg.steps
    carry = (params, opt_state, ls)
    t0 = time.perf_counter()
    compiled = jax.jit(chunk).lower(carry, idx[:size], active[:size]).compile()
    compile_s = time.perf_counter() - t0
    if n_chunks == 1:  # nothing left to time after a warm-up chunk: warm up on a discarded call
        jax.block_until_ready(compiled(carry, idx[:size], active[:size]))
    outs, elapsed, timed = [], 0.0, 0
    for k in range(n_chunks):
        t0 = time.perf_counter()
        carry, out = compiled(
            carry, idx[k * size : (k + 1) * size], active[k * size : (k + 1) * size]
        )
        jax.block_until_ready(out)
        if k > 0 or n_chunks == 1:
            elapsed += time.perf_counter() - t0
            timed += min(size, cfg.steps - k * size)
        outs.append(out)
        if progress is not None:
            progress(min((k + 1) * size, cfg.steps))
    losses, finite, scales = (
        np.concatenate([np.asarray(o[j]) for o in outs])[: cfg.steps] for j in range(3)
    )
    params, opt_state, ls = carry

    @jax.jit
    def evaluate(params, inputs, targets):
        logits = model.forward(
            ns, ns.cast(params, prec, "compute"), ns.cast(inputs, prec, "compute")
        )
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        loss = -jnp.mean(jnp.take_along_axis(logp, targets[:, None], axis=1))
        return loss, jnp.mean(jnp.argmax(logits, axis=1) == targets) * 100

    eval_loss, accuracy = (float(v) for v in evaluate(params, *d.test))
    skipped = final_scale = None
    if regime.scaled and backend == "heddle":
        state = scaling.loss_scale_state(opt_state)
        skipped, final_scale = int(state.skipped), float(state.scale)
    elif regime.scaled:
        skipped, final_scale = int(ls.skipped), float(ls.scale)
    return Result(
        regime.name, backend, losses.astype(np.float32), scales.astype(np.float32), accuracy,
        eval_loss, timed / elapsed, compile_s, int(np.sum(~finite)), skipped, final_scale,
    )  # fmt: skip


def gradient_error(
    regime: Regime | str, backend: str, cfg: Config, leaf: str, data: Any = None
) -> float:
    """Relative error of one parameter's gradient at the first step, against float32.

    The gradient of the first batch's loss at the initial weights, computed as the regime's step
    computes it (unscaled), compared with the same gradient computed in float32:
    ``||g - g32|| / ||g32||``.

    Args:
      regime: a ``Regime`` or the name of one of the model's regimes.
      backend: a key of ``BACKENDS``.
      cfg: hyperparameters; ``cfg.model`` names the model.
      leaf: the parameter's name (``"embed"`` for the ``char`` model's embedding table).
      data: the model's ``load()`` output (loaded if None).

    Returns:
      The relative error.

    Raises:
      ValueError: an unknown model, regime or backend.
    """
    model, regime = _resolve(cfg, regime, backend)
    d = model.data(cfg, data)
    x, y = d.batch(d.train, jnp.asarray(d.sample(np.random.default_rng(cfg.seed), 1)[0]))
    masters = jax.tree.map(jnp.asarray, model.init(cfg))

    def grads(backend: str, prec: Precision) -> dict:
        ns = _NAMESPACES[backend]()
        copy = ns.cast(masters, prec, "compute") if model.grads_of_copy else masters
        g = jax.jit(ns.value_and_grad(_loss_fn(model, ns, prec)))(copy, x, y)[1]
        return ns.cast(g, prec, "param")

    g = np.asarray(grads(backend, Precision.parse(regime.precision))[leaf], np.float64)
    ref = np.asarray(grads("jax", Precision.parse("float32"))[leaf], np.float64)
    return float(np.linalg.norm(g - ref) / np.linalg.norm(ref))


def run(
    cfg: Config = Config(),
    runs: Sequence[tuple[str, str]] | None = None,
    progress: Callable[[str, str, int, int], None] | None = None,
) -> list[Result]:
    """Trains every ``(regime, backend)`` pair of ``runs``; see ``train``.

    Args:
      cfg: hyperparameters; ``cfg.model`` names the model.
      runs: ``(regime, backend)`` pairs (default: the model's ``runs``, in order).
      progress: called as ``progress(regime, backend, done, total)`` after each chunk.

    Returns:
      One ``Result`` per pair, in order.

    Raises:
      ValueError: an unknown model, regime or backend.
    """
    model = _model(cfg.model)
    runs = model.runs if runs is None else runs
    for name, backend in runs:
        _resolve(cfg, name, backend)
    data = model.load()
    results = []
    for name, backend in runs:
        report = None
        if progress is not None:
            report = lambda done, n=name, b=backend: progress(n, b, done, cfg.steps)
        results.append(train(name, backend, cfg, data, report))
    return results
