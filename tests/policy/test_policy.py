"""``Policy``, the presets, the active policy (jit cache key, threads), defaults, ``enforce``, ``table``."""

from __future__ import annotations

import csv
import dataclasses
import html.parser
import os
import pathlib
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from heddle import policy

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = pathlib.Path(__file__).with_name("promotion.csv")
NAMES = [d.name for d in policy.DTYPES]


def golden_cells() -> dict[tuple[str, str], str]:
    with GOLDEN.open() as f:
        rows = list(csv.reader(f))
    return {(r[0], b): v for r in rows[1:] for b, v in zip(rows[0][1:], r[1:], strict=True)}


F16_WINS = policy.Policy.from_table({("float16", "bfloat16"): "float16"}, name="f16-wins")


# ---- Policy: a frozen, hashable value -------------------------------------------------------------


def test_policy_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.HEDDLE.default_float = np.dtype("bfloat16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.HEDDLE.table = policy.JAX.table
    with pytest.raises(TypeError):
        policy.HEDDLE.table[np.dtype("int8"), np.dtype("int8")] = np.dtype("int16")


def test_policy_is_hashable_and_compares_by_value():
    copy = dataclasses.replace(policy.HEDDLE)
    assert copy is not policy.HEDDLE
    assert copy == policy.HEDDLE and hash(copy) == hash(policy.HEDDLE)
    assert len({policy.HEDDLE, copy, policy.JAX, F16_WINS}) == 3
    changed = dataclasses.replace(policy.HEDDLE, min_float_acc="float64")
    assert changed != policy.HEDDLE
    assert changed.min_float_acc == np.dtype("float64")  # dtype-likes are parsed


def test_policy_fields_are_validated():
    with pytest.raises(TypeError, match="from_table"):
        policy.Policy(name="raw", table={(np.dtype("int8"),) * 2: np.dtype("int8")})
    with pytest.raises(ValueError, match="float32_matmul_precision"):
        dataclasses.replace(policy.HEDDLE, float32_matmul_precision="fast")
    with pytest.raises(policy.UnknownDTypeError):
        dataclasses.replace(policy.HEDDLE, default_float="float33")


def test_heddle_is_the_default_policy():
    assert policy.current() is policy.HEDDLE
    assert policy.HEDDLE.name == "heddle"
    p = policy.HEDDLE
    assert (p.default_int, p.default_float, p.default_complex) == tuple(
        map(np.dtype, ("int32", "float32", "complex64"))
    )
    assert p.min_float_acc == np.dtype("float32") and p.index_dtype == np.dtype("int32")
    assert p.int_float_dtype == np.dtype("float32")


def test_heddle_table_is_the_golden_table():
    for (a, b), want in golden_cells().items():
        got = policy.HEDDLE.table[policy.dtype(a), policy.dtype(b)]
        assert (got.name if got is not None else "error") == want, (a, b)


@pytest.mark.parametrize("mode", ["standard", "strict"])
def test_jax_preset_equals_jnp_promote_types_on_every_pair(mode):
    """JAX's default ('standard') promotion, whatever mode is active when the preset is used."""
    checked = refused = 0
    for a in policy.DTYPES:
        for b in policy.DTYPES:
            try:
                with jax.numpy_dtype_promotion("standard"):
                    want = np.dtype(jnp.promote_types(a, b))
            except jax.dtypes.TypePromotionError:
                refused += 1
                with pytest.raises(policy.PromotionError, match="policy 'jax'"):
                    policy.JAX.promote(a, b)
                continue
            checked += 1
            assert policy.JAX.promote(a, b) == want, (a, b)
    assert checked + refused == 784 and refused > 0
    # and through the active-policy entry points
    with policy.use(policy.JAX), jax.numpy_dtype_promotion(mode):
        assert policy.promote_types("uint64", "int8") == np.dtype("float64")
        with pytest.raises(policy.PromotionError):
            policy.promote_types("float8_e4m3fn", "bfloat16")


# ---- Policy.from_table --------------------------------------------------------------------------


def test_from_table_mapping():
    p = F16_WINS
    assert p.name == "f16-wins"
    assert p.promote("float16", "bfloat16") == np.dtype("float16")
    assert p.promote("bfloat16", "float16") == np.dtype("float16")  # mirrored
    assert p.promote("bfloat16", "bfloat16") == policy.dtype("bfloat16")  # diagonal
    with pytest.raises(policy.PromotionError, match="does not cover"):
        p.promote("int8", "float16")
    q = policy.Policy.from_table(
        {("int8", "uint8"): "error", ("int8", "int16"): None, ("i8", "f32"): "f32"},
        name="tiny",
        default_float="bfloat16",
    )
    assert q.default_float == policy.dtype("bfloat16")
    assert q.promote("float32", "int8") == np.dtype("float32")
    for pair in (("uint8", "int8"), ("int16", "int8")):
        with pytest.raises(policy.PromotionError, match="marks this pair as an error"):
            q.promote(*pair)


def test_from_table_refuses_bad_tables():
    with pytest.raises(ValueError, match="symmetric"):
        policy.Policy.from_table({("int8", "uint8"): "int16", ("uint8", "int8"): "int32"})
    with pytest.raises(policy.UnknownDTypeError, match="float33"):
        policy.Policy.from_table({("int8", "uint8"): "float33"})
    with pytest.raises(ValueError, match="symmetric"):
        policy.Policy.from_table(",int8,uint8\nint8,int8,int16\nuint8,int32,uint8\n")


def test_from_table_csv_text_and_path(tmp_path):
    text = GOLDEN.read_text()
    for source in (text, GOLDEN, str(GOLDEN)):
        p = policy.Policy.from_table(source, name="golden")
        assert p.table == policy.HEDDLE.table
        assert hash(p.table) == hash(policy.HEDDLE.table)
    small = tmp_path / "small.csv"
    small.write_text(",int8,uint8\nint8,int8,error\nuint8,error,uint8\n")
    p = policy.Policy.from_table(small, name="small")
    assert len(p.table) == 4 and p.table.dtypes == (np.dtype("int8"), np.dtype("uint8"))
    with pytest.raises(policy.PromotionError):
        p.promote("int8", "uint8")


def test_custom_policy_drives_result_type_and_table():
    with policy.use(F16_WINS):
        assert policy.result_type(np.zeros(2, np.float16), np.zeros(2, ml_dtypes.bfloat16)) == (
            np.dtype("float16")
        )
        assert policy.table(fmt="csv") == ",float16,bfloat16\nfloat16,float16,float16\n" + (
            "bfloat16,float16,bfloat16"
        )


# ---- the active policy: use, threads, jit cache key ---------------------------------------------


def test_use_nests_and_restores():
    assert policy.current() is policy.HEDDLE
    with policy.use(policy.JAX) as p:
        assert p is policy.JAX and policy.current() is policy.JAX
        with policy.use(F16_WINS):
            assert policy.current() is F16_WINS
        assert policy.current() is policy.JAX
    assert policy.current() is policy.HEDDLE
    with pytest.raises(RuntimeError), policy.use(policy.JAX):
        raise RuntimeError  # restored on the way out of an exception too
    assert policy.current() is policy.HEDDLE


def test_use_refuses_non_policies():
    with pytest.raises(TypeError, match=r"heddle\.policy\.Policy"), policy.use("jax"):
        pass
    with policy.use(policy.JAX):  # the fix the message names
        assert policy.current().name == "jax"


def test_active_policy_is_part_of_the_jit_cache_key():
    traces = []

    @jax.jit
    def f(x):
        d = policy.promote_types(
            "float16", "bfloat16"
        )  # float32 under HEDDLE, float16 under F16_WINS
        traces.append(d)
        return x.astype(d)

    x = jnp.ones(2, jnp.float16)
    assert f(x).dtype == np.dtype("float32")
    with policy.use(F16_WINS):
        assert f(x).dtype == np.dtype("float16")  # traced again, not the stale float32 trace
    assert f(x).dtype == np.dtype("float32")  # the first trace, reused
    with policy.use(dataclasses.replace(F16_WINS)):  # an equal policy reuses its trace
        assert f(x).dtype == np.dtype("float16")
    assert traces == [np.dtype("float32"), np.dtype("float16")]


def test_default_dtypes_are_part_of_the_jit_cache_key():
    @jax.jit
    def f(x):
        return x + jnp.zeros((), policy.result_type(0.5)).astype(x.dtype) * 0, jnp.zeros(
            (), policy.result_type(0.5)
        )

    x = jnp.ones(2)
    assert f(x)[1].dtype == np.dtype("float32")
    with policy.default_dtypes(float="bfloat16"):
        assert f(x)[1].dtype == policy.dtype("bfloat16")
    assert f(x)[1].dtype == np.dtype("float32")


def test_threads_do_not_see_each_others_policy():
    @jax.jit
    def f(x):
        return x.astype(policy.promote_types("float16", "bfloat16"))

    x = jnp.ones(2, jnp.float16)
    barrier = threading.Barrier(2)
    seen: dict[str, set] = {"heddle": set(), "f16-wins": set()}
    errors = []

    def run(p):
        try:
            with policy.use(p):
                barrier.wait(timeout=30)
                for _ in range(25):
                    seen[p.name].add((policy.current().name, f(x).dtype.name))
                barrier.wait(timeout=30)  # both still inside their blocks
                seen[p.name].add((policy.current().name, f(x).dtype.name))
        except Exception as e:  # surfaced below; a thread's exception would be lost
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in (policy.HEDDLE, F16_WINS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert seen == {"heddle": {("heddle", "float32")}, "f16-wins": {("f16-wins", "float16")}}
    assert policy.current() is policy.HEDDLE


# ---- default_dtypes -----------------------------------------------------------------------------


def test_default_dtypes_context_manager():
    i8 = np.zeros(2, np.int8)
    with policy.default_dtypes(float="bfloat16", int="int16") as p:
        assert p is policy.current()
        assert (p.default_float, p.default_int) == (policy.dtype("bf16"), np.dtype("int16"))
        assert policy.result_type(0.5) == policy.dtype("bfloat16")
        assert policy.result_type(7) == np.dtype("int16")
        assert policy.result_type(i8, 0.5) == policy.dtype("bfloat16")  # float meets integer
        assert policy.result_type(np.zeros(2, np.bool_), 1) == np.dtype("int16")  # int meets bool
        assert policy.result_type(np.zeros(2, np.float16), 0.5) == np.dtype("float16")  # typed
        with pytest.raises(policy.ScalarRangeError, match="default int16"):
            policy.result_type(40000)
        with policy.default_dtypes(int="int8"):  # nests: float stays bfloat16
            assert policy.result_type(0.5, 1) == policy.dtype("bfloat16")
            assert policy.result_type(1) == np.dtype("int8")
        assert policy.result_type(1) == np.dtype("int16")
        assert p.name == "heddle"  # the rest of the policy is unchanged
        assert p.table is policy.HEDDLE.table
    assert policy.result_type(0.5) == np.dtype("float32")
    assert policy.result_type(7) == np.dtype("int32")
    with policy.default_dtypes(complex="complex128"):
        assert policy.result_type(1j) == np.dtype("complex128")
    with policy.use(policy.JAX), policy.default_dtypes(float="float16"):
        assert policy.current().name == "jax"  # it changes the active policy, whichever it is
        assert policy.result_type(0.5) == np.dtype("float16")


def test_default_dtypes_refuses_wrong_kinds():
    cases = [
        ({"float": "int8"}, "not a float dtype", {"float": "float32"}),
        ({"int": "float32"}, "not an integer dtype", {"int": "int32"}),
        ({"int": "bool"}, "not an integer dtype", {"int": "int32"}),
        ({"complex": "float32"}, "not a complex dtype", {"complex": "complex64"}),
    ]
    for bad, why, fix in cases:
        with pytest.raises(policy.UnknownDTypeError, match=why) as e:
            with policy.default_dtypes(**bad):
                pass
        assert f"default_dtypes({next(iter(fix))}={next(iter(fix.values()))!r})" in str(e.value)
        with policy.default_dtypes(**fix):  # the suggested call works
            pass
    with pytest.raises(policy.UnknownDTypeError, match="float33"):
        with policy.default_dtypes(float="float33"):
            pass


def _run(code: str, **env: str) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HEDDLE_")}
    full.update(env, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


PROBE = (
    "import numpy as np; from heddle import policy as p; "
    "print(p.result_type(0.5).name, p.result_type(1).name, "
    "p.result_type(np.zeros(2, np.int8), 0.5).name)"
)
STRICT_AT_IMPORT = (
    "import jax; jax.config.update('jax_numpy_dtype_promotion', 'strict'); "
    "from heddle import policy; print(policy.JAX.promote('int8', 'uint8').name)"
)


@pytest.fixture(scope="module")
def fresh_imports():
    """Each case imports heddle in a fresh interpreter; all start at once (jax takes a while)."""
    procs = {
        "env": _run(PROBE, HEDDLE_DEFAULT_FLOAT="bf16", HEDDLE_DEFAULT_INT="int16"),
        "bad_env": _run(PROBE, HEDDLE_DEFAULT_FLOAT="float33"),
        "strict": _run(STRICT_AT_IMPORT),
    }
    return {k: (p.wait(timeout=180), *p.communicate()) for k, p in procs.items()}


def test_environment_defaults_read_at_import(fresh_imports):
    assert fresh_imports["env"][:2] == (0, "bfloat16 int16 bfloat16\n"), fresh_imports["env"]


def test_bad_environment_default_fails_the_import_naming_the_variable(fresh_imports):
    rc, _, err = fresh_imports["bad_env"]
    assert rc != 0
    last = err.strip().splitlines()[-1]  # the error line, not buried in the traceback
    assert last.startswith(
        "heddle.policy._errors.UnknownDTypeError: HEDDLE_DEFAULT_FLOAT='float33'"
    )
    assert "set e.g. HEDDLE_DEFAULT_FLOAT=float32" in last, last


@pytest.mark.parametrize(
    ("var", "value", "fallback", "kinds", "why"),
    [
        ("HEDDLE_DEFAULT_FLOAT", "float33", "float32", "f", "names no dtype"),
        ("HEDDLE_DEFAULT_FLOAT", "int8", "float32", "f", "not of the kind"),
        ("HEDDLE_DEFAULT_FLOAT", "", "float32", "f", "names no dtype"),
        ("HEDDLE_DEFAULT_INT", "float32", "int32", "iu", "not of the kind"),
        ("HEDDLE_DEFAULT_INT", "bool", "int32", "iu", "not of the kind"),
    ],
)
def test_environment_defaults_validation(monkeypatch, var, value, fallback, kinds, why):
    """What the import runs (``_default_from_env``), with every kind of bad value; then the fix."""
    from heddle.policy._policy import _default_from_env

    monkeypatch.setenv(var, value)
    with pytest.raises(policy.UnknownDTypeError, match=why) as e:
        _default_from_env(var, fallback, kinds)
    assert f"{var}={value!r}" in str(e.value) and f"{var}={fallback}" in str(e.value)
    monkeypatch.setenv(var, fallback)  # the value the message suggests
    assert _default_from_env(var, fallback, kinds) == np.dtype(fallback)
    monkeypatch.setenv(var, "f16" if kinds == "f" else "u8")  # aliases are accepted
    assert _default_from_env(var, fallback, kinds) == np.dtype(
        "float16" if kinds == "f" else "uint8"
    )
    monkeypatch.delenv(var)
    assert _default_from_env(var, fallback, kinds) == np.dtype(fallback)


def test_jax_preset_does_not_depend_on_the_mode_at_import(fresh_imports):
    assert fresh_imports["strict"][:2] == (0, "int16\n"), fresh_imports["strict"]


# ---- enforce ------------------------------------------------------------------------------------


def test_enforce_makes_raw_jax_numpy_mixing_raise(transform):
    a, b = jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float32)
    add = transform(lambda x, y: x + y)
    with jax.numpy_dtype_promotion("standard"):  # what JAX does by default
        assert add(a, b).dtype == np.dtype("float32")
        with policy.enforce(), pytest.raises(jax.dtypes.TypePromotionError):
            transform(lambda x, y: jnp.add(x, y))(a, b)
        with policy.enforce(), pytest.raises(jax.dtypes.TypePromotionError):
            jnp.concatenate([a, b])
        # restored on exit
        assert jnp.concatenate([a, b]).dtype == np.dtype("float32")
    with policy.enforce():  # explicit conversions are untouched
        assert (a.astype(jnp.float32) + b).dtype == np.dtype("float32")
        assert (a * 2).dtype == np.dtype("bfloat16")


def test_enforce_lets_heddle_ops_work():
    import importlib.util

    if importlib.util.find_spec("heddle.numpy") is None:
        pytest.skip("heddle.numpy does not exist yet")
    import heddle.numpy as hnp

    with policy.enforce():
        out = hnp.add(jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float32))
    assert out.dtype == np.dtype("float32")


# ---- table --------------------------------------------------------------------------------------


def test_table_csv_equals_the_golden_file():
    assert policy.table(fmt="csv") + "\n" == GOLDEN.read_text()
    assert policy.table(fmt="csv", policy=policy.HEDDLE) + "\n" == GOLDEN.read_text()


def test_table_markdown_cells():
    lines = policy.table().splitlines()
    assert len(lines) == 2 + 28
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["", *NAMES]
    assert set(lines[1]) <= {"|", "-"}
    cells = golden_cells()
    for line in lines[2:]:
        row, *values = [c.strip() for c in line.strip("|").split("|")]
        row = row.strip("*")
        assert values == [cells[row, b] for b in NAMES], row


class _Cells(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self._cell)
            self._cell = None


def test_table_html_cells():
    parser = _Cells()
    parser.feed(policy.table(fmt="html"))
    header, *rows = parser.rows
    assert header == ["", *NAMES]
    cells = golden_cells()
    for row, *values in rows:
        assert values == [cells[row, b] for b in NAMES], row
    assert len(rows) == 28


def test_table_subset_aliases_and_other_policies():
    assert (
        policy.table(["i8", "u8"], fmt="csv") == ",int8,uint8\nint8,int8,int16\nuint8,int16,uint8"
    )
    md = policy.table(["uint64", "int8"], policy=policy.JAX)
    assert md.splitlines()[2] == "| **uint64** | uint64 | float64 |"
    with policy.use(policy.JAX):
        assert "float64" in policy.table(["uint64", "int8"], fmt="html")
    assert "error" in policy.table(["uint64", "int8"], fmt="html")


def test_table_refuses_unknown_formats_and_dtypes():
    with pytest.raises(ValueError, match="'markdown', 'html' or 'csv'"):
        policy.table(fmt="latex")
    with pytest.raises(policy.UnknownDTypeError, match="float33"):
        policy.table(["float33"])
