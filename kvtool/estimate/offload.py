"""The CPU tier of vLLM's KV offloading (``--kv-offloading-size GiB``, ``--kv-offloading-backend``): how many blocks
the offloading connector allocates on the host, and the tokens they hold.

vLLM's native backend (the OffloadingConnector with its CPU spec) sizes the host tier after the GPU KV cache exists:

    cpu_bytes_to_use  = kv_offloading_size x 2**30          (all ranks together; vllm/config/vllm.py
                                                             VllmConfig._post_init_kv_transfer_config)
    bytes_per_block   = total GPU KV bytes // num_gpu_blocks (one worker: page x layers per group)
                        x world_size x blocks_per_chunk      (1 unless extra_config sets block_size)
    num_cpu_blocks    = int(cpu_bytes_to_use) // round_up(bytes_per_block, mmap.PAGESIZE)   (0.23.0 on; unrounded
                                                             before)

From 0.20.0 the connector keys each offloaded block by (block hash, KV-cache group), so on a hybrid model one block
of tokens takes one CPU block per group: the tier holds num_cpu_blocks // groups x block_size tokens.  The rule of
each release is a row of :data:`OFFLOAD_RULES`, read from vllm/v1/kv_offload/cpu.py (0.14.0-0.19.1),
vllm/v1/kv_offload/cpu/spec.py (0.20.0-0.33.0) ``CPUOffloadingSpec.__init__``.

The lmcache backend (vLLM 0.11.1-0.22.1) starts LMCacheConnectorV1 with ``lmcache.local_cpu`` and
``lmcache.max_local_cpu_size = kv_offloading_size / (tp x pp)``; each rank's LMCache then keeps chunks of
``chunk_size`` tokens (LMCache's default 256) in its own pinned buffer:

    cpu_bytes_per_rank = int(max_local_cpu_size x 1024**3)
    bytes_per_chunk    = round_up(K/V planes x layers x chunk_size x kv_heads_per_rank x head_dim x dtype, 4096)
    chunks             = cpu_bytes_per_rank // bytes_per_chunk           (each chunk of tokens on every rank)

From vLLM 0.23.0 the lmcache backend is LMCacheMPConnector and the size is not passed on (the LMCache server's own
size decides), so kvtool refuses it there.  LMCache's rule is a row of :data:`LMCACHE_RULES`, keyed by LMCache release.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from kvtool.core.errors import UsageError
from kvtool.core.units import GIB
from kvtool.estimate.capacity import Capacity
from kvtool.estimate.kinds import FULL
from kvtool.estimate.layout import KvLayout
from kvtool.estimate.vllm_versions import pick

# mmap.PAGESIZE on the x86-64 and aarch64 Linux hosts vLLM runs on (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT,
# vllm/v1/kv_offload/cpu/shared_offload_region.py (0.23.0-0.33.0)); a 64 KiB-page host would round to 65,536
HOST_PAGE_BYTES = 4096
BACKENDS = ("native", "lmcache")
# LMCache's chunk_size default (lmcache/v1/config.py _CONFIG_DEFINITIONS, 0.3.9-0.5.6); its LMCACHE_CHUNK_SIZE
LMCACHE_DEFAULT_CHUNK_SIZE = 256
LMCACHE_CONNECTOR = "LMCacheConnectorV1"


class LmcacheRule(NamedTuple):
    """How one range of LMCache releases sizes its local CPU tier (the default, non-paged allocator)."""

    since: str  # LMCache release
    align_bytes: int  # each chunk's MemoryObj is rounded up to this (TensorMemoryAllocator / AddressManager)
    source: str


LMCACHE_RULES: tuple[LmcacheRule, ...] = (
    LmcacheRule(
        "0.3.9",
        4096,
        "lmcache/v1/storage_backend/local_cpu_backend.py LocalCPUBackend.initialize_allocator: "
        "MixedMemoryAllocator(int(max_local_cpu_size * 1024**3)); lmcache/v1/memory_management.py "
        "TensorMemoryAllocator.allocate rounds to ALIGN_BYTES 4096; kv_shape from "
        "lmcache/integration/vllm/vllm_v1_adapter.py _init_lmcache_engine",
    ),
    LmcacheRule(
        "0.4.1",
        4096,
        "lmcache/v1/storage_backend/local_cpu_backend.py LocalCPUBackend.initialize_allocator: "
        "MixedMemoryAllocator(int(cpu_size * 1024**3)); lmcache/v1/memory_management.py "
        "AddressManager.compute_aligned_size (ALIGN_BYTES 4096); kv_shape from lmcache/integration/vllm/utils.py "
        "create_lmcache_metadata",
    ),
    LmcacheRule(
        "0.5.6",
        4096,
        "lmcache/v1/storage_backend/local_cpu_backend.py LocalCPUBackend.initialize_allocator: "
        "MixedMemoryAllocator(int(cpu_size * 1024**3)); lmcache/v1/memory_allocators/tensor_memory_allocator.py "
        "TensorMemoryAllocator.allocate via lmcache/v1/memory_management.py AddressManager (ALIGN_BYTES 4096); "
        "kv_shape from lmcache/integration/vllm/vllm_service_factory.py VllmServiceFactory.get_or_create_metadata",
    ),
)
# the LMCache release kvtool follows (its allocator is recorded in tests/data/lmcache-offload); the rows before it
# compute the same figure for a model of one attention kind
LMCACHE_VERSION = LMCACHE_RULES[-1].since


class OffloadRule(NamedTuple):
    """How one range of releases sizes the native CPU tier."""

    since: str
    has_option: bool  # --kv-offloading-size exists (vllm/engine/arg_utils.py EngineArgs)
    native_error: str | None  # what the native backend raises at start-up, when it cannot start
    page_aligned: bool  # bytes per CPU block rounded up to the host page
    per_group_keys: bool  # a hybrid model's groups each take a CPU block per token block
    source: str
    # what --kv-offloading-backend lmcache starts: LMCacheConnectorV1 with lmcache.max_local_cpu_size, or
    # LMCacheMPConnector (0.23.0 on), which passes no size (vllm/config/vllm.py _post_init_kv_transfer_config)
    lmcache_connector: str = LMCACHE_CONNECTOR


OFFLOAD_RULES: tuple[OffloadRule, ...] = (
    OffloadRule("0.10.0", False, None, False, False, "vllm/engine/arg_utils.py EngineArgs (0.10.0-0.11.0): no option"),
    OffloadRule(
        "0.11.1",
        True,
        # _post_init_kv_transfer_config passes num_cpu_blocks=0 and CPUOffloadingSpec.__init__ refuses a falsy one
        "num_cpu_blocks must be specified in kv_connector_extra_config",
        False,
        False,
        "vllm/config/vllm.py _post_init_kv_transfer_config sets num_cpu_blocks 0; vllm/v1/kv_offload/cpu.py "
        "CPUOffloadingSpec.__init__ (0.11.1-0.13.0) refuses it",
    ),
    OffloadRule(
        "0.14.0",
        True,
        None,
        False,
        False,
        "vllm/v1/kv_offload/cpu.py CPUOffloadingSpec.__init__ (0.14.0-0.19.1): "
        "cpu_bytes_to_use // (page x len(kv_cache_tensors) x world_size x block_size_factor)",
    ),
    OffloadRule(
        "0.20.0",
        True,
        None,
        False,
        True,
        "vllm/v1/kv_offload/cpu/spec.py CPUOffloadingSpec.__init__ (0.20.0-0.22.1): "
        "cpu_bytes_to_use // (total GPU KV bytes // num_blocks x world_size x block_size_factor)",
    ),
    OffloadRule(
        "0.23.0",
        True,
        None,
        True,
        True,
        "vllm/v1/kv_offload/cpu/spec.py CPUOffloadingSpec.__init__ (0.23.0-0.33.0): "
        "cpu_bytes_to_use // round_up(GPU KV bytes per block x world_size x blocks_per_chunk, mmap.PAGESIZE)",
        "LMCacheMPConnector",
    ),
)

FIRST_WITH_OPTION = next(r.since for r in OFFLOAD_RULES if r.has_option)
FIRST_NATIVE = next(r.since for r in OFFLOAD_RULES if r.has_option and r.native_error is None)


@dataclasses.dataclass(frozen=True)
class OffloadTier:
    """The host (CPU) tier of the KV cache, as vLLM's offloading connector allocates it."""

    backend: str  # --kv-offloading-backend
    size_gib: float  # --kv-offloading-size, GiB, all ranks together
    cpu_bytes: int  # native: int(size x 2**30); lmcache: int(size / ranks x 2**30) x ranks
    bytes_per_cpu_block: int  # all ranks, after the host-page (native) or 4 KiB (LMCache) rounding
    cpu_kv_blocks: int  # vLLM's num_blocks / num_chunks of CPUOffloadingSpec, or LMCache's chunks (each on every rank)
    cpu_kv_tokens: int  # tokens of every group the tier holds: blocks // groups x tokens_per_cpu_block
    method: str
    tokens_per_cpu_block: int = 0  # vLLM's block_size (native) or LMCache's chunk_size


