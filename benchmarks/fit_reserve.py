"""Fit the reserve's coefficients on one half of the real vLLM start-up logs and measure the other half.

The cases are tests/data/gpu-logs/*/case.yaml, sorted by name; the fitting half is every other one from the first
(0, 2, 4 ...), the held-out half the rest.  Fitted, per release group of kvtool/estimate/reserve.py, from the terms
the logs print (the DEBUG "Memory profiling takes" line, the 0.10.2+ "--kv-cache-memory" suggestion line):

- the sampler's bytes per logit: least squares through the origin of the logged torch peak, less what the model
  puts beside the sampler (0.17+: two resident hidden-state copies; 0.13+: the fused-MoE workspace), over requests x
  vocabulary; the torch-sort path before 0.17.0, the Triton path from it;
- non-torch memory at TP 1, TP > 1 and PP alone: the medians of the logged figures, before and from 0.19.0;
- the CUDA-graph pool that 0.20.0+ subtracts: the medians of the "estimated CUDA graph memory" that 0.18/0.19 logs
  print (estimated there, not subtracted) at max_num_seqs 1024, for dense TP 1, MoE TP 1 and TP > 1.

Only cases kvtool can run from scratch take part (a config.json, ``from_scratch`` not false).  Then it prints, for
the held-out half and for all such cases, the error of the KV budget per GPU (GiB) and of the token count (% of the
count at the logged budget), each case under its own ``--vllm-version`` and engine arguments, and whether the tables
in reserve.py hold the fitted figures (the held-out error means something only if they do).

Run from the repository root:  python benchmarks/fit_reserve.py
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtool.estimate import reserve  # noqa: E402
from kvtool.estimate.dtypes import model_dtype_bytes  # noqa: E402
from kvtool.estimate.estimator import estimate  # noqa: E402
from kvtool.estimate.hf_config import ModelSpec, load_config_path, parse_config  # noqa: E402
from kvtool.estimate.model_runner import default_runner  # noqa: E402
from kvtool.estimate.request import EstimateRequest  # noqa: E402
from kvtool.estimate.serve_defaults import serve_batch_defaults  # noqa: E402
from kvtool.estimate.vllm_versions import pick, version_key  # noqa: E402

LOGS = ROOT / "tests" / "data" / "gpu-logs"
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    data: dict
    fitting: bool  # in the fitting half

    @property
    def logged(self) -> dict:
        return self.data["logged"]

    @property
    def version(self) -> str:
        return str(self.data["vllm_version"])

    @property
    def gpus(self) -> tuple[int, int]:
        return int(self.data.get("tp", 1)), int(self.data.get("pp", 1))

    @property
    def usable(self) -> bool:
        d = self.data
        return (
            (LOGS / self.name / "config.json").is_file()
            and bool(d.get("from_scratch", True))
            and not d.get("sizing_not_modelled")
            and bool(d.get("gpu_memory_gib") or d.get("gpu_profile"))
        )

    def spec(self) -> ModelSpec:
        data, path = load_config_path(LOGS / self.name / "config.json")
        return parse_config(data, where=str(path))

    def engine(self) -> dict:
        return self.data.get("engine_args") or {}


def cases() -> list[Case]:
    names = sorted(p.parent.name for p in LOGS.glob("*/case.yaml"))
    return [
        Case(n, yaml.safe_load((LOGS / n / "case.yaml").read_text(encoding="utf-8")), i % 2 == 0)
        for i, n in enumerate(names)
    ]


def _scheduler(case: Case) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as the case ran."""
    gib = case.data.get("gpu_memory_gib") or 80
    serve = serve_batch_defaults(int(gib * GIB), case.data.get("gpu_profile") or "H100", case.version)
    engine = case.engine()
    return (
        int(engine.get("max_num_batched_tokens") or serve.max_num_batched_tokens),
        int(engine.get("max_num_seqs") or serve.max_num_seqs),
    )


def _multimodal(case: Case) -> bool:
    import json

    data = json.loads((LOGS / case.name / "config.json").read_text(encoding="utf-8"))
    return isinstance(data.get("vision_config"), dict) or isinstance(data.get("audio_config"), dict)


def _fit_through_origin(points: list[tuple[float, float]]) -> float | None:
    if not points:
        return None
    return sum(x * y for x, y in points) / sum(x * x for x, _ in points)


