"""`kvtool repro --target package.module:factory`: the isolation checks run against the user's own module.

The factory returns a ``torch.nn.Module`` whose ``forward(x, cache)`` takes x [batch, seq, d_model] and a
cache (None on a request's first call) and returns ``(out, new_cache)``; the cache is any nesting of
tensors, tuples, lists, dicts and objects with tensor attributes.  Requests run with batch 1, one cache per request, held by kvtool.

Checks (each fails on its own, naming the evidence; an exception inside forward fails the check it
happened in, with its message):

- ``determinism``: one request run twice on the instance, each from an empty cache, gives the same outputs.
- ``isolation``: requests decoded step by step in seeded random interleavings on the instance give the
  same outputs as each request alone on a fresh copy of the module (same weights).
- ``no-shared-storage``: no two requests' live caches share a byte of memory.
- ``cache-length``: every cache tensor of 2+ dimensions has a dimension equal to the tokens seen, after
  every step.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import random
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from kvtool.core.errors import UsageError
from kvtool.repro.checks import DECODE_STEPS, DTYPES, N_REQUESTS, PROMPT_LENGTHS, TOLERANCES, random_schedule
from kvtool.repro.results import TargetCheck, TargetResult
from kvtool.repro.storage import overlap_pairs

# What the user's code may raise into kvtool: any exception, and SystemExit (a module that runs argparse
# at import, a factory that calls sys.exit("no GPU")), which would otherwise end kvtool with the
# target's exit code (1 would read as "checks failed").  KeyboardInterrupt still stops kvtool.
_USER_ERRORS = (Exception, SystemExit)


class TargetFailure(Exception):
    """The target misbehaved during a check (raised, or returned something unusable)."""


def load_target(spec: str) -> tuple[torch.nn.Module, Callable[[], Any]]:
    """Import ``package.module:factory`` and call it; returns (module, factory).  UsageError names the target."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--target must look like package.module:factory, got '{spec}'", where="--target")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the current directory's packages are importable
    try:
        obj: Any = importlib.import_module(module_name)
    except _USER_ERRORS as err:  # noqa: BLE001 - any import-time failure is the target's fault
        raise UsageError(
            f"cannot import module '{module_name}' of target '{spec}': {type(err).__name__}: {err}", where="--target"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"target '{spec}': '{module_name}' has no attribute '{attr}'", where="--target")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(
            f"target '{spec}' is not callable (it is of type {type(obj).__name__}); name a factory", where="--target"
        )
    factory = obj
    try:
        module = factory()
    except _USER_ERRORS as err:  # noqa: BLE001
        raise UsageError(f"factory of target '{spec}' raised {type(err).__name__}: {err}", where="--target") from None
    if not isinstance(module, torch.nn.Module):
        raise UsageError(
            f"factory of target '{spec}' returned {type(module).__name__}, expected a torch.nn.Module",
            where="--target",
        )
    return module, factory


