"""A ``vllm serve`` command line read into kvtool's option values: ``kvtool estimate ... -- vllm serve MODEL ...``.

vLLM's argument names, aliases and value forms are read from its source: ``vllm/engine/arg_utils.py
EngineArgs.add_cli_args`` and ``_compute_kwargs`` (0.10.0-0.33.0), ``vllm/utils/argparse_utils.py
FlexibleArgumentParser.parse_args`` (0.33.0: ``--model`` moved to the front, ``_`` read as ``-`` in names, dotted
``--json-arg.key value``, ``--config FILE.yaml``) and ``human_readable_int`` (``1k`` = 1000, ``1K`` = 1024).
Core code: it returns a frozen :class:`VllmServeLine` and raises :class:`UsageError`; the CLI merges and warns.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from kvtool.core.errors import InputFileError, UsageError

# What a flag's value is (the argparse type vLLM gives it):
#   int   - int;  size - human_readable_int (1k = 1000, 1K = 1024, 1g = 10**9, 1G = 2**30; no decimals on K/M/G/T)
#   len   - human_readable_int_or_auto (max_model_len; -1 and "auto" mean "fit to memory")
#   float - float;  text - str;  bool - argparse.BooleanOptionalAction (--x, --no-x; 0.33 also --disable-x)
_INT, _SIZE, _LEN, _FLOAT, _TEXT, _BOOL = "int", "size", "len", "float", "text", "bool"


@dataclasses.dataclass(frozen=True)
class _Flag:
    option: str  # the name of kvtool estimate's option (its parameter in kvtool.cli.estimate)
    kind: str


# vLLM's spellings of the settings kvtool estimate has (vllm/engine/arg_utils.py EngineArgs.add_cli_args, 0.33.0;
# the same names in every release 0.10.0-0.33.0, except --kv-cache-memory-bytes, new in 0.10.2, and
# --device-memory-utilization, new by 0.33.0).  --kv-cache-memory is the prefix of --kv-cache-memory-bytes that
# vLLM's own start-up log suggests (vllm/v1/worker/gpu_worker.py, 0.33.0): argparse takes a unique prefix.
_FLAGS: dict[str, _Flag] = {
    "--model": _Flag("model", _TEXT),
    "--dtype": _Flag("dtype", _TEXT),
    "--max-model-len": _Flag("seq_len", _LEN),
    "--quantization": _Flag("quantization", _TEXT),
    "-q": _Flag("quantization", _TEXT),
    "--enforce-eager": _Flag("enforce_eager", _BOOL),
    "--tensor-parallel-size": _Flag("tp", _INT),
    "-tp": _Flag("tp", _INT),
    "--pipeline-parallel-size": _Flag("pp", _INT),
    "-pp": _Flag("pp", _INT),
    "--block-size": _Flag("block_size", _INT),
    "--gpu-memory-utilization": _Flag("gpu_memory_utilization", _FLOAT),
    "--device-memory-utilization": _Flag("gpu_memory_utilization", _FLOAT),
    "--kv-cache-memory-bytes": _Flag("kv_memory", _SIZE),
    "--kv-cache-memory": _Flag("kv_memory", _SIZE),
    "--kv-cache-dtype": _Flag("kv_dtype", _TEXT),
    "--kv-transfer-config": _Flag("kv_transfer_config", _TEXT),  # JSON, as vLLM takes it (kvtool.estimate.disagg)
    "--enable-prefix-caching": _Flag("prefix_caching", _BOOL),
    # vllm/engine/arg_utils.py CacheConfig fields: --mamba-block-size from 0.11.1, --mamba-cache-mode from 0.15.0
    # (kvtool.estimate.hybrid_block refuses them for a release without them)
    "--mamba-cache-mode": _Flag("mamba_cache_mode", _TEXT),
    "--mamba-block-size": _Flag("mamba_block_size", _INT),
    "--max-num-batched-tokens": _Flag("max_num_batched_tokens", _SIZE),
    "--max-num-seqs": _Flag("max_num_seqs", _INT),
    "--async-scheduling": _Flag("async_scheduling", _BOOL),
    "--speculative-config": _Flag("speculative_config", _TEXT),  # JSON, as vLLM takes it (kvtool.estimate.spec_decode)
    "-sc": _Flag("speculative_config", _TEXT),
    # LoRA (kvtool.estimate.lora): BooleanOptionalAction and LoRAConfig's int fields, 0.10.0-0.33.0
    "--enable-lora": _Flag("enable_lora", _BOOL),
    "--max-loras": _Flag("max_loras", _INT),
    "--max-lora-rank": _Flag("max_lora_rank", _INT),
}
# JSON-valued flags whose dotted keys kvtool reads (--speculative-config.method ngram): FlexibleArgumentParser
# gathers them into one JSON object, added after the other arguments (so it replaces a whole JSON given too)
_DOTTED_JSON = {"--speculative-config": "speculative_config", "--kv-transfer-config": "kv_transfer_config"}

# vLLM's boolean flags that kvtool does not model: they take no value, so the token after one is not eaten as its
# value.  Read from the source of 0.10.0, 0.10.2, 0.12.0, 0.15.0, 0.19.0, 0.25.0 and 0.33.0: every config dataclass
# field typed bool that add_cli_args or a FrontendArgs class turns into a flag (_compute_kwargs gives bool fields
# argparse.BooleanOptionalAction), the store_true arguments, and --disable-log-requests / --enable-reasoning of the
# older releases.  Any other unknown flag takes the tokens up to the next flag as its value(s) (nargs="+" flags
# such as --served-model-name take several).
_BOOLEAN_FLAGS_IGNORED = frozenset(
    {
        "--aggregate-engine-logging",
        "--allow-credentials",
        "--allow-deprecated-quantization",
        "--calculate-kv-scales",
        "--cohere-is-reasoning-model",
        "--cudagraph-metrics",
        "--data-parallel-external-lb",
        "--data-parallel-hybrid-lb",
        "--data-parallel-multi-port-external-lb",
        "--dcp-q-replicate",
        "--disable-async-output-proc",
        "--disable-cascade-attn",
        "--disable-chunked-mm-input",
        "--disable-custom-all-reduce",
        "--disable-fastapi-docs",
        "--disable-frontend-multiprocessing",
        "--disable-hybrid-kv-cache-manager",
        "--disable-log-requests",
        "--disable-log-stats",
        "--disable-log-stats-server",
        "--disable-mm-preprocessor-cache",
        "--disable-nccl-for-dp-synchronization",
        "--disable-sliding-window",
        "--disable-uvicorn-access-log",
        "--dry-run",
        "--enable-auto-tool-choice",
        "--enable-batch-sharded-sampling",
        "--enable-chunked-prefill",
        "--enable-cumem-allocator",
        "--enable-dbo",
        "--enable-elastic-ep",
        "--enable-ep-weight-filter",
        "--enable-eplb",
        "--enable-expert-parallel",
        "--enable-fault-tolerance",
        "--enable-flash-late-interaction",
        "--enable-flashinfer-autotune",
        "--enable-force-include-usage",
        "--enable-hc-sp",
        "--enable-layerwise-nvtx-tracing",
        "--enable-log-deltas",
        "--enable-log-outputs",
        "--enable-log-requests",
        "--enable-logging-iteration-details",
        "--enable-lora-bias",
        "--enable-mamba-cache-stochastic-rounding",
        "--enable-mamba-shared-prefix-checkpoint",
        "--enable-metrics",
        "--enable-mfu-metrics",
        "--enable-mixed-moe-lora-format",
        "--enable-mm-embeds",
        "--enable-moe-shared-loras",
        "--enable-multimodal-encoder-data-parallel",
        "--enable-nccl-comm-suspend",
        "--enable-offline-docs",
        "--enable-per-request-metrics",
        "--enable-prompt-embeds",
        "--enable-prompt-tokens-details",
        "--enable-reasoning",
        "--enable-request-id-headers",
        "--enable-return-routed-experts",
        "--enable-scale-out",
        "--enable-server-load-tracking",
        "--enable-shm-tensor-arena",
        "--enable-sleep-mode",
        "--enable-ssl-refresh",
        "--enable-tokenizer-info-endpoint",
        "--enable-tower-connector-lora",
        "--enable-trace-replay",
        "--eplb-log-balancedness",
        "--exclude-tools-when-tool-choice-none",
        "--fail-on-environ-validation",
        "--fully-sharded-loras",
        "--grpc",
        "--guided-decoding-disable-additional-properties",
        "--guided-decoding-disable-any-whitespace",
        "--guided-decoding-disable-fallback",
        "--headless",
        "--interleave-mm-strings",
        "--jit-monitor-verbose",
        "--kv-cache-metrics",
        "--kv-sharing-fast-prefill",
        "--language-model-only",
        "--log-error-stack",
        "--long-prefill-token-threshold-adaptive",
        "--mm-device-do-normalize",
        "--mm-encoder-only",
        "--monokernel",
        "--multi-step-stream-outputs",
        "--numa-bind",
        "--ray-workers-use-nsight",
        "--return-sampling-mask",
        "--return-tokens-as-token-ids",
        "--scheduler-reserve-full-isl",
        "--skip-mm-profiling",
        "--skip-tokenizer-init",
        "--sleep-mode-offload-cudagraph",
        "--specialize-active-lora",
        "--stats",
        "--swa-bounded-replay",
        "--tokens-only",
        "--trust-remote-code",
        "--trust-request-chat-template",
        "--trust-request-mm-kwargs",
        "--use-fp64-gumbel",
        "--use-gpu-for-pooling-score",
        "--use-replayssm",
        "--use-tqdm-on-load",
    }
)

_WHERE = "the vllm serve line after --"
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_NEGATIVE_NUMBER = re.compile(r"^-[0-9.]")
# shell operators end the command: `nohup vllm serve ... >/dev/null 2>&1 &`
_SHELL_END = re.compile(r"^(?:&&?|\|\|?|;|[0-9]*>.*|<.*)$")
_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


@dataclasses.dataclass(frozen=True)
class VllmSetting:
    """One setting of the vLLM line, as kvtool estimate's option takes it."""

    option: str  # kvtool estimate's parameter name: tp, seq_len, kv_memory, ...
    value: object  # in the option's own type (seq_len and kv_memory as text, as typed after kvtool's names)
    flag: str  # the flag as the line spelled it, e.g. "-tp" or "--max_model_len"