def fit_sampler(fitting: list[Case], triton: bool) -> tuple[float | None, list[str]]:
    """Bytes per logit of the sort path (before 0.17) or the Triton path (0.17 on), on the last stage."""
    points, used = [], []
    for case in fitting:
        if not (case.usable and "activation_gib" in case.logged) or case.gpus[1] > 1:
            continue
        if (version_key(case.version) >= (0, 17)) != triton:
            continue
        if _multimodal(case):
            continue  # its peak holds the encoder's profiling run too (kvtool.estimate.multimodal)
        spec = case.spec()
        if default_runner(spec, case.version).runner != "V1":
            continue  # Model Runner V2 profiles its own sampler (kvtool.estimate.model_runner)
        tokens, seqs = _scheduler(case)
        requests = min(tokens, seqs)
        tp = case.gpus[0]
        rest = reserve.moe_workspace_bytes(spec, tokens, tp, case.version)
        if triton:
            rest += 2 * tokens * (spec.hidden_size or 0) * model_dtype_bytes(spec.dtype)
        points.append((requests * (spec.vocab_size or 32_000), case.logged["activation_gib"] * GIB - rest))
        used.append(case.name)
    return _fit_through_origin(points), used


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fit_non_torch(fitting: list[Case], since_0_19: bool) -> dict[str, tuple[float | None, list[str]]]:
    groups: dict[str, list[tuple[float, str]]] = {"tp1": [], "tp": [], "pp_only": []}
    for case in fitting:
        if "non_torch_gib" not in case.logged or (version_key(case.version) >= (0, 19)) != since_0_19:
            continue
        tp, pp = case.gpus
        key = "tp1" if tp * pp == 1 else "pp_only" if tp == 1 else "tp"
        groups[key].append((case.logged["non_torch_gib"], case.name))
    return {k: (_median([v for v, _ in rows]), [n for _, n in rows]) for k, rows in groups.items()}


def fit_cudagraphs(fitting: list[Case]) -> dict[str, tuple[float | None, list[str]]]:
    """Medians of vLLM's own "Estimated CUDA graph memory" (0.18 on), scaled to 512 capture sizes by the rule's
    fixed share, per kind: dense TP 1, MoE TP 1, TP > 1."""
    rule = pick(reserve.CUDAGRAPH_RULES, "0.20.0")
    groups: dict[str, list[tuple[float, str]]] = {"dense": [], "moe": [], "tp": []}
    for case in fitting:
        if "cudagraph_estimate_gib" not in case.logged or version_key(case.version) < (0, 18):
            continue
        if not (LOGS / case.name / "config.json").is_file() or case.gpus[1] > 1:
            continue
        share = rule.fixed_share + (1 - rule.fixed_share) * min(2 * _scheduler(case)[1], 512) / 512
        key = "tp" if case.gpus[0] > 1 else "moe" if case.spec().num_experts else "dense"
        groups[key].append((case.logged["cudagraph_estimate_gib"] / share, case.name))
    return {k: (_median([v for v, _ in rows]), [n for _, n in rows]) for k, rows in groups.items()}


