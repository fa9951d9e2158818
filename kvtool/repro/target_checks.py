"""The checks of `kvtool repro --target`, each returning a TargetCheck that names its evidence.

- determinism: one request run twice on the instance, each from an empty cache, gives the same outputs.
- isolation: requests decoded step by step in seeded random interleavings on the instance give the same
  outputs as each request alone on a fresh copy (same weights).
- consistency: a request decoded step by step through its cache (fresh copy) gives the outputs of one
  forward over all its positions from an empty cache (another fresh copy): position, mask, RoPE-offset
  and never-filled-cache bugs.  Names the first diverging layer (HF) or cache tensor and position.
- no-shared-storage: no two requests' live caches share a byte of memory.
- no-aliasing: within one request, no two cache tensors (layers, K and V) are the same memory, and no
  tensor has rows that are one memory (a stride-0 dimension from ``expand``).
- cache-length: every cache tensor holds the tokens seen: growing with them, preallocated with the valid
  region written, or a declared sliding window.
- batch: requests of equal length run as one batch match their runs alone (token and HF targets).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kvtool.repro.cachewalk import CacheScan, CacheTensor, scan_cache
from kvtool.repro.checks import random_schedule
from kvtool.repro.drivers import Driver, Live, TargetFailure
from kvtool.repro.results import TargetCheck, Tolerance
from kvtool.repro.storage import overlap_pairs
from kvtool.repro.workload import BATCH, Workload

MAX_EVIDENCE = 8  # evidence lines per check after collapsing repeats


@dataclass
class Context:
    """What every check needs; reference runs are computed once and shared."""

    driver: Driver  # on the instance under test
    fresh: Callable[[], Driver]  # the same driver on a fresh copy of the module
    work: Workload
    tol: Tolerance
    weights: set[int]  # storage addresses of the target's parameters
    window: int | None  # sliding window declared by the module or its config
    seed: int
    interleavings: int
    alone: list[tuple[list[torch.Tensor], CacheScan]] = field(default_factory=list)
    round_robin: Any = None
    path_tol: Tolerance | None = None  # across two computation paths (consistency, batch); default: tol

    @property
    def cross_tol(self) -> Tolerance:
        return self.path_tol or self.tol

    def scan(self, cache: Any) -> CacheScan:
        return scan_cache(cache, self.weights)


def collapse(items: list[tuple[str, str]], limit: int = MAX_EVIDENCE) -> tuple[str, ...]:
    """(key, line) pairs -> the first line of each key, with how many more lines shared that key."""
    groups: dict[str, list[str]] = {}
    for key, line in items:
        groups.setdefault(key, []).append(line)
    lines = [g[0] if len(g) == 1 else f"{g[0]} (and {len(g) - 1} more like it)" for g in groups.values()]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return tuple(lines)


def _close(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=tol.rtol, atol=tol.atol)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.shape == b.shape else float("inf")


def _first_bad_position(a: torch.Tensor, b: torch.Tensor, tol: Tolerance, seq_dim: int) -> int:
    bad = ~torch.isclose(a.double(), b.double(), rtol=tol.rtol, atol=tol.atol)
    per_position = bad.movedim(seq_dim, 0).reshape(bad.shape[seq_dim], -1).any(dim=1)
    return int(per_position.nonzero()[0, 0]) if per_position.any() else -1


def _tol_text(tol: Tolerance) -> str:
    return f"rtol {tol.rtol:g}, atol {tol.atol:g}"


def run_alone(driver: Driver, work: Workload, rid: int) -> tuple[list[torch.Tensor], Live]:
    live = driver.begin(1)
    outs = [driver.step(live, chunk) for chunk in work.requests[rid].chunks()]
    return outs, live


def references(ctx: Context) -> list[tuple[list[torch.Tensor], CacheScan]]:
    """Each request alone on a fresh copy: its outputs per step and its final cache."""
    if not ctx.alone:
        for rid in range(len(ctx.work.requests)):
            driver = ctx.fresh()
            outs, live = run_alone(driver, ctx.work, rid)
            ctx.alone.append((outs, ctx.scan(live.cache)))
            driver.end(live)
    return ctx.alone


def first_diverging_tensor(got: CacheScan, want: CacheScan, tol: Tolerance) -> str | None:
    """The first cache tensor (in cache order) whose contents differ, with the first position along dim -2."""
    wanted = {t.path: t.tensor for t in want.tensors}
    for item in got.tensors:
        ref = wanted.get(item.path)
        if ref is None or item.tensor.dim() < 2 or item.tensor.is_floating_point() is False:
            continue
        if item.tensor.shape != ref.shape:
            return f"{item.path}: shape {list(item.tensor.shape)}, expected {list(ref.shape)}"
        if not _close(item.tensor, ref, tol):
            pos = _first_bad_position(item.tensor, ref, tol, -2)
            return f"{item.path} from position {pos} (max |diff| {_diff(item.tensor, ref):.3g})"
    return None


# --- determinism and isolation ------------------------------------------------------------------------


def determinism(ctx: Context) -> TargetCheck:
    first, live = run_alone(ctx.driver, ctx.work, 0)
    ctx.driver.end(live)
    second, live = run_alone(ctx.driver, ctx.work, 0)
    ctx.driver.end(live)
    for step, (a, b) in enumerate(zip(second, first)):
        if not _close(a, b, ctx.tol):
            return TargetCheck(
                "determinism",
                False,
                f"request r0 run a second time from an empty cache differs at step {step}: max |diff| "
                f"{_diff(a, b):.3g} ({_tol_text(ctx.tol)}); state survives between requests",
                (),
            )
    return TargetCheck("determinism", True, "the same request twice from an empty cache: identical outputs", ())


def run_schedule(ctx: Context, driver: Driver, schedule: list[list[int]]) -> tuple[list[list[torch.Tensor]], dict]:
    """Steps in ``schedule`` order on ``driver``; each request begins at its first step, ends after its last."""
    lives: dict[int, Live] = {}
    outs: list[list[torch.Tensor]] = [[] for _ in ctx.work.requests]
    chunks = [r.chunks() for r in ctx.work.requests]
    for group in schedule:
        for rid in group:
            if rid not in lives:
                lives[rid] = driver.begin(1)
            outs[rid].append(driver.step(lives[rid], chunks[rid][len(outs[rid])]))
    return outs, lives


def _schedule(rng: random.Random, work: Workload) -> list[list[int]]:
    """A seeded random interleaving of every request's steps (their step counts differ)."""
    counts = [r.chunk_count() for r in work.requests]
    base = random_schedule(rng, len(counts), max(counts), "single")
    done = [0] * len(counts)
    schedule = []
    for (rid,) in base:
        if done[rid] < counts[rid]:
            done[rid] += 1
            schedule.append([rid])
    return schedule