def check_offload_options(size_gib: float | None, backend: str, vllm_version: str) -> None:
    """Refuse an offloading size that is not positive, an unknown backend, or a release without the option or
    whose native backend cannot start."""
    if backend not in BACKENDS:
        raise UsageError(
            f"--kv-offloading-backend takes native or lmcache, not {backend!r}", where="--kv-offloading-backend"
        )
    if size_gib is None:
        return
    if not size_gib > 0:
        raise UsageError(
            f"--kv-offloading-size must be greater than zero, not {size_gib:g}", where="--kv-offloading-size"
        )
    rule = pick(OFFLOAD_RULES, vllm_version)
    if not rule.has_option:
        raise UsageError(
            f"vLLM {vllm_version} has no --kv-offloading-size (it first appears in {FIRST_WITH_OPTION})",
            where="--kv-offloading-size",
            tip=f"pass --vllm-version {FIRST_WITH_OPTION} or later",
        )
    if backend == "lmcache":
        if rule.lmcache_connector != LMCACHE_CONNECTOR:
            raise UsageError(
                f"vLLM {vllm_version}'s --kv-offloading-backend lmcache starts {rule.lmcache_connector} and passes "
                "no size on: the LMCache server's own size decides (vllm/config/vllm.py _post_init_kv_transfer_config)",
                where="--kv-offloading-backend",
                tip="pass --vllm-version 0.22.1 (LMCacheConnectorV1 with lmcache.max_local_cpu_size) or the native backend",
            )
        return
    if rule.native_error is not None:
        raise UsageError(
            f"vLLM {vllm_version}'s native offloading does not start: it raises {rule.native_error!r} ({rule.source})",
            where="--kv-offloading-size",
            tip=f"pass --vllm-version {FIRST_NATIVE} or later",
        )


