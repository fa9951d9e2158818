"""Result types of `kvtool repro` (torch-free frozen dataclasses; the JSON is derived from them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtool.core.jsonable import to_jsonable


@dataclass(frozen=True)
class Tolerance:
    """torch.allclose tolerances: |a - b| <= atol + rtol * |b| elementwise."""

    dtype: str
    rtol: float
    atol: float


@dataclass(frozen=True)
class CacheTensorInfo:
    """One cache tensor (or one head's view of it) held by one request at the end of a run."""

    request: int
    label: str  # "L0 k h2": layer 0, keys, head 2 (or the nesting path for a --target)
    data_ptr: int  # tensor.data_ptr(): address of its first element
    storage_ptr: int  # tensor.untyped_storage().data_ptr(): address of the whole allocation
    byte_start: int  # absolute address of the lowest byte the view can touch
    byte_end: int  # one past the highest byte (byte_start == byte_end for an empty tensor)
    shape: tuple[int, ...]
    expected_shape: tuple[int, ...]  # what a correct cache holds for the tokens this request has seen
    overlaps_with: tuple[str, ...]  # "r1 L0 k h2" for every other cache tensor sharing a byte with this one


@dataclass(frozen=True)
class ImplResult:
    """The checks of one implementation (buggy or fixed) of a scenario."""

    kind: str  # "buggy" or "fixed"
    detected: bool  # any check flagged this implementation
    allclose: bool  # every request's logits allclose to the same request run alone on a fresh model
    max_abs_diff: float  # largest |logit - reference logit| over requests and steps
    request_max_abs_diff: tuple[float, ...]  # the same, per request
    shared_storage: bool  # two different cache tensors (request/layer/head/k-v) share a byte
    shapes_ok: bool  # every cache tensor has its expected shape
    interleaving_mismatches: int  # seeded random interleavings in which some request differed from its run alone
    interleavings: int
    greedy_divergence_step: int | None  # first greedy decode step (1-based) whose token differs from the run alone
    greedy_steps: int  # greedy decode steps compared per request
    findings: tuple[str, ...]  # the evidence, one line each (empty when clean)
    cache_tensors: tuple[CacheTensorInfo, ...]


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    summary: str
    bug: str
    fix: str
    requests: int  # requests run together
    buggy: ImplResult
    fixed: ImplResult
    passed: bool  # buggy detected and fixed clean


@dataclass(frozen=True)
class TargetCheck:
    name: str  # determinism, isolation, consistency, no-shared-storage, no-aliasing, cache-length, batch
    passed: bool  # True for a skipped check (it found nothing wrong)
    message: str  # one line: what was checked and what was found
    evidence: tuple[str, ...]  # data_ptr / shape / position lines behind a failure, repeats collapsed with a count
    skipped: bool = False  # the check could not apply to this target (message says why)
    elapsed_s: float = 0.0  # wall time of the check


@dataclass(frozen=True)
class TargetResult:
    target: str  # "package.module:factory" or "hf:DIR"
    module_type: str
    d_model: int | None  # embeds protocol; None for token-id targets
    passed: bool
    checks: tuple[TargetCheck, ...]
    failed_checks: tuple[str, ...]
    protocol: str = "embeds"  # embeds, tokens or hf
    vocab_size: int | None = None  # token-id targets
    built: str = ""  # how the module was made ("random weights (seed 0) from .../config.json")
    workload: str = ""  # the requests: "r0 5+4, r1 8+4, ..." (prompt + decode positions)
    cache_notes: tuple[str, ...] = ()  # what kvtool found in a request's cache, and what it skipped and why
    interrupted: bool = False  # Ctrl-C: only the checks listed finished


@dataclass(frozen=True)
class ReproReport:
    device: str
    dtype: str
    seed: int
    tolerance: Tolerance
    interleavings: int
    scenarios: tuple[ScenarioResult, ...]  # empty with --target
    target: TargetResult | None
    passed: bool  # exit 0 when True
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtool repro --json`` object."""
        return to_jsonable(self)
