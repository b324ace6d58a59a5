"""grad, value_and_grad, vjp, jacfwd, jacrev, jacobian and hessian under POLICY.md section 7."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from heddle.autodiff import _scaled
from heddle.autodiff._leaves import Leaves, normalize_argnums
from heddle.autodiff._twins import evaluate, is_narrow
from heddle.policy._errors import message
from heddle.policy._rules import promote_types

_F32 = np.dtype("float32")


class _Traced:
    """One call of the user's function as JAX sees it: widened inputs, widened main outputs."""

    def __init__(
        self,
        fun: Callable[..., Any],
        leaves: Leaves,
        kwargs: dict,
        has_aux: bool,
        contractions: str = "float32",
    ):
        self.fun, self.leaves, self.kwargs, self.has_aux = fun, leaves, kwargs, has_aux
        self.contractions = contractions
        self.out_dtypes: Any = None  # pytree of the main output's dtypes, set while tracing

    def __call__(self, *wide_args: Any) -> Any:
        with _scaled.mode(self.contractions):
            return self._call(*wide_args)

    def _call(self, *wide_args: Any) -> Any:
        dynamic, twins, _, place = self.leaves.rebuild(wide_args)
        flat, twin_of, tree = evaluate(
            lambda *xs: self.fun(*place(xs), **self.kwargs), dynamic, twins
        )
        idx = tree.unflatten(list(range(len(flat))))
        if self.has_aux:
            if not isinstance(idx, tuple | list) or len(idx) != 2:
                raise TypeError(
                    message(
                        "has_aux=True",
                        "the function must return a (value, aux) pair, "
                        f"but returned a {type(idx).__name__}",
                        "Return (value, aux), or pass has_aux=False.",
                    )
                )
            main, aux = idx
        else:
            main, aux = idx, None
        self.out_dtypes = jax.tree.map(lambda i: np.dtype(jnp.result_type(flat[i])), main)
        wide = jax.tree.map(
            lambda i: twin_of(i) if is_narrow(jnp.result_type(flat[i])) else flat[i],
            main,
        )
        # JAX is always given an aux: the user's, and the main output as the function computed it
        # (its narrow values returned bit for bit, signalling NaN payloads included, rather than
        # rounded back from their float32 twins)
        user_aux = jax.tree.map(lambda i: flat[i], aux) if self.has_aux else None
        return wide, (user_aux, jax.tree.map(lambda i: flat[i], main))


def _check_contractions(contractions: str, name: str) -> str:
    if contractions not in _scaled.MODES:
        raise ValueError(
            message(
                f"{name}(..., contractions={contractions!r})",
                f"contractions must be one of {', '.join(map(repr, _scaled.MODES))}",
                'Pass contractions="float32" (every backward contraction reads float32 '
                'cotangents, the default) or contractions="scaled" (bfloat16/float16 backward '
                "contractions at the narrow dtype's speed, the cotangent scaled into its range).",
            )
        )
    return contractions


def _setup(fun, args, kwargs, argnums, has_aux, name, contractions="float32"):
    nums = normalize_argnums(argnums, len(args), name)
    leaves = Leaves(args, nums)
    return _Traced(fun, leaves, kwargs, has_aux, contractions), leaves


def _jax_argnums(argnums: int | Sequence[int], nums: tuple[int, ...]) -> int | tuple[int, ...]:
    return nums[0] if isinstance(argnums, int) else nums


def _check_holomorphic(leaves: Leaves, name: str) -> None:
    """Refuses a real leaf under ``holomorphic=True`` naming its own dtype (JAX would name the
    float32 dtype heddle widened it to)."""
    for i in leaves.argnums:
        for leaf in jax.tree.leaves(leaves.args[i]):
            is_number = isinstance(leaf, bool | int | float | complex)
            d = jnp.result_type(leaf) if is_number else getattr(leaf, "dtype", None)
            if d is None:  # not an array (a string, say): JAX says what is wrong with it
                continue
            if not jax.dtypes.issubdtype(d, jnp.complexfloating):
                raise TypeError(
                    message(
                        f"{name}(..., holomorphic=True) of an argument of dtype {d} (argnums {i})",
                        "holomorphic differentiation needs every differentiated input complex",
                        "Pass complex inputs (x.astype(jnp.complex64)), or holomorphic=False "
                        f"for the gradient with respect to a real {d} input.",
                    )
                )


