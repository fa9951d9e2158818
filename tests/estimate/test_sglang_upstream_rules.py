"""kvtool's SGLang defaults against each release's own code, run on a stand-in ServerArgs.

Skipped unless SGLANG_SRC names a folder holding the unpacked wheels, one ``<SGLANG_SRC>/<release>/sglang/srt`` per
release (``pip download sglang==X --no-deps -d w && unzip -q w/*.whl 'sglang/srt/*' -d <SGLANG_SRC>/X``).  For every
release 0.5.6.post2-0.5.23 it executes the release's ``_handle_gpu_memory_settings`` (srt/server_args.py, a method
of ServerArgs to 0.5.18) or ``handle_gpu_memory_settings`` (srt/arg_groups/memory_hook.py, 0.5.19+) with the
helpers it calls from the same release (the ``_generate_*`` batch-size lists, ``reserve_for_graph_mb``; from 0.5.14
the release's CudaGraphConfig), on a CUDA GPU with no speculative decoding, DP attention, disaggregation, LoRA or
multimodal model, and compares chunked_prefill_size, the decode graph's max batch and mem_fraction_static with
kvtool.estimate.sglang.rules over GPU sizes, TP sizes and the options the rule reads.  Where a release turns the
default prefill graph off (MLA in 0.5.16-0.5.17, _disable_breakable_cudagraph_if_incompatible) the stand-in does so.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import itertools
import logging
import math
import os
import sys
import types
from pathlib import Path

import pytest

from kvtool.estimate.sglang.rules import PrefillGraphInputs, default_mem_fraction_static, gpu_defaults

SRC = os.environ.get("SGLANG_SRC")
pytestmark = pytest.mark.skipif(SRC is None, reason="set SGLANG_SRC to a folder of unpacked SGLang wheels")
RELEASES = (
    "0.5.6.post2 0.5.7 0.5.8 0.5.8.post1 0.5.9 0.5.10 0.5.10.post1 0.5.11 0.5.12 0.5.12.post1 0.5.13 0.5.13.post1 "
    "0.5.14 0.5.15 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23"
).split()
GPU_MIB = (None, 16303, 24564, 32607, 46068, 81559, 95830, 97871, 143771, 183359)
OPTIONS = (
    {},
    {"ctx": 2048},
    {"mtt": 3000},
    {"mrr": 64},
    {"cps": 4096},
    {"model_path": "meta-llama/Llama-2-7b-hf"},
    {"mla": True},
    {"mla": True, "ctx": 2048},
)


@functools.cache
def _functions(path: str) -> dict[str, str]:
    text = Path(path).read_text()
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, ast.get_source_segment(text, node) or "")
    return found


def _as_function(method: str) -> str:
    """A method's source (its body indented past its ``def``) re-indented as a module-level function."""
    first, *body = method.split("\n")
    indent = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
    return "\n".join([first] + [("    " + line[indent:]) if line.strip() else "" for line in body])


class _Envs:
    class _Value:
        def __init__(self, value: object) -> None:
            self.value = value

        def get(self) -> object:
            return self.value

        def is_set(self) -> bool:
            return False

        def set(self, value: object) -> None:
            self.value = value

    def __getattr__(self, name: str) -> _Envs._Value:
        return _Envs._Value(None if name == "SGLANG_MOONCAKE_CUSTOM_MEM_POOL" else False)


class _ModelConfig:
    is_multimodal = False
    is_piecewise_cuda_graph_disabled_model = False
    is_multimodal_breakable_cuda_graph_supported = False
    hf_config = types.SimpleNamespace(architectures=["LlamaForCausalLM"])


def _module(name: str, **members: object) -> None:
    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]
    module.__dict__.update(members)
    sys.modules[name] = module


