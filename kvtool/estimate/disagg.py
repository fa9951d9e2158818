"""Prefill/decode disaggregation (vLLM's ``--kv-transfer-config``): the KV bytes one request hands from the prefill
instance to the decode instance, the decode pool's blocks that transfers in flight hold, and the link bandwidth one
handoff needs to arrive within a TTFT budget.

How vLLM moves the KV (read from vLLM 0.33.0, the same in 0.19.0):

- The decode side's NixlConnector asks for every prompt token it does not hold: ``count = len(prompt_token_ids) -
  num_computed_tokens`` (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py
  get_num_new_matched_tokens (0.33.0); nixl_connector.py NixlConnectorScheduler.get_num_new_matched_tokens
  (0.19.0)), less a trailing backoff kept for Mamba state or multi-module MTP (base_scheduler.py _prefill_backoff,
  0.33.0), which kvtool refuses rather than models: the handoff here is of attention layers only.
- It reads whole blocks, one descriptor per (layer, block): a request of P prompt tokens moves ceil(P / block_size)
  blocks of every layer, each block the page of that layer on that rank.  Each decode rank pulls the KV heads it
  holds (from one or several prefill ranks when the two TP sizes differ: nixl/tp_mapping.py), so the bytes one
  decode GPU receives depend on the decode TP only.
- The decode scheduler allocates the request's blocks before the transfer starts and keeps them while the request
  waits in WAITING_FOR_REMOTE_KVS (vllm/v1/core/sched/scheduler.py Scheduler.schedule, 0.33.0 and 0.19.0): N
  transfers in flight hold N x ceil(P / block_size) blocks of the decode pool.
"""

from __future__ import annotations

import dataclasses
import json
import math

from kvtool.core.errors import UsageError
from kvtool.core.units import GB
from kvtool.estimate.capacity import Capacity
from kvtool.estimate.kinds import FULL
from kvtool.estimate.layout import MLA, KvLayout

# the connectors whose transfer is the whole-block pull above; others are sized the same way, with a warning
BLOCK_CONNECTORS = ("NixlConnector", "P2pNcclConnector", "MooncakeConnector")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
READ_KEYS = ("kv_connector", "kv_role")


@dataclasses.dataclass(frozen=True)
class TransferConfig:
    """The two keys of vLLM's --kv-transfer-config that kvtool reads, and a warning for each key it does not."""

    kv_connector: str | None
    kv_role: str | None
    warnings: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Disaggregation:
    """One prefill -> decode handoff, the decode pool it holds, and the bandwidth a TTFT budget needs."""

    kv_connector: str | None
    kv_role: str | None
    prompt_len: int  # tokens handed off (--prompt-len, else the first --seq-len)
    handoff_blocks: int  # ceil(prompt_len / block_size): blocks per layer, and blocks of the decode pool
    handoff_bytes_per_gpu: int  # what one decode GPU receives (its KV heads, whole blocks of every layer)
    handoff_bytes: int  # all decode GPUs together (x TP)
    transfers_in_flight: int | None  # --transfers-in-flight, else (decode pool - null block) // handoff_blocks
    transfer_blocks_in_flight: int | None  # transfers_in_flight x handoff_blocks
    ttft_budget_ms: float | None
    prefill_ms: float
    link_gb_s_for_ttft: float | None  # per GPU pair: handoff_bytes_per_gpu / (ttft - prefill), 10**9 B/s
    method: str
    warnings: tuple[str, ...]