def _apply(
    transform, name, fun, argnums, has_aux, holomorphic, args, kwargs, contractions="float32"
):
    """Applies the JAX transform of ``fun`` to the widened ``args``.

    Returns ``(traced, leaves, jargnums, result)``: the traced call (its ``out_dtypes`` set), the
    arguments' leaves, the argnums JAX differentiated and what the transformed function returned.
    """
    traced, leaves = _setup(fun, args, kwargs, argnums, has_aux, name, contractions)
    if holomorphic:
        _check_holomorphic(leaves, name)
    jargnums = _jax_argnums(argnums, leaves.argnums)
    res = transform(traced, argnums=jargnums, has_aux=True, holomorphic=holomorphic)(
        *leaves.wide_args
    )
    return traced, leaves, jargnums, res


def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    contractions: str = "float32",
) -> Callable[..., tuple[Any, Any]]:
    """``jax.value_and_grad`` with gradients at ``grad_dtype`` of each leaf (POLICY.md 7).

    The value is bit for bit what ``fun`` returns. A bfloat16, float16 or float8 leaf gets a float32
    gradient accumulated in float32 without ever being rounded to the leaf's dtype; float32, float64
    and complex leaves keep their dtype; an integer or bool leaf gets a zero float32 gradient of its
    shape (no float0, no error), so parameters and gradients zip.

    Args:
      fun: the function; its (first) output a real scalar of any float dtype.
      argnums: position or positions of the arguments to differentiate.
      has_aux: ``fun`` returns ``(value, aux)``; aux is returned untouched.
      holomorphic: as ``jax.value_and_grad``.
      allow_int: as ``jax.value_and_grad`` for leaves JAX refuses without it (a typed PRNG key
        gets a ``float0`` gradient); integer and bool leaves get zero float32 gradients either way.
      contractions: ``"float32"`` (default): the two contractions that transpose each narrow
        contraction read its float32 cotangent. ``"scaled"``: where both operands are bfloat16 or
        both float16, they read a copy of it rounded to that dtype (float16: first multiplied by
        a power of two that puts its largest magnitude in ``[2**14, 2**15)``, undone exactly on
        the float32 result), so they run at the narrow dtype's speed (tensor cores) with float32
        accumulation; the cotangent itself stays float32 and never underflows, its precision
        inside those contractions is the narrow dtype's. See docs/autodiff.md.

    Returns:
      A function returning ``(value, grads)`` or ``((value, aux), grads)``.

    Raises:
      TypeError: ``argnums`` is not an int or a sequence of ints, or names a missing argument; and
        whatever ``jax.value_and_grad`` raises for the function (non-scalar output, ...).
      ValueError: ``contractions`` is not ``"float32"`` or ``"scaled"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import autodiff
      >>> w = jnp.ones(3, jnp.bfloat16)
      >>> value, g = autodiff.value_and_grad(lambda w: (w * w).sum())(w)
      >>> value.dtype, g.dtype
      (dtype(bfloat16), dtype('float32'))
    """
    return _value_and_grad(
        fun, argnums, has_aux, holomorphic, allow_int, contractions, "value_and_grad"
    )


def _value_and_grad(
    fun, argnums, has_aux, holomorphic, allow_int, contractions, name
) -> Callable[..., tuple[Any, Any]]:
    _check_contractions(contractions, name)
    transform = functools.partial(jax.value_and_grad, allow_int=allow_int)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        _, _, _, (value, grads) = _apply(
            transform,
            name,
            fun,
            argnums,
            has_aux,
            holomorphic,
            args,
            kwargs,
            contractions,
        )
        _, (aux, value) = value
        return ((value, aux) if has_aux else value), grads

    return wrapped


def grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    contractions: str = "float32",
) -> Callable[..., Any]:
    """``jax.grad`` with gradients at ``grad_dtype`` of each leaf (POLICY.md 7).

    See ``value_and_grad`` for the dtype contract.

    Args:
      fun: the function; its (first) output a real scalar of any float dtype.
      argnums: position or positions of the arguments to differentiate.
      has_aux: ``fun`` returns ``(value, aux)``; the result is then ``(grads, aux)``.
      holomorphic: as ``jax.grad``.
      allow_int: as ``jax.value_and_grad`` for leaves JAX refuses without it (a typed PRNG key
        gets a ``float0`` gradient); integer and bool leaves get zero float32 gradients either way.
      contractions: ``"float32"`` or ``"scaled"``, as ``value_and_grad``.

    Returns:
      A function returning the gradients (and aux).

    Raises:
      TypeError: as ``value_and_grad``.
      ValueError: as ``value_and_grad``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import autodiff
      >>> params = {"w": jnp.ones(2, jnp.bfloat16), "step": jnp.int32(3)}
      >>> g = autodiff.grad(lambda p: (p["w"] * p["step"].astype(p["w"].dtype)).sum())(params)
      >>> g["w"].dtype, g["step"].dtype, g["step"].item()
      (dtype('float32'), dtype('float32'), 0.0)
    """
    vg = _value_and_grad(fun, argnums, has_aux, holomorphic, allow_int, contractions, "grad")

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        value, grads = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return wrapped