@dataclasses.dataclass(frozen=True)
class VllmServeLine:
    """What a ``vllm serve`` line sets that kvtool models, and what it sets that kvtool leaves aside."""

    model: str | None  # the positional model of vllm serve, or --model
    settings: tuple[VllmSetting, ...]  # one per option, the last given (argparse: the last one wins)
    ignored_flags: tuple[str, ...]  # vLLM flags kvtool does not model, as spelled (without their values)
    notes: tuple[str, ...]  # anything else read and not used: environment variables, stray words, repeats

    def values(self) -> dict[str, object]:
        """kvtool option name -> value, the model included as ``model``."""
        found: dict[str, object] = {s.option: s.value for s in self.settings}
        if self.model is not None:
            found["model"] = self.model
        return found

    def warnings(self) -> tuple[str, ...]:
        """One line for the flags kvtool ignores (named), one per note."""
        lines = [f"vllm serve line: {note}" for note in self.notes]
        if self.ignored_flags:
            names = ", ".join(dict.fromkeys(self.ignored_flags))
            lines.append(f"vllm serve line: ignored (kvtool does not model them): {names}")
        return tuple(lines)


def split_command_line(text: str) -> list[str]:
    """A shell command line as words: ``\\`` line continuations joined, quotes removed (shlex), ``#`` comments
    dropped.  Variables such as ``$MODEL`` are not expanded (a shell would); they are reported where they land."""
    joined = re.sub(r"\\\r?\n", " ", text)
    try:
        return shlex.split(joined, comments=True)
    except ValueError as err:  # an unclosed quote
        raise UsageError(f"cannot split the vllm serve line: {err}", where=_WHERE) from None