def _request(case: Case, **extra: object) -> EstimateRequest:
    d = case.data
    engine = case.engine()
    flags: dict[str, object] = {}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if engine.get(key):
            flags[key] = int(engine[key])
    if engine.get("dtype"):
        flags["dtype"] = str(engine["dtype"])
    if engine.get("quantization") in ("fp8", "bitsandbytes"):
        flags["quantization"] = engine["quantization"]
    for key in ("enforce_eager", "async_scheduling"):
        if key in engine:
            flags[key] = bool(engine[key])
    if "enable_prefix_caching" in engine:
        flags["prefix_caching"] = bool(engine["enable_prefix_caching"])
    return EstimateRequest(
        config=str(LOGS / case.name),
        seq_lens=(int(d["seq_len"]),),
        block_size=int(d.get("block_size", 16)),
        tp=case.gpus[0],
        pp=case.gpus[1],
        kv_dtype=d.get("kv_dtype") or "auto",
        vllm_version=case.version,
        **flags,  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


def errors(case: Case) -> tuple[float, float | None]:
    """(budget error GiB, token error fraction or None) of the estimate from scratch."""
    d = case.data
    where: dict[str, object] = (
        {"gpu_memory": f"{d['gpu_memory_gib']}GiB"} if d.get("gpu_memory_gib") else {"gpu": d["gpu_profile"]}
    )
    scratch = estimate(_request(case, gpu_memory_utilization=float(d.get("gpu_memory_utilization", 0.9)), **where))
    assert scratch.kv_budget_bytes is not None and scratch.kv_cache_tokens
    stage = d.get("logged_stage")
    budget = scratch.stages[stage].kv_budget_bytes if stage is not None else scratch.kv_budget_bytes
    budget_error = budget / GIB - case.logged["kv_gib"]
    if stage is not None:
        return budget_error, None  # the pool is the least stage's; the log gives one stage's budget
    given = estimate(_request(case, kv_memory=f"{case.logged['kv_gib']}GiB"))
    assert given.kv_cache_tokens
    return budget_error, (scratch.kv_cache_tokens - given.kv_cache_tokens) / given.kv_cache_tokens


def _report(title: str, rows: list[tuple[str, str, float, float | None]]) -> None:
    print(f"\n{title} ({len(rows)} cases)")
    for name, version, gib, frac in rows:
        tokens = "" if frac is None else f"   tokens {100 * frac:+.2f} %"
        print(f"  {name:48s} {version:8s} budget {gib:+.3f} GiB{tokens}")
    if rows:
        gibs = [abs(r[2]) for r in rows]
        fracs = [abs(r[3]) for r in rows if r[3] is not None]
        print(
            f"  median |budget| {statistics.median(gibs):.3f} GiB, max {max(gibs):.3f} GiB; "
            f"median |tokens| {100 * statistics.median(fracs):.2f} %, max {100 * max(fracs):.2f} %"
        )


def _say(label: str, fitted: float | None, used: list[str], table: float, unit: str) -> bool:
    if fitted is None:
        print(f"{label}: no case in the fitting half; the table holds {table:g} {unit}")
        return True
    same = abs(fitted - table) <= (0.05 if unit == "B/logit" else 0.005)
    print(
        f"{label}: {fitted:.2f} {unit} (fitted on {', '.join(used)}); the table holds {table:g}"
        + ("" if same else "  <- DIFFERS")
    )
    return same


def main() -> int:
    every = cases()
    fitting = [c for c in every if c.fitting]
    held = [c for c in every if not c.fitting]
    print("fitting half:", ", ".join(c.name for c in fitting if c.usable))
    print("held-out half:", ", ".join(c.name for c in held if c.usable))
    print()
    ok = True
    sort_b, used = fit_sampler(fitting, triton=False)
    ok &= _say(
        "sampler, torch sort (< 0.17.0)", sort_b, used, pick(reserve.SAMPLER_RULES, "0.10.0").bytes_per_logit, "B/logit"
    )
    tri_b, used = fit_sampler(fitting, triton=True)
    ok &= _say(
        "sampler, Triton (0.17.0 on)", tri_b, used, pick(reserve.SAMPLER_RULES, "0.19.0").bytes_per_logit, "B/logit"
    )
    for since_0_19, release in ((False, "0.10.0"), (True, "0.19.0")):
        row = pick(reserve.NON_TORCH_RULES, release)
        fits = fit_non_torch(fitting, since_0_19)
        span = "0.19.0 on" if since_0_19 else "before 0.19.0"
        ok &= _say(f"non-torch TP 1 ({span})", *fits["tp1"], row.tp1_bytes / GIB, "GiB")
        ok &= _say(f"non-torch TP > 1 ({span})", *fits["tp"], row.tp_bytes / GIB, "GiB")
        pp_table = (row.pp_only_bytes if row.pp_only_bytes is not None else row.tp_bytes) / GIB
        ok &= _say(f"non-torch PP alone ({span})", *fits["pp_only"], pp_table, "GiB")
    graphs = pick(reserve.CUDAGRAPH_RULES, "0.20.0")
    fits = fit_cudagraphs(fitting)
    ok &= _say("CUDA graphs, dense TP 1 (0.20.0 on)", *fits["dense"], graphs.estimate_bytes / GIB, "GiB")
    ok &= _say("CUDA graphs, MoE TP 1 (0.20.0 on)", *fits["moe"], graphs.moe_estimate_bytes / GIB, "GiB")
    ok &= _say("CUDA graphs, TP > 1 (0.20.0 on)", *fits["tp"], graphs.multi_gpu_estimate_bytes / GIB, "GiB")
    if not ok:
        print(
            "  (a table differs from this fit: update kvtool/estimate/reserve.py, or the held-out error is not held out)"
        )

    _report("held-out half, from scratch", [(c.name, c.version, *errors(c)) for c in held if c.usable])
    _report("fitting half, from scratch", [(c.name, c.version, *errors(c)) for c in fitting if c.usable])
    _report("all, from scratch", [(c.name, c.version, *errors(c)) for c in every if c.usable])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