@functools.cache
def _cuda_graph_config(release: str):  # noqa: ANN202 - the release's cuda_graph_config module, or None
    path = Path(SRC or "", release, "sglang/srt/model_executor/cuda_graph_config.py")
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"sglang_cgc_{release.replace('.', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def _stand_in_modules():
    saved = {name: mod for name, mod in sys.modules.items() if name == "sglang" or name.startswith("sglang.")}
    for name in (
        "sglang",
        "sglang.srt",
        "sglang.srt.arg_groups",
        "sglang.srt.configs",
        "sglang.srt.arg_groups.model_overrides",
    ):
        _module(name)
    _module("sglang.srt.utils", is_cuda=lambda: True)
    _module("sglang.srt.runtime_context", get_exec=lambda: None)
    _module("sglang.srt.arg_groups.overrides", resolved_view=lambda view: view)
    _module("sglang.srt.configs.model_config", is_deepseek_v4=lambda c: False, is_minimax_sparse=lambda c: False)
    _module(
        "sglang.srt.arg_groups.model_overrides.qwen3_vl",
        expand_multimodal_decode_graph_to_running_limit=lambda *a: None,
    )
    yield
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def _upstream(release: str, gpu_mem: int | None, tp: int, **asked: object) -> tuple[int, int, float]:
    cgc = _cuda_graph_config(release)
    mla = bool(asked.get("mla"))
    names = {
        "is_npu": lambda: False,
        "is_cuda": lambda: True,
        "is_hip": lambda: False,
        "logger": logging.getLogger("sglang-upstream"),
        "envs": _Envs(),
        "resolved_view": lambda view: view,
        "copy": copy,
        "math": math,
        "Optional": None,
        "List": list,
        "Any": object,
    }
    if cgc is not None:
        names["Backend"], names["Phase"] = cgc.Backend, getattr(cgc, "Phase", None)
    args = types.SimpleNamespace(
        chunked_prefill_size=asked.get("cps"),
        cuda_graph_max_bs=None,
        cuda_graph_bs=None,
        piecewise_cuda_graph_max_tokens=4096 if release == "0.5.6.post2" else None,  # the field's default there
        piecewise_cuda_graph_tokens=None,
        mem_fraction_static=None,
        max_prefill_tokens=16384,
        tp_size=tp,
        pp_size=1,
        enable_dp_attention=False,
        dp_size=1,
        attn_dp_size=1,
        speculative_algorithm=None,
        speculative_num_draft_tokens=None,
        enable_piecewise_cuda_graph=False,
        disable_piecewise_cuda_graph=False,
        device="cuda",
        max_total_tokens=asked.get("mtt"),
        model_path=asked.get("model_path", "meta-llama/Llama-3.1-8B"),
        context_length=asked.get("ctx"),
        max_running_requests=asked.get("mrr"),
        disaggregation_mode="null",
        language_only=False,
        language_model_only=False,
        enable_symm_mem=False,
        torch_compile_max_bs=32,
        moe_a2a_backend="none",
        disable_cuda_graph_padding=False,
        cuda_graph_config=cgc.CudaGraphConfig() if cgc is not None else None,
        _cuda_graph_config_locked=set(),
    )
    args.use_mla_backend = lambda: mla
    args.get_model_config = lambda: _ModelConfig()
    args._resolved = lambda: args
    args.post_capture_kv_sizing_planned = lambda: False
    args.adjust_mem_fraction_for_vlm = lambda model_config: None
    if mla and release in ("0.5.16", "0.5.17"):  # _disable_breakable_cudagraph_if_incompatible: "MLA attention"
        args.cuda_graph_config.prefill.backend = cgc.Backend.DISABLED
    server_args = _functions(str(Path(SRC or "", release, "sglang/srt/server_args.py")))
    if "_handle_gpu_memory_settings" in server_args:
        helpers = [n for n in server_args if n.startswith("_generate_") or n.startswith("reserve_for_")]
        for name in [*helpers, "_handle_gpu_memory_settings"]:
            scope: dict[str, object] = {}
            exec(_as_function(server_args[name]), names, scope)  # noqa: S102 - the release's own code
            setattr(args, name, types.MethodType(scope[name], args))
        args._handle_gpu_memory_settings(gpu_mem)
        decode = args.cuda_graph_config.decode.max_bs if cgc is not None else args.cuda_graph_max_bs
        return args.chunked_prefill_size, decode, args.mem_fraction_static
    hooks = _functions(str(Path(SRC or "", release, "sglang/srt/arg_groups/memory_hook.py")))
    graphs = _functions(str(Path(SRC or "", release, "sglang/srt/arg_groups/cuda_graph_hook.py")))
    names.update(
        resolving_view=lambda view: view,
        use_mla_backend=lambda view: mla,
        attn_dp_enabled_of=lambda view: False,
        model_config_of=lambda view: _ModelConfig(),
        post_capture_kv_sizing_planned=lambda view: False,
        get_platform=lambda: types.SimpleNamespace(is_xpu=False),
        get_device_memory_capacity=lambda device=None: gpu_mem,
        _DEFAULT_PP_PREFILL_CUDA_GRAPH_MAX_TOKENS=0,
        declare_resolution=lambda target, who, **values: [setattr(target, k, v) for k, v in values.items()],
    )
    hook_module = types.ModuleType("sglang.srt.arg_groups.cuda_graph_hook")
    for name in (
        "generate_cpu_graph_batch_sizes",
        "generate_decode_cuda_graph_batch_sizes",
        "generate_prefill_cuda_graph_batch_sizes",
    ):
        scope = {}
        exec(graphs[name], names, scope)  # noqa: S102
        setattr(hook_module, name, scope[name])
    sys.modules[hook_module.__name__] = hook_module
    for name in (
        "reserve_for_graph_mb",
        "reserve_for_deepep_a2a_mb",
        "adjust_mem_fraction_for_vlm",
        "handle_gpu_memory_settings",
    ):
        scope = {}
        exec(hooks[name], names, scope)  # noqa: S102
        names[name] = scope[name]
    handle = names["handle_gpu_memory_settings"]
    if handle.__code__.co_argcount == 2:  # type: ignore[attr-defined]  # 0.5.19 takes gpu_mem
        handle(args, gpu_mem)  # type: ignore[operator]
    else:
        handle(args)  # type: ignore[operator]
    return args.chunked_prefill_size, args.cuda_graph_config.decode.max_bs, args.mem_fraction_static