def parse_vllm_serve(words: Sequence[str]) -> VllmServeLine:
    """Read a ``vllm serve`` command line (as words, or one word holding the whole line) into kvtool's settings.

    Accepted forms: ``[VAR=value ...] [wrapper ...] vllm serve MODEL [flags]``, ``python -m
    vllm.entrypoints.openai.api_server --model MODEL [flags]``, or the flags alone (a container's arguments).
    """
    if len(words) == 1 and any(c.isspace() for c in words[0]):
        words = split_command_line(words[0])
    env, args = _server_arguments(list(words))
    notes: list[str] = []
    if env:
        notes.append(f"environment ignored: {', '.join(env)}")
    args = _with_config_file(args, notes)
    reader = _Reader(args, notes)
    return reader.read()


def _server_arguments(words: list[str]) -> tuple[list[str], list[str]]:
    """The environment assignments before the launcher, and the words after ``vllm serve`` (or the server module),
    up to the first shell operator."""
    for end, word in enumerate(words):
        if _SHELL_END.match(word):
            words = words[:end]
            break
    env = [w.split("=", 1)[0] for w in words if _ENV_ASSIGNMENT.match(w)]
    for i, word in enumerate(words):
        if Path(word).name == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return env, words[i + 2 :]
        if word in _SERVER_MODULES and i > 0 and words[i - 1] == "-m":
            return env, words[i + 1 :]
        if word == "vllm.entrypoints.cli.main" and words[i + 1 : i + 2] == ["serve"]:
            return env, words[i + 2 :]
    rest = [w for w in words if not _ENV_ASSIGNMENT.match(w)]
    if not rest or rest[0].startswith("-"):
        return env, rest  # the flags alone
    raise UsageError(
        f"not a vllm serve command line: {' '.join(words[:4])} ...",
        where=_WHERE,
        tip="give `vllm serve MODEL [flags]`, `python -m vllm.entrypoints.openai.api_server --model MODEL [flags]` "
        "or vLLM's flags alone, after --",
    )


