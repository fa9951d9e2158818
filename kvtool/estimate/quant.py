"""Quantized weights: bytes of a linear weight matrix under a checkpoint's ``quantization_config`` or vLLM's
``--quantization`` (online), as vLLM stores them on the GPU.

Only the decoder's linear layers are quantized (q/k/v/o, the MLP, the MoE experts); embeddings, the LM head, norms
and routers stay at the model dtype (vLLM's ``LinearMethodBase`` is applied to linear layers only).  Per method:

- ``fp8`` (DeepSeek-V3, Qwen3-FP8): one byte per weight plus a float32 scale per ``weight_block_size`` block, or one
  per matrix without blocks; vLLM's online ``--quantization fp8`` is the per-tensor form.
- ``mxfp4`` (gpt-oss): MoE experts only, 4-bit values plus one 1-byte E8M0 scale per 32 (4.25 bits), laid out per
  TP rank as each release's Hopper kernel keeps them (:data:`MXFP4_LAYOUTS`, :func:`mxfp4_expert_bytes`).
- ``awq``: packed 4-bit weights, per group of ``group_size`` inputs a float16 scale and a packed 4-bit zero point.
- ``gptq``: packed ``bits`` weights, per group a float16 scale and a packed zero point, plus an int32 ``g_idx`` per
  input channel.
- ``compressed-tensors``: the first config group's ``weights`` (num_bits, strategy group/channel/tensor/block,
  group_size); scales at the model dtype.
- ``bitsandbytes``: NF4 (4 bits, a float32 absmax per 64; with double quantization one byte per 64 plus a float32
  per 256 blocks) or LLM.int8 (1 byte plus a float32 scale per row).
- ``modelopt``: FP8 per tensor, or NVFP4 (4 bits plus one FP8 scale per 16).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from kvtool.core.errors import InputFileError, UsageError

ONLINE_METHODS = ("fp8", "bitsandbytes")


@dataclasses.dataclass(frozen=True)
class WeightQuant:
    """How a quantized linear weight matrix of (rows = outputs, cols = inputs) is stored."""

    method: str  # in words, for the output
    bits: int  # per weight
    group_size: int  # inputs per scale; 0: one scale per output row; -1: one per matrix
    scale_bytes: float  # bytes of one scale plus its zero point
    block: tuple[int, int] | None = None  # 2-D scale blocks (rows, cols), fp8 only
    experts_only: bool = False  # only the MoE experts are quantized (mxfp4)
    mxfp4_experts: bool = False  # the experts laid out by the release's MXFP4 kernel (MXFP4_LAYOUTS)
    per_input_bytes: int = 0  # bytes per input channel (GPTQ's int32 g_idx)

    def matrix_bytes(self, rows: int, cols: int) -> int:
        values = math.ceil(rows * cols * self.bits / 8)
        if self.block is not None:
            scales = math.ceil(rows / self.block[0]) * math.ceil(cols / self.block[1])
        elif self.group_size == -1:
            scales = 1
        elif self.group_size == 0:
            scales = rows
        else:
            scales = rows * math.ceil(cols / self.group_size)
        return values + math.ceil(scales * self.scale_bytes) + cols * self.per_input_bytes


class Mxfp4Layout(NamedTuple):
    """How one release keeps the MXFP4 experts of one TP rank on a Hopper GPU (the TRITON MoE backend)."""

    since: str
    pad_intermediate_to: int  # the intermediate size per TP partition rounded up to this
    hopper_swizzle: bool  # values padded to 64 x 64 bytes, the original scales kept beside a copy padded to 256 rows
    source: str


MXFP4_LAYOUTS: tuple[Mxfp4Layout, ...] = (
    # Fitted, not read: 0.11.0's source pads to 64 on Hopper (create_weights' last branch; 256 is the SM100 TRTLLM
    # and ROCm branch) and, on its pinned torch 2.8.0, _swizzle_mxfp4 keeps StridedLayout views (no copy, no
    # padding): 12.80 / 60.69 GiB for gpt-oss-20b / 120b at TP 1, where its logs say 13.47 / 64.38 GiB.  Padding to
    # 256 without a copy gives 13.43 / 64.48 GiB, and is kept for 0.10.0-0.11.0 until a log explains the difference.
    Mxfp4Layout(
        "0.10.0",
        256,
        False,
        "fitted to the 0.11.0 gpt-oss logs; vllm/model_executor/layers/quantization/mxfp4.py "
        "Mxfp4MoEMethod.create_weights (0.11.0) pads Hopper to 64",
    ),
    # 0.11.1 is the first release on torch 2.9 (vllm-project/vllm#27228), so _swizzle_mxfp4's Hopper branch
    # (torch >= 2.8.1) swizzles: HopperMXValueLayout.swizzle_data pads both byte dims to 64, HopperMXScaleLayout the
    # scales' rows to 2 x num_warps(8) x 2 x 8 = 256 and their columns to 2; the swizzled scales are new tensors and
    # the loaded w13/w2_weight_scale parameters stay (only w13/w2_weight are deleted).  Same in every release since:
    # the padding moved to fused_moe/oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size (0.19.0),
    # the swizzle to convert_to_mxfp4_moe_kernel_format (0.19.0).
    Mxfp4Layout(
        "0.11.1",
        64,
        True,
        "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py _swizzle_mxfp4 (0.11.1); "
        "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size "
        "(0.19.0)",
    ),
)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def mxfp4_expert_bytes(layout: Mxfp4Layout, hidden: int, inter_per_rank: int, matrices: int = 3) -> int:
    """Bytes of one MXFP4 expert on one TP rank: gate + up fused as w13 (2 x inter rows of hidden inputs; up only
    when ``matrices`` is 2) and down as w2 (hidden rows of inter inputs), half a byte per value and a byte per 32."""
    inter = _round_up(inter_per_rank, layout.pad_intermediate_to)
    rows13 = (matrices - 1) * inter
    scales = rows13 * math.ceil(hidden / 32) + hidden * math.ceil(inter / 32)
    if not layout.hopper_swizzle:
        return math.ceil(rows13 * hidden / 2) + math.ceil(hidden * inter / 2) + scales
    # transposed to (inputs / 2 bytes, rows), both padded to 64; the scales' copy (rows, inputs / 32) to (256, 2)
    values = _round_up(hidden // 2, 64) * _round_up(rows13, 64) + _round_up(inter // 2, 64) * _round_up(hidden, 64)
    copy = _round_up(rows13, 256) * _round_up(math.ceil(hidden / 32), 2)
    copy += _round_up(hidden, 256) * _round_up(math.ceil(inter / 32), 2)
    return values + scales + copy


def _int(config: dict[str, Any], where: str, *keys: str, default: int) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 4096:
                raise InputFileError(f"{key} must be a small integer, not {value!r}", where=f"{where}.{key}")
            return value
    return default


def _fp8(config: dict[str, Any], where: str) -> WeightQuant:
    block = config.get("weight_block_size")
    if block is None:
        return WeightQuant("fp8, one scale per matrix", 8, -1, 4)
    if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
        raise InputFileError(
            f"weight_block_size must be two positive integers, not {block!r}", where=f"{where}.weight_block_size"
        )
    return WeightQuant(f"fp8, {block[0]}x{block[1]} blocks", 8, 0, 4, block=(block[0], block[1]))


def _compressed_tensors(config: dict[str, Any], where: str, dtype_bytes: int) -> WeightQuant:
    groups = config.get("config_groups") or {}
    first = next(iter(groups.values()), None) if isinstance(groups, dict) else None
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        raise InputFileError("compressed-tensors config has no config_groups.*.weights", where=f"{where}.config_groups")
    bits = _int(weights, where, "num_bits", default=8)
    strategy = weights.get("strategy") or "tensor"
    kind = weights.get("type") or "int"
    label = f"compressed-tensors w{bits} {kind} ({strategy})"
    if strategy == "group":
        return WeightQuant(label, bits, _int(weights, where, "group_size", default=128), dtype_bytes)
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        return WeightQuant(label, bits, 0, 4, block=(int(block[0]), int(block[1])))
    return WeightQuant(label, bits, 0 if strategy == "channel" else -1, 4 if kind == "float" else dtype_bytes)


def _bitsandbytes(config: dict[str, Any]) -> WeightQuant:
    if config.get("load_in_8bit"):
        return WeightQuant("bitsandbytes LLM.int8", 8, 0, 4)
    if config.get("bnb_4bit_use_double_quant"):
        return WeightQuant("bitsandbytes NF4, double quantization", 4, 64, 1 + 4 / 256)
    return WeightQuant("bitsandbytes NF4", 4, 64, 4)


def _modelopt(config: dict[str, Any]) -> WeightQuant:
    algo = str(config.get("quant_algo") or (config.get("quantization") or {}).get("quant_algo") or "").upper()
    if "FP4" in algo:
        return WeightQuant("modelopt NVFP4", 4, 16, 1)
    return WeightQuant("modelopt FP8, one scale per matrix", 8, -1, 4)


def from_quantization_config(config: dict[str, Any], where: str, dtype_bytes: int) -> WeightQuant | None:
    """The storage of a checkpoint's ``quantization_config``; None when the method is not modelled."""
    method = str(config.get("quant_method") or "").lower()
    where = f"{where}: field quantization_config"
    if method == "fp8":
        return _fp8(config, where)
    if method == "mxfp4":
        return WeightQuant(
            "mxfp4 MoE experts (4-bit + E8M0 scale per 32)", 4, 32, 1, experts_only=True, mxfp4_experts=True
        )
    if method == "awq":
        bits = _int(config, where, "w_bit", "bits", default=4)
        group = _int(config, where, "q_group_size", "group_size", default=128)
        return WeightQuant(f"AWQ int{bits}, groups of {group}", bits, group, 2 + bits / 8)
    if method == "gptq":
        bits = _int(config, where, "bits", default=4)
        group = _int(config, where, "group_size", default=128)
        groups = "per channel" if group <= 0 else f"groups of {group}"
        return WeightQuant(f"GPTQ int{bits}, {groups}", bits, max(group, 0), 2 + bits / 8, per_input_bytes=4)
    if method == "compressed-tensors":
        return _compressed_tensors(config, where, dtype_bytes)
    if method == "bitsandbytes":
        return _bitsandbytes(config)
    if method == "modelopt":
        return _modelopt(config)
    return None


def online(method: str) -> WeightQuant:
    """vLLM's ``--quantization`` on an unquantized checkpoint: fp8 (per tensor) or bitsandbytes (NF4 in flight)."""
    if method == "fp8":
        return WeightQuant("fp8 online (--quantization fp8), one scale per matrix", 8, -1, 4)
    if method == "bitsandbytes":
        return WeightQuant("bitsandbytes NF4 in flight (--quantization bitsandbytes)", 4, 64, 4)
    raise UsageError(
        f"--quantization {method!r} is not modelled for an unquantized checkpoint",
        where="--quantization",
        tip=f"use one of {', '.join(ONLINE_METHODS)}; a quantized checkpoint's own quantization_config is read as is",
    )