def _kvtool(release: str, gpu_mem: int | None, tp: int, **asked: object) -> tuple[int, int | None, float]:
    running = asked.get("mrr")
    tiers = gpu_defaults(gpu_mem, tp, release, running if isinstance(running, int) else None)
    chunked = asked.get("cps") or tiers.chunked_prefill_size
    assert isinstance(chunked, int)
    inputs = PrefillGraphInputs(
        mla=bool(asked.get("mla")),
        model_path=str(asked.get("model_path", "meta-llama/Llama-3.1-8B")),
        context_length=asked.get("ctx"),  # type: ignore[arg-type]
        max_total_tokens=asked.get("mtt"),  # type: ignore[arg-type]
    )
    fraction, _ = default_mem_fraction_static(gpu_mem, tp, 1, chunked, tiers.cuda_graph_max_bs, release, inputs)
    return chunked, tiers.cuda_graph_max_bs, fraction


@pytest.mark.parametrize("release", RELEASES)
def test_defaults_equal_the_release_own_code(release):
    differ = []
    for gpu_mem, tp, asked in itertools.product(GPU_MIB, (1, 2, 4, 8), OPTIONS):
        upstream = _upstream(release, gpu_mem, tp, **asked)
        ours = _kvtool(release, gpu_mem, tp, **asked)
        if (upstream[0], upstream[1], round(upstream[2], 6)) != (ours[0], ours[1], round(ours[2], 6)):
            differ.append((gpu_mem, tp, asked, upstream, ours))
    assert not differ, differ[:5]