def _with_config_file(args: list[str], notes: list[str]) -> list[str]:
    """vLLM's ``--config FILE.yaml``: its keys as flags, placed before the command line's own flags so that the
    command line wins (vllm/utils/argparse_utils.py FlexibleArgumentParser._pull_args_from_config, 0.33.0)."""
    spelled = [i for i, a in enumerate(args) if a == "--config" or a.startswith("--config=")]
    if not spelled:
        return args
    i = spelled[0]
    if args[i] == "--config":
        if i + 1 >= len(args):
            raise UsageError("--config needs a YAML file", where=_WHERE)
        path, rest = args[i + 1], args[:i] + args[i + 2 :]
    else:
        path, rest = args[i].split("=", 1)[1], args[:i] + args[i + 1 :]
    from_file = _config_file_args(path)
    notes.append(f"read the settings of --config {path}")
    if rest and not rest[0].startswith("-"):  # vllm serve MODEL: the model stays first
        return rest[:1] + from_file + rest[1:]
    return from_file + rest


def _config_file_args(path: str) -> list[str]:
    """The flags of a vLLM YAML config (vllm/utils/argparse_utils.py load_config_file, 0.33.0): ``key: true`` is
    ``--key``, ``false`` is ``--no-key``, a list is the key and its items, a mapping is one JSON value."""
    import json

    import yaml

    if not path.endswith((".yaml", ".yml")):
        raise UsageError(f"vLLM's --config takes a .yaml or .yml file, not {path!r}", where=_WHERE)
    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise InputFileError(f"cannot read vLLM's --config file: {err.strerror}", where=path) from None
    except yaml.YAMLError as err:
        raise InputFileError(f"vLLM's --config file is not YAML: {' '.join(str(err).split())}", where=path) from None
    if not isinstance(config, dict):
        raise InputFileError("vLLM's --config file must be a mapping of flag names to values", where=path)
    args: list[str] = []
    for key, value in config.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{key}")
        elif isinstance(value, list):
            args += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