def _leaves(cache: Any, path: str = "cache", _seen: set[int] | None = None) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in a nesting of tuples, lists, dicts and plain objects (their
    attributes: a ``KVCache`` class, a dataclass, HF's ``DynamicCache``); other leaves are skipped.

    Modules (torch's or Python's) are not descended into: their weights and globals are shared by design.
    Nothing is visited twice."""
    seen = set() if _seen is None else _seen
    if isinstance(cache, torch.Tensor):
        return [(path, cache)]
    skipped = (torch.nn.Module, types.ModuleType, str, bytes, int, float, bool, type(None))
    if id(cache) in seen or isinstance(cache, skipped):
        return []
    seen.add(id(cache))
    if isinstance(cache, dict):
        return [leaf for key, value in cache.items() for leaf in _leaves(value, f"{path}[{key!r}]", seen)]
    if isinstance(cache, (tuple, list)):
        return [leaf for i, value in enumerate(cache) for leaf in _leaves(value, f"{path}[{i}]", seen)]
    if callable(cache):
        return []
    attributes = dict(getattr(cache, "__dict__", None) or {})
    for klass in type(cache).__mro__:  # a class with __slots__ has no __dict__
        slots = klass.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if hasattr(cache, name):
                attributes.setdefault(name, getattr(cache, name))
    return [leaf for key, value in attributes.items() for leaf in _leaves(value, f"{path}.{key}", seen)]


def _no_tensors(caches: dict[int, Any], what: str) -> str:
    """Why no tensor was found: name the type the target returned as its cache."""
    kinds = sorted({type(c).__name__ for c in caches.values()})
    return (
        f"the returned caches hold no {what} (kvtool looks inside tuples, lists, dicts and object attributes; "
        f"the caches are of type {', '.join(kinds) or 'nothing'})"
    )


def _forward(module: torch.nn.Module, x: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
    try:
        result = module(x, cache)
    except _USER_ERRORS as err:  # noqa: BLE001 - the target's exception is the finding
        raise TargetFailure(f"forward raised {type(err).__name__}: {' '.join(str(err).split())}") from None
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.Tensor)):
        raise TargetFailure(f"forward returned {type(result).__name__}, expected (out tensor, new_cache)")
    return result[0].detach().clone(), result[1]  # clone: a later step must not change this output


class _Workload:
    """Seeded requests of random vectors: a prompt [1, P, d_model], then DECODE_STEPS single vectors."""

    def __init__(self, d_model: int, seed: int, dtype: torch.dtype, device: torch.device):
        g = torch.Generator().manual_seed(seed + 2)
        self.chunks = [
            [torch.randn(1, length, d_model, generator=g).to(device=device, dtype=dtype)]
            + [torch.randn(1, 1, d_model, generator=g).to(device=device, dtype=dtype) for _ in range(DECODE_STEPS)]
            for length in PROMPT_LENGTHS[:N_REQUESTS]
        ]

    def run_alone(self, module: torch.nn.Module, rid: int) -> list[torch.Tensor]:
        cache, outs = None, []
        for x in self.chunks[rid]:
            out, cache = _forward(module, x, cache)
            outs.append(out)
        return outs

    def run_schedule(self, module, schedule, on_step=None):
        """Steps in ``schedule`` order (a list of single-request groups); returns (outputs, caches)."""
        caches: dict[int, Any] = {}
        outs: list[list[torch.Tensor]] = [[] for _ in self.chunks]
        for group in schedule:
            for rid in group:
                step = len(outs[rid])
                out, caches[rid] = _forward(module, self.chunks[rid][step], caches.get(rid))
                outs[rid].append(out)
                if on_step is not None:
                    on_step(rid, caches[rid])
        return outs, caches

    def tokens_seen(self, rid: int, steps: int) -> int:
        return sum(x.shape[1] for x in self.chunks[rid][:steps])


def _first_mismatch(outs, refs, tol) -> tuple[int, float] | None:
    """(step, max |diff|) of the first output not allclose to its reference, or None."""
    for step, (out, ref) in enumerate(zip(outs, refs)):
        if out.shape != ref.shape:
            return step, float("inf")
        if not torch.allclose(out, ref, rtol=tol.rtol, atol=tol.atol):
            return step, float((out.double() - ref.double()).abs().max())
    return None


def _check(name: str, fn) -> TargetCheck:
    try:
        return fn()
    except TargetFailure as err:
        return TargetCheck(name, False, str(err), ())


def check_target(
    spec: str,
    *,
    d_model: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    interleavings: int = 200,
) -> TargetResult:
    """Load the target and run the four checks; UsageError if it cannot be loaded or has no d_model.

    Whatever the target's own code prints (the article's habit: print each cache's shape and data_ptr
    on every step) goes to stderr, so stdout carries only kvtool's answer and ``--json`` stays JSON.
    """
    with contextlib.redirect_stdout(sys.stderr):
        return _check_target(spec, d_model=d_model, device=device, dtype=dtype, seed=seed, interleavings=interleavings)


def _check_target(
    spec: str, *, d_model: int | None, device: str, dtype: str, seed: int, interleavings: int
) -> TargetResult:
    module, factory = load_target(spec)
    if d_model is None:
        d_model = getattr(module, "d_model", None)
        if not isinstance(d_model, int) or isinstance(d_model, bool) or d_model <= 0:
            raise UsageError(
                f"cannot tell d_model of target '{spec}': the module has no positive integer d_model attribute",
                where="--target",
                tip="pass --d-model N",
            )
    tol = TOLERANCES[dtype]
    dev = torch.device(device)
    try:
        module = module.to(device=dev, dtype=DTYPES[dtype]).eval()
    except _USER_ERRORS as err:  # noqa: BLE001
        raise UsageError(f"cannot move target '{spec}' to {device}/{dtype}: {err}", where="--target") from None
    work = _Workload(d_model, seed, DTYPES[dtype], dev)
    try:
        pristine = copy.deepcopy(module)
    except _USER_ERRORS:  # noqa: BLE001 - fall back to a new instance with the same weights
        pristine = None
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def fresh() -> torch.nn.Module:
        try:
            if pristine is not None:
                return copy.deepcopy(pristine)
            other = factory().to(device=dev, dtype=DTYPES[dtype]).eval()
            other.load_state_dict(state)
            return other
        except _USER_ERRORS as err:  # noqa: BLE001
            raise TargetFailure(f"could not make a fresh copy of the module: {type(err).__name__}: {err}") from None

    with torch.no_grad():
        checks = (
            _check("determinism", lambda: _determinism(module, work, tol)),
            _check("isolation", lambda: _isolation(module, fresh, work, tol, seed, interleavings)),
            _check("no-shared-storage", lambda: _no_shared_storage(module, work)),
            _check("cache-length", lambda: _cache_length(module, work)),
        )
    failed = tuple(c.name for c in checks if not c.passed)
    return TargetResult(spec, type(module).__name__, d_model, not failed, checks, failed)


def _determinism(module, work: _Workload, tol) -> TargetCheck:
    first = work.run_alone(module, 0)
    second = work.run_alone(module, 0)
    miss = _first_mismatch(second, first, tol)
    if miss is None:
        return TargetCheck("determinism", True, "the same request twice from an empty cache: identical outputs", ())
    step, diff = miss
    return TargetCheck(
        "determinism",
        False,
        f"request r0 run a second time from an empty cache differs at step {step}: max |diff| {diff:.3g} "
        f"(rtol {tol.rtol:g}, atol {tol.atol:g}); state survives between requests",
        (),
    )


def _isolation(module, fresh, work: _Workload, tol, seed: int, interleavings: int) -> TargetCheck:
    refs = [work.run_alone(fresh(), rid) for rid in range(len(work.chunks))]
    rng = random.Random(seed)
    mismatches, first = 0, None
    for _ in range(interleavings):
        schedule = random_schedule(rng, len(work.chunks), 1 + DECODE_STEPS, "single")
        outs, _ = work.run_schedule(module, schedule)
        for rid, (o, r) in enumerate(zip(outs, refs)):
            miss = _first_mismatch(o, r, tol)
            if miss is not None:
                mismatches += 1
                if first is None:
                    order = " ".join(f"r{g[0]}" for g in schedule)
                    first = f"first: r{rid} step {miss[0]} max |diff| {miss[1]:.3g}, order {order}"
                break
    if not mismatches:
        return TargetCheck(
            "isolation", True, f"{interleavings} seeded interleavings: every request matches its run alone", ()
        )
    return TargetCheck(
        "isolation",
        False,
        f"{mismatches} of {interleavings} seeded interleavings gave a request other outputs than its run alone "
        f"on a fresh copy (rtol {tol.rtol:g}, atol {tol.atol:g})",
        (first,),
    )


def _no_shared_storage(module, work: _Workload) -> TargetCheck:
    schedule = [[r] for _ in range(1 + DECODE_STEPS) for r in range(len(work.chunks))]
    _, caches = work.run_schedule(module, schedule)
    labelled = [(rid, path, t) for rid in sorted(caches) for path, t in _leaves(caches[rid])]
    evidence = []
    for i, j in overlap_pairs([t for _, _, t in labelled]):
        (ri, pi, ti), (rj, pj, tj) = labelled[i], labelled[j]
        if ri != rj:
            evidence.append(
                f"r{ri} {pi} (data_ptr {ti.data_ptr():#x}, shape {list(ti.shape)}) and r{rj} {pj} "
                f"(data_ptr {tj.data_ptr():#x}, shape {list(tj.shape)}) share storage "
                f"{ti.untyped_storage().data_ptr():#x}"
            )
    if not labelled:
        return TargetCheck("no-shared-storage", False, _no_tensors(caches, "tensors"), ())
    if not evidence:
        return TargetCheck(
            "no-shared-storage",
            True,
            f"{len(labelled)} cache tensors of {len(caches)} live requests: no shared bytes",
            (),
        )
    return TargetCheck(
        "no-shared-storage",
        False,
        f"{len(evidence)} pair(s) of cache tensors of different requests share memory",
        tuple(evidence),
    )


def _cache_length(module, work: _Workload) -> TargetCheck:
    shapes: dict[tuple[int, str], list[tuple[int, tuple[int, ...]]]] = {}
    steps_done = [0] * len(work.chunks)

    def record(rid, cache):
        steps_done[rid] += 1
        seen = work.tokens_seen(rid, steps_done[rid])
        for path, t in _leaves(cache):
            if t.dim() >= 2:
                shapes.setdefault((rid, path), []).append((seen, tuple(t.shape)))

    schedule = [[r] for _ in range(1 + DECODE_STEPS) for r in range(len(work.chunks))]
    _, caches = work.run_schedule(module, schedule, on_step=record)
    evidence = []
    for (rid, path), history in shapes.items():
        ndim = len(history[0][1])
        dims = set(range(ndim))
        for seen, shape in history:
            dims &= {d for d, size in enumerate(shape) if len(shape) == ndim and size == seen}
            if not dims:
                first_seen, first_shape = history[0]
                before = "" if seen == first_seen else f" (shape {list(first_shape)} after {first_seen})"
                evidence.append(
                    f"r{rid} {path}: shape {list(shape)} after {seen} tokens seen{before}; "
                    "no dimension tracks the tokens seen"
                )
                break
    if not shapes:
        return TargetCheck("cache-length", False, _no_tensors(caches, "tensor of 2 or more dimensions"), ())
    if not evidence:
        return TargetCheck(
            "cache-length", True, f"{len(shapes)} cache tensors: length equals tokens seen after every step", ()
        )
    return TargetCheck(
        "cache-length", False, f"{len(evidence)} cache tensor(s) whose length is not the tokens seen", tuple(evidence)
    )
