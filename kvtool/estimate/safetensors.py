"""Exact weight bytes from safetensors headers, without reading any tensor data.

A ``.safetensors`` file starts with an 8-byte little-endian header length and a JSON header mapping each
tensor name to ``{"dtype", "shape", "data_offsets"}``.  Bytes are taken from shape x dtype size, so a file that
holds only the header (no tensor data) gives the same answer.  ``model.safetensors.index.json`` names the
shard files; when the shards are absent its ``metadata.total_size`` is used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path

from kvtool.core.errors import InputFileError

# safetensors dtype codes -> bits per element (safetensors spec, Dtype enum).
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's limit


@dataclasses.dataclass(frozen=True)
class SafetensorsWeights:
    weights_bytes: int
    num_params: int
    num_tensors: int
    files: tuple[str, ...]
    method: str  # "safetensors headers" or "index.json total_size"


def read_header(file: Path) -> dict:
    """The JSON header of one safetensors file (errors name the file)."""
    try:
        with open(file, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise InputFileError("too short to be a safetensors file", where=str(file))
            (length,) = struct.unpack("<Q", raw_len)
            if length == 0 or length > _MAX_HEADER:
                raise InputFileError(f"implausible safetensors header length {length}", where=str(file))
            raw = fh.read(length)
    except OSError as err:
        raise InputFileError(f"cannot read: {err}", where=str(file)) from None
    if len(raw) < length:
        raise InputFileError("safetensors header is truncated", where=str(file))
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputFileError("safetensors header is not valid JSON", where=str(file)) from None
    if not isinstance(header, dict):
        raise InputFileError("safetensors header is not a JSON object", where=str(file))
    return header


def _tensor_bits(name: str, info: object, file: Path) -> tuple[int, int]:
    if not isinstance(info, dict) or "dtype" not in info or "shape" not in info:
        raise InputFileError(f"tensor {name!r} lacks dtype or shape", where=f"{file}: tensor {name}")
    dtype, shape = info["dtype"], info["shape"]
    bits = SAFETENSORS_DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
    if bits is None:
        raise InputFileError(f"unknown dtype {dtype!r}", where=f"{file}: tensor {name}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise InputFileError(f"bad shape {shape!r}", where=f"{file}: tensor {name}")
    count = math.prod(shape)
    offsets = info.get("data_offsets")
    if offsets is not None:  # the reference implementation refuses a header whose offsets and shape disagree
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise InputFileError(f"bad data_offsets {offsets!r}", where=f"{file}: tensor {name}")
        size = (count * bits + 7) // 8
        if offsets[1] - offsets[0] != size:
            raise InputFileError(
                f"shape {shape} of {dtype} is {size:,} bytes but data_offsets {offsets} span {offsets[1] - offsets[0]:,}",
                where=f"{file}: tensor {name}",
            )
    return count, count * bits


def tensor_bytes(name: str, info: object, file: Path) -> int:
    """One header entry's bytes (shape x dtype size, rounded up to whole bytes)."""
    return (_tensor_bits(name, info, file)[1] + 7) // 8


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def weights_from_files(files: list[Path]) -> SafetensorsWeights:
    params = bits = tensors = 0
    for file in files:
        for name, info in read_header(file).items():
            if name == "__metadata__":
                continue
            n, b = _tensor_bits(name, info, file)
            params += n
            bits += b
            tensors += 1
    return SafetensorsWeights((bits + 7) // 8, params, tensors, tuple(str(f) for f in files), "safetensors headers")


def weights_from_dir(directory: Path) -> SafetensorsWeights | None:
    """Weights of the safetensors in ``directory`` (via the index when present); None when there are none."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            weight_map = data["weight_map"]
            if not isinstance(weight_map, dict) or not weight_map:
                raise TypeError
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            raise InputFileError(
                "not a safetensors index (needs a weight_map object naming the shards)", where=str(index)
            ) from None
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str) or not shard:
                raise InputFileError(f"shard {shard!r} is not a file name", where=f"{index}: weight_map {tensor}")
        shards = [directory / name for name in dict.fromkeys(weight_map.values())]
        if all(s.is_file() for s in shards):
            return weights_from_files(shards)
        metadata = data.get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if isinstance(total, int) and total > 0:
            return SafetensorsWeights(total, 0, len(weight_map), (str(index),), "index.json total_size")
        missing = next(s for s in shards if not s.is_file())
        raise InputFileError("shard named in the index is missing and there is no total_size", where=str(missing))
    files = sorted(directory.glob("*.safetensors"))
    return weights_from_files(files) if files else None
