"""Differentiation under heddle's policy: gradients are never narrower than float32 (POLICY.md 7).

``grad``, ``value_and_grad``, ``vjp``, ``jacfwd``, ``jacrev``, ``jacobian`` and ``hessian`` take JAX's
arguments and return JAX's structures, with three differences:

- The gradient of a leaf has ``heddle.policy.grad_dtype`` of the leaf: float32 for bfloat16, float16
  and every float8/float4 leaf, float64 for float64, complex kept. An integer or bool leaf gets a zero
  float32 gradient of its shape (JAX: float0 or an error), so parameters and gradients zip.
- The forward pass is unchanged: every primal value is bit for bit what the function computes
  without differentiation.
- Every cotangent of a narrow float value is float32 (``grad_dtype``), from the loss to every leaf:
  a cotangent float32 holds is never flushed by float16's range or rounded to bfloat16's 8 bits,
  every sum of cotangent contributions is a float32 sum, and a parameter's gradient is never rounded.
  Forward-mode tangents follow the same rule.

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
   6496 instead of 6506.35), and a parameter used by several ops gets case 1 as well;
3. every cotangent between ops has its value's narrow dtype: float16 flushes a cotangent below 6e-8
   to zero (a loss normalised by a large global batch has such cotangents everywhere), which is
   what loss scaling exists to work around.

heddle.autodiff differentiates with respect to a float32 copy of each narrow leaf and evaluates the
function's jaxpr with a float32 *twin* beside each narrow value (``_twins``, a rule set on the
interpreter core autocast runs on, ``heddle.programs._interpret``): every ``convert(v -> float32)``
of a narrow ``v`` returns ``v``'s twin, one variable shared by all uses, so JAX's own ``add_any``
sums the uses in float32; value-copying ops (reshape, transpose, slicing, gather, ...) apply
themselves to the twins; ``dot_general`` on narrow operands with a float32 result takes its tangent
through the twins (``_rules.contract``); every other equation with a narrow result gives it a twin
whose value is the result, exactly, and whose derivative is the equation's computed in float32, and
one that reads narrow values into a float32 result (a convolution or a ragged dot with
``preferred_element_type=float32``, a ``scan`` with a float32 carry and narrow layers inside) keeps
its value and takes the same float32 derivative (``_widen``: narrow dtypes in parameters and
literals become float32, bodies of ``jit``, ``cond``, ``scan`` and ``while`` are widened
recursively, a ``custom_jvp`` function keeps its rule, widened; a rounding to a narrow dtype or by
``lax.reduce_precision`` has derivative 1). The primal computations are bound unchanged, so the
forward pass is bit for bit the plain one, and XLA removes the twins that nothing needs.

Higher orders compose: ``hessian`` is ``jacfwd(jacrev(fun))`` with heddle's transforms, and the outer
one sees the inner one's backward pass as ordinary equations with twins of their own. Forward-mode
tangents follow the same rule as cotangents.

``jax.checkpoint`` is kept (re-applied around the evaluation, with the twins of its inputs passed in
and those of its narrow results returned), whenever narrow values cross it or live inside it;
``scan``, ``cond`` and ``switch`` bodies that hold narrow values are evaluated with twins in a new
loop or branch (a narrow carry carried as its twin), so a scan over layers keeps float32
cotangents in every layer along the narrow program's values.

Backward contractions: by default the two contractions that transpose a narrow contraction read
its float32 cotangent (float32 matmuls). ``contractions="scaled"`` (``grad``, ``value_and_grad``,
``vjp``, ``jacrev``) gives bfloat16 x bfloat16 and float16 x float16 contractions backward
contractions at the narrow dtype's speed: each reads a copy of the float32 cotangent rounded to the
operands' dtype (float16: scaled by a power of two into its range first, undone exactly after), and
accumulates in float32; the cotangents themselves stay float32 (``_scaled``).

Limits: ``custom_vjp`` functions, bit casts and the bodies of ``shard_map`` and ``pmap`` keep JAX's
derivative (a narrow value they produce has a cotangent of its own dtype), and a function whose Python
control flow depends on argument values is differentiated directly (gradients at the right dtypes,
cotangents as in JAX). A plain ``jax.grad`` applied outside a heddle transform sees only JAX's rules,
``jax.grad(heddle.autocast(f))`` included: autocast's narrow results are narrow values.

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
