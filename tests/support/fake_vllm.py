"""A miniature of vLLM 0.32's scheduler and KV-cache manager, for testing the recorder without vLLM.

Only what the recorder touches, with vLLM's names and behaviour (vllm/v1/core/kv_cache_manager.py,
single_type_kv_cache_manager.py, block_pool.py, sched/scheduler.py): a block pool with a null block (id 0) and
prefix-cached blocks that stay evictable in the free queue, per-group ``req_to_blocks`` lists, ``allocate_slots``
returning only the new blocks (None when there is no room), frees through ``_free_request`` and
``_preempt_request``, and a sliding-window group that replaces blocks that left the window by the null block.
"""

from __future__ import annotations

import dataclasses
import enum


class RequestStatus(enum.IntEnum):
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_ABORTED = 5


@dataclasses.dataclass(eq=False)
class Block:
    block_id: int
    is_null: bool = False


@dataclasses.dataclass(eq=False)
class Request:
    request_id: str
    num_tokens: int
    status: RequestStatus = RequestStatus.WAITING


@dataclasses.dataclass
class KVCacheBlocks:
    blocks: tuple


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_gpu_blocks = num_blocks
        self.null_block = Block(0, is_null=True)
        self.free = [Block(i) for i in range(1, num_blocks)]

    def get_num_free_blocks(self) -> int:
        return len(self.free)

    def get_new_blocks(self, n: int) -> list[Block]:
        taken = self.free[:n]  # from the front, freed blocks go to the back (vLLM's LRU free queue)
        del self.free[:n]
        return taken

    def free_blocks(self, ordered_blocks) -> None:
        self.free.extend(b for b in ordered_blocks if not b.is_null)


class Manager:
    """One KV-cache group's single-type manager."""

    def __init__(self, pool: BlockPool, block_size: int, window_blocks: int | None = None):
        self.block_pool, self.block_size, self.window_blocks = pool, block_size, window_blocks
        self.req_to_blocks: dict[str, list[Block]] = {}

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int, num_prompt_tokens=None) -> None:
        if self.window_blocks is None or request_id not in self.req_to_blocks:
            return
        blocks = self.req_to_blocks[request_id]
        skipped = max(0, processed_computed_tokens // self.block_size - self.window_blocks)
        freed = []
        for i in range(min(skipped, len(blocks)) - 1, -1, -1):
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self.block_pool.null_block
        if freed:
            self.block_pool.free_blocks(freed)


class SlidingWindowManager(Manager):
    pass


class Coordinator:
    def __init__(self, managers):
        self.single_type_managers = tuple(managers)


class KVCacheManager:
    def __init__(self, num_blocks: int = 16, block_size: int = 4, window_blocks: int | None = None, hybrid=False):
        self.block_pool = pool = BlockPool(num_blocks)
        managers = [Manager(pool, block_size)]
        if hybrid or window_blocks is not None:
            managers = [Manager(pool, block_size)] if hybrid else []
            managers.append(SlidingWindowManager(pool, block_size, window_blocks))
        self.coordinator = Coordinator(managers)
        self.block_size = block_size

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, **kwargs):
        managers = self.coordinator.single_type_managers
        computed = getattr(request, "num_computed_tokens", 0) + num_new_computed_tokens
        for m in managers:
            m.remove_skipped_blocks(request.request_id, computed)
        held = [m.req_to_blocks.get(request.request_id, []) for m in managers]
        hits = new_computed_blocks.blocks if new_computed_blocks is not None else tuple([] for _ in managers)
        need = [-(-(computed + num_new_tokens) // self.block_size) - len(h) - len(c) for h, c in zip(held, hits)]
        if sum(max(n, 0) for n in need) > self.block_pool.get_num_free_blocks():
            return None
        new = []
        for m, n, h in zip(managers, need, hits):
            blocks = m.req_to_blocks.setdefault(request.request_id, [])
            blocks.extend(h)
            got = self.block_pool.get_new_blocks(max(n, 0))
            blocks.extend(got)
            new.append(got)
        request.num_computed_tokens = computed + num_new_tokens
        return KVCacheBlocks(tuple(new))

    def free(self, request) -> None:
        for m in self.coordinator.single_type_managers:
            self.block_pool.free_blocks(reversed(m.req_to_blocks.pop(request.request_id, [])))

    def pop_blocks_for_free(self, request) -> list:
        out = []
        for m in self.coordinator.single_type_managers:
            out.extend(m.req_to_blocks.pop(request.request_id, []))
        return out


class Scheduler:
    def __init__(self, manager: KVCacheManager):
        self.kv_cache_manager = manager
        self.steps = 0

    def schedule(self):
        self.steps += 1

    def update_from_output(self):
        return {}

    def _preempt_request(self, request, timestamp=0.0):
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0

    def _free_request(self, request, delay_free_blocks=False):
        if not delay_free_blocks:
            self.kv_cache_manager.free(request)

    def finish(self, request, status=RequestStatus.FINISHED_STOPPED, delay_free_blocks=False):
        request.status = status
        self._free_request(request, delay_free_blocks=delay_free_blocks)

    def shutdown(self):
        pass
