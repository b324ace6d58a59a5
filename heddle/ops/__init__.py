"""The op wrappers behind heddle.numpy, heddle.nn and heddle.lax, grouped by op class.

``_core`` is the mechanism (resolve, convert, call, round once), ``_table`` the classification of every
jax.numpy name, ``_creation`` the creation ops.
"""
