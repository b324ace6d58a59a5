"""The policy's error types.

Every refusal made by the policy is a ``PolicyError`` and also the built-in exception a Python user
would reach for, so ``except TypeError`` keeps working in code written for jax.numpy. Messages follow
one shape: what was asked, why it is refused, and the call that does what the user meant.
"""

from __future__ import annotations


class PolicyError(Exception):
    """Base class of every error raised by heddle's dtype policy."""


class PromotionError(PolicyError, TypeError):
    """Two dtypes have no promotion under the active policy (POLICY.md 2)."""


class ScalarRangeError(PolicyError, OverflowError):
    """A Python scalar does not fit the dtype it would take (POLICY.md 3)."""


class PrecisionError(PolicyError, TypeError):
    """A 64-bit dtype was asked for while ``jax_enable_x64`` is off (POLICY.md 1)."""


class UnknownDTypeError(PolicyError, ValueError):
    """A name or object that is not one of the policy's dtypes (POLICY.md 1)."""


def message(asked: str, why: str, fix: str) -> str:
    """Formats an error message in the house shape: asked, why, fix."""
    return f"{asked}: {why}. {fix}"
