"""Probe planning for the prefix-cache isolation check: which requests to send, in which order, expecting what.

The unit is a *trial*: three requests on fresh random content, sent one after the other.

1. ``prime``   partition A, prompt P (at least four full blocks plus a partial one): expected cached tokens 0;
2. ``control`` partition A again, prompt P (exact variant) or P's first blocks plus a fresh tail (prefix
   variant): must reuse what the prime stored; expected cached tokens = the shared full blocks;
3. ``victim``  partition B, the same kind of prompt: must not reuse anything of A; expected cached tokens 0.

The control runs right before the victim, so a victim miss counts only when the control proved, a moment
earlier, that the cache was on and still held the prime's blocks.  Each ordered partition pair runs in both
orders (A then B, B then A), in both variants, ``repeats`` times, each time on new random content.

Behind a router over several engines, ``repeat_primes`` sends each prime that many times in a row (the copies are
the trial's ``REPRIME`` probes, after any fillers) so that every engine the router may pick holds it before the
control and the victim run (kvtool.vllm.isolation.routing).

Embeddings are the one dimension where the partition *is* the content: the victim sends other embedding rows
at the same positions; in the prefix variant its first blocks carry the prime's rows, so exactly those
blocks are expected back and anything beyond them is a leak.

Prompts are described by per-block seeds (see :mod:`kvtool.vllm.isolation.client` for how a seed becomes
token ids or embedding rows), so a recorded plan stays small and the requests can be rebuilt from it.
"""

from __future__ import annotations

import dataclasses
import random

DIMENSIONS = (
    "salt", "adapter", "adapter-version", "embeddings", "cross",
    "salt-variant", "length", "salt-adapter", "salt-embeds", "eviction", "multimodal", "tier",
)  # fmt: skip
DIMENSION_TITLES = {
    "salt": "Tenants (cache_salt)",
    "adapter": "LoRA adapters",
    "adapter-version": "Adapter versions",
    "embeddings": "Prompt embeddings",
    "cross": "Cross (LoRA name = salt)",
    "salt-variant": "Salt variants",
    "length": "Prompt lengths",
    "salt-adapter": "Salt x adapter",
    "salt-embeds": "Salt x embeddings",
    "eviction": "After evictions",
    "multimodal": "Salt x multimodal",
    "tier": "Second tier (KV connector)",
}
ROLES = ("prime", "control", "victim")
FILLER = "filler"  # role of the requests that push the prime's pool into evicting (eviction dimension)
REPRIME = "reprime"  # role of the copies of a prime sent before it (--repeat-primes; kvtool.vllm.isolation.routing)
VARIANTS = ("exact", "prefix")
MIN_FULL_BLOCKS = 4  # the issue: at least four full blocks plus a partial one
PREFIX_BLOCKS = 2  # blocks the prefix variant shares between prime, control and victim


@dataclasses.dataclass(frozen=True)
class Partition:
    """One side of an isolation pair: what a request carries that must keep its KV blocks apart."""

    label: str  # short and unique within the run: "salt:a", "base", "adapter:iso-a", "embeds"
    model: str | None = None  # the served model or LoRA name to send as "model"; None = the base model
    cache_salt: str | None = None  # the request body's cache_salt
    api_key: str | None = None  # a tenant's API key (gateways that derive the salt from credentials)
    adapter_path: str | None = None  # adapter-version: the path the adapter name must point at when probed
    image: int | None = None  # multimodal: the seed of the image every request carries (isolation.multimodal)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One request of the plan."""

    index: int  # position in the run (requests are sent strictly in this order)
    dimension: str
    trial: str  # the trial id, e.g. "salt/0" (three probes share it)
    role: str  # prime | control | victim
    partition: Partition
    kind: str  # "tokens", "embeds" or "image" (a chat request with the partition's image, isolation.multimodal)
    block_seeds: tuple[int, ...]  # one seed per full block, then one for the partial tail
    expected_cached_tokens: int  # what a correct engine reports for this request
    session_id: str  # sent as session_id so its KV events can be told apart


