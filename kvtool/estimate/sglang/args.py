"""A ``python -m sglang.launch_server`` (or ``sglang serve``) line read into kvtool's option values:
``kvtool estimate ... -- python -m sglang.launch_server --model-path M --tp-size 2 ...``.

SGLang's argument names and aliases are read from python/sglang/srt/server_args.py ``ServerArgs.add_cli_args``
(0.4.0-0.5.6): ``--model-path`` (``--model`` from 0.4.1), ``--tp-size`` / ``--tp`` / ``--tensor-parallel-size``,
``--pp-size``, ``--mem-fraction-static``, ``--kv-cache-dtype``, ``--page-size``, ``--max-running-requests``,
``--max-total-tokens``, ``--chunked-prefill-size``, ``--context-length``, ``--dtype``, ``--quantization``.  Any other
flag is named in a warning and ignored (its value, the tokens up to the next flag, with it).  The result answers as
kvtool.estimate.vllm_args.VllmServeLine does (values, warnings), so the CLI merges both the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvtool.core.errors import UsageError
from kvtool.estimate.vllm_args import VllmSetting, split_command_line

_INT, _FLOAT, _TEXT = int, float, str

_FLAGS: dict[str, tuple[str, type]] = {
    "--model-path": ("model", _TEXT),
    "--model": ("model", _TEXT),
    "--tp-size": ("tp", _INT),
    "--tp": ("tp", _INT),
    "--tensor-parallel-size": ("tp", _INT),
    "--pp-size": ("pp", _INT),
    "--pipeline-parallel-size": ("pp", _INT),
    "--mem-fraction-static": ("mem_fraction_static", _FLOAT),
    "--kv-cache-dtype": ("kv_dtype", _TEXT),
    "--page-size": ("page_size", _INT),
    "--max-running-requests": ("max_running_requests", _INT),
    "--max-total-tokens": ("max_total_tokens", _INT),
    "--chunked-prefill-size": ("chunked_prefill_size", _INT),
    "--context-length": ("seq_len", _TEXT),
    "--dtype": ("dtype", _TEXT),
    "--quantization": ("quantization", _TEXT),
}
# SGLang's store_true flags (no value): the token after one is not eaten as its value (server_args.py, 0.5.6)
_BOOLEAN_FLAGS = frozenset(
    "--trust-remote-code --enable-metrics --enable-cache-report --disable-radix-cache --disable-cuda-graph "
    "--enable-torch-compile --enable-dp-attention --enable-p2p-check --disable-custom-all-reduce --enable-mixed-chunk "
    "--disable-overlap-schedule --enable-ep-moe --skip-tokenizer-init --log-requests --show-time-cost "
    "--enable-hierarchical-cache --disable-cuda-graph-padding --enable-nan-detection --allow-auto-truncate "
    "--enable-memory-saver --enable-deterministic-inference --enable-lora --is-embedding".split()
)
# settings that change SGLang's pool in ways kvtool does not model: refused rather than ignored
_REFUSED = {
    "--speculative-algorithm": "speculative decoding (its draft pool and mem_fraction_static's reserve)",
    "--dp-size": "data-parallel attention",
    "--dp": "data-parallel attention",
    "--enable-dp-attention": "data-parallel attention",
    "--enable-hierarchical-cache": "the hierarchical (host) cache",
}


@dataclasses.dataclass(frozen=True)
class SglangLaunchLine:
    """What an SGLang launch line sets that kvtool models, and the flags it leaves aside."""

    settings: tuple[VllmSetting, ...]  # one per flag given, in order (argparse: the last one wins)
    ignored_flags: tuple[str, ...]

    def values(self) -> dict[str, object]:
        """kvtool option name -> value (the model as ``model``)."""
        return {s.option: s.value for s in self.settings}

    def warnings(self) -> tuple[str, ...]:
        if not self.ignored_flags:
            return ()
        return (f"SGLang line: ignored (kvtool does not model them): {', '.join(dict.fromkeys(self.ignored_flags))}",)


def is_sglang_line(words: Sequence[str]) -> bool:
    """``python[3] -m sglang.launch_server ...``, ``sglang.launch_server ...`` or ``sglang serve ...``."""
    head = list(words[:3])
    if head[:1] and head[0].split("/")[-1].startswith("python") and head[1:3] == ["-m", "sglang.launch_server"]:
        return True
    return head[:1] == ["sglang.launch_server"] or head[:2] == ["sglang", "serve"]


def parse_sglang_launch(words: Sequence[str]) -> SglangLaunchLine:
    """The settings of an SGLang launch line; a model given twice, a bad number or a refused setting is a
    :class:`UsageError`."""
    args = split_command_line(words[0]) if len(words) == 1 and " " in words[0] else list(words)
    if not is_sglang_line(args):
        raise UsageError(
            "an SGLang line after -- starts with 'python -m sglang.launch_server' or 'sglang serve'",
            where="the SGLang line",
        )
    args = args[3:] if args[0].split("/")[-1].startswith("python") else args[2:] if args[0] == "sglang" else args[1:]
    settings: list[VllmSetting] = []
    ignored: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("-"):
            raise UsageError(f"the SGLang line has {word!r} where a flag was expected", where="the SGLang line")
        name, _, inline = word.partition("=")
        name = "--" + name.lstrip("-").replace("_", "-")
        if name in _REFUSED:
            raise UsageError(
                f"the SGLang line's {name}: kvtool does not model {_REFUSED[name]} for SGLang",
                where="the SGLang line",
                tip="drop it to see the pool without it",
            )
        if name in _FLAGS:
            option, kind = _FLAGS[name]
            if inline:
                text, i = inline, i + 1
            elif i + 1 < len(args):
                text, i = args[i + 1], i + 2
            else:
                raise UsageError(f"the SGLang line's {name} has no value", where="the SGLang line")
            try:
                value = kind(text)
            except ValueError:
                raise UsageError(f"the SGLang line's {name} takes a number, not {text!r}", where=name) from None
            settings.append(VllmSetting(option, value, name))
            continue
        ignored.append(name)
        i += 1
        if name in _BOOLEAN_FLAGS or inline:
            continue
        while i < len(args) and not args[i].startswith("-"):
            i += 1
    models = [s for s in settings if s.option == "model"]
    if len(models) > 1 and len({s.value for s in models}) > 1:
        raise UsageError("the SGLang line names two models", where="--model-path")
    if not models:
        raise UsageError("the SGLang line has no --model-path", where="the SGLang line")
    return SglangLaunchLine(tuple(settings), tuple(ignored))