def vjp(
    fun: Callable[..., Any], *primals: Any, has_aux: bool = False, contractions: str = "float32"
) -> tuple[Any, ...]:
    """``jax.vjp`` with cotangents at ``grad_dtype`` of each primal leaf (POLICY.md 7).

    Args:
      fun: the function.
      *primals: its arguments; all are differentiated.
      has_aux: ``fun`` returns ``(out, aux)``.
      contractions: ``"float32"`` or ``"scaled"``, as ``value_and_grad``.

    Returns:
      ``(out, pullback)`` or ``(out, pullback, aux)``. ``out`` is bit for bit what ``fun`` returns.
      ``pullback(cotangent)`` accepts, for a narrow float output, a cotangent of the output's dtype
      or of float32 (rounded once to the output's dtype where the output was produced, as every
      cotangent of a narrow value is), and returns a tuple with one cotangent per primal, at its
      ``grad_dtype`` (zeros of float32 for integer leaves).

    Raises:
      TypeError: whatever ``jax.vjp`` raises for the function or the cotangent.
      ValueError: as ``value_and_grad``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import autodiff
      >>> x = jnp.arange(3).astype(jnp.bfloat16)
      >>> out, pullback = autodiff.vjp(lambda x: x * x, x)
      >>> (ct,) = pullback(jnp.ones(3, jnp.float32))
      >>> out.dtype, ct.dtype, ct.tolist()
      (dtype(bfloat16), dtype('float32'), [0.0, 2.0, 4.0])
    """
    _check_contractions(contractions, "vjp")
    traced, leaves = _setup(
        fun, primals, {}, tuple(range(len(primals))), has_aux, "vjp", contractions
    )
    _, pull, (aux, out) = jax.vjp(traced, *leaves.wide_args, has_aux=True)

    shapes = jax.tree.map(np.shape, out)

    def pullback(ct: Any) -> tuple[Any, ...]:
        got = jax.tree.structure(ct)
        if got != jax.tree.structure(traced.out_dtypes):
            raise ValueError(
                message(
                    f"heddle.autodiff.vjp's pullback(cotangent) with a cotangent of structure {got}",
                    "the cotangent must have the structure of the function's output, "
                    f"{jax.tree.structure(traced.out_dtypes)}",
                    "Pass one array per output leaf, of its shape and dtype.",
                )
            )
        return pull(jax.tree.map(_pullback_cotangent, ct, traced.out_dtypes, shapes))

    return (out, pullback, aux) if has_aux else (out, pullback)


def _pullback_cotangent(c: Any, d: np.dtype, shape: tuple[int, ...]) -> Any:
    """One output's cotangent as the pullback takes it: float32 for a narrow output (given at the
    output's dtype or at float32), the output's own dtype otherwise. A Python or NumPy number is
    taken at the accepted dtype, as a float literal is."""
    if not jnp.issubdtype(d, jnp.inexact):
        return c  # an integer or bool output's cotangent (float0): JAX checks it
    accepted = (d, _F32) if is_narrow(d) else (d,)
    if isinstance(c, int | float | complex) and not isinstance(c, bool):
        c = np.asarray(c, accepted[-1])
    c_dtype = np.dtype(c.dtype) if hasattr(c, "dtype") else None
    if c_dtype not in accepted or tuple(np.shape(c)) != tuple(shape):
        kinds = " or ".join(f"{np.dtype(a).name}{list(shape)}" for a in accepted)
        given = f"{c_dtype.name}{list(np.shape(c))}" if c_dtype is not None else type(c).__name__
        raise ValueError(
            message(
                f"heddle.autodiff.vjp's pullback(cotangent) with a {given} cotangent for an output "
                f"of {d.name}{list(shape)}",
                f"the cotangent of that output must be {kinds}",
                f"Pass e.g. jnp.ones({tuple(shape)}, jnp.{accepted[-1].name}).",
            )
        )
    return lax.convert_element_type(c, _F32) if is_narrow(d) else c


def _align(jac: Any, out_dtypes: Any, in_dtypes: Any) -> Any:
    """Casts each Jacobian block to the promotion of its output's and input's gradient dtypes."""

    def block(o: np.dtype, sub: Any) -> Any:
        def cast(i: Any, b: Any) -> Any:
            if i is None or not hasattr(b, "dtype"):
                return b
            target = promote_types(_grad_of(o), _grad_of(i))
            return b if b.dtype == target else lax.convert_element_type(b, target)

        return jax.tree.map(cast, in_dtypes, sub, is_leaf=lambda x: x is None)

    return jax.tree.map(block, out_dtypes, jac)