def isolation(ctx: Context) -> TargetCheck:
    refs = references(ctx)
    rng = random.Random(ctx.seed)
    mismatched, first = 0, None
    hits: dict[int, int] = {}  # request -> interleavings in which it differed
    for _ in range(ctx.interleavings):
        schedule = _schedule(rng, ctx.work)
        outs, lives = run_schedule(ctx, ctx.driver, schedule)
        bad = [rid for rid, (o, (r, _)) in enumerate(zip(outs, refs)) if not all(map(_close, o, r, [ctx.tol] * len(o)))]
        if bad and first is None:
            first = _isolation_evidence(ctx, bad[0], outs[bad[0]], lives[bad[0]], schedule)
        mismatched += bool(bad)
        for rid in bad:
            hits[rid] = hits.get(rid, 0) + 1
        for live in lives.values():
            ctx.driver.end(live)
    if not mismatched:
        return TargetCheck(
            "isolation", True, f"{ctx.interleavings} seeded interleavings: every request matches its run alone", ()
        )
    counts = [f"r{rid} ({ctx.work.requests[rid].note}) in {n}" for rid, n in sorted(hits.items())]
    return TargetCheck(
        "isolation",
        False,
        f"{mismatched} of {ctx.interleavings} seeded interleavings gave a request other outputs than its run alone "
        f"on a fresh copy ({_tol_text(ctx.tol)})",
        (first or "", "requests that differed, and in how many interleavings: " + ", ".join(counts)),
    )


def _isolation_evidence(ctx: Context, rid: int, outs: list[torch.Tensor], live: Live, schedule) -> str:
    ref_outs, ref_scan = references(ctx)[rid]
    step = next(i for i, (o, r) in enumerate(zip(outs, ref_outs)) if not _close(o, r, ctx.tol))
    order = " ".join(f"r{g[0]}" for g in schedule)
    where = first_diverging_tensor(ctx.scan(live.cache), ref_scan, ctx.tol)
    tensor = f"; first diverging cache tensor: {where}" if where else ""
    return f"first: r{rid} step {step} max |diff| {_diff(outs[step], ref_outs[step]):.3g}{tensor}; order {order}"


