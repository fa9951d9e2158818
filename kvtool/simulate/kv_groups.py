"""vLLM 0.32's KV-cache groups in the serving simulation: one block pool shared by every group of a model.

Modelled on vllm 0.32.0 ``vllm/v1/core/single_type_kv_cache_manager.py`` (``FullAttentionManager``,
``SlidingWindowManager``, ``ChunkedLocalAttentionManager``), ``kv_cache_coordinator.py`` (``UnitaryKVCacheCoordinator``,
``HybridKVCacheCoordinator``) and ``kv_cache_manager.py`` (``allocate_slots``, ``get_computed_blocks``).  The groups
themselves (which layers, how many groups, the pool's blocks) come from :func:`kvtool.estimate.capacity.vllm_groups`,
the estimate's own reading of ``kv_cache_utils.py``.

Each group keeps a block table per request; every block is a real block of the shared
:class:`~kvtool.simulate.prefix_cache.BlockPool` (an id, a reference count, a key once cached), and a table entry 0 is
vLLM's null block (a skipped block a sliding window freed, or a hit's padding).  What differs between groups is on the
group's type:

- **skipped tokens** (``get_num_skipped_tokens``): none for full attention; ``max(0, c - window + 1)`` for a sliding
  window; ``c // chunk x chunk`` for chunked local attention.  ``remove_skipped`` frees the blocks wholly before them
  (last first, stopping at a null block) before every allocation, as ``allocate_slots`` does.
- **blocks to allocate** (``get_num_blocks_to_allocate``): a running request needs ``cdiv(tokens, block) - len(table)``;
  a new one ``cdiv(tokens, block) - max(skipped blocks, hit blocks)`` plus the hit blocks that sit in the free queue;
  the admission check (``full_sequence_must_fit``) caps a sliding / chunked group's blocks at its
  ``max_admission_blocks_per_request`` (``SlidingWindowSpec``: ``cdiv(min(window - 1 + in_flight, max_model_len),
  block) + 1``; chunked: ``cdiv(min(chunk + in_flight, max_model_len), block)``).
- **the hit rule** (``find_longest_cache_hit``): full attention takes the leading cached blocks; a sliding window
  scans from the right for ``cdiv(window - 1, block)`` consecutive cached blocks (its blocks before them are null), or
  else the leading run; chunked local attention counts the blocks before the current chunk as hit (null) and takes the
  cached blocks of the chunk from the left.  The hybrid coordinator looks up full attention first and lets every
  other kind shorten the hit until all agree (a fixed point; one pass for one full and one other kind); full groups
  are then cut to the agreed length.
- **which blocks are cached** (``reachable_block_mask`` with ``prefix_cache_retention_interval`` 0, vLLM 0.32's
  default): full and chunked groups cache every full block; a sliding group only the ``cdiv(window - 1, block)``
  blocks that end at a replay boundary: the prompt's last token rounded down to a block (``replay_boundaries``), and a
  shared-prefix junction (``shared_prefix_boundary``: where a full group's hit went further than the agreed hit).
  Its other blocks never get a key (they are freed to the front of the free queue).

Block keys are per group (``make_block_hash_with_group_id``): the chained key of the request's block i, tagged with
the group.  Groups of one spec are looked up together: a block index hits only if each of them has it.
Mamba / linear-attention state groups run in align mode (MambaKind). Not modelled here (refused before a run): state
groups without prefix caching, groups whose block size differs
from the pool's (Gemma 4), EAGLE, KV connectors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvtool.estimate.kinds import CHUNKED, FULL, MAMBA, SLIDING
from kvtool.simulate.prefix_cache import BlockKeys, BlockPool

NULL = 0  # vLLM's null block in a table (BlockPool ids start at 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group as the simulation runs it."""

    kind: str  # FULL ("mla" runs as full attention), SLIDING, CHUNKED or MAMBA (a state group, 'align' mode)
    num_layers: int
    window_tokens: int | None  # the sliding window or the attention chunk
    admission_cap_blocks: int | None  # max_admission_blocks_per_request (sliding / chunked); None: no cap

    @property
    def spec_key(self) -> tuple:
        """Groups with equal keys are one spec group (looked up jointly, vLLM's ``SpecGroup``)."""
        return (self.kind, self.window_tokens)

    def describe(self) -> str:
        if self.kind == SLIDING:
            return f"sliding window {self.window_tokens} ({self.num_layers} layers)"
        if self.kind == CHUNKED:
            return f"chunked local {self.window_tokens} ({self.num_layers} layers)"
        if self.kind == MAMBA:
            return f"Mamba / linear-attention state ({self.num_layers} layers)"
        return f"full attention ({self.num_layers} layers)"


