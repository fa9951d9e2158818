"""Fit the reserve's coefficients on one half of the real vLLM start-up logs and measure the other half.

The cases are tests/data/gpu-logs/*/case.yaml, sorted by name; the fitting half is every other one from the first
(0, 2, 4 ...), the held-out half the rest.  Fitted per release group of kvtool/estimate/reserve.py:

- the sampler's torch-sort bytes per logit (releases before 0.17.0): least squares through the origin of each
  logged activation peak over requests x vocabulary, on the fitting half's cases with a config.json whose sampler
  term exceeds its forward term and that kvtool can run from scratch (``from_scratch`` not false: no vision encoder);
- non-torch memory at TP 1 and at TP x PP > 1: the median of the fitting half's logged non-torch figures.

Then it prints, for the held-out half and for all cases kvtool can run from scratch, the error of the KV budget
per GPU (GiB) and of the token count (% of the count at the logged budget), each case under its own
``--vllm-version``, and the logged non-torch / activation figures of the held-out half against the fitted terms.
The fitted figures are what reserve.py's tables hold (a row whose value differs is reported).

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
from kvtool.estimate.estimator import estimate  # noqa: E402
from kvtool.estimate.hf_config import load_config_path, parse_config  # noqa: E402
from kvtool.estimate.request import EstimateRequest  # noqa: E402
from kvtool.estimate.serve_defaults import serve_batch_defaults  # noqa: E402
from kvtool.estimate.vllm_versions import pick, version_key  # noqa: E402

LOGS = ROOT / "tests" / "data" / "gpu-logs"
GIB = 1024**3
# cases kept off from_scratch only because the log prints no device total, run here with the GPU profile's total
# (their case.yaml says so): the one check of a release after 0.17 (Triton sampler, CUDA graphs subtracted)
PROFILE_TOTAL = {"qwen3-14b-l40s-v0.28.0": "l40s"}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    data: dict
    fitting: bool  # in the fitting half

    @property
    def logged(self) -> dict:
        return self.data["logged"]

    @property
    def has_config(self) -> bool:
        return (LOGS / self.name / "config.json").is_file()

    @property
    def from_scratch(self) -> bool:
        return bool(self.data.get("from_scratch", True)) and self.has_config


def cases() -> list[Case]:
    names = sorted(p.parent.name for p in LOGS.glob("*/case.yaml"))
    return [
        Case(n, yaml.safe_load((LOGS / n / "case.yaml").read_text(encoding="utf-8")), i % 2 == 0)
        for i, n in enumerate(names)
    ]


def _requests(case: Case) -> int:
    engine = case.data.get("engine_args") or {}
    serve = serve_batch_defaults(int(case.data["gpu_memory_gib"] * GIB), "H100", str(case.data["vllm_version"]))
    tokens = engine.get("max_num_batched_tokens") or serve.max_num_batched_tokens
    seqs = engine.get("max_num_seqs") or serve.max_num_seqs
    return min(tokens, seqs)


def fit_sort_bytes_per_logit(fitting: list[Case]) -> tuple[float, list[str]]:
    """Least squares through the origin: activation = b x requests x vocab."""
    xs, ys, used = [], [], []
    for case in fitting:
        version = str(case.data["vllm_version"])
        if not (case.from_scratch and "activation_gib" in case.logged) or version_key(version) >= (0, 17):
            continue
        data, path = load_config_path(LOGS / case.name / "config.json")
        spec = parse_config(data, where=str(path))
        xs.append(_requests(case) * (spec.vocab_size or 32_000))
        ys.append(case.logged["activation_gib"] * GIB)
        used.append(case.name)
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs), used


def fit_non_torch(fitting: list[Case]) -> tuple[float | None, list[str], float | None, list[str]]:
    one, many, one_used, many_used = [], [], [], []
    for case in fitting:
        if "non_torch_gib" not in case.logged:
            continue
        gpus = int(case.data.get("tp", 1)) * int(case.data.get("pp", 1))
        (one if gpus == 1 else many).append(case.logged["non_torch_gib"])
        (one_used if gpus == 1 else many_used).append(case.name)
    return (
        statistics.median(one) if one else None,
        one_used,
        statistics.median(many) if many else None,
        many_used,
    )


def _request(case: Case, **extra: object) -> EstimateRequest:
    d = case.data
    return EstimateRequest(
        config=str(LOGS / case.name),
        seq_lens=(int(d["seq_len"]),),
        block_size=int(d.get("block_size", 16)),
        tp=int(d.get("tp", 1)),
        pp=int(d.get("pp", 1)),
        kv_dtype=d.get("kv_dtype") or "auto",
        vllm_version=str(d["vllm_version"]),
        **extra,  # type: ignore[arg-type]
    )


def errors(case: Case) -> tuple[float, float]:
    """(budget error GiB, token error fraction) of the estimate from scratch."""
    d = case.data
    where = (
        {"gpu": PROFILE_TOTAL[case.name]} if case.name in PROFILE_TOTAL else {"gpu_memory": f"{d['gpu_memory_gib']}GiB"}
    )
    scratch = estimate(_request(case, gpu_memory_utilization=float(d.get("gpu_memory_utilization", 0.9)), **where))
    given = estimate(_request(case, kv_memory=f"{case.logged['kv_gib']}GiB"))
    assert scratch.kv_budget_bytes is not None and scratch.kv_cache_tokens and given.kv_cache_tokens
    budget_error = scratch.kv_budget_bytes / GIB - case.logged["kv_gib"]
    return budget_error, (scratch.kv_cache_tokens - given.kv_cache_tokens) / given.kv_cache_tokens


def _report(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title} ({len(rows)} cases)")
    for name, gib, frac in rows:
        print(f"  {name:40s} budget {gib:+.3f} GiB   tokens {100 * frac:+.2f} %")
    if rows:
        gibs, fracs = [abs(r[1]) for r in rows], [abs(r[2]) for r in rows]
        print(
            f"  median |budget| {statistics.median(gibs):.3f} GiB, max {max(gibs):.3f} GiB; "
            f"median |tokens| {100 * statistics.median(fracs):.2f} %, max {100 * max(fracs):.2f} %"
        )


def main() -> int:
    every = cases()
    fitting = [c for c in every if c.fitting]
    held = [c for c in every if not c.fitting]
    print("fitting half:", ", ".join(c.name for c in fitting))
    print("held-out half:", ", ".join(c.name for c in held))

    sort_b, sort_used = fit_sort_bytes_per_logit(fitting)
    nt1, nt1_used, ntn, ntn_used = fit_non_torch(fitting)
    print(f"\nsampler torch-sort bytes per logit (< 0.17.0): {sort_b:.2f}  (fitted on {', '.join(sort_used)})")
    print(f"non-torch TP 1: {nt1} GiB (fitted on {', '.join(nt1_used) or 'none'})")
    print(f"non-torch TP x PP > 1: {ntn} GiB (fitted on {', '.join(ntn_used) or 'none'})")

    table_sort = pick(reserve.SAMPLER_RULES, "0.10.0").bytes_per_logit
    table_nt = pick(reserve.NON_TORCH_RULES, "0.10.0")
    print(
        f"reserve.py holds: {table_sort} B/logit, non-torch {table_nt.tp1_bytes / GIB:.2f} / "
        f"{table_nt.tp_bytes / GIB:.2f} GiB"
    )
    if round(sort_b, 1) != table_sort or (nt1 is not None and abs(table_nt.tp1_bytes / GIB - nt1) > 0.005):
        print("  (the table differs from this fit: update kvtool/estimate/reserve.py)")
    if ntn is not None and abs(table_nt.tp_bytes / GIB - ntn) > 0.005:
        print("  (the TP > 1 row differs from this fit: update kvtool/estimate/reserve.py)")

    print("\nheld-out logged terms against the fitted ones:")
    for case in held:
        if "non_torch_gib" in case.logged:
            gpus = int(case.data.get("tp", 1)) * int(case.data.get("pp", 1))
            fitted = nt1 if gpus == 1 else ntn
            print(f"  {case.name:40s} non-torch logged {case.logged['non_torch_gib']:.2f} GiB, fitted {fitted} GiB")

    _report("held-out, from scratch", [(c.name, *errors(c)) for c in held if c.from_scratch])
    _report("all, from scratch", [(c.name, *errors(c)) for c in every if c.from_scratch])
    extra = [c for c in every if c.name in PROFILE_TOTAL]
    _report("GPU total from the profile (not logged)", [(c.name, *errors(c)) for c in extra])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