class _Reader:
    """One pass over vLLM's arguments, the way its argparse reads them; state lives here, not in counters."""

    def __init__(self, args: list[str], notes: list[str]):
        self.args = args
        self.notes = notes
        self.pos = 0
        self.model: str | None = None
        self.model_flag: str | None = None
        self.settings: dict[str, VllmSetting] = {}
        self.ignored: list[str] = []
        self.stray: list[str] = []
        self.dotted: dict[str, dict[str, object]] = {}

    def read(self) -> VllmServeLine:
        if self.args and not self.args[0].startswith("-"):  # vllm serve MODEL
            self._set_model(self.args[0], "the positional model")
            self.pos = 1
        while self.pos < len(self.args):
            word = self.args[self.pos]
            self.pos += 1
            if word.startswith("-") and not _NEGATIVE_NUMBER.match(word):
                self._flag(word)
            else:
                self.stray.append(word)
        if self.stray:
            self.notes.append(f"words ignored (not a flag's value): {' '.join(self.stray)}")
        for flag, keys in self.dotted.items():
            self._set(_FLAGS[flag], json.dumps(keys), f"{flag}.*")
        return VllmServeLine(self.model, tuple(self.settings.values()), tuple(self.ignored), tuple(self.notes))

    def _flag(self, word: str) -> None:
        spelled, value = word.split("=", 1) if "=" in word else (word, None)
        name = _normalised(spelled)
        if word.startswith("-O") and not word.startswith("--") and word != "-O":
            self.ignored.append("-O")  # -O3: vLLM's optimization level, its value attached
            return
        if "." in name:  # --speculative-config.method ngram: one key of a JSON-valued flag
            head, key = name.split(".", 1)
            if head in _DOTTED_JSON:
                self._dotted(head, key, value)
                return
            self.ignored.append(head)
            if value is None:
                self._values()
            return
        known, negated = _known(name)
        if known is None:
            self._unknown(name, value)
            return
        if known.kind == _BOOL:
            self._set(known, _bool_value(name, value, negated), spelled)
            return
        if value is None:
            given = self._values()
            if len(given) != 1:
                raise UsageError(f"{spelled} takes one value, not {len(given)}", where=_WHERE)
            value = given[0]
        self._set(known, _typed(known, spelled, value), spelled)

    def _dotted(self, head: str, key: str, value: str | None) -> None:
        """One key of a JSON flag, its value read as vLLM does: JSON, else human_readable_int, else the text."""
        if value is None:
            given = self._values()
            if len(given) != 1:
                raise UsageError(f"{head}.{key} takes one value, not {len(given)}", where=_WHERE)
            value = given[0]
        parsed: object
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            try:
                parsed = human_readable_int(value, flag=f"{head}.{key}")
            except UsageError:
                parsed = value
        self.dotted.setdefault(head, {})[key] = parsed

    def _unknown(self, name: str, value: str | None) -> None:
        self.ignored.append(name)
        boolean = name in _BOOLEAN_FLAGS_IGNORED or _positive(name) in _BOOLEAN_FLAGS_IGNORED
        if value is None and not boolean:
            self._values()

    def _values(self) -> list[str]:
        """The words up to the next flag (a flag's value, or several for nargs="+")."""
        start = self.pos
        while self.pos < len(self.args):
            word = self.args[self.pos]
            if word.startswith("-") and not _NEGATIVE_NUMBER.match(word):
                break
            self.pos += 1
        return self.args[start : self.pos]

    def _set(self, flag: _Flag, value: object, spelled: str) -> None:
        if flag.option == "model":
            self._set_model(str(value), spelled)
            return
        if value is None:  # --max-model-len auto
            return
        before = self.settings.get(flag.option)
        if before is not None and before.value != value:
            self.notes.append(f"{before.flag} {before.value} and {spelled} {value} both given: the last wins")
        self.settings[flag.option] = VllmSetting(flag.option, value, spelled)

    def _set_model(self, model: str, spelled: str) -> None:
        if self.model is not None and self.model != model:
            raise UsageError(
                f"two models: {self.model!r} ({self.model_flag}) and {model!r} ({spelled})",
                where=_WHERE,
                tip="vllm serve takes the model once, as its first word",
            )
        self.model, self.model_flag = model, spelled


