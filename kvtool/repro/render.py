"""Rendering of `kvtool repro` results: rich tables (JSON comes from the same dataclasses via print_json)."""

from __future__ import annotations

from kvtool.repro.results import CacheTensorInfo, ImplResult, ReproReport, ScenarioResult, TargetCheck, TargetResult
from kvtool.repro.scenarios import SCENARIOS


def render_list(console) -> None:
    from kvtool.core.render import new_table

    table = new_table(title="kvtool repro scenarios", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("what it replays")
    for info in SCENARIOS:
        table.add_row(info.name, info.summary)
    console.print(table)


def render_report(report: ReproReport, console, *, streamed: bool = False, verbose: bool = False) -> None:
    """The verdict first, then the summary and the evidence of what failed; ``verbose``: every table.

    ``streamed``: the target's check lines were already printed as they finished.  By default a scenario that
    passed is one row of the summary, and a target check that passed one line; a failed one keeps its tables,
    findings and evidence, what a user needs to act on.  ``verbose`` shows every scenario's tables and findings.
    """
    tol = report.tolerance
    console.print(_answer(report), highlight=False, soft_wrap=True)
    console.print(
        f"device {report.device}, dtype {report.dtype} (torch.allclose rtol {tol.rtol:g}, atol {tol.atol:g}), "
        f"seed {report.seed}, {report.interleavings} interleavings",
        highlight=False,
        soft_wrap=True,
    )
    shown = [s for s in report.scenarios if verbose or not s.passed]
    for scenario in shown:
        _render_scenario(scenario, console)
    if report.scenarios:
        _render_summary(report, console)
    if report.target is not None:
        _render_target(report.target, console, streamed, verbose)
    hidden_evidence = report.target is not None and any(c.evidence and c.passed for c in report.target.checks)
    if not verbose and (len(shown) < len(report.scenarios) or hidden_evidence):
        console.print("Every table, finding and piece of evidence: --verbose; all of it as JSON: --json", style="dim")
    console.print(f"took {report.elapsed_s:.1f} s; {'PASSED' if report.passed else 'FAILED'}", highlight=False)


def _answer(report: ReproReport) -> str:
    """The first line: did every buggy version get caught and every fixed one stay clean."""
    parts = []
    if report.scenarios:
        passed = sum(s.passed for s in report.scenarios)
        failed = [s.name for s in report.scenarios if not s.passed]
        parts.append(
            f"{passed} of {len(report.scenarios)} scenarios passed (buggy detected, fixed clean)"
            + (f"; failed: {', '.join(failed)}" if failed else "")
        )
    if report.target is not None:
        t = report.target
        checks = sum(c.passed and not c.skipped for c in t.checks)
        parts.append(
            f"target {t.target}: {checks} of {len(t.checks)} checks passed"
            + (f"; failed: {', '.join(t.failed_checks)}" if t.failed_checks else "")
        )
    return f"kvtool repro: {'PASSED' if report.passed else 'FAILED'}: " + "; ".join(parts)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _verdict(impl: ImplResult) -> str:
    if impl.kind == "buggy":
        return "[green]detected[/]" if impl.detected else "[red]NOT DETECTED[/]"
    return "[red]FLAGGED[/]" if impl.detected else "[green]clean[/]"


def _render_scenario(s: ScenarioResult, console) -> None:
    from kvtool.core.render import new_table

    b, f = s.buggy, s.fixed
    console.print(f"\n[bold]{s.name}[/]: {s.summary}", highlight=False)
    table = new_table()
    table.add_column("check")
    table.add_column("buggy", justify="right")
    table.add_column("fixed", justify="right")
    table.add_row("allclose to each request alone", _yes_no(b.allclose), _yes_no(f.allclose))
    table.add_row("max |logit diff|", f"{b.max_abs_diff:.3g}", f"{f.max_abs_diff:.3g}")
    table.add_row("cache tensors share memory", _yes_no(b.shared_storage), _yes_no(f.shared_storage))
    table.add_row("cache shapes as expected", _yes_no(b.shapes_ok), _yes_no(f.shapes_ok))
    table.add_row(
        "interleavings mismatched",
        f"{b.interleaving_mismatches}/{b.interleavings}",
        f"{f.interleaving_mismatches}/{f.interleavings}",
    )
    table.add_row(
        f"greedy diverges at step (of {b.greedy_steps})",
        _step(b.greedy_divergence_step),
        _step(f.greedy_divergence_step),
    )
    table.add_row("verdict", _verdict(b), _verdict(f))
    console.print(table)
    console.print(_tensor_table(b, f))
    console.print(f"  bug: {s.bug}", highlight=False)
    console.print(f"  fix: {s.fix}", highlight=False)
    for impl in (b, f):
        for line in impl.findings:
            console.print(f"  {impl.kind}: {line}", highlight=False, markup=False)


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)


def _grouped(infos: tuple[CacheTensorInfo, ...]) -> dict[str, list[CacheTensorInfo]]:
    """Per-head infos grouped by request + tensor ("r0 L0 k")."""
    groups: dict[str, list[CacheTensorInfo]] = {}
    for info in infos:
        base = f"r{info.request} {info.label.rsplit(' h', 1)[0]}"
        groups.setdefault(base, []).append(info)
    return groups