def _grad_of(d: np.dtype) -> np.dtype:
    return _F32 if is_narrow(d) or np.dtype(d).kind in "biu" else np.dtype(d)


def _jac(
    transform: Callable[..., Any],
    name: str,
    fun,
    argnums,
    has_aux,
    holomorphic,
    contractions: str = "float32",
):
    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        traced, leaves, jargnums, res = _apply(
            transform, name, fun, argnums, has_aux, holomorphic, args, kwargs, contractions
        )
        jac, (aux, _) = res
        if isinstance(jargnums, int):
            in_dtypes = leaves.input_dtypes(jargnums)
        else:
            in_dtypes = tuple(leaves.input_dtypes(i) for i in jargnums)
        jac = _align(jac, traced.out_dtypes, in_dtypes)
        return (jac, aux) if has_aux else jac

    return wrapped


def jacfwd(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable[..., Any]:
    """``jax.jacfwd`` under POLICY.md 7: tangents never narrower than float32.

    Each Jacobian block (one output leaf by one input leaf) has the promotion of the two leaves'
    ``grad_dtype`` (float32 for narrow floats and integers), the same dtype as ``jacrev`` gives.

    Args:
      fun: the function.
      argnums: position or positions of the arguments to differentiate.
      has_aux: ``fun`` returns ``(out, aux)``; the result is then ``(jacobian, aux)``.
      holomorphic: as ``jax.jacfwd``.

    Returns:
      A function returning the Jacobian, shaped as ``jax.jacfwd``'s.

    Raises:
      TypeError: as ``value_and_grad``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import autodiff
      >>> j = autodiff.jacfwd(lambda x: x * x)(jnp.arange(2).astype(jnp.bfloat16))
      >>> j.dtype, j.tolist()
      (dtype('float32'), [[0.0, 0.0], [0.0, 2.0]])
    """
    return _jac(jax.jacfwd, "jacfwd", fun, argnums, has_aux, holomorphic, _scaled.FORWARD)


def jacrev(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    contractions: str = "float32",
) -> Callable[..., Any]:
    """``jax.jacrev`` under POLICY.md 7: cotangents never narrower than float32.

    Args:
      fun: the function.
      argnums: position or positions of the arguments to differentiate.
      has_aux: ``fun`` returns ``(out, aux)``; the result is then ``(jacobian, aux)``.
      holomorphic: as ``jax.jacrev``.
      allow_int: passed to ``jax.jacrev``; integer and bool leaves get zero float32 blocks either
        way.
      contractions: ``"float32"`` or ``"scaled"``, as ``value_and_grad``.

    Returns:
      A function returning the Jacobian; block dtypes as ``jacfwd``.

    Raises:
      TypeError: as ``value_and_grad``.
      ValueError: as ``value_and_grad``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import autodiff
      >>> j = autodiff.jacrev(lambda x: x * x)(jnp.arange(2).astype(jnp.bfloat16))
      >>> j.dtype, j.tolist()
      (dtype('float32'), [[0.0, 0.0], [0.0, 2.0]])
    """
    transform = functools.partial(jax.jacrev, allow_int=allow_int)
    _check_contractions(contractions, "jacrev")
    return _jac(transform, "jacrev", fun, argnums, has_aux, holomorphic, contractions)


jacobian = jacrev


def hessian(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable[..., Any]:
    """``jax.hessian`` under POLICY.md 7: ``jacfwd(jacrev(fun))`` with heddle's transforms.

    Both levels carry float32 twins, so second-order terms are never rounded to a narrow dtype.

    Args:
      fun: the function.
      argnums: position or positions of the arguments to differentiate.
      has_aux: ``fun`` returns ``(out, aux)``; the result is then ``(hessian, aux)``.
      holomorphic: as ``jax.hessian``.

    Returns:
      A function returning the Hessian, shaped as ``jax.hessian``'s.

    Raises:
      TypeError: as ``value_and_grad``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from heddle import autodiff
      >>> h = autodiff.hessian(lambda x: (x * x * x).sum())(jnp.array([1.0, 2.0], jnp.bfloat16))
      >>> h.dtype, h.tolist()
      (dtype('float32'), [[6.0, 0.0], [0.0, 12.0]])
    """
    inner = _jac(jax.jacrev, "hessian", fun, argnums, has_aux, holomorphic)
    return _jac(jax.jacfwd, "hessian", inner, argnums, has_aux, holomorphic, _scaled.FORWARD)
