"""The checks of `kvtool repro` over the built-in scenarios: isolation, memory sharing, shapes, greedy
divergence, and the seeded interleaving stress test (article 6.3).

Every request's logits are compared with the same request run alone on a fresh model (all its tokens in
one forward, no cache reused) with ``torch.allclose``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from kvtool.repro.engines import VOCAB, CacheEntry, Engine, Implementation, build_pair
from kvtool.repro.results import CacheTensorInfo, ImplResult, ScenarioResult, Tolerance
from kvtool.repro.scenarios import scenario_info
from kvtool.repro.storage import overlap_pairs, span

# allclose tolerances per dtype.  float32/float64: about a thousand ulps of logits of size ~1, room for
# the different summation order of a cached step versus one full forward (measured: <= 2.4e-7 and 3e-16);
# bfloat16 (8-bit mantissa, ulp 2**-7 near 1): torch.testing.assert_close's rtol for bfloat16, 1.6e-2,
# and one ulp near 1 as atol.
TOLERANCES = {
    "float32": Tolerance("float32", rtol=1e-4, atol=1e-5),
    "float64": Tolerance("float64", rtol=1e-9, atol=1e-12),
    "bfloat16": Tolerance("bfloat16", rtol=1.6e-2, atol=1e-2),
}
# Comparisons across two computation paths of a target (consistency: cached steps vs one forward; batch: a batch
# row vs the request alone) in bfloat16: the reduction order differs in every layer, so round-off adds up with
# depth, about as its square root.  Measured on a real GPU (H200, Llama-3.2-1B's shape, 16 layers, random weights,
# transformers 5.17): a correct model's logits differ by up to 0.039, over TOLERANCES' 0.016; scaled by
# sqrt(16) = 4 the bound is 0.064.  float32/float64 keep TOLERANCES (their round-off is far below them).


def path_tolerance(dtype: str, num_layers: int) -> Tolerance:
    """The tolerance of a two-path comparison for a model of ``num_layers`` layers (bfloat16 scaled by depth)."""
    base = TOLERANCES[dtype]
    if dtype != "bfloat16" or num_layers <= 1:
        return base
    scale = math.sqrt(num_layers)
    return Tolerance(dtype, rtol=base.rtol * scale, atol=base.atol * scale)


DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}

N_REQUESTS = 3
PROMPT_LENGTHS = (5, 8, 3)  # different, so batches need padding and slots differ
DECODE_STEPS = 4  # teacher-forced decode tokens per request (canonical run and interleavings)
GREEDY_STEPS = 10  # greedy decode steps per request


@dataclass(frozen=True)
class Request:
    prompt: torch.Tensor  # token ids [P]
    continuation: torch.Tensor  # token ids [DECODE_STEPS], fed one per step (teacher forcing)

    @property
    def tokens(self) -> torch.Tensor:
        return torch.cat([self.prompt, self.continuation])


def make_requests(seed: int, device, shared_prompt: bool) -> list[Request]:
    """Seeded requests; ``shared_prompt`` for parallel sampling (one prompt, different continuations)."""
    g = torch.Generator().manual_seed(seed + 1)
    first = torch.randint(0, VOCAB, (PROMPT_LENGTHS[0],), generator=g)
    requests = []
    for length in PROMPT_LENGTHS[:N_REQUESTS]:
        prompt = first if shared_prompt else torch.randint(0, VOCAB, (length,), generator=g)
        cont = torch.randint(0, VOCAB, (DECODE_STEPS,), generator=g)
        requests.append(Request(prompt.to(device), cont.to(device)))
    return requests


def canonical_schedule(n_requests: int, steps: int, mode: str) -> list[list[int]]:
    """Round robin (one request per forward) for "single"; the whole batch per forward otherwise."""
    if mode == "single":
        return [[r] for _ in range(steps) for r in range(n_requests)]
    return [list(range(n_requests)) for _ in range(steps)]


def random_schedule(rng: random.Random, n_requests: int, steps: int, mode: str) -> list[list[int]]:
    """A seeded interleaving: at each forward a random request (or random subset, for batching modes)
    of those with steps left takes its next step.  A fork starts with every request together."""
    left = [steps] * n_requests
    schedule = []
    if mode == "fork":
        schedule.append(list(range(n_requests)))
        left = [steps - 1] * n_requests
    while any(left):
        active = [r for r in range(n_requests) if left[r]]
        if mode == "single":
            group = [rng.choice(active)]
        else:
            group = sorted(rng.sample(active, rng.randint(1, len(active))))
        for r in group:
            left[r] -= 1
        schedule.append(group)
    return schedule


def run_schedule(engine: Engine, requests: list[Request], schedule: list[list[int]], greedy: bool = False):
    """Drive ``engine`` through ``schedule``; step 0 of a request is its prompt, step i its i-th token:
    the given continuation while it lasts, then (with ``greedy``) the argmax of its previous logits.

    Returns (logits per request [T, vocab], generated tokens per request).
    """
    logits: list[list[torch.Tensor]] = [[] for _ in requests]
    generated: list[list[int]] = [[] for _ in requests]
    steps_done = [0] * len(requests)
    for group in schedule:
        batch = []
        for r in group:
            i = steps_done[r]
            if i == 0:
                tokens = requests[r].prompt
            elif greedy and i > len(requests[r].continuation):
                tokens = logits[r][-1][-1].argmax().reshape(1)
                generated[r].append(int(tokens))
            else:
                tokens = requests[r].continuation[i - 1 : i]
            batch.append((r, tokens))
            steps_done[r] += 1
        for (r, _), out in zip(batch, engine.step(batch)):
            logits[r].append(out)
    return [torch.cat(chunks) for chunks in logits], generated


def greedy_reference(impl: Implementation, prompt: torch.Tensor, steps: int) -> list[int]:
    """Greedy tokens of ``prompt`` alone, every step one full forward on a fresh model."""
    tokens = prompt
    out = []
    for _ in range(steps):
        nxt = impl.reference(tokens)[-1].argmax().reshape(1)
        out.append(int(nxt))
        tokens = torch.cat([tokens, nxt])
    return out


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _close(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=tol.rtol, atol=tol.atol)


def cache_infos(engine: Engine, n_requests: int) -> tuple[list[CacheTensorInfo], list[str]]:
    """Every request's cache tensors split per head, with the other tensors each shares memory with."""
    labelled: list[tuple[int, str, torch.Tensor, tuple[int, ...]]] = []
    for rid in range(n_requests):
        for entry in engine.cache_entries(rid):
            labelled.extend(_per_head(rid, entry))
    pairs = overlap_pairs([t for _, _, t, _ in labelled])
    names = [f"r{rid} {label}" for rid, label, _, _ in labelled]
    overlaps: list[list[str]] = [[] for _ in labelled]
    for i, j in pairs:
        overlaps[i].append(names[j])
        overlaps[j].append(names[i])
    infos = []
    for (rid, label, t, expected), others in zip(labelled, overlaps):
        s = span(t)
        infos.append(
            CacheTensorInfo(
                rid, label, s.data_ptr, s.storage_ptr, s.byte_start, s.byte_end, tuple(t.shape), expected, tuple(others)
            )
        )
    findings = _overlap_findings(pairs, names, [t for _, _, t, _ in labelled])
    return infos, findings