# --- consistency -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Divergence:
    rid: int
    position: int
    diff: float
    where: str  # the first diverging layer or cache tensor ("" when not found)


def _stepwise(ctx: Context, rid: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], CacheScan]:
    """Request ``rid`` decoded step by step on a fresh copy: outputs and per-layer states over all positions."""
    driver = ctx.fresh()
    live = driver.begin(1)
    outs, states = [], []
    for chunk in ctx.work.requests[rid].chunks():
        out, layer_states = driver.step_layers(live, chunk)
        outs.append(out)
        states.append(layer_states)
    scan = ctx.scan(live.cache)
    driver.end(live)
    per_layer = tuple(torch.cat(layer, dim=1) for layer in zip(*states)) if states and states[0] else ()
    return torch.cat(outs, dim=1), per_layer, scan


def _one_shot(ctx: Context, rid: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], CacheScan]:
    driver = ctx.fresh()
    out, live, states = driver.full(ctx.work.requests[rid].inputs.unsqueeze(0))
    scan = ctx.scan(live.cache)
    driver.end(live)
    return out, states, scan


def _first_diverging_layer(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], tol: Tolerance) -> str:
    for i, (a, b) in enumerate(zip(got, want)):
        if not _close(a, b, tol):
            pos = _first_bad_position(a, b, tol, 1)
            what = "the embeddings" if i == 0 else f"the output of layer {i - 1}"
            return f"{what} (hidden_states[{i}]) from position {pos}, max |diff| {_diff(a, b):.3g}"
    return ""


def _divergence(ctx: Context, rid: int) -> _Divergence | None:
    got, got_states, got_scan = _stepwise(ctx, rid)
    want, want_states, want_scan = _one_shot(ctx, rid)
    if _close(got, want, ctx.cross_tol):
        return None
    if got.shape != want.shape:
        return _Divergence(rid, 0, float("inf"), f"output shapes {list(got.shape)} vs {list(want.shape)}")
    position = _first_bad_position(got, want, ctx.cross_tol, 1)
    where = _first_diverging_layer(got_states, want_states, ctx.cross_tol)
    if not where:
        tensor = first_diverging_tensor(got_scan, want_scan, ctx.cross_tol)
        where = f"cache tensor {tensor}" if tensor else ""
    if not where and got_scan.tensors and not want_scan.tensors:
        where = "the one forward over all positions left the cache empty (a multi-token input bypasses the cache)"
    return _Divergence(rid, position, _diff(got, want), where)


def consistency(ctx: Context) -> TargetCheck:
    found = [d for rid in range(len(ctx.work.requests)) if (d := _divergence(ctx, rid)) is not None]
    n = len(ctx.work.requests)
    if not found:
        return TargetCheck(
            "consistency",
            True,
            f"{n} requests decoded step by step match one forward over all their positions ({_tol_text(ctx.cross_tol)})",
            (),
        )
    evidence = []
    for d in found:
        request = ctx.work.requests[d.rid]
        kind = "prompt" if d.position < request.prompt_length else "decode"
        line = f"r{d.rid}: first differs at position {d.position} ({kind}), max |diff| {d.diff:.3g}"
        evidence.append(
            (f"{kind} {d.where.split(' from ')[0]}", line + (f"; first diverging: {d.where}" if d.where else ""))
        )
    return TargetCheck(
        "consistency",
        False,
        f"{len(found)} of {n} requests decoded step by step through the cache differ from one forward over all "
        f"their positions from an empty cache ({_tol_text(ctx.cross_tol)})",
        collapse(evidence),
    )


# --- the cache itself: one round-robin run on the instance ------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    seen: int
    shape: tuple[int, ...]
    unwritten: dict[int, int]  # dim -> positions in [0, seen) along it that are all zeros
    reported: int | None  # valid length the cache reported


@dataclass
class RoundRobin:
    caches: dict[int, Any]  # request -> its cache object at the end
    scans: dict[int, CacheScan]
    history: dict[tuple[int, str], list[_Snapshot]]