@dataclasses.dataclass(frozen=True)
class Trial:
    """prime, control and victim of one ordered partition pair, variant and repeat."""

    id: str
    dimension: str
    variant: str  # exact | prefix
    first: str  # partition label of prime and control
    second: str  # partition label of the victim
    repeat: int
    probes: tuple[Probe, Probe, Probe]
    full_blocks: int = MIN_FULL_BLOCKS  # full blocks of the prime (the search varies it; older records: 4)
    case: str = ""  # what the pair varies, e.g. "case" or "nfc-nfd" for salt variants; "" for the plain pairs
    stage: str = "search"  # search | minimize (a follow-up that shrinks the first leaking case)
    fillers: tuple[Probe, ...] = ()  # sent before the prime: fresh prompts that make the pool evict
    # tier dimension: the fillers go between the prime and the rest, and the victim runs before the control, so both
    # can only be served from a second tier (kvtool.vllm.isolation.tier); see send_order
    fillers_after_prime: bool = False


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    block_size: int  # the engine's KV block size in tokens
    full_blocks: int = MIN_FULL_BLOCKS
    repeats: int = 2
    seed: int | None = None  # None: fresh content every run (the default; a fixed seed is for tests)
    repeat_primes: int = 1  # each prime sent this many times (behind a router: once per engine it may pick)


@dataclasses.dataclass(frozen=True)
class Plan:
    block_size: int
    full_blocks: int
    partial_tokens: int  # tokens of the last, partial block
    run_id: str  # random hex that prefixes session ids and generated salts
    trials: tuple[Trial, ...]
    budget_requests: int | None = None  # the --budget the plan was cut to (None: no bound)
    not_covered: tuple[str, ...] = ()  # what the plan would have sent past the budget, per dimension

    @property
    def probes(self) -> tuple[Probe, ...]:
        return tuple(p for t in self.trials for p in send_order(t))

    @property
    def prompt_tokens(self) -> int:
        return self.full_blocks * self.block_size + self.partial_tokens


@dataclasses.dataclass(frozen=True)
class DimensionPartitions:
    """The partitions a dimension compares, as unordered pairs (each runs in both orders)."""

    dimension: str
    pairs: tuple[tuple[Partition, Partition], ...]
    kind: str = "tokens"
    variants: tuple[str, ...] = VARIANTS
    lengths: tuple[int, ...] = (MIN_FULL_BLOCKS,)  # full blocks of each trial's prime
    cases: tuple[str, ...] = ()  # per pair: what it varies ("" for all when empty)
    same_content: bool = False  # embeddings: the victim sends the prime's rows (the partition is not the content)
    filler_blocks: int = 0  # eviction: blocks of fresh filler sent before each prime (more than the pool holds)
    filler_prompt_blocks: int = 0  # full blocks per filler request
    one_order: bool = False  # only (a, b), not also (b, a): minimization steps
    fillers_after_prime: bool = False  # tier: prime, fillers, victim, control (Trial.fillers_after_prime)