def _overlap_findings(pairs, names: list[str], tensors: list[torch.Tensor]) -> list[str]:
    """One line per pair of cache tensors sharing memory, with their per-head views summed up."""
    groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for i, j in pairs:
        key = (names[i].rsplit(" h", 1)[0], names[j].rsplit(" h", 1)[0])
        groups.setdefault(key, []).append((i, j))
    lines = []
    for (a, b), members in groups.items():
        i, j = members[0]
        ptrs = f"data_ptr {tensors[i].data_ptr():#x} / {tensors[j].data_ptr():#x}"
        what = f"{a}: its per-head views" if a == b else f"{a} and {b}"
        lines.append(
            f"{what} share memory ({len(members)} head pair(s), e.g. {names[i]} / {names[j]}: {ptrs}, "
            f"storage {span(tensors[i]).storage_ptr:#x})"
        )
    return lines


def _per_head(rid: int, entry: CacheEntry):
    t, expected = entry.tensor, entry.expected_shape
    if entry.head_dim is None:
        return [(rid, entry.label, t, expected)]
    per_head_expected = expected[: entry.head_dim] + expected[entry.head_dim + 1 :]
    return [
        (rid, f"{entry.label} h{h}", t.select(entry.head_dim, h), per_head_expected)
        for h in range(t.shape[entry.head_dim])
    ]


