"""`kvtool record -o events.parquet -- COMMAND ...`: run a vLLM command with kvtool's KV-event recorder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvtool.cli.options import JsonOpt, path_option
from kvtool.cli.output import handle_errors

EXAMPLES = """
Examples:

  kvtool record -o events.parquet -- vllm serve Qwen/Qwen2.5-0.5B-Instruct --enable-prefix-caching

  kvtool record -o events.csv --sample 0.01 -- python my_llm_driver.py

  kvtool analyze events.parquet
"""


def register(app: typer.Typer) -> None:
    @app.command(
        "record",
        epilog=EXAMPLES,
        context_settings={"allow_interspersed_args": False},
    )
    @handle_errors
    def command(
        command: Optional[list[str]] = typer.Argument(
            None, help="The command to run (after --), e.g. vllm serve MODEL ...", show_default=False
        ),
        output: Path = path_option(
            ...,
            "--output",
            "-o",
            empty_tip="give the events file to write (NAME.csv or NAME.parquet)",
            help="Events file to write: .csv or .parquet (one per data-parallel rank).",
        ),
        sample: float = typer.Option(
            1.0, "--sample", help="Share of requests to record (0 < rate <= 1), chosen by a hash of the request id."
        ),
        block_appends_only: bool = typer.Option(
            False,
            "--block-appends-only",
            help="Record only the appends that add blocks (most appends add a token to the last block).",
        ),
        grace: float = typer.Option(
            30.0,
            "--grace",
            help="Seconds the command's engines may run on after the command itself exits (a killed driver leaves "
            "its engine running) before kvtool stops them; the file is finished only when every one has ended.",
        ),
        serve_metrics: Optional[str] = typer.Option(
            None,
            "--serve-metrics",
            help="Serve kvtool watch's figures of the recording to Prometheus on [HOST]:PORT while it runs.",
            show_default=False,
        ),
        json_output: JsonOpt = False,
    ) -> None:
        """Run a command with kvtool's recorder inside vLLM: per-request KV-block events for `kvtool analyze`.

        A vLLM 0.32 general plugin: each engine the command starts writes its rows (docs/vllm-record.md).

        Exits with the command's exit code.
        """
        from kvtool.cli.output import print_json, stdout_console, warn
        from kvtool.vllm.recorder.launch import RecordOptions, run_record

        options = RecordOptions(
            output=output,
            command=tuple(command or ()),
            sample=sample,
            appends="blocks" if block_appends_only else "all",
            grace_s=grace,
        )
        stop_serving = None
        if serve_metrics:
            from kvtool.vllm.recorder.launch import _remove_previous
            from kvtool.watch.session import WatchOptions, serve_in_background

            _remove_previous(output)  # the watcher must not follow an earlier recording's file
            stop_serving = serve_in_background(WatchOptions(follow=output), serve_metrics)
            warn(f"serving kvtool watch's figures on {serve_metrics} (/metrics)")
        try:
            result = run_record(options, on_note=warn)
        finally:
            if stop_serving is not None:
                stop_serving()
        if json_output:
            print_json(result)
        else:
            from kvtool.vllm.events.render import record_table

            stdout_console().print(record_table(result))
        if not result.files:
            warn(
                "nothing was recorded: the command started no vLLM engine, or its vLLM is not a supported version "
                "(the engine's log says which, on lines starting 'kvtool recorder:')"
            )
        raise typer.Exit(result.command_exit_code)
