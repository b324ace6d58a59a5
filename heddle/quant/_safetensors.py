"""safetensors checkpoints in and out, with heddle's correctly rounded casts and all-or-nothing I/O.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (per tensor:
dtype tag, shape, ``[begin, end)`` offsets into the data), then the data. The header is checked here
first, so that each way a file can be bad gets its own message; then the ``safetensors`` package
decodes it. Loading builds every array before returning any; saving writes a temporary file beside
the target and renames it over the target only once it is complete.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import heddle.numpy as hnp
from heddle.policy import _dtypes as D
from heddle.policy._errors import PolicyError, PrecisionError, message
from heddle.quant._qarray import QArray


class CheckpointError(PolicyError, ValueError):
    """A safetensors file that cannot be read: truncated, corrupt, or holding an unknown dtype."""


# safetensors dtype tag -> NumPy dtype; F4 is packed two per byte (element 2i in the low nibble).
_TAGS = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16),
    "I32": np.dtype(np.int32),
    "U32": np.dtype(np.uint32),
    "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "C64": np.dtype(np.complex64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "F4": np.dtype(ml_dtypes.float4_e2m1fn),
}
_BY_DTYPE = {d: t for t, d in _TAGS.items()}
_F4 = np.dtype(ml_dtypes.float4_e2m1fn)


def _package() -> Any:
    try:
        import safetensors
    except ImportError as e:
        raise ImportError(
            message(
                "heddle.quant.load_safetensors / save_safetensors",
                "they need the 'safetensors' package, which is not installed",
                "Install it: pip install safetensors (or pip install 'heddle[safetensors]').",
            )
        ) from e
    return safetensors


def _bad(path: Any, why: str) -> CheckpointError:
    return CheckpointError(
        message(
            f"load_safetensors({os.fspath(path)!r})",
            why,
            "Nothing was loaded. Re-create the file (heddle.quant.save_safetensors) or fetch it "
            "again; a partial download is the usual cause.",
        )
    )


def _check_header(raw: bytes, path: Any) -> dict[str, Any]:
    """The parsed header, after the checks that give each kind of bad file its own message."""
    if len(raw) < 8:
        raise _bad(
            path, f"the file is truncated: {len(raw)} bytes, less than the 8-byte header length"
        )
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8:
        raise _bad(
            path,
            f"the file is truncated or corrupt: its header length says {n} bytes, but only "
            f"{len(raw) - 8} bytes follow",
        )
    try:
        header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"the header is corrupt: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is corrupt: not a JSON object")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise _bad(path, f"the header entry of tensor {name!r} is corrupt: {info!r}")
        if info["dtype"] not in _TAGS:
            raise _bad(
                path,
                f"tensor {name!r} has dtype tag {info['dtype']!r}, which heddle cannot read "
                f"(known tags: {', '.join(_TAGS)})",
            )
        end = max(end, int(info["data_offsets"][1]))
    if 8 + n + end > len(raw):
        raise _bad(
            path,
            f"the file is truncated: its header places data up to byte {8 + n + end}, but the "
            f"file has {len(raw)} bytes",
        )
    return header


def _from_raw(tag: str, shape: list[int], data: bytes) -> np.ndarray:
    d = _TAGS[tag]
    if d == _F4:
        b = np.frombuffer(data, np.uint8)
        nib = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(-1)[: math.prod(shape)]
        return nib.astype(np.uint8).view(_F4).reshape(shape)
    return np.frombuffer(data, d).reshape(shape)


def _to_jax(a: np.ndarray, name: str, dtype: np.dtype | None, path: Any) -> jax.Array:
    src = np.dtype(a.dtype)
    if dtype is not None and D.kind(src) == "f":
        return hnp.astype(a, dtype)  # rounded once, on the host for float64 without x64
    if D.is_64bit(src) and not D.x64_enabled():
        fix = "Enable it with jax.config.update('jax_enable_x64', True)"
        if D.kind(src) == "f":
            fix += ", or load with dtype='float32' (each value rounded once)"
        raise PrecisionError(
            message(
                f"load_safetensors({os.fspath(path)!r}): tensor {name!r} is {src.name}",
                "64-bit arrays need jax_enable_x64, which is off, and heddle never narrows "
                "silently; nothing was loaded",
                fix + ".",
            )
        )
    return jnp.asarray(a)


def load_safetensors(
    path: str | os.PathLike, dtype: jax.typing.DTypeLike | None = None
) -> dict[str, jax.Array]:
    """Loads every tensor of a safetensors file, casting float tensors with one correct rounding.

    All tensors are decoded and converted before anything is returned: a bad file raises and
    yields nothing.

    Args:
      path: the file.
      dtype: if given, every float tensor is cast to it with ``heddle.numpy.astype`` (float64 data
        is rounded once from float64, even with ``jax_enable_x64`` off). Integer, bool and complex
        tensors keep their dtype.

    Returns:
      ``{name: jax.Array}`` in the file's order.

    Raises:
      CheckpointError: the file is truncated, its header is corrupt, or a tensor has a dtype tag
        heddle cannot read.
      PrecisionError: a 64-bit tensor with ``jax_enable_x64`` off and no ``dtype`` to cast it to.
      ImportError: the ``safetensors`` package is not installed.
      FileNotFoundError: no file at ``path``.

    Examples:
      >>> import tempfile, os, jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> p = os.path.join(tempfile.mkdtemp(), "w.safetensors")
      >>> hq.save_safetensors({"w": jnp.array([1.0, 1.00390625], jnp.float32)}, p)
      >>> hq.load_safetensors(p, dtype="bfloat16")["w"]  # 1 + 2**-8 ties to even: 1.0
      Array([1, 1], dtype=bfloat16)
    """
    st = _package()
    d = None if dtype is None else D.require_available(D.dtype(dtype), "load_safetensors")
    if d is not None and D.kind(d) != "f":
        raise TypeError(
            message(
                f"load_safetensors(..., dtype={d.name!r})",
                "dtype sets the dtype of the float tensors; integer tensors keep theirs",
                "Pass a float dtype (e.g. 'bfloat16'), or convert integer tensors after loading.",
            )
        )
    with open(path, "rb") as fh:
        raw = fh.read()
    header = _check_header(raw, path)
    try:
        entries = st.deserialize(raw)
    except st.SafetensorError as e:
        raise _bad(path, f"the safetensors package rejects it: {e}") from None
    order = {name: i for i, name in enumerate(header)}
    entries = sorted(entries, key=lambda kv: order.get(kv[0], 0))
    arrays = {name: _from_raw(v["dtype"], v["shape"], v["data"]) for name, v in entries}
    return {name: _to_jax(a, name, d, path) for name, a in arrays.items()}


def _spec(st: Any, name: Any, value: Any, keep: list[Any]) -> Any:
    if not isinstance(name, str):
        raise TypeError(
            message(
                f"save_safetensors({{{name!r}: ...}})",
                "safetensors names tensors with strings",
                f"Use str keys, e.g. {{'{name}': ...}}.",
            )
        )
    if isinstance(value, QArray):
        raise TypeError(
            message(
                f"save_safetensors({{{name!r}: <{value!r}>}})",
                "a QArray is two arrays (codes and scales) plus static metadata, not one tensor",
                f"Save its two leaves and rebuild it after loading: save_safetensors({{"
                f"'{name}.data': q.data, '{name}.scales': q.scales}}, path), then t = "
                f"load_safetensors(path); q = heddle.quant.QArray(t['{name}.data'], "
                f"t['{name}.scales'], {value.format!r}, jax.numpy.dtype({value.dtype.name!r}), "
                f"{value.axis}, {value.length}). Or save the values: "
                f"save_safetensors({{'{name}': heddle.dequantize(q)}}, path).",
            )
        )
    try:
        a = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged nested sequences
        a = np.array(None)
        detail = f" ({e})"
    else:
        detail = ""
    if a.dtype == object:
        raise TypeError(
            message(
                f"save_safetensors({{{name!r}: <{type(value).__name__}>}})",
                f"a tensor must be an array of numbers; a {type(value).__name__} is not "
                f"one{detail}",
                f"Pass a NumPy or JAX array under {name!r} (e.g. numpy.asarray(value, "
                "'float32')), or leave the name out.",
            )
        )
    a = a if a.flags.c_contiguous else a.copy(order="C")  # keeps 0-d arrays 0-d
    if a.dtype not in _BY_DTYPE:
        raise TypeError(
            message(
                f"save_safetensors({{{name!r}: <{a.dtype.name} array>}})",
                f"safetensors has no dtype tag for {a.dtype.name}",
                f"Cast it first, e.g. heddle.numpy.astype(x, 'float32'); tags exist for "
                f"{', '.join(sorted(d.name for d in _BY_DTYPE))}.",
            )
        )
    shape = list(a.shape)
    if a.dtype == _F4:
        if not shape or shape[-1] % 2:
            raise ValueError(
                message(
                    f"save_safetensors({{{name!r}: <float4_e2m1fn array of shape {a.shape}>}})",
                    "safetensors packs float4 in pairs along the last axis, which must be even",
                    "Pad the last axis to an even size (heddle.numpy.pad) or cast to float8.",
                )
            )
        nib = a.view(np.uint8) & 0x0F
        a = (nib[..., 0::2] | (nib[..., 1::2] << 4)).copy(order="C")
        dname = "float4_e2m1fn_x2"
    else:
        dname = a.dtype.name
    keep.append(a)
    shape = list(a.shape)
    return st.TensorSpec(dtype=dname, shape=shape, data_ptr=a.ctypes.data, data_len=a.nbytes)


def save_safetensors(
    tensors: Mapping[str, jax.typing.ArrayLike],
    path: str | os.PathLike,
    *,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes arrays to a safetensors file, atomically: the file is complete or untouched.

    Args:
      tensors: ``{name: array}``; JAX and NumPy arrays of bool, integer (8 to 64 bits), float16,
        bfloat16, float32, float64, float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu),
        float4_e2m1fn (last axis even; packed two per byte) and complex64.
      path: the file to write (replaced if it exists).
      metadata: optional ``{str: str}`` stored in the header.

    Returns:
      None.

    Raises:
      TypeError: a name is not a string, or an array's dtype has no safetensors tag.
      ValueError: a float4 array with an odd last axis.
      ImportError: the ``safetensors`` package is not installed.

    Examples:
      >>> import tempfile, os, jax.numpy as jnp
      >>> import heddle.quant as hq
      >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
      >>> hq.save_safetensors({"b": jnp.zeros(3, jnp.bfloat16)}, p, metadata={"step": "10"})
      >>> hq.load_safetensors(p)["b"].dtype
      dtype(bfloat16)
    """
    st = _package()
    keep: list[Any] = []
    specs = {name: _spec(st, name, v, keep) for name, v in tensors.items()}
    meta = None if metadata is None else {str(k): str(v) for k, v in metadata.items()}
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    fd, tmp = tempfile.mkstemp(prefix=".heddle-", suffix=".safetensors.tmp", dir=folder)
    os.close(fd)
    try:
        st.serialize_file(specs, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    del keep
