"""The scheduler of :mod:`kvtool.simulate.scheduler` over several KV-cache groups (sliding-window, chunked-local and
full-attention layers sharing one pool): vLLM 0.32's ``allocate_slots`` through the coordinator of
:mod:`kvtool.simulate.kv_groups`.

The scheduling policy is the base engine's (running requests first, then admissions FCFS, preemption of the last
running request, ``long_prefill_token_threshold``, ``max_num_seqs``, the token budget); only what the KV cache answers
differs: how many blocks a step needs (after the window has freed what it left behind), the prefix hit, the admission
check (with the sliding / chunked admission cap), and what a release frees.  Every step runs the plain loop (the
decode group and jumps of the base engine assume one full-attention table per request).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvtool.estimate.kinds import MAMBA
from kvtool.events.load import ALLOCATE, APPEND, REUSE
from kvtool.simulate.kv_groups import Coordinator, GroupSpec, Lookup
from kvtool.simulate.scheduler import Engine, EngineConfig, Prompt, StepCost, shared_block_contents

_NO_HIT = None


class GroupedEngine(Engine):
    """One vLLM engine whose model has several KV-cache groups (or one that is not full attention)."""

    def __init__(
        self,
        config: EngineConfig,
        prompts: Sequence[Prompt],
        max_tokens: Sequence[int],
        cost: StepCost | None = None,
        keys=None,
        record_events: bool = False,
    ):
        super().__init__(dataclasses.replace(config, fast_path=False), prompts, max_tokens, cost, keys, record_events)
        self.coord = Coordinator(config.kv_groups, self.b, self.pool, self.keys, config.num_blocks)
        # vLLM's need_mamba_block_aligned_split: a state group in 'align' mode (prefix caching on)
        self.aligned_split = any(s.kind == MAMBA for s in config.kv_groups)
        if self.aligned_split and not config.enable_prefix_caching:
            from kvtool.core.errors import UsageError

            raise UsageError(
                "the serving simulation runs Mamba / linear-attention state groups in prefix caching's 'align' mode "
                "only (vLLM's default with prefix caching); without prefix caching vLLM keeps one state block of "
                "max_model_len tokens per request, which is not simulated",
                where="--no-prefix-caching",
            )
        self.chains: list[list[int]] = [[] for _ in prompts]  # chained block keys, grown as needed
        self._contents: list[list[object] | None] = [None] * len(prompts)
        self.run.group_hit_tokens = [0] * len(config.kv_groups)

    # ----------------------------------------------------------------- keys
    def chain(self, r: int, n: int) -> list[int]:
        """The request's first n chained block keys: shareable prompt blocks by content, the rest its own."""
        chain = self.chains[r]
        if len(chain) < n:
            contents = self._contents[r]
            if contents is None:
                contents = self._contents[r] = shared_block_contents(self.prompts[r], self.b)
            key = self.keys.key
            parent = chain[-1] if chain else 0
            for i in range(len(chain), n):
                parent = key(parent, contents[i] if i < len(contents) else ("own", r, i))
                chain.append(parent)
        return chain

    def nblocks(self, r: int) -> int:
        return self.coord.held(r)

    def fits_alone(self) -> list[bool]:
        """Per request: whether the engine ever takes it (the admission check's blocks, all groups, fit the pool
        alone; the prompt shorter than max_model_len)."""
        usable = self.cfg.num_blocks - 1
        max_len = self.cfg.max_model_len
        specs = self.cfg.kv_groups
        b = self.b
        out = []
        for p, o in zip(self.P, self.out):
            tokens = min(p + o - 1, max_len)
            need = 0
            for spec in specs:
                blocks = -(-tokens // b)
                cap = spec.admission_cap_blocks
                need += blocks if cap is None or cap > blocks else cap
            out.append(need <= usable and p < max_len)
        return out

    # ----------------------------------------------------------------- the cache
    def _lookup(self, r: int, num_tokens: int) -> Lookup | None:  # type: ignore[override]
        if not self.cfg.enable_prefix_caching or num_tokens <= 1:
            return _NO_HIT
        limit = (num_tokens - 1) // self.b
        return self.coord.find_longest_cache_hit(self.chain(r, limit), num_tokens - 1)

    def _cache_full(self, r: int, tokens: int) -> None:
        if self.cfg.enable_prefix_caching:
            self.coord.cache(r, tokens, self.chain(r, tokens // self.b), self.P[r])

    def _release(self, r: int, finished: bool) -> None:
        freed, entries = self.coord.free(r)
        self.used -= freed
        self.entries -= entries
        self.tokens_held -= self.c[r]
        self.head_blocked = False

    def _block_aligned_split(self, r: int, start: int, n: int, junction: int, lpt: int) -> int:
        """vLLM 0.32 ``Scheduler._mamba_block_aligned_split`` (hash block = block, no EAGLE, no prefill checkpoint
        blocks, no shared-prefix checkpoint): a prefill chunk ends on a block boundary (the state is written at chunk
        ends), never past the last cacheable boundary ``(tokens - 1) // block x block`` and stops at the
        block-floored shared-prefix junction; the prompt's last chunk is exempt."""
        num_tokens = self.P[r] + self.g[r]
        prefill_end = max(self.P[r], num_tokens - 1)
        if start >= prefill_end:
            return n
        b = self.b
        last_cache = max((num_tokens - 1) // b * b, 0)
        end = start + n
        if end < prefill_end:
            max_prefill = self.cfg.max_num_batched_tokens
            if lpt > 0:
                max_prefill = min(max_prefill, lpt)
            aligned = end // b * b
            if aligned > start or b <= max_prefill:
                end = aligned
        stops = (
            (start // b + 1) * b if start % b else 0,
            last_cache,
            start + (junction - start) // b * b if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    # ----------------------------------------------------------------- one exact step
    def _schedule_running(self, budget: int, lpt: int, scheduled: list[tuple[int, int]]) -> tuple[int, bool]:
        running, pool, coord = self.running, self.pool, self.coord
        P, g, c = self.P, self.g, self.c
        max_len = self.cfg.max_model_len
        preempted = False
        coord.new_step()  # schedule() opens with kv_cache_manager.new_step_starts()
        split = self.aligned_split
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = P[r] + g[r] - c[r]
            if 0 < lpt < n:
                n = lpt
            if n > budget:
                n = budget
            if n > max_len - c[r] - 1:
                n = max_len - c[r] - 1
            if split and n > 0:
                n = self._block_aligned_split(r, c[r], n, coord.junction.get(r, 0), lpt)
            if n <= 0:
                i += 1
                continue
            freed, dropped = coord.remove_skipped(r, c[r])  # allocate_slots frees what left the window first
            self.used -= freed
            self.entries -= dropped
            need = coord.blocks_to_allocate(r, c[r] + n, None, c[r])
            if need > pool.num_free():
                preempted = True
                if not self._make_room(r, need):
                    break
            taken = coord.allocate(r, c[r] + n)
            self.used += taken
            self.entries += taken
            self._cache_full(r, min(c[r] + n, P[r] + g[r]))
            if self.rows is not None:
                self.rows.append((self.step, APPEND, r, taken, n, 0))
            scheduled.append((r, n))
            budget -= n
            i += 1
        return budget, preempted

    def _schedule_waiting(self, budget: int, lpt: int, scheduled: list[tuple[int, int]]) -> None:
        waiting, running, pool, coord, b = self.waiting, self.running, self.pool, self.coord, self.b
        run = self.run
        max_len = self.cfg.max_model_len
        self.head_blocked = False  # a window may have freed blocks since the last check
        while budget > 0 and waiting:
            if len(running) >= self.cfg.max_num_seqs:
                break
            r = waiting[0]
            total = self.P[r] + self.g[r]
            hit = self._lookup(r, total)
            computed = hit.tokens if hit is not None else 0
            if run.num_preemptions[r] == 0:
                run.num_cached_tokens[r] = computed
            n = total - computed
            if 0 < lpt < n:
                n = lpt
            if n > budget:
                n = budget
            if self.aligned_split:
                n = self._block_aligned_split(r, computed, n, hit.junction if hit is not None else 0, lpt)
                if n == 0:
                    break
            free = pool.num_free()
            need_full = coord.blocks_to_allocate(r, min(total, max_len), hit, computed, cap=True)
            new = coord.blocks_to_allocate(r, computed + n, hit, computed)
            if need_full > free or new > free:
                self.head_blocked = True
                break
            waiting.popleft()
            coord.junction[r] = hit.junction if hit is not None else 0
            if hit is not None:
                evictable = coord.add_hits(r, hit)
            else:
                evictable = 0
            taken = coord.allocate(r, computed + n)
            held = coord.held(r)
            self.used += taken + evictable
            self.entries += held
            self.c[r] = computed
            self.tokens_held += computed
            self._cache_full(r, computed + n)
            running.append(r)
            self.order[r] = self.admissions
            self.admissions += 1
            run.hit_tokens += computed
            run.queried_tokens += total
            if run.num_preemptions[r] == 0 and hit is not None:
                for k, tokens in enumerate(hit.group_tokens):
                    run.group_hit_tokens[k] += tokens  # type: ignore[index]
            if run.admit_step[r] < 0:
                run.admit_step[r] = self.step
                run.admit_s[r] = self.now
            if self.rows is not None:
                if computed:
                    self.rows.append((self.step, REUSE, r, computed // b, computed, 0))
                self.rows.append((self.step, ALLOCATE, r, taken, n, 0))
            scheduled.append((r, n))
            budget -= n


@dataclasses.dataclass(frozen=True)
class ModelGroups:
    """The KV-cache groups one model gets at one block size, as vLLM 0.32 forms them (kvtool.estimate's reading)."""

    specs: tuple[GroupSpec, ...]  # empty: one full-attention group (the base engine, unchanged)
    layers_per_group: int  # vLLM's group_size
    page_bytes_per_layer: int
    method: str  # the estimate's sentence on how the pool is split

    def num_blocks(self, budget_bytes: int) -> int:
        """vLLM's num_gpu_blocks: budget // page // layers per group (one pool shared by every group)."""
        return budget_bytes // self.page_bytes_per_layer // self.layers_per_group

    def describe(self) -> tuple[str, ...]:
        return tuple(s.describe() for s in self.specs) or ("full attention (one group)",)


def model_groups(
    layout, block_size: int, max_model_len: int, in_flight_tokens: int, layer_kinds: Sequence[str] = ()
) -> ModelGroups:
    """The groups of a model's KV layout (:func:`kvtool.estimate.layout.kv_layout`) at ``block_size``, through
    :func:`kvtool.estimate.capacity.vllm_groups`; a kind the serving simulation does not run is refused, never run as
    full attention.  ``in_flight_tokens``: vLLM's max_in_flight_tokens (the sliding / chunked admission cap).
    ``layer_kinds``: the model's layers in order (``ModelSpec.kv_layer_kinds``): vLLM numbers its groups by the
    first layer of each kind (``_get_kv_cache_groups_uniform_page_size`` buckets the layers in their order), which
    decides the order blocks are freed in and looked up."""
    from kvtool.core.errors import UsageError
    from kvtool.estimate.capacity import vllm_groups
    from kvtool.estimate.kinds import CHUNKED, FULL, MAMBA, SLIDING

    groups, group_size, page, method = vllm_groups(layout, block_size)
    if any(g.kind == MAMBA for g in groups):
        import math

        from kvtool.estimate.hybrid_block import attention_block_size

        # the simulated scheduler is vLLM 0.32's, whose only Mamba cache mode with prefix caching is 'align'
        state = max(g.state_bytes_per_request for g in layout.groups if g.kind == MAMBA)
        token = math.ceil(next(g for g in layout.groups if g.kind != MAMBA).bytes_per_token_per_layer)
        aligned, _ = attention_block_size(
            state, token, block_size, mode="align", chunk_tokens=None, vllm_version="0.32.0"
        )
        if aligned != block_size:
            raise UsageError(
                f"vLLM raises a hybrid model's attention block to {aligned} tokens so that one page holds a state "
                f"(Platform._align_hybrid_block_size); the serving simulation was given {block_size}",
                where="--block-size",
                tip=f"pass --block-size {aligned}",
            )
    for g in groups:
        if g.block_size is not None and g.block_size != block_size:
            raise UsageError(
                f"vLLM gives the model's {g.kind} layers blocks of {g.block_size} tokens and its other layers "
                f"{block_size} (page sizes unified, as for Gemma 4); `kvtool simulate --serve` does not simulate "
                "groups of different block sizes",
                where="--model/--config",
            )
    specs = []
    for g in groups:
        kind = FULL if g.kind == "mla" else g.kind
        if kind not in (
            FULL,
            SLIDING,
            CHUNKED,
            MAMBA,
        ):  # pragma: no cover - every kind the estimate forms is named above
            raise UsageError(f"layer kind {g.kind!r} is not simulated by `kvtool simulate --serve`", where="--model")
        cap = g.blocks_for(max_model_len, block_size, in_flight_tokens) if kind in (SLIDING, CHUNKED) else None
        if kind == MAMBA:
            cap = 1  # the admission check's state blocks: the physical block cap of get_num_blocks_to_allocate
        specs.append(GroupSpec(kind, g.num_layers, g.window_tokens, cap))
    first = {kind: i for i, kind in reversed(list(enumerate(layer_kinds)))}
    specs.sort(key=lambda spec: first.get(spec.kind, len(first)))  # stable: a kind's own groups keep their order
    if len(specs) == 1 and specs[0].kind == FULL:
        specs = []
    return ModelGroups(tuple(specs), group_size, page, method)
