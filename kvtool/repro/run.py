"""The core entry point of `kvtool repro`: resolve device and dtype, run the scenarios or the target, time it."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kvtool.core.errors import UsageError
from kvtool.repro.checks import DTYPES, TOLERANCES, run_scenario
from kvtool.repro.defaults import MAX_INTERLEAVINGS, SCENARIO_INTERLEAVINGS, TARGET_INTERLEAVINGS
from kvtool.repro.hf import HF_CACHES
from kvtool.repro.results import ReproReport, ScenarioResult, TargetCheck, TargetResult
from kvtool.repro.scenarios import SCENARIO_NAMES
from kvtool.repro.target import check_target

MAX_SEED = 2**62  # torch.Generator takes a signed 64-bit seed; the workloads add small offsets to it
THREADS = 1  # tiny tensors: a second thread only adds synchronisation (measured: 7 s vs 125 s on a busy 2-core box)


def resolve_device(device: str | None, *, target: bool) -> str:
    """cuda when available for the scenarios (cpu for a target) unless asked; an error if cuda is absent."""
    if device is None:
        return "cuda" if (not target and torch.cuda.is_available()) else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device '{device}'; use cpu or cuda", where="--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda asked, but this torch {torch.__version__} sees no CUDA device",
            where="--device",
            tip="run with --device cpu, or install a CUDA build of torch on a machine with a GPU",
        )
    return device


def _validate(
    names: list[str] | None,
    *,
    dtype: str,
    seed: int,
    interleavings: int,
    target: str | None,
    d_model: int | None,
    hf_cache: str | None,
) -> None:
    """UsageError for the first bad option value."""
    if hf_cache is not None and hf_cache not in HF_CACHES:
        raise UsageError(f"unknown --hf-cache '{hf_cache}'; use dynamic or static", where="--hf-cache")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)}", where="--dtype")
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and {MAX_SEED}, got {seed}", where="--seed")
    if not 1 <= interleavings <= MAX_INTERLEAVINGS:
        raise UsageError(
            f"--interleavings must be between 1 and {MAX_INTERLEAVINGS:,}, got {interleavings:,}",
            where="--interleavings",
        )
    if d_model is not None and d_model <= 0:
        raise UsageError(f"--d-model must be positive, got {d_model}", where="--d-model")
    if target is not None and names:
        raise UsageError("give scenario names or --target, not both", where="--target")
    if target is None and d_model is not None:
        raise UsageError("--d-model only applies with --target", where="--d-model")
    if target is None and hf_cache is not None:
        raise UsageError("--hf-cache only applies with --target", where="--hf-cache")
    unknown = [n for n in names or [] if n not in SCENARIO_NAMES]
    if unknown:
        raise UsageError(
            f"unknown scenario '{unknown[0]}'", where="NAME", tip=f"scenarios: {', '.join(SCENARIO_NAMES)}"
        )


def run_repro(
    names: list[str] | None = None,
    *,
    device: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    interleavings: int | None = None,
    target: str | None = None,
    d_model: int | None = None,
    hf_cache: str | None = None,
    progress: Callable[[str], None] | None = None,
    on_check: Callable[[TargetCheck], None] | None = None,
) -> ReproReport:
    """Run the named scenarios (all when empty), or with ``target`` only the target's checks.

    ``progress`` is called with a short description before each scenario (for a status line on stderr);
    ``on_check`` with each target check as it finishes.  ``interleavings`` defaults to 200 for the scenarios
    and 10 for a target, and is at most MAX_INTERLEAVINGS (10,000).
    """
    if interleavings is None:
        interleavings = SCENARIO_INTERLEAVINGS if target is None else TARGET_INTERLEAVINGS
    _validate(
        names, dtype=dtype, seed=seed, interleavings=interleavings, target=target, d_model=d_model, hf_cache=hf_cache
    )
    dev = resolve_device(device, target=target is not None)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, THREADS))
    start = time.perf_counter()
    scenarios: tuple[ScenarioResult, ...] = ()
    result: TargetResult | None = None
    try:
        if target is not None:
            if progress is not None:
                progress(f"checking {target}")
            result = check_target(
                target,
                d_model=d_model,
                device=dev,
                dtype=dtype,
                seed=seed,
                interleavings=interleavings,
                hf_cache=hf_cache,
                on_check=on_check,
            )
            passed = result.passed
        else:
            chosen = list(dict.fromkeys(names)) if names else list(SCENARIO_NAMES)
            runs: list[ScenarioResult] = []
            for i, name in enumerate(chosen):
                if progress is not None:
                    progress(f"scenario {i + 1}/{len(chosen)}: {name}")
                runs.append(run_scenario(name, seed=seed, dtype=dtype, device=dev, interleavings=interleavings))
            scenarios = tuple(runs)
            passed = all(s.passed for s in scenarios)
    finally:
        torch.set_num_threads(threads)
    return ReproReport(
        device=dev,
        dtype=dtype,
        seed=seed,
        tolerance=TOLERANCES[dtype],
        interleavings=interleavings,
        scenarios=scenarios,
        target=result,
        passed=passed,
        elapsed_s=round(time.perf_counter() - start, 3),
    )