def greedy_divergence(impl: Implementation, requests: list[Request], mode: str) -> dict[int, int]:
    """Request -> first greedy decode step (1-based) whose token differs from the request decoded alone.

    Parallel samples of one prompt ("fork") would all pick the same tokens, so there each sample's first
    token is forced (its own continuation's), as sampling would.
    """
    forced = 1 if mode == "fork" else 0
    gen_requests = [Request(r.prompt, r.continuation[:forced]) for r in requests]
    schedule = canonical_schedule(len(requests), 1 + forced + GREEDY_STEPS, mode)
    _, generated = run_schedule(impl.new_engine(), gen_requests, schedule, greedy=True)
    divergence = {}
    for rid, (req, got) in enumerate(zip(gen_requests, generated)):
        want = greedy_reference(impl, req.tokens, GREEDY_STEPS)
        step = next((i + 1 for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if step is not None:
            divergence[rid] = step
    return divergence


def interleaving_mismatches(
    impl: Implementation, requests: list[Request], references, mode: str, tol: Tolerance, n: int, seed: int
) -> int:
    """How many of ``n`` seeded random interleavings (a fresh engine each) give some request other logits."""
    rng = random.Random(seed)
    mismatches = 0
    for _ in range(n):
        schedule = random_schedule(rng, len(requests), 1 + DECODE_STEPS, mode)
        outs, _ = run_schedule(impl.new_engine(), requests, schedule)
        if not all(_close(o, ref, tol) for o, ref in zip(outs, references)):
            mismatches += 1
    return mismatches


def check_implementation(
    impl: Implementation, requests: list[Request], mode: str, tol: Tolerance, interleavings: int, seed: int
) -> ImplResult:
    """Run the canonical schedule, greedy decoding and ``interleavings`` random schedules on ``impl``."""
    findings: list[str] = []
    references = [impl.reference(r.tokens) for r in requests]

    engine = impl.new_engine()
    outputs, _ = run_schedule(engine, requests, canonical_schedule(len(requests), 1 + DECODE_STEPS, mode))
    diffs = [_diff(out, ref) if out.shape == ref.shape else float("inf") for out, ref in zip(outputs, references)]
    close = [_close(out, ref, tol) for out, ref in zip(outputs, references)]
    if not all(close):
        per_request = ", ".join(f"r{rid} {d:.3g}" for rid, (ok, d) in enumerate(zip(close, diffs)) if not ok)
        findings.append(
            f"logits not allclose to the request run alone on a fresh model (rtol {tol.rtol:g}, atol {tol.atol:g}); "
            f"max |diff|: {per_request}"
        )
    infos, overlap_findings = cache_infos(engine, len(requests))
    findings.extend(overlap_findings)
    bad_shapes = [i for i in infos if i.shape != i.expected_shape]
    reported = set()
    for info in bad_shapes:
        base = f"r{info.request} {info.label.rsplit(' h', 1)[0]}"
        if base not in reported:  # one line per tensor, not per head view
            reported.add(base)
            findings.append(f"{base}: shape {list(info.shape)} per head, expected {list(info.expected_shape)}")

    divergence = greedy_divergence(impl, requests, mode)
    if divergence:
        steps_text = ", ".join(f"r{rid} step {step}" for rid, step in divergence.items())
        findings.append(f"greedy tokens diverge from the request run alone: {steps_text} (of {GREEDY_STEPS})")

    mismatches = interleaving_mismatches(impl, requests, references, mode, tol, interleavings, seed)
    if mismatches:
        findings.append(
            f"{mismatches} of {interleavings} seeded interleavings gave a request other logits than its run alone"
        )

    return ImplResult(
        kind=impl.kind,
        detected=bool(findings),
        allclose=all(close),
        max_abs_diff=max(diffs),
        request_max_abs_diff=tuple(diffs),
        shared_storage=any(i.overlaps_with for i in infos),
        shapes_ok=not bad_shapes,
        interleaving_mismatches=mismatches,
        interleavings=interleavings,
        greedy_divergence_step=min(divergence.values(), default=None),
        greedy_steps=GREEDY_STEPS,
        findings=tuple(findings),
        cache_tensors=tuple(infos),
    )


def run_scenario(
    name: str,
    *,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    interleavings: int = 200,
    rope_mode: str | None = None,
) -> ScenarioResult:
    """Build scenario ``name`` (buggy and fixed, same weights) and check both sides."""
    info = scenario_info(name)
    tol = TOLERANCES[dtype]
    dev = torch.device(device)
    buggy, fixed = build_pair(name, seed, DTYPES[dtype], dev, rope_mode=rope_mode)
    requests = make_requests(seed, dev, shared_prompt=info.schedule == "fork")
    with torch.inference_mode():
        b, f = (
            check_implementation(impl, requests, info.schedule, tol, interleavings, seed) for impl in (buggy, fixed)
        )
    return ScenarioResult(
        name=info.name,
        summary=info.summary,
        bug=info.bug,
        fix=info.fix,
        requests=len(requests),
        buggy=b,
        fixed=f,
        passed=b.detected and not f.detected,
    )
