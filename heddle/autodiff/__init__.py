"""Differentiation under heddle's policy: gradients are never narrower than float32 (POLICY.md 7).

``grad``, ``value_and_grad``, ``vjp``, ``jacfwd``, ``jacrev``, ``jacobian`` and ``hessian`` take JAX's
arguments and return JAX's structures, with three differences:

- The gradient of a leaf has ``heddle.policy.grad_dtype`` of the leaf: float32 for bfloat16, float16
  and every float8/float4 leaf, float64 for float64, complex kept. An integer or bool leaf gets a zero
  float32 gradient of its shape (JAX: float0 or an error), so parameters and gradients zip.
- The forward pass is unchanged: every primal value is bit for bit what the function computes
  without differentiation.
- Cotangents are summed in float32. Where the function uses heddle's ops, every sum of cotangent
  contributions (a bias broadcast over a batch, a contraction, a gather's repeated indices, a scan,
  the uses of one value by several ops) accumulates in float32 and is rounded once, to the value's
  dtype, at the op that produced the value; a parameter's gradient is never rounded.

Why JAX needs help, and how it is done
--------------------------------------
heddle's ops compute in float32 on narrow inputs: each op converts its operands to float32
(``convert_element_type``, exact), computes, and rounds its result once to the narrow dtype;
contractions pass the narrow operands to ``dot_general`` with ``preferred_element_type=float32``.
JAX's transposes of those explicit paths already keep the backward pass of one op in float32 (the
transpose of a broadcast inside the float32 path is a float32 sum; ``dot_general``'s transpose keeps
``preferred_element_type=float32`` and rounds once). What remains narrow in plain ``jax.grad`` comes
from JAX's rule that a cotangent has its primal's dtype:

1. the contributions of the several ops that read one bfloat16 value are each rounded to bfloat16
   (the transpose of each op's own ``convert(bf16 -> f32)``) and then added in bfloat16
   (``add_any``);
2. the gradient of a bfloat16 parameter is a bfloat16 array: the float32 sum an op computed for it
   is rounded to bfloat16 at the end (a bias broadcast over 65,000 rows with cotangent 0.1 gets
   6496 instead of 6506.35), and a parameter used by several ops gets case 1 as well.

heddle.autodiff differentiates with respect to a float32 copy of each narrow leaf and evaluates the
function's jaxpr with a float32 *twin* beside each narrow value (``_twins``): every
``convert(v -> float32)`` of a narrow ``v`` returns ``v``'s twin, one variable shared by all uses, so
JAX's own ``add_any`` sums the uses in float32 and the transpose of the producing op's rounding rounds
the total once; ``dot_general`` on narrow operands takes its tangent through the twins
(``_rules.contract``); value-copying ops (reshape, transpose, slicing, gather, ...) carry the twins
along; and a leaf's twin is the variable being differentiated, so its gradient is the float32 sum,
never rounded. The primal computations are bound unchanged, so the forward pass is bit for bit the
plain one, and XLA removes the twins that nothing needs. Cotangents between ops keep the narrow dtype
of their value, as in JAX, so the backward pass moves no more bytes than plain ``jax.grad`` (keeping
them in float32 everywhere measured 1.1-1.7x slower on the transformer benchmark). Where the function
uses plain JAX on narrow values those values keep JAX's behaviour; the result dtypes are heddle's
either way.

Higher orders compose: ``hessian`` is ``jacfwd(jacrev(fun))`` with heddle's transforms, and the outer
one sees the inner one's backward pass as ordinary equations with twins of their own. Forward-mode
tangents follow the same rule as cotangents.

``jax.checkpoint`` is kept (re-applied around the evaluation, with the leaves' twins passed in).

Limits: ``scan``, ``while``, ``cond``, ``shard_map`` and custom_jvp/custom_vjp functions are
evaluated as they are (their bodies see no twins), and a function whose Python control
flow depends on argument values is differentiated directly (gradients at the right dtypes, a narrow
leaf's gradient rounded once to the leaf's dtype). A plain ``jax.grad`` applied outside a heddle
transform sees only JAX's rules. On CPU, XLA's YNN fusion may compute a contraction, elementwise ops
and a reduction in one float32 kernel and skip a rounding written between them: under ``jax.jit`` a
cotangent can then be rounded less often than this page says (never more often).

Examples:
  A bias broadcast over 65,000 rows, cotangent 0.1 (bfloat16: 0.10009765625) on every row; the
  float32 sum of the rounded cotangents is 6506.34765625:

  >>> import jax, jax.numpy as jnp
  >>> from heddle import autodiff
  >>> bf16, f32 = jnp.bfloat16, jnp.float32
  >>> rows, bias = jnp.zeros((65000, 1), bf16), jnp.zeros(1, bf16)
  >>> ct = jnp.full((65000, 1), 0.1, bf16)
  >>> layer = lambda b: (rows.astype(f32) + b.astype(f32)).astype(bf16)  # heddle's op style
  >>> autodiff.vjp(layer, bias)[1](ct)[0].tolist()
  [6506.34765625]
  >>> jax.vjp(layer, bias)[1](ct)[0].tolist(), jax.vjp(lambda b: rows + b, bias)[1](ct)[0].tolist()
  ([6496.0], [6208.0])
"""

from heddle.autodiff._api import grad as grad
from heddle.autodiff._api import hessian as hessian
from heddle.autodiff._api import jacfwd as jacfwd
from heddle.autodiff._api import jacobian as jacobian
from heddle.autodiff._api import jacrev as jacrev
from heddle.autodiff._api import value_and_grad as value_and_grad
from heddle.autodiff._api import vjp as vjp

__all__ = ["grad", "hessian", "jacfwd", "jacobian", "jacrev", "value_and_grad", "vjp"]