def _tensor_cells(heads: list[CacheTensorInfo] | None) -> tuple[str, str, str]:
    if not heads:
        return ("-", "-", "-")
    first = heads[0]
    ptrs = f"{first.data_ptr:#x}"
    if len(heads) > 1:
        ptrs += f" (h+{heads[1].data_ptr - first.data_ptr} B)"
    shape = "x".join(map(str, first.shape))
    if first.shape != first.expected_shape:
        shape = f"[red]{shape}[/] (want {'x'.join(map(str, first.expected_shape))})"
    others = sorted({o.rsplit(" h", 1)[0] for h in heads for o in h.overlaps_with})
    label = first.label.rsplit(" h", 1)[0]
    own = f"r{first.request} {label}"
    shared = ", ".join("own heads" if o == own else o for o in others)
    return ptrs, shape, f"[red]{shared}[/]" if shared else "none"


def _tensor_table(b: ImplResult, f: ImplResult):
    from kvtool.core.render import new_table

    table = new_table(title="cache tensors per request / layer (per-head views inside)", title_justify="left")
    table.add_column("tensor")
    for side in ("buggy", "fixed"):
        table.add_column(f"{side} data_ptr", overflow="fold")  # never an ellipsis inside an address
        table.add_column("per-head shape")
        table.add_column("shares memory with")
    gb, gf = _grouped(b.cache_tensors), _grouped(f.cache_tensors)
    for base in dict.fromkeys([*gb, *gf]):
        table.add_row(base, *_tensor_cells(gb.get(base)), *_tensor_cells(gf.get(base)))
    return table


def _render_summary(report: ReproReport, console) -> None:
    from kvtool.core.render import new_table

    table = new_table(title="summary", title_justify="left", title_style="bold")
    table.add_column("scenario")
    table.add_column("buggy")
    table.add_column("fixed")
    table.add_column("result")
    table.add_column("buggy: what differed")
    for s in report.scenarios:
        result = "[green]ok[/]" if s.passed else "[red]FAIL[/]"
        table.add_row(s.name, _verdict(s.buggy), _verdict(s.fixed), result, _evidence(s.buggy))
    console.print(table)
    passed = sum(s.passed for s in report.scenarios)
    console.print(
        f"{passed} of {len(report.scenarios)} scenarios: buggy version detected and fixed version clean",
        highlight=False,
    )


def _evidence(impl: ImplResult) -> str:
    """The checks that fired, in a few words: '|logit diff| 0.435; shared memory; 200/200 interleavings'."""
    seen = [] if impl.allclose else [f"|logit diff| {impl.max_abs_diff:.3g}"]
    seen += ["shared memory"] if impl.shared_storage else []
    seen += [] if impl.shapes_ok else ["cache shapes"]
    if impl.interleaving_mismatches:
        seen.append(f"{impl.interleaving_mismatches}/{impl.interleavings} interleavings")
    if impl.greedy_divergence_step is not None:
        seen.append(f"greedy step {impl.greedy_divergence_step}")
    return "; ".join(seen) or "nothing"


_STATUS = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]skip[/]"}


def render_check(c: TargetCheck, console, *, verbose: bool = True) -> None:
    """One target check: a status line, then its evidence (repeats already collapsed); without ``verbose`` the
    evidence of a failed check only."""
    from rich.markup import escape

    status = "skip" if c.skipped else ("pass" if c.passed else "fail")
    console.print(f"{_STATUS[status]} {c.name}: {escape(c.message)}", highlight=False, soft_wrap=True)
    for line in c.evidence if verbose or status == "fail" else ():
        console.print(f"    {line}", highlight=False, markup=False, soft_wrap=True)


def _target_title(t: TargetResult) -> str:
    inputs = f"vocab {t.vocab_size}" if t.d_model is None else f"d_model {t.d_model}"
    return f"target {t.target} ({t.module_type}, protocol {t.protocol}, {inputs})"


def _render_target(t: TargetResult, console, streamed: bool = False, verbose: bool = True) -> None:
    from rich.markup import escape

    console.print(f"[bold]{escape(_target_title(t))}[/]", highlight=False, soft_wrap=True)
    details = [f"built: {t.built}"] if t.built else []
    details += [f"requests (prompt+decode): {t.workload}"] if t.workload else []
    for line in (*details, *t.cache_notes):
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    if not streamed:
        for c in t.checks:
            render_check(c, console, verbose=verbose)
    passed = sum(c.passed and not c.skipped for c in t.checks)  # a skipped check is no pass ("5 of 7" for 4 + 1)
    skipped = sum(c.skipped for c in t.checks)
    counts = f"{passed} of {len(t.checks)} checks passed" + (f", {skipped} skipped" if skipped else "")
    failed = f"; failed: {', '.join(t.failed_checks)}" if t.failed_checks else ""
    stop = " (interrupted: the checks above finished)" if t.interrupted else ""
    console.print(f"{counts}{failed}{stop}", highlight=False)
