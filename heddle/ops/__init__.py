"""The op wrappers behind heddle.numpy, heddle.nn and heddle.lax, grouped by op class.

``_core`` is the mechanism (resolve, convert, call, round once), ``_scalars`` the host side of its
Python scalars, ``lowering`` (public: heddle.programs uses it too) the conversion and how narrow
contractions reach each backend's dot, ``_table`` the classification of every jax.numpy name,
``_creation`` the creation ops.
"""
