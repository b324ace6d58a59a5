"""The README's examples run as written, and each line whose comment starts with a value (``# 32:``,
``# bfloat16:``) evaluates to that value."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import jax
import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
# an expression statement followed by a comment that opens with the value it shows
CLAIM = re.compile(r"^(?P<expr>[^#=\s][^#]*?)\s+#\s*(?P<value>-?[\d,]+(?:\.\d+)?|[a-z]+\d+)\b")


def claims(block: str) -> list[tuple[str, str]]:
    return [
        (m["expr"], m["value"])
        for line in block.splitlines()
        if (m := CLAIM.match(line))
        and not line.startswith(("def ", "return", " "))
        and not re.match(r"^[\w.\[\], ]+ = ", line)  # an assignment, not an expression
    ]


def matches(value: object, shown: str) -> bool:
    if shown[0].isdigit() or shown[0] == "-":
        return float(np.asarray(value, np.float64)) == float(shown.replace(",", ""))
    return str(value) == shown


def test_the_readme_has_examples_with_claims():
    assert len(BLOCKS) >= 2
    assert sum(len(claims(b)) for b in BLOCKS) >= 7


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs_and_shows_what_it_says(index):
    block = BLOCKS[index]
    namespace: dict = {}
    with jax.numpy_dtype_promotion("standard"), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, f"README.md block {index}", "exec"), namespace)
        for expr, shown in claims(block):
            value = eval(expr, namespace)
            if hasattr(value, "dtype") and not isinstance(value, np.dtype):
                value = value if shown[0].isdigit() or shown[0] == "-" else value.dtype
            assert matches(value, shown), f"README: {expr} is {value}, the comment says {shown}"


def test_a_wrong_claim_is_caught():
    assert claims("x = 1  # 1: one\nabs(-3)  # 3: three\n") == [("abs(-3)", "3")]
    assert not matches(32, "12480") and matches(np.float32(12480), "12,480")