class GroupKind:
    """The behaviour of one kind of group (vLLM's SingleTypeKVCacheManager subclasses)."""

    def __init__(self, spec: GroupSpec, block_size: int):
        self.spec = spec
        self.b = block_size

    def skipped_tokens(self, computed: int) -> int:
        return 0

    def blocks_needed(
        self,
        table: Sequence[int],
        running: bool,
        num_tokens: int,
        hits: Sequence[int],
        total_computed: int,
        cap: bool,
        ref: dict[int, int],
        keys: dict[int, int],
        num_blocks: int,
    ) -> int:
        """get_num_blocks_to_allocate: new blocks plus the hit blocks that sit in the free queue."""
        required = _cdiv(num_tokens, self.b)
        spec_cap = self.spec.admission_cap_blocks
        if cap and spec_cap is not None and spec_cap < required:
            required = spec_cap
        if running:
            return max(required - len(table), 0)
        skipped = self.skipped_tokens(total_computed) // self.b
        total = max(required - max(skipped, len(hits) + len(table)), 0)
        skip_new = max(0, skipped - len(table))
        return total + sum(1 for blk in hits[skip_new:] if blk != NULL and ref[blk] == 0)

    def remove_skipped(self, r: int, table: list[int], computed: int) -> list[list[int]]:
        """remove_skipped_blocks: the table entries nulled, as vLLM's ``free_blocks`` calls (each list in the order
        vLLM frees it: last block first); blocks wholly before the skipped tokens, stopping at a null block."""
        skipped = self.skipped_tokens(computed)
        if skipped <= 0 or not table:
            return []
        freed: list[int] = []
        for i in range(min(skipped // self.b, len(table)) - 1, -1, -1):
            if table[i] == NULL:
                break
            freed.append(table[i])
            table[i] = NULL
        return [freed] if freed else []

    def allocate(self, r: int, table: list[int], num_tokens: int) -> int:
        """allocate_new_blocks: how many new blocks the table takes (appended by the caller)."""
        return max(_cdiv(num_tokens, self.b) - len(table), 0)

    def new_step(self) -> None:
        """new_step_starts."""

    def cached(self, key: int) -> None:
        """A block of this group got ``key`` in this step's cache_blocks."""

    def forget(self, r: int) -> None:
        """pop_blocks_for_free: the request's own state goes with its blocks."""

    def cache_mask(self, lo: int, hi: int, prompt_tokens: int, junction: int) -> list[bool] | None:
        """Which of blocks [lo, hi) get a key (None: all)."""
        return None

    def tail_block(self, table: Sequence[int], num_tokens: int, prompt_tokens: int) -> int:
        """The index of a block this cache_blocks call registers again although it was cached before (-1: none)."""
        return -1

    def longest_hit(self, cached: Sequence[list[int] | None], max_length: int) -> list[list[int]]:
        """The hit: per block index, the group's blocks (NULL where skipped); ``cached[i]`` is what each group of
        the spec group holds under block i's key (None: a miss in one of them)."""
        out: list[list[int]] = []
        for i in range(max_length // self.b):
            blocks = cached[i]
            if blocks is None:
                break
            out.append(blocks)
        return out


class FullKind(GroupKind):
    pass


class SlidingKind(GroupKind):
    def __init__(self, spec: GroupSpec, block_size: int):
        super().__init__(spec, block_size)
        self.window = spec.window_tokens or 0
        self.contiguous = _cdiv(self.window - 1, block_size)  # _contiguous_blocks_for_hit (no EAGLE)

    def skipped_tokens(self, computed: int) -> int:
        return max(0, computed - self.window + 1)

    def cache_mask(self, lo: int, hi: int, prompt_tokens: int, junction: int) -> list[bool] | None:
        """reachable_block_mask, retention interval 0, alignment = the block: the tails ending at the replay
        boundary (prompt - 1) and at the shared-prefix junction."""
        need, b = self.contiguous, self.b
        mask = [False] * (hi - lo)
        for boundary in (prompt_tokens - 1, junction) if junction else (prompt_tokens - 1,):
            end = boundary // b
            for j in range(max(lo, end - need), min(hi, end)):
                mask[j - lo] = True
        return mask

    def longest_hit(self, cached: Sequence[list[int] | None], max_length: int) -> list[list[int]]:
        n = max_length // self.b
        width = len(next((c for c in cached if c is not None), [NULL])) if n else 1
        null = [NULL] * width
        computed: list[list[int]] = [null] * n
        run = 0
        for i in range(n - 1, -1, -1):
            blocks = cached[i]
            if blocks is not None:
                computed[i] = blocks
                run += 1
                if run >= self.contiguous:
                    return computed[: i + run]
            else:
                run = 0
        return computed[:run]


class ChunkedKind(GroupKind):
    def __init__(self, spec: GroupSpec, block_size: int):
        super().__init__(spec, block_size)
        self.chunk = spec.window_tokens or 1

    def skipped_tokens(self, computed: int) -> int:
        return computed // self.chunk * self.chunk

    def longest_hit(self, cached: Sequence[list[int] | None], max_length: int) -> list[list[int]]:
        n = max_length // self.b
        start = (max_length // self.chunk * self.chunk) // self.b if max_length > 0 else 0
        width = len(next((c for c in cached if c is not None), [NULL]))
        out: list[list[int]] = [[NULL] * width for _ in range(start)]
        for i in range(start, n):
            blocks = cached[i]
            if blocks is None:
                break
            out.append(blocks)
        return out


class MambaKind(GroupKind):
    """A Mamba / linear-attention state group in prefix caching's 'align' mode (vLLM 0.32 ``MambaManager`` with
    ``mamba_cache_mode == "align"``), for the case the CPU and GPU runs take by default: the attention and state
    blocks of one size (hash block = block = cache-hit alignment, so no sub-block partial hits and no copy-on-write),
    no speculative blocks, no prefill checkpoint blocks (Gated DeltaNet's ``MambaSpec`` has
    ``num_prefill_checkpoint_blocks`` 0), ``prefix_cache_retention_interval`` 0.

    Block i of a request's table holds the state after (i + 1) x block tokens; the table is null except for the
    current state block and, until the next allocation retires it, the previous one (``last_state_block_idx``).
    """

    def __init__(self, spec: GroupSpec, block_size: int):
        super().__init__(spec, block_size)
        self.allocated: set[int] = set()  # _allocated_block_reqs
        self.last_state: dict[int, int] = {}  # last_state_block_idx
        self.retired: dict[int, int] = {}  # _num_retired_blocks
        self.this_step: set[int] = set()  # cached_blocks_this_step (keys)

    def skipped_tokens(self, computed: int) -> int:
        return computed - 1  # get_num_skipped_tokens: only the last computed token's state is needed

    def cache_mask(self, lo: int, hi: int, prompt_tokens: int, junction: int) -> list[bool] | None:
        """reachable_block_mask, retention interval 0: only the single state block ending at each reachable
        boundary (the replay boundary ``prompt - 1`` and the shared-prefix junction), floored to a block."""
        mask = [False] * (hi - lo)
        for boundary in (prompt_tokens - 1, junction) if junction else (prompt_tokens - 1,):
            i = boundary // self.b - 1
            if lo <= i < hi:
                mask[i - lo] = True
        return mask

    def tail_block(self, table: Sequence[int], num_tokens: int, prompt_tokens: int) -> int:
        """``MambaManager._cache_partial_tail_block``, align mode, no checkpoint, hash block = block: every
        cache_blocks call whose cacheable tokens (``_align_cacheable``: floored to a block) are the prompt's last
        cacheable boundary ``(prompt - 1) // block x block`` (``get_mamba_prefill_checkpoint_position``) registers the
        state block there again (``cache_partial_block``) and adds its key to ``cached_blocks_this_step``, as long as
        the request's table still holds that block (not yet nulled by ``remove_skipped_blocks``).  So while the
        request that computed (or hit) a prompt's last state sits at that boundary (its prompt's last, partial chunk
        runs in this step), a request whose hit ends on that state is not admitted in this step either.  The hits of
        identical prefixes thus stagger one step behind one another."""
        boundary = (prompt_tokens - 1) // self.b * self.b
        if num_tokens <= 0 or num_tokens != boundary:
            return -1
        i = num_tokens // self.b - 1
        return i if i < len(table) and table[i] != NULL else -1

    def longest_hit(self, cached: Sequence[list[int] | None], max_length: int) -> list[list[int]]:
        """find_longest_cache_hit: the rightmost cached state at or below max_length, nulls before it."""
        for i in range(max_length // self.b - 1, -1, -1):
            blocks = cached[i]
            if blocks is not None:
                return [[NULL] * len(blocks)] * i + [blocks]
        return []

    def blocks_needed(
        self,
        table: Sequence[int],
        running: bool,
        num_tokens: int,
        hits: Sequence[int],
        total_computed: int,
        cap: bool,
        ref: dict[int, int],
        keys: dict[int, int],
        num_blocks: int,
    ) -> int:
        """get_num_blocks_to_allocate, align mode: a state computed by another request in this very step cannot be
        used before the next (num_gpu_blocks + 1, so the admission fails); otherwise at most one new block (the
        physical block cap: 1, no partial hit, no checkpoint), plus the hit block if it sits in the free queue.
        Not clamped at 0 when the table is longer than needed, as in vLLM."""
        if hits and keys.get(hits[-1], -1) in self.this_step:
            return num_blocks + 1
        new = _cdiv(num_tokens, self.b) - len(hits) - len(table)
        if new > 0:
            new = 1
        return new + sum(1 for blk in hits if blk != NULL and ref[blk] == 0)

    def remove_skipped(self, r: int, table: list[int], computed: int) -> list[list[int]]:
        """remove_skipped_blocks, align mode: the blocks before the state (skipping the null gaps, from the first not
        yet retired), then the previous state block once the current one is past it."""
        calls: list[list[int]] = []
        skipped = self.skipped_tokens(computed)
        if skipped > 0 and table:
            last = min(skipped // self.b, len(table))
            first = self.retired.get(r, 0)
            if first < last:
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if table[i] != NULL:
                        freed.append(table[i])
                        table[i] = NULL
                if freed:
                    calls.append(freed)
                self.retired[r] = last
        idx = self.last_state.get(r)
        if idx is not None and idx < _cdiv(computed, self.b) - 1 and table[idx] != NULL:
            calls.append([table[idx]])
            table[idx] = NULL
        return calls

    def allocate(self, r: int, table: list[int], num_tokens: int) -> int:
        """allocate_new_blocks, align mode: the table grows to cdiv(tokens, block) with nulls and one new block at its
        end; the block before (the previous state, or a hit's state) is remembered to be retired."""
        required = _cdiv(num_tokens, self.b)
        if required <= len(table):
            self.allocated.add(r)
            return 0
        prev = len(table)
        if r in self.allocated or prev > 0:
            self.last_state[r] = prev - 1
        if prev < required - 1:
            table.extend([NULL] * (required - 1 - prev))
        self.allocated.add(r)
        return required - len(table)

    def new_step(self) -> None:
        self.this_step.clear()

    def cached(self, key: int) -> None:
        self.this_step.add(key)

    def forget(self, r: int) -> None:
        self.allocated.discard(r)
        self.last_state.pop(r, None)
        self.retired.pop(r, None)


_KINDS = {FULL: FullKind, SLIDING: SlidingKind, CHUNKED: ChunkedKind, MAMBA: MambaKind}


def kind_of(spec: GroupSpec, block_size: int) -> GroupKind:
    """The behaviour of a group of this spec (a fresh one: no request state)."""
    return _KINDS[spec.kind](spec, block_size)


@dataclasses.dataclass
class Lookup:
    """get_computed_blocks' answer for one request."""

    blocks: list[list[int]]  # per group: the hit's blocks (NULL where skipped)
    tokens: int  # the agreed hit
    junction: int  # shared_prefix_boundary (0: none)
    group_tokens: list[int]  # per group: the longest hit that group alone found (before agreement)


class Coordinator:
    """The KV-cache coordinator of one engine: every group's block tables over one shared pool."""

    def __init__(
        self, specs: Sequence[GroupSpec], block_size: int, pool: BlockPool, keys: BlockKeys, num_blocks: int = 0
    ):
        self.specs = tuple(specs)
        self.num_blocks = num_blocks  # the pool's blocks (a state group's refusal answers num_blocks + 1)
        self.b = block_size
        self.pool = pool
        self.keys = keys
        self.kinds = [kind_of(s, block_size) for s in self.specs]
        n = len(self.specs)
        self.tables: list[dict[int, list[int]]] = [{} for _ in range(n)]
        self.ncached: list[dict[int, int]] = [{} for _ in range(n)]  # running requests only (num_cached_block)
        self.junction: dict[int, int] = {}  # request -> shared_prefix_boundary
        # spec groups, full attention first (verify_and_split_kv_cache_groups)
        order: dict[tuple, list[int]] = {}
        for g, s in enumerate(self.specs):
            order.setdefault(s.spec_key, []).append(g)
        self.spec_groups = sorted(order.values(), key=lambda ids: self.specs[ids[0]].kind != FULL)
        self.unitary = n == 1
        self._tags = [("group", g) for g in range(n)]

    # ------------------------------------------------------------------ keys
    def group_key(self, chain_key: int, g: int) -> int:
        return self.keys.key(chain_key, self._tags[g])

    # ------------------------------------------------------------------ lookups
    def _cached(self, chain: Sequence[int], group_ids: list[int], n: int) -> list[list[int] | None]:
        lookup = self.pool.lookup
        out: list[list[int] | None] = []
        for i in range(n):
            row: list[int] | None = []
            for g in group_ids:
                blk = lookup(self.group_key(chain[i], g))
                if blk < 0:
                    row = None
                    break
                row.append(blk)  # type: ignore[union-attr]
            out.append(row)
        return out

    def find_longest_cache_hit(self, chain: Sequence[int], max_length: int) -> Lookup:
        """``chain``: the request's chained block keys (at least max_length // block of them)."""
        n_groups = len(self.specs)
        b = self.b
        max_length = min(max_length, len(chain) * b)
        cached = {id(ids): self._cached(chain, ids, max_length // b) for ids in self.spec_groups}
        hits: list[list[int] | None] = [None] * n_groups
        own = [0] * n_groups
        hit_length = max_length
        longest = 0
        simple = len(self.spec_groups) == 2 and self.specs[self.spec_groups[0][0]].kind == FULL
        full_len: dict[int, int] = {}
        while True:
            curr = hit_length
            for ids in self.spec_groups:
                first = ids[0]
                kind = self.kinds[first]
                if self.specs[first].kind == FULL and first in full_len:
                    curr = min(curr, full_len[first])
                    continue
                found = kind.longest_hit(cached[id(ids)], curr)
                length = len(found) * b
                if self.specs[first].kind == FULL:
                    full_len[first] = length
                for j, g in enumerate(ids):
                    hits[g] = [row[j] for row in found]
                    if not own[g]:
                        own[g] = length
                curr = length
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple or self.unitary:
                break
        final = curr if self.unitary else hit_length
        if self.unitary:
            return Lookup([hits[0] or []], final, 0, own)
        for ids in self.spec_groups:
            if self.specs[ids[0]].kind == FULL:
                for g in ids:
                    del hits[g][_cdiv(final, b) :]  # type: ignore[index,union-attr]
        uncached = longest - final
        return Lookup([h or [] for h in hits], final, final + uncached if uncached else 0, own)

    # ------------------------------------------------------------------ allocation
    def blocks_to_allocate(
        self, r: int, num_tokens: int, hit: Lookup | None, total_computed: int, cap: bool = False
    ) -> int:
        """get_num_blocks_to_allocate summed over the groups (hit blocks in the free queue included)."""
        ref, keys, n = self.pool.ref, self.pool.key_of, self.num_blocks
        total = 0
        for g, kind in enumerate(self.kinds):
            table = self.tables[g].get(r, ())
            hits = hit.blocks[g] if hit is not None else []
            total += kind.blocks_needed(
                table, r in self.ncached[g], num_tokens, hits, total_computed, cap, ref, keys, n
            )
        return total

    def remove_skipped(self, r: int, computed: int) -> tuple[int, int]:
        """remove_skipped_blocks in every group; returns (blocks that no request references any more, table entries
        nulled)."""
        freed_total = dropped = 0
        for g, kind in enumerate(self.kinds):
            table = self.tables[g].get(r)
            if not table:
                continue
            for freed in kind.remove_skipped(r, table, computed):
                dropped += len(freed)
                # BlockPool.free releases its list last first: reversed, vLLM's order
                freed_total += self.pool.free(r, freed[::-1], 0, 0, 0, False)
        return freed_total, dropped

    def new_step(self) -> None:
        for kind in self.kinds:
            kind.new_step()

    def add_hits(self, r: int, hit: Lookup) -> int:
        """add_local_computed_blocks: the hit's blocks inside the window are touched, the rest padded with nulls.
        Returns how many touched blocks were in the free queue."""
        ref = self.pool.ref
        evictable = 0
        for g, kind in enumerate(self.kinds):
            blocks = hit.blocks[g]
            skipped = max(kind.skipped_tokens(hit.tokens) // self.b, 0)  # a state group skips -1 tokens of none
            kept = [blk for blk in blocks[skipped:]]
            real = [blk for blk in kept if blk != NULL]
            evictable += sum(1 for blk in real if ref[blk] == 0)
            if real:
                self.pool.touch(real)
            self.tables[g][r] = [NULL] * skipped + kept
            self.ncached[g][r] = skipped + len(kept)
        return evictable

    def allocate(self, r: int, num_tokens: int) -> int:
        """allocate_new_blocks in every group; returns the blocks taken."""
        taken = 0
        for g, kind in enumerate(self.kinds):
            table = self.tables[g].setdefault(r, [])
            self.ncached[g].setdefault(r, 0)
            n = kind.allocate(r, table, num_tokens)
            if n > 0:
                self.pool.new_ids(n, table)
                taken += n
        return taken

    def cache(self, r: int, num_tokens: int, chain: Sequence[int], prompt_tokens: int) -> None:
        """cache_blocks: the full blocks up to num_tokens get their group's key where the group's mask keeps them."""
        full = num_tokens // self.b
        junction = self.junction.get(r, 0)
        for g, kind in enumerate(self.kinds):
            table = self.tables[g][r]
            tail = kind.tail_block(table, full * self.b, prompt_tokens)
            if tail >= 0:
                key = self.group_key(chain[tail], g)
                if table[tail] not in self.pool.key_of:
                    self.pool.set_key(table[tail], key)
                kind.cached(key)
            done = self.ncached[g].get(r, 0)
            if done >= full:
                continue
            mask = kind.cache_mask(done, full, prompt_tokens, junction)
            for i in range(done, full):
                blk = table[i]
                if blk == NULL or (mask is not None and not mask[i - done]):
                    continue
                if blk not in self.pool.key_of:
                    self.pool.set_key(blk, self.group_key(chain[i], g))
                kind.cached(self.pool.key_of.get(blk, -1))
            self.ncached[g][r] = full

    def free(self, r: int) -> tuple[int, int]:
        """A request's blocks back, group by group, each table last first.  Returns (blocks no longer referenced,
        table entries dropped)."""
        freed = entries = 0
        for g, kind in enumerate(self.kinds):
            table = self.tables[g].pop(r, None)
            self.ncached[g].pop(r, None)
            kind.forget(r)
            if table:
                real = [blk for blk in table if blk != NULL]
                entries += len(real)
                freed += self.pool.free(r, real, 0, 0, 0, False)
        self.junction.pop(r, None)
        return freed, entries

    def held(self, r: int) -> int:
        """Non-null blocks the request holds, all groups."""
        return sum(sum(1 for blk in t.get(r, ()) if blk != NULL) for t in self.tables)

    def group_blocks(self) -> list[int]:
        """Per group: distinct non-null blocks held by requests."""
        return [len({blk for t in tables.values() for blk in t if blk != NULL}) for tables in self.tables]