def _normalised(spelled: str) -> str:
    """vLLM reads ``_`` as ``-`` in a long flag's name, up to its first ``.`` (FlexibleArgumentParser.parse_args)."""
    if not spelled.startswith("--"):
        return spelled
    head, dot, tail = spelled.partition(".")
    return head.replace("_", "-") + dot + tail


def _positive(name: str) -> str:
    """The flag that ``--no-x`` or ``--disable-x`` turns off."""
    if name.startswith("--no-"):
        return "--" + name[5:]
    if name.startswith("--disable-"):
        return "--enable-" + name[10:]
    return name


def _known(name: str) -> tuple[_Flag | None, bool]:
    """The flag kvtool models under this name, and whether the name is its negative form (``--no-x``; and
    ``--disable-x`` for ``--enable-x``, vllm/utils/argparse_utils.py EnableDisableAction, 0.33.0)."""
    if name in _FLAGS:
        return _FLAGS[name], False
    flag = _FLAGS.get(_positive(name))
    if flag is not None and flag.kind == _BOOL:
        return flag, True
    return None, False


def _bool_value(name: str, value: str | None, negated: bool) -> bool:
    if value is None:
        return not negated
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if value.lower() not in words:
        raise UsageError(f"{name} is on or off, not {value!r}", where=_WHERE, tip=f"write {name} or {_negative(name)}")
    return words[value.lower()] != negated


def _negative(name: str) -> str:
    return "--no-" + name[2:]


def _typed(flag: _Flag, spelled: str, text: str) -> object:
    """The value in the type of kvtool's option, read as vLLM reads it."""
    if flag.kind == _TEXT:
        return text
    if flag.kind == _FLOAT:
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"{spelled} takes a number, not {text!r}", where=_WHERE) from None
    if flag.kind == _LEN and text.strip().lower() in ("auto", "-1"):
        return None  # vLLM fits it to memory; kvtool keeps its own default (the model's length)
    number = human_readable_int(text, flag=spelled) if flag.kind in (_SIZE, _LEN) else _whole(text, spelled)
    if flag.option in ("seq_len", "kv_memory"):  # kvtool's options take these as text
        return str(number)
    return number


def _whole(text: str, spelled: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{spelled} takes a whole number, not {text!r}", where=_WHERE) from None


def human_readable_int(text: str, *, flag: str) -> int:
    """vLLM's ``human_readable_int`` (vllm/utils/argparse_utils.py, 0.33.0): ``25.6k`` = 25,600, ``1K`` = 1,024,
    ``10G`` = 10 x 2**30, ``10g`` = 10**10; decimals only with the lowercase (decimal) suffixes."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        if "." in number:
            raise UsageError(
                f"{flag}: decimals are not allowed with the binary suffix {suffix} ({text!r})",
                where=_WHERE,
                tip=f"write {number}{suffix.lower()} (powers of 1000) or a whole number of {suffix}",
            )
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    return _whole(value, flag)