def check_lmcache_chunk_size(chunk_size: int | None, backend: str) -> None:
    """Refuse --lmcache-chunk-size that is not positive or that comes without the lmcache backend."""
    if chunk_size is None:
        return
    if backend != "lmcache":
        raise UsageError(
            "--lmcache-chunk-size applies to --kv-offloading-backend lmcache only", where="--lmcache-chunk-size"
        )
    if chunk_size <= 0:
        raise UsageError(
            f"--lmcache-chunk-size must be greater than zero, not {chunk_size}", where="--lmcache-chunk-size"
        )


def plan_offload(
    size_gib: float | None,
    backend: str,
    capacity: Capacity | None,
    tp: int,
    pp: int,
    vllm_version: str,
    layout: KvLayout | None = None,
    lmcache_chunk_size: int | None = None,
) -> OffloadTier | None:
    """The CPU tier for ``--kv-offloading-size`` on the GPU tier ``capacity`` (None without the option).

    Args:
        size_gib: --kv-offloading-size, all ranks together.
        capacity: the GPU tier (its page bytes and layers per group give the bytes per block).
        tp, pp: the tensor and pipeline sizes (vLLM's world_size is their product).
        layout: the model's KV per token and layer on one rank (the lmcache backend's chunk shape).
        lmcache_chunk_size: LMCache's chunk_size (lmcache.chunk_size; None: LMCache's default 256).
    """
    if size_gib is None:
        return None
    check_offload_options(size_gib, backend, vllm_version)
    check_lmcache_chunk_size(lmcache_chunk_size, backend)
    if pp > 1:  # each stage's workers hold other layers, so bytes per block differ by stage
        raise UsageError(
            "kvtool does not model the CPU tier with pipeline parallelism (--pp > 1)", where="--kv-offloading-size"
        )
    world_size = tp
    if capacity is None:
        raise UsageError(
            "--kv-offloading-size needs the GPU tier: give --gpu, --gpu-memory or --kv-memory",
            where="--kv-offloading-size",
        )
    if backend == "lmcache":
        if layout is None:
            raise UsageError(
                "--kv-offloading-backend lmcache needs the model's KV layout", where="--kv-offloading-size"
            )
        return _lmcache_tier(size_gib, layout, tp, lmcache_chunk_size or LMCACHE_DEFAULT_CHUNK_SIZE)
    rule = pick(OFFLOAD_RULES, vllm_version)
    groups = len(capacity.groups)
    if groups > 1 and not rule.per_group_keys:
        raise UsageError(
            f"kvtool does not model vLLM {vllm_version}'s offloading of a model with {groups} KV-cache groups",
            where="--kv-offloading-size",
            tip="pass --vllm-version 0.20.0 or later",
        )
    worker_bytes_per_block = capacity.page_bytes_per_layer * capacity.layers_per_group
    per_block = worker_bytes_per_block * world_size
    if rule.page_aligned:
        per_block = -(-per_block // HOST_PAGE_BYTES) * HOST_PAGE_BYTES
    cpu_bytes = int(size_gib * GIB)
    blocks = cpu_bytes // per_block
    tokens = blocks // groups * capacity.block_size
    method = (
        f"{cpu_bytes:,} B // {per_block:,} B per block ({worker_bytes_per_block:,} B per GPU block x {world_size} "
        f"rank(s){', rounded up to the ' + str(HOST_PAGE_BYTES) + ' B host page' if rule.page_aligned else ''})"
        f"{f'; each of the {groups} KV-cache groups takes its own CPU block' if groups > 1 else ''}; {rule.source}"
    )
    return OffloadTier(backend, size_gib, cpu_bytes, per_block, blocks, tokens, method, capacity.block_size)


def _lmcache_tier(size_gib: float, layout: KvLayout, ranks: int, chunk_size: int) -> OffloadTier:
    """LMCache's local CPU tier: each rank's pinned buffer of max_local_cpu_size GB holds whole chunks of its KV."""
    if len(layout.groups) != 1 or layout.groups[0].kind != FULL:
        kinds = ", ".join(sorted({g.kind for g in layout.groups}))
        raise UsageError(
            f"kvtool models LMCache's CPU tier for full-attention models only, not {kinds} layers (LMCache's layer "
            "groups, and MLA's first-rank-only save sized from the host's free memory, are not modelled)",
            where="--kv-offloading-backend",
        )
    group = layout.groups[0]
    rule = LMCACHE_RULES[-1]
    per_token_layer = group.bytes_per_token_per_layer  # K and V of one rank's heads, exact
    raw = per_token_layer * group.num_layers * chunk_size
    if raw.denominator != 1:
        raise UsageError(
            f"kvtool does not model LMCache's chunks of a {layout.kv_dtype} KV cache (not whole bytes per chunk)",
            where="--kv-offloading-backend",
        )
    per_rank_chunk = -(-int(raw) // rule.align_bytes) * rule.align_bytes
    max_local_cpu_size = size_gib / ranks  # vLLM's kv_gb_per_rank, given to LMCache as lmcache.max_local_cpu_size
    rank_bytes = int(max_local_cpu_size * GIB)
    chunks = rank_bytes // per_rank_chunk
    method = (
        f"LMCache {rule.since}: lmcache.max_local_cpu_size {max_local_cpu_size:g} GB per rank = {rank_bytes:,} B // "
        f"{per_rank_chunk:,} B per chunk ([{group.kv_factor}, {group.num_layers}, {chunk_size}, "
        f"{group.kv_heads_per_gpu * group.vector_elements}] {layout.kv_dtype} = {int(raw):,} B, rounded up to "
        f"{rule.align_bytes} B) on each of {ranks} rank(s); {rule.source}"
    )
    return OffloadTier(
        "lmcache", size_gib, rank_bytes * ranks, per_rank_chunk * ranks, chunks, chunks * chunk_size, method, chunk_size
    )