class _Seeds:
    """Fresh 63-bit seeds, one per block; never the same twice within a run."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[int] = set()

    def take(self, n: int) -> tuple[int, ...]:
        out: list[int] = []
        while len(out) < n:
            seed = self.rng.getrandbits(63)
            if seed not in self.used:
                self.used.add(seed)
                out.append(seed)
        return tuple(out)


def _trial_prompts(
    seeds: _Seeds, variant: str, kind: str, full_blocks: int, same_content: bool = False
) -> tuple[tuple[int, ...], ...]:
    """Block seeds of prime, control and victim (each ``full_blocks`` + 1 long)."""
    n = full_blocks + 1
    prime = seeds.take(n)
    if variant == "exact":
        victim = prime if (kind != "embeds" or same_content) else seeds.take(n)  # images: the partition sets it
        return prime, prime, victim
    head = prime[: prefix_blocks(full_blocks)]
    tail = n - len(head)
    return prime, head + seeds.take(tail), head + seeds.take(tail)


def prefix_blocks(full_blocks: int) -> int:
    """Blocks the prefix variant shares: two, or one for a prime of two full blocks or fewer."""
    return min(PREFIX_BLOCKS, max(1, full_blocks - 1))


def _expected(variant: str, kind: str, role: str, full_blocks: int, block_size: int, same_content: bool = False) -> int:
    """Cached tokens a correct engine reports (vLLM caches full blocks only and always recomputes the last token,
    so a prompt of ``full_blocks`` full blocks plus a partial one can reuse at most ``full_blocks`` blocks)."""
    shared_blocks = full_blocks if variant == "exact" else prefix_blocks(full_blocks)
    if role == "prime":
        return 0
    if role == "control":
        return shared_blocks * block_size
    # victim: nothing for another partition; embeddings share exactly the blocks whose rows are equal
    return (
        prefix_blocks(full_blocks) * block_size
        if (kind == "embeds" and variant == "prefix" and not same_content)
        else 0
    )


def send_order(trial: Trial) -> tuple[Probe, ...]:
    """The trial's requests in the order they are sent (their indices ascend in this order): fillers, prime, control,
    victim; or, for a second-tier trial, prime, fillers, victim, control."""
    prime, control, victim = trial.probes
    if trial.fillers_after_prime:
        return (prime, *trial.fillers, victim, control)
    return (*trial.fillers, prime, control, victim)


def trial_requests(trial: Trial) -> int:
    return len(trial.fillers) + len(trial.probes)


def plan_trials(
    partitions: tuple[DimensionPartitions, ...],
    options: PlanOptions,
    run_id: str,
    *,
    budget_requests: int | None = None,
    stage: str = "search",
    first_index: int = 0,
) -> Plan:
    """Every trial, in the order they run.  Coverage first: the first repeat of every dimension (each pair, both
    orders, each variant and length) before any second repeat, so a ``budget_requests`` cut drops repeats and the
    last dimensions' tails first; what the budget left out is listed in ``Plan.not_covered``."""
    rng = random.Random(options.seed)
    seeds = _Seeds(rng)
    partial = max(1, options.block_size // 2)
    shapes: list[tuple[DimensionPartitions, int, Partition, Partition, str, int, str]] = []
    for repeat in range(options.repeats):
        for group in partitions:
            cases = group.cases or ("",) * len(group.pairs)
            for length in group.lengths:
                for (a, b), case in zip(group.pairs, cases):
                    for first, second in ((a, b),) if group.one_order else ((a, b), (b, a)):
                        for variant in group.variants:
                            shapes.append((group, repeat, first, second, variant, length, case))
    # trials that fill the pool run last, after every repeat: whatever they evict cannot disturb the others
    shapes.sort(key=lambda shape: shape[0].filler_blocks > 0)
    trials: list[Trial] = []
    dropped: dict[str, int] = {}
    numbers: dict[str, int] = {}
    index, sent = first_index, 0
    for group, repeat, first, second, variant, length, case in shapes:
        n_fill = -(-group.filler_blocks // group.filler_prompt_blocks) if group.filler_blocks else 0
        cost = 3 + n_fill + options.repeat_primes - 1
        if budget_requests is not None and sent + cost > budget_requests:
            dropped[group.dimension] = dropped.get(group.dimension, 0) + 1
            continue
        sent += cost
        number = numbers.get(group.dimension, 0)
        numbers[group.dimension] = number + 1
        trial_id = (
            f"{group.dimension}/{number}" if stage == "search" else f"{group.dimension}/{stage}{first_index}-{number}"
        )
        fill_seeds = [seeds.take(group.filler_prompt_blocks + 1) for _ in range(n_fill)]
        prompts = _trial_prompts(seeds, variant, group.kind, length, group.same_content)
        # indices in send order (send_order): fillers, the prime's copies (--repeat-primes), prime, control, victim;
        # a second-tier trial sends prime, fillers, victim, control (its prime is not repeated)
        n_copies = 0 if group.fillers_after_prime else options.repeat_primes - 1
        slots = ("prime", *[FILLER] * n_fill, "victim", "control") if group.fillers_after_prime else (
            *[FILLER] * n_fill, *[REPRIME] * n_copies, "prime", "control", "victim")  # fmt: skip
        at = {role: index + slots.index(role) for role in ROLES}
        fill_at = [index + i for i, role in enumerate(slots) if role == FILLER]
        copy_at = [index + i for i, role in enumerate(slots) if role == REPRIME]
        index += len(slots)
        fillers = [Probe(i, group.dimension, trial_id, FILLER, Partition("filler"), "tokens", fs, -1,
                         f"kvtool-iso-{run_id}-{i}") for i, fs in zip(fill_at, fill_seeds)]  # fmt: skip
        fillers += [Probe(i, group.dimension, trial_id, REPRIME, first, group.kind, prompts[0], -1,
                          f"kvtool-iso-{run_id}-{i}") for i in copy_at]  # fmt: skip
        probes = []
        for role, partition, block_seeds in zip(ROLES, (first, first, second), prompts):
            expected = _expected(variant, group.kind, role, length, options.block_size, group.same_content)
            session = f"kvtool-iso-{run_id}-{at[role]}"
            probes.append(
                Probe(at[role], group.dimension, trial_id, role, partition, group.kind, block_seeds, expected, session)
            )
        trials.append(
            Trial(trial_id, group.dimension, variant, first.label, second.label, repeat,
                  (probes[0], probes[1], probes[2]), length, case, stage, tuple(fillers), group.fillers_after_prime)
        )  # fmt: skip
    not_covered = tuple(f"{d}: {n} trials past the budget" for d, n in dropped.items())
    return Plan(options.block_size, options.full_blocks, partial, run_id, tuple(trials), budget_requests, not_covered)


def new_run_id(seed: int | None = None) -> str:
    """8 hex digits naming this run (salts, session ids); random unless seeded."""
    return f"{random.Random(seed).getrandbits(32):08x}"