def parse_transfer_config(text: str) -> TransferConfig:
    """kv_connector and kv_role of --kv-transfer-config (vLLM's JSON); a warning names every other key."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kv-transfer-config is not JSON: {exc.msg}", where="--kv-transfer-config") from None
    if not isinstance(value, dict):
        raise UsageError("--kv-transfer-config must be a JSON object", where="--kv-transfer-config")
    connector, role = value.get("kv_connector"), value.get("kv_role")
    if connector is not None and not isinstance(connector, str):
        raise UsageError("--kv-transfer-config's kv_connector must be a string", where="--kv-transfer-config")
    if role is not None and role not in KV_ROLES:
        # vllm/config/kv_transfer.py KVTransferConfig.__post_init__ refuses it (0.33.0)
        raise UsageError(
            f"--kv-transfer-config's kv_role takes {', '.join(KV_ROLES)}, not {role!r}", where="--kv-transfer-config"
        )
    if connector is not None and role is None:
        raise UsageError(
            "--kv-transfer-config names a kv_connector without a kv_role (vLLM refuses it: "
            "vllm/config/kv_transfer.py KVTransferConfig.__post_init__)",
            where="--kv-transfer-config",
        )
    warnings = [
        f"--kv-transfer-config: {key!r} is not modelled (kvtool reads kv_connector and kv_role only)"
        for key in value
        if key not in READ_KEYS
    ]
    if connector is not None and connector not in BLOCK_CONNECTORS:
        warnings.append(
            f"--kv-transfer-config: {connector} is sized as NixlConnector moves KV (whole blocks of every layer); "
            "kvtool has not read its own transfer"
        )
    if role == "kv_producer":
        warnings.append(
            "--kv-transfer-config: kv_role kv_producer is the prefill side; the blocks in flight are the decode "
            "(kv_consumer) pool's, counted here on this pool"
        )
    return TransferConfig(connector, role, tuple(warnings))


def check_disagg_options(
    prompt_len: int | None, transfers_in_flight: int | None, ttft_budget_ms: float | None, prefill_ms: float | None
) -> None:
    """Refuse a count or a time that is not positive, and a prefill time that leaves no transfer time."""
    for option, count in (("--prompt-len", prompt_len), ("--transfers-in-flight", transfers_in_flight)):
        if count is not None and count <= 0:
            raise UsageError(f"{option} must be greater than zero, not {count}", where=option)
    if ttft_budget_ms is not None and not ttft_budget_ms > 0:
        raise UsageError(
            f"--ttft-budget-ms must be greater than zero, not {ttft_budget_ms:g}", where="--ttft-budget-ms"
        )
    if prefill_ms is not None:
        if not prefill_ms >= 0:
            raise UsageError(f"--prefill-ms must not be negative, not {prefill_ms:g}", where="--prefill-ms")
        if ttft_budget_ms is None:
            raise UsageError("--prefill-ms needs --ttft-budget-ms", where="--prefill-ms")
        if prefill_ms >= ttft_budget_ms:
            raise UsageError(
                f"--prefill-ms {prefill_ms:g} leaves no time of --ttft-budget-ms {ttft_budget_ms:g} for the transfer",
                where="--prefill-ms",
            )


def handoff_bytes_per_gpu(layout: KvLayout, prompt_len: int, block_size: int) -> tuple[int, int]:
    """The blocks per layer and the bytes one decode GPU receives for a prompt of ``prompt_len`` tokens."""
    kinds = {g.kind for g in layout.groups}
    if not kinds <= {FULL, MLA}:
        other = ", ".join(sorted(kinds - {FULL, MLA}))
        raise UsageError(
            f"kvtool models the prefill/decode handoff of full-attention and MLA layers only, not {other} layers",
            where="--kv-transfer-config",
        )
    blocks = math.ceil(prompt_len / block_size)
    per_block = sum((math.ceil(g.bytes_per_token_per_layer * block_size) * g.num_layers for g in layout.groups), 0)
    return blocks, blocks * per_block


def plan_disagg(
    layout: KvLayout,
    capacity: Capacity | None,
    *,
    prompt_len: int,
    block_size: int,
    tp: int,
    transfer_config: str | None = None,
    transfers_in_flight: int | None = None,
    ttft_budget_ms: float | None = None,
    prefill_ms: float | None = None,
) -> Disaggregation:
    """The handoff of one prompt of ``prompt_len`` tokens from prefill to decode, on the decode side's layout
    (``tp`` is the decode TP) and pool (``capacity``; None without a budget)."""
    check_disagg_options(prompt_len, transfers_in_flight, ttft_budget_ms, prefill_ms)
    config = parse_transfer_config(transfer_config) if transfer_config is not None else TransferConfig(None, None, ())
    warnings = list(config.warnings)
    blocks, per_gpu = handoff_bytes_per_gpu(layout, prompt_len, block_size)
    usable = capacity.num_blocks - 1 if capacity else None  # one block is vLLM's null block
    in_flight = transfers_in_flight
    if in_flight is None and usable is not None:
        in_flight = usable // blocks
    held = in_flight * blocks if in_flight is not None else None
    if held is not None and usable is not None and held > usable:
        warnings.append(
            f"{in_flight} transfers in flight hold {held:,} blocks, more than the decode pool's {usable:,}: "
            "the decode scheduler leaves the rest waiting"
        )
    prefill = prefill_ms or 0.0
    link = None
    if ttft_budget_ms is not None:
        link = per_gpu / ((ttft_budget_ms - prefill) / 1000) / GB
    method = (
        f"ceil({prompt_len:,} / {block_size}) = {blocks:,} blocks x {per_gpu // blocks:,} B per block of all layers "
        f"on one decode GPU = {per_gpu:,} B (x TP {tp} = {per_gpu * tp:,} B)"
    )
    if link is not None:
        method += f"; {per_gpu:,} B / ({ttft_budget_ms:g} - {prefill:g}) ms = {link:.2f} GB/s per GPU pair"
    if in_flight is not None:
        source = (
            "--transfers-in-flight" if transfers_in_flight is not None else f"({usable:,} pool blocks // {blocks:,})"
        )
        method += f"; {in_flight:,} transfers in flight {source} hold {held:,} decode blocks (WAITING_FOR_REMOTE_KVS)"
    return Disaggregation(
        config.kv_connector,
        config.kv_role,
        prompt_len,
        blocks,
        per_gpu,
        per_gpu * tp,
        in_flight,
        held,
        ttft_budget_ms,
        prefill,
        link,
        method,
        tuple(warnings),
    )