def _unwritten(t: torch.Tensor, seen: int) -> dict[int, int]:
    counts = {}
    nonzero = t.detach() != 0
    for dim in range(t.dim()):
        n = min(seen, t.shape[dim])
        if n:
            written = nonzero.movedim(dim, 0).reshape(t.shape[dim], -1)[:n].any(dim=1)
            counts[dim] = int((~written).sum())
    return counts


def round_robin(ctx: Context) -> RoundRobin:
    """Every request one step at a time, in turn, on the instance; the caches looked at after every step."""
    if ctx.round_robin is None:
        counts = [r.chunk_count() for r in ctx.work.requests]
        schedule = [[rid] for step in range(max(counts)) for rid in range(len(counts)) if step < counts[rid]]
        history: dict[tuple[int, str], list[_Snapshot]] = {}
        lives: dict[int, Live] = {}
        chunks = [r.chunks() for r in ctx.work.requests]
        steps = [0] * len(counts)
        for (rid,) in schedule:
            if rid not in lives:
                lives[rid] = ctx.driver.begin(1)
            live = lives[rid]
            ctx.driver.step(live, chunks[rid][steps[rid]])
            steps[rid] += 1
            seen = ctx.work.tokens_seen(rid, steps[rid])
            for item in ctx.scan(live.cache).tensors:
                if item.tensor.dim() >= 2:
                    snap = _Snapshot(seen, tuple(item.tensor.shape), _unwritten(item.tensor, seen), item.valid_length)
                    history.setdefault((rid, item.path), []).append(snap)
        ctx.round_robin = RoundRobin(
            {rid: live.cache for rid, live in lives.items()},
            {rid: ctx.scan(live.cache) for rid, live in lives.items()},
            history,
        )
        for live in lives.values():
            ctx.driver.end(live)
    result: RoundRobin = ctx.round_robin
    return result


def _no_tensors(ctx: Context, what: str) -> str:
    rr = round_robin(ctx)
    kinds = sorted({type(live_cache).__name__ for live_cache in rr.caches.values()})
    return (
        f"the returned caches hold no {what} (kvtool looks inside tuples, lists, dicts, object attributes, "
        f"nn.Module buffers and transformers caches; the caches are of type {', '.join(kinds) or 'nothing'})"
    )


def _live_tensors(scan: CacheScan) -> list[CacheTensor]:
    return [t for t in scan.tensors if t.tensor.dim() >= 2 and t.tensor.numel() > 0]


def no_shared_storage(ctx: Context) -> TargetCheck:
    rr = round_robin(ctx)
    labelled = [(rid, item) for rid in sorted(rr.scans) for item in _live_tensors(rr.scans[rid])]
    if not labelled:
        return TargetCheck("no-shared-storage", False, _no_tensors(ctx, "tensors of 2 or more dimensions"), ())
    evidence = []
    for i, j in overlap_pairs([item.tensor for _, item in labelled]):
        (ri, a), (rj, b) = labelled[i], labelled[j]
        if ri != rj:
            ti, tj = a.tensor, b.tensor
            evidence.append(
                (
                    f"{a.path} {b.path}",
                    f"r{ri} {a.path} (data_ptr {ti.data_ptr():#x}, shape {list(ti.shape)}) and r{rj} {b.path} "
                    f"(data_ptr {tj.data_ptr():#x}, shape {list(tj.shape)}) share storage "
                    f"{ti.untyped_storage().data_ptr():#x}",
                )
            )
    if not evidence:
        return TargetCheck(
            "no-shared-storage",
            True,
            f"{len(labelled)} cache tensors of {len(rr.scans)} live requests: no shared bytes",
            (),
        )
    return TargetCheck(
        "no-shared-storage",
        False,
        f"{len(evidence)} pair(s) of cache tensors of different requests share memory",
        collapse(evidence),
    )


def _stride_zero(item: CacheTensor) -> str | None:
    t = item.tensor
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if size > 1 and stride == 0:
            return f"{item.path} (shape {list(t.shape)}): its {size} rows along dim {dim} are one memory (stride 0, as `expand` makes)"
    return None


def _contains(outer: torch.Tensor, inner: torch.Tensor) -> bool:
    """``inner`` is a strictly smaller view inside ``outer`` (a combined K/V buffer and its halves)."""
    from kvtool.repro.storage import span

    so, si = span(outer), span(inner)
    return so.byte_start <= si.byte_start and si.byte_end <= so.byte_end and inner.numel() < outer.numel()


