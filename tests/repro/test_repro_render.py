"""The `kvtool repro` renderer against a reviewed golden file (a hand-built report, so addresses are fixed)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from kvtool.core.jsonable import to_jsonable
from kvtool.repro.render import render_report
from kvtool.repro.results import (
    CacheTensorInfo,
    ImplResult,
    ReproReport,
    ScenarioResult,
    TargetCheck,
    TargetResult,
    Tolerance,
)
from tests.support import DATA

GOLDEN = DATA / "repro" / "render_golden.txt"


def _infos(shared: bool) -> tuple[CacheTensorInfo, ...]:
    # Two requests, one layer, keys only, two heads of 4 floats x 3 tokens (48 bytes per head).
    infos = []
    for rid in range(2):
        base = 0x1000 if shared else 0x1000 + rid * 0x100
        for h in range(2):
            start = base + h * 48
            others = tuple(f"r{1 - rid} L0 k h{h}" for _ in [0] if shared)
            infos.append(CacheTensorInfo(rid, f"L0 k h{h}", start, base, start, start + 48, (3, 4), (3, 4), others))
    return tuple(infos)


def _impl(kind: str, bad: bool) -> ImplResult:
    return ImplResult(
        kind=kind,
        detected=bad,
        allclose=not bad,
        max_abs_diff=0.25 if bad else 1e-7,
        request_max_abs_diff=(0.25, 0.125) if bad else (1e-7, 0.0),
        shared_storage=bad,
        shapes_ok=True,
        interleaving_mismatches=5 if bad else 0,
        interleavings=5,
        greedy_divergence_step=2 if bad else None,
        greedy_steps=10,
        findings=("r0 L0 k and r1 L0 k share memory",) if bad else (),
        cache_tensors=_infos(bad),
    )


def _report() -> ReproReport:
    buggy, fixed = _impl("buggy", True), _impl("fixed", False)
    scenario = ScenarioResult("example", "an example scenario", "the bug line", "the fix line", 2, buggy, fixed, True)
    target = TargetResult(
        "pkg.mod:make",
        "Attn",
        16,
        False,
        (
            TargetCheck("determinism", True, "identical", ()),
            TargetCheck("isolation", False, "forward raised RuntimeError: [bad] shape", ("evidence [1, 2]",)),
        ),
        ("isolation",),
    )
    return ReproReport("cpu", "float32", 0, Tolerance("float32", 1e-4, 1e-5), 5, (scenario,), target, False, 1.5)


def test_render_matches_golden():
    out = io.StringIO()
    render_report(_report(), Console(file=out, width=140, color_system=None, soft_wrap=False), verbose=True)
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_json_is_derived_from_the_same_dataclasses():
    data = json.loads(json.dumps(to_jsonable(_report())))
    s = data["scenarios"][0]
    assert s["buggy"]["detected"] is True and s["fixed"]["shared_storage"] is False
    assert s["buggy"]["cache_tensors"][0]["overlaps_with"] == ["r1 L0 k h0"]
    assert data["target"]["failed_checks"] == ["isolation"]


def test_addresses_stay_whole_on_a_narrow_terminal():
    # Real heap addresses are 14 characters; at 80 columns rich used to cut them to "0x55a55…",
    # which hid the very evidence (equal data_ptr) the article diagnosed the bug with.
    from dataclasses import replace

    report = _report()
    scenario = report.scenarios[0]
    big = 0x55A55C0A3600

    def real(impl):
        infos = tuple(
            replace(i, data_ptr=i.data_ptr + big, storage_ptr=i.storage_ptr + big) for i in impl.cache_tensors
        )
        return replace(impl, cache_tensors=infos)

    report = replace(report, scenarios=(replace(scenario, buggy=real(scenario.buggy), fixed=real(scenario.fixed)),))
    out = io.StringIO()
    render_report(report, Console(file=out, width=80, color_system=None, soft_wrap=False), verbose=True)
    assert "…" not in out.getvalue()
    # the table is split into parts that repeat the tensor column: each address stays whole on one line
    words = out.getvalue().split()
    assert f"{big + 0x1000:#x}" in words  # r0's buggy data_ptr


def _text(report: ReproReport, **kwargs) -> str:
    out = io.StringIO()
    render_report(report, Console(file=out, width=140, color_system=None, soft_wrap=False), **kwargs)
    return out.getvalue()


def test_the_default_report_is_the_verdict_the_summary_and_what_failed():
    # Issue 24: `kvtool repro` printed about 470 lines by default.  A passed scenario is now one summary row and a
    # passed target check one line; a failed scenario keeps its tables and findings, a failed check its evidence.
    from dataclasses import replace

    report = _report()
    ok = report.scenarios[0]
    broken = replace(ok, name="broken", bug="the broken bug line", fixed=_impl("fixed", True), passed=False)
    checks = (TargetCheck("determinism", True, "identical", ("seed 0 and seed 0: equal",)), *report.target.checks)
    report = replace(report, scenarios=(ok, broken), target=replace(report.target, checks=checks))
    short, full = _text(report), _text(report, verbose=True)
    assert short.splitlines()[0] == (
        "kvtool repro: FAILED: 1 of 2 scenarios passed (buggy detected, fixed clean); failed: broken; "
        "target pkg.mod:make: 2 of 3 checks passed; failed: isolation"
    )
    assert "the broken bug line" in short and "cache tensors per request" in short  # what failed, in full
    assert "the bug line" not in short.replace("the broken bug line", "")  # the passed scenario: its summary row
    assert "example" in short and "|logit diff| 0.25; shared memory; 5/5 interleavings; greedy step 2" in short
    assert "evidence [1, 2]" in short and "seed 0 and seed 0: equal" not in short
    assert "--verbose" in short and short.rstrip().endswith("took 1.5 s; FAILED")
    assert "the bug line" in full and "seed 0 and seed 0: equal" in full and "--verbose" not in full
    assert len(short.splitlines()) < len(full.splitlines())
