"""The seeded requests a --target is checked with: varied prompt lengths, equal lengths, an equal prefix.

Requests r0, r1, r2 have prompts of 5, 8 and 3 positions (different, so slots and cache lengths differ);
r3 has r0's length with other content (a memo keyed by prompt length mixes them up); r4 is r0's prompt plus
1 to 4 more positions (a shared prefix); r5 has a random length of 1 to 12.  Each request then takes
``DECODE_STEPS`` single positions.  r0 and r3, of equal length, also run together as one batch of 2.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from kvtool.repro.checks import DECODE_STEPS

BASE_PROMPT_LENGTHS = (5, 8, 3)
BATCH = (0, 3)  # the requests run together as one batch where the target takes batches


@dataclass(frozen=True)
class TargetRequest:
    inputs: torch.Tensor  # [T, d_model] float (embeds protocol) or [T] int64 token ids
    prompt_length: int
    note: str  # how it was made: "random", "r0's length", "r0's prompt + 2"

    @property
    def total(self) -> int:
        return int(self.inputs.shape[0])

    def chunks(self) -> list[torch.Tensor]:
        """The prompt, then one position per decode step; each [1, seq, ...]."""
        bounds = [0, self.prompt_length, *range(self.prompt_length + 1, self.total + 1)]
        return [self.inputs[a:b].unsqueeze(0) for a, b in zip(bounds, bounds[1:])]

    def chunk_count(self) -> int:
        return 1 + self.total - self.prompt_length


@dataclass(frozen=True)
class Workload:
    requests: tuple[TargetRequest, ...]

    @property
    def max_tokens(self) -> int:
        return max(r.total for r in self.requests)

    def tokens_seen(self, rid: int, steps: int) -> int:
        """Tokens request ``rid`` has fed after its first ``steps`` calls."""
        if steps == 0:
            return 0
        return self.requests[rid].prompt_length + steps - 1

    def describe(self) -> str:
        return ", ".join(f"r{i} {r.prompt_length}+{r.total - r.prompt_length}" for i, r in enumerate(self.requests))


def make_workload(
    seed: int, *, d_model: int | None, vocab: int | None, dtype: torch.dtype, device: torch.device
) -> Workload:
    """Seeded requests of random vectors ``[T, d_model]`` (d_model given) or random token ids (vocab given)."""
    g = torch.Generator().manual_seed(seed + 2)
    rng = random.Random(seed + 3)

    def draw(n: int) -> torch.Tensor:
        if vocab is not None:
            return torch.randint(0, vocab, (n,), generator=g).to(device)
        assert d_model is not None
        return torch.randn(n, d_model, generator=g).to(device=device, dtype=dtype)

    def request(prompt: torch.Tensor, note: str) -> TargetRequest:
        return TargetRequest(torch.cat([prompt, draw(DECODE_STEPS)]), int(prompt.shape[0]), note)

    prompts = [draw(n) for n in BASE_PROMPT_LENGTHS]
    requests = [request(p, "random") for p in prompts]
    requests.append(request(draw(BASE_PROMPT_LENGTHS[0]), "r0's length"))
    extra = rng.randint(1, 4)
    requests.append(request(torch.cat([prompts[0], draw(extra)]), f"r0's prompt + {extra}"))
    requests.append(request(draw(rng.randint(1, 12)), "random length"))
    return Workload(tuple(requests))