def _sharing_groups(tensors: list[CacheTensor]) -> list[list[int]]:
    """Groups (index lists) of tensors joined by shared memory; a view strictly inside another is not sharing
    (a combined K/V buffer and its halves)."""
    parent = list(range(len(tensors)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in overlap_pairs([t.tensor for t in tensors]):
        a, b = tensors[i].tensor, tensors[j].tensor
        if not (_contains(a, b) or _contains(b, a)):
            parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(tensors)):
        groups.setdefault(root(i), []).append(i)
    return [members for members in groups.values() if len(members) > 1]


def _intra_evidence(rid: int, scan: CacheScan) -> list[tuple[str, str]]:
    evidence = []
    holders = [t.path for t in scan.tensors]
    for alias in scan.aliases:
        if any(p == alias.same_as or p.startswith((alias.same_as + ".", alias.same_as + "[")) for p in holders):
            evidence.append(
                (f"{alias.path} {alias.same_as}", f"r{rid} {alias.path} is the same object as {alias.same_as}")
            )
    tensors = _live_tensors(scan)
    groups = _sharing_groups(tensors)
    for members in groups:
        first = tensors[members[0]].tensor
        names = ", ".join(tensors[m].path for m in members)
        evidence.append(
            (
                re.sub(r"\d+", "N", names),
                f"r{rid} {names} share memory (data_ptr {first.data_ptr():#x}, "
                f"storage {first.untyped_storage().data_ptr():#x})",
            )
        )
    for item in tensors:
        text = _stride_zero(item)
        if text:
            evidence.append((item.path, f"r{rid} {text}"))
    return evidence


def no_aliasing(ctx: Context) -> TargetCheck:
    rr = round_robin(ctx)
    if not any(_live_tensors(scan) for scan in rr.scans.values()):
        return TargetCheck("no-aliasing", True, "no cache tensors to compare (see no-shared-storage)", (), skipped=True)
    evidence = [line for rid in sorted(rr.scans) for line in _intra_evidence(rid, rr.scans[rid])]
    if not evidence:
        n = len(_live_tensors(rr.scans[min(rr.scans)]))
        return TargetCheck(
            "no-aliasing", True, f"within each request, its {n} cache tensors (layers, K and V) are separate memory", ()
        )
    return TargetCheck(
        "no-aliasing",
        False,
        "within one request, cache tensors of different layers, K and V, or rows share memory",
        collapse(evidence),
    )


def _judge_length(history: list[_Snapshot], window: int | None) -> str | None:
    """Why this cache tensor does not hold the tokens seen, or None when it does."""
    for snap in history:
        if snap.reported is not None and snap.reported != snap.seen:
            return f"reports {snap.reported} tokens held after {snap.seen} tokens seen"
    ndim = len(history[0].shape)
    if any(len(s.shape) != ndim for s in history):
        return f"changes rank: shape {list(history[0].shape)} then {list(history[-1].shape)}"
    dims = range(ndim)
    if any(all(s.shape[d] == s.seen for s in history) for d in dims):
        return None
    if window and any(all(s.shape[d] == min(s.seen, w) for s in history) for d in dims for w in (window, window - 1)):
        return None
    constant = [d for d in dims if len({s.shape[d] for s in history}) == 1]
    preallocated = [d for d in constant if all(s.shape[d] >= s.seen for s in history) or history[0].shape[d] == window]
    if preallocated:
        dim = ndim - 2 if ndim - 2 in preallocated else max(preallocated, key=lambda d: history[0].shape[d])
        for snap in history:
            if snap.unwritten.get(dim):
                held = min(snap.seen, snap.shape[dim])
                return (
                    f"preallocated along dim {dim} (capacity {snap.shape[dim]}): {snap.unwritten[dim]} of the first "
                    f"{held} positions never written after {snap.seen} tokens seen (all zeros)"
                )
        return None
    tracking = set(dims)
    for snap in history:
        tracking &= {d for d in dims if snap.shape[d] == snap.seen}
        if not tracking:
            first = history[0]
            before = "" if snap.seen == first.seen else f" (shape {list(first.shape)} after {first.seen})"
            return (
                f"shape {list(snap.shape)} after {snap.seen} tokens seen{before}; no dimension tracks the tokens seen"
            )
    return None


def cache_length(ctx: Context) -> TargetCheck:
    rr = round_robin(ctx)
    if not rr.history:
        return TargetCheck("cache-length", False, _no_tensors(ctx, "tensor of 2 or more dimensions"), ())
    windows = {(rid, t.path): t.window for rid, scan in rr.scans.items() for t in scan.tensors}
    evidence = []
    for (rid, path), history in rr.history.items():
        problem = _judge_length(history, windows.get((rid, path)) or ctx.window)
        if problem:
            evidence.append((re.sub(r"\d+", "N", problem), f"r{rid} {path}: {problem}"))
    if not evidence:
        return TargetCheck(
            "cache-length",
            True,
            f"{len(rr.history)} cache tensors: each holds the tokens seen (growing, preallocated with the valid "
            "region written, or a declared window) after every step",
            (),
        )
    return TargetCheck(
        "cache-length",
        False,
        f"{len(evidence)} cache tensor(s) that do not hold the tokens seen",
        collapse(evidence),
    )


# --- batch ---------------------------------------------------------------------------------------------


def batch(ctx: Context) -> TargetCheck:
    if not ctx.driver.supports_batch:
        return TargetCheck("batch", True, "not run: the embeds protocol is driven with batch 1", (), skipped=True)
    a, b = BATCH
    refs = references(ctx)
    driver = ctx.fresh()
    try:
        live = driver.begin(2)
        pairs = zip(ctx.work.requests[a].chunks(), ctx.work.requests[b].chunks())
        outs = [driver.step(live, torch.cat([x, y])) for x, y in pairs]
    except TargetFailure as err:
        return TargetCheck("batch", True, f"not run: the target does not take a batch of 2 ({err})", (), skipped=True)
    scan = ctx.scan(live.cache)
    driver.end(live)
    evidence = [(t.path, text) for t in _live_tensors(scan) if (text := _stride_zero(t))]
    for row, rid in enumerate((a, b)):
        for step, (out, ref) in enumerate(zip(outs, refs[rid][0])):
            if not _close(out[row : row + 1], ref, ctx.cross_tol):
                diff = _diff(out[row : row + 1], ref)
                evidence.append(
                    (
                        f"row {row}",
                        f"row {row} (r{rid}) differs from r{rid} alone at step {step}: max |diff| {diff:.3g}",
                    )
                )
                break
    padded = _padded_batch(ctx)
    evidence.extend(padded)
    if not evidence:
        extra = "; r0, r1, r2 left-padded to one batch (attention_mask) match theirs" if _pads(ctx) else ""
        return TargetCheck(
            "batch", True, f"r{a} and r{b} as one batch of 2: each row matches its request alone{extra}", ()
        )
    return TargetCheck(
        "batch",
        False,
        f"requests run as one batch differ from their runs alone ({_tol_text(ctx.cross_tol)})",
        collapse(evidence),
    )


PADDED = (0, 1, 2)  # prompts of 5, 8 and 3 tokens: left padding of 3, 0 and 5 positions


def _pads(ctx: Context) -> bool:
    """Whether the target takes a left-padded batch with an attention_mask (transformers models do)."""
    return callable(getattr(ctx.driver, "run_padded", None))


def _padded_batch(ctx: Context) -> list[tuple[str, str]]:
    """Requests of different lengths as one left-padded batch: each row vs its request alone (padding-mask bugs)."""
    if not _pads(ctx):
        return []
    refs = references(ctx)
    requests = [ctx.work.requests[rid] for rid in PADDED]
    steps = min(r.total - r.prompt_length for r in requests)
    prompts = [r.inputs[: r.prompt_length] for r in requests]
    decode = [torch.stack([r.inputs[r.prompt_length + s] for r in requests]) for s in range(steps)]
    driver = ctx.fresh()
    outs = driver.run_padded(prompts, decode)  # type: ignore[attr-defined]
    width = max(r.prompt_length for r in requests)
    evidence = []
    for rid, request, row in zip(PADDED, requests, outs):
        for step, (out, ref) in enumerate(zip(row, refs[rid][0])):
            if not _close(out, ref, ctx.tol):
                pad = width - request.prompt_length
                evidence.append(
                    (
                        "padded",
                        f"left-padded batch: r{rid} ({pad} pad positions) differs from r{rid} alone at step {step}: "
                        f"max |diff| {_diff(out, ref):.3g}",
                    )
                )
                break
    return evidence
