"""The vLLM KV-event branch of `kvtool analyze` (the analyze command calls run_vllm_analysis)."""

from __future__ import annotations

from pathlib import Path

from kvtool.core.inflate import DEFAULT_MAX_INPUT_BYTES


def run_vllm_analysis(
    path: Path, *, json_output: bool, plot_dir: Path | None, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
):
    """Analyse a vLLM KV-event JSON-lines file, print tables or one JSON object on stdout; return the analysis.

    Raises InputFileError (exit 3) for a file that is not vLLM events (``.gz`` files are read too).
    """
    from kvtool.cli.output import print_json, stdout_console
    from kvtool.vllm.events.analysis import analyze_vllm_events
    from kvtool.vllm.events.render import analysis_tables, write_plots

    analysis = analyze_vllm_events(Path(path), max_input_bytes)
    written = write_plots(analysis, plot_dir) if plot_dir is not None else []
    if json_output:
        print_json(analysis)
    else:
        console = stdout_console()
        for renderable in analysis_tables(analysis):
            console.print(renderable)
        for plot in written:
            console.print(f"wrote {plot}", highlight=False)
    return analysis
