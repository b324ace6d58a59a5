"""Drop-in replacement for ``jax.scipy.stats`` under heddle's dtype policy.

Every distribution module of the installed ``jax.scipy.stats`` (``beta``, ``binom``, ``gamma``,
``multivariate_normal``, ``norm``, ``t``, ...) exists here, each with all of JAX's functions: each is
float-only (the promotion of its value operands: ``x`` or ``k``, the shape parameters, ``loc``,
``scale``; an integer count meeting a bfloat16 parameter is converted to bfloat16, as in any heddle
op), runs JAX's implementation in float32 for narrow inputs and rounds once. ``sem`` computes in
float32 and rounds once; ``mode`` keeps the input dtype for the modes (copied) and gives int32
counts; ``rankdata`` gives ranks in float32 (JAX: float64 under ``jax_enable_x64``);
``gaussian_kde`` holds its state (dataset, weights, covariance) in float32 for narrow data, and its
methods round their outputs once to the data's dtype. The classification is data in
``heddle/scipy/_table.py`` (``norm`` and ``logistic``: ``heddle/ops/_special.py``).

Examples:
  >>> import numpy as np, ml_dtypes
  >>> from heddle.scipy.stats import norm, sem
  >>> norm.logpdf(np.array([0.0], ml_dtypes.bfloat16))
  Array([-0.917969], dtype=bfloat16)
  >>> sem(np.array([1.0, 2.0, 3.0, 4.0], ml_dtypes.bfloat16))
  Array(0.644531, dtype=bfloat16)
"""

from __future__ import annotations

from heddle.scipy import _build
from heddle.scipy.stats import bernoulli as bernoulli
from heddle.scipy.stats import beta as beta
from heddle.scipy.stats import betabinom as betabinom
from heddle.scipy.stats import binom as binom
from heddle.scipy.stats import cauchy as cauchy
from heddle.scipy.stats import chi2 as chi2
from heddle.scipy.stats import dirichlet as dirichlet
from heddle.scipy.stats import expon as expon
from heddle.scipy.stats import gamma as gamma
from heddle.scipy.stats import gennorm as gennorm
from heddle.scipy.stats import geom as geom
from heddle.scipy.stats import gumbel_l as gumbel_l
from heddle.scipy.stats import gumbel_r as gumbel_r
from heddle.scipy.stats import laplace as laplace
from heddle.scipy.stats import logistic as logistic
from heddle.scipy.stats import multinomial as multinomial
from heddle.scipy.stats import multivariate_normal as multivariate_normal
from heddle.scipy.stats import nbinom as nbinom
from heddle.scipy.stats import norm as norm
from heddle.scipy.stats import pareto as pareto
from heddle.scipy.stats import poisson as poisson
from heddle.scipy.stats import t as t
from heddle.scipy.stats import truncnorm as truncnorm
from heddle.scipy.stats import uniform as uniform
from heddle.scipy.stats import vonmises as vonmises
from heddle.scipy.stats import wrapcauchy as wrapcauchy

_DISTRIBUTIONS = [
    "bernoulli",
    "beta",
    "betabinom",
    "binom",
    "cauchy",
    "chi2",
    "dirichlet",
    "expon",
    "gamma",
    "gennorm",
    "geom",
    "gumbel_l",
    "gumbel_r",
    "laplace",
    "logistic",
    "multinomial",
    "multivariate_normal",
    "nbinom",
    "norm",
    "pareto",
    "poisson",
    "t",
    "truncnorm",
    "uniform",
    "vonmises",
    "wrapcauchy",
]

__all__ = sorted([*_build.export(globals(), _build.namespace("stats")), *_DISTRIBUTIONS])
