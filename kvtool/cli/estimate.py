"""`kvtool estimate` and `kvtool models`: parse options, call kvtool.estimate.estimator, render."""

from __future__ import annotations

from typing import Optional

import typer

from kvtool.cli.options import JsonOpt, ProfilesOpt
from kvtool.cli.output import handle_errors
from kvtool.core.errors import UsageError


def _int_list(text: Optional[str], option: str) -> tuple[int, ...]:
    if text is None:
        return ()
    values = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        try:
            value = int(part)
        except ValueError:
            raise UsageError(f"{option} takes whole numbers separated by commas, not {text!r}", where=option) from None
        if value <= 0:
            raise UsageError(f"{option} must be greater than zero, not {value}", where=option)
        values.append(value)
    return tuple(values)


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    @handle_errors
    def estimate_command(
        model: Optional[str] = typer.Option(
            None,
            "--model",
            "-m",
            help="Profile name (see 'kvtool models'), or a Hugging Face id org/name read from the local cache.",
        ),
        config: Optional[str] = typer.Option(
            None,
            "--config",
            "-c",
            help="A Hugging Face config.json, or a model directory holding one (and *.safetensors).",
        ),
        layers: Optional[int] = typer.Option(None, "--layers", help="Manual mode: number of layers."),
        kv_heads: Optional[int] = typer.Option(None, "--kv-heads", help="Manual mode: KV heads."),
        head_dim: Optional[int] = typer.Option(None, "--head-dim", help="Manual mode: dimension per head."),
        heads: Optional[int] = typer.Option(None, "--heads", help="Manual mode: attention (query) heads."),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="Manual mode: hidden size."),
        dtype: Optional[str] = typer.Option(
            None,
            "--dtype",
            help="The dtype the model runs in: auto (vLLM's rule: float32 checkpoints run in bfloat16), float16, bfloat16, float32.",
        ),
        seq_len: Optional[str] = typer.Option(
            None,
            "--seq-len",
            "--max-model-len",
            "-s",
            help="Tokens per sequence; a comma list sweeps. Default: the model's max_position_embeddings.",
        ),
        batch: Optional[str] = typer.Option(
            None, "--batch", "-b", help="Concurrent sequences; a comma list sweeps. Default 1."
        ),
        kv_dtype: str = typer.Option(
            "auto",
            "--kv-dtype",
            help="vLLM KV cache dtype: auto, fp32, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2, int8, int4, nvfp4, fp8_ds_mla.",
        ),
        tp: int = typer.Option(
            1, "--tp", "--num-gpus", help="Tensor-parallel GPUs (KV heads per GPU = max(1, kv_heads // tp))."
        ),
        pp: int = typer.Option(
            1, "--pp", help="Pipeline stages (vLLM's split of the layers; capacity by the most loaded stage)."
        ),
        gpu: Optional[str] = typer.Option(
            None, "--gpu", help="GPU profile for capacity planning (see 'kvtool models')."
        ),
        gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="GPU memory instead of --gpu, e.g. 80GiB."),
        kv_memory: Optional[str] = typer.Option(
            None, "--kv-memory", help="KV budget per GPU (vLLM kv_cache_memory_bytes): 10GiB, 10GB or bytes."
        ),
        gpu_memory_utilization: Optional[float] = typer.Option(
            None,
            "--gpu-memory-utilization",
            help="vLLM's fraction of GPU memory for weights, activations and KV (with --gpu/--gpu-memory). Default 0.9.",
        ),
        reserve: Optional[str] = typer.Option(
            None,
            "--reserve",
            help="Per-GPU memory held besides weights, all terms at once. Default: modelled as vLLM 0.32 profiles it.",
        ),
        activation_memory: Optional[str] = typer.Option(
            None, "--activation-memory", help="Override the modelled activation peak of vLLM's profiling run."
        ),
        non_torch_memory: Optional[str] = typer.Option(
            None, "--non-torch-memory", help="Override the modelled non-torch memory (NCCL, cuBLAS)."
        ),
        cudagraph_memory: Optional[str] = typer.Option(
            None, "--cudagraph-memory", help="Override the modelled CUDA-graph memory vLLM 0.32 subtracts."
        ),
        max_num_seqs: Optional[int] = typer.Option(
            None,
            "--max-num-seqs",
            help="vLLM's max_num_seqs (sizes the sampler's profiling peak). Default: vllm serve's.",
        ),
        enforce_eager: bool = typer.Option(False, "--enforce-eager", help="As vLLM's: no CUDA graphs, none reserved."),
        quantization: Optional[str] = typer.Option(
            None,
            "--quantization",
            "-q",
            help="vLLM's online quantization of an unquantized checkpoint: fp8 or bitsandbytes (quantized checkpoints "
            "are read from their quantization_config).",
        ),
        block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block (vLLM default 16)."),
        max_num_batched_tokens: Optional[int] = typer.Option(
            None,
            "--max-num-batched-tokens",
            help="vLLM's scheduler budget; sizes sliding-window layers. Default: vllm serve's for the GPU (2048; 8192 at >= 70 GiB but A100; 16384 at >= 160 GiB).",
        ),
        compare: bool = typer.Option(False, "--compare", help="Add a what-if table: MHA, GQA-8, MQA, fp8 and int8 KV."),
        json_output: JsonOpt = False,
        list_models: bool = typer.Option(False, "--list", help="List the model and GPU profiles and exit."),
        profiles: ProfilesOpt = None,
    ) -> None:
        """Exact KV-cache bytes for a model, and how many requests fit on a GPU the way vLLM counts it."""
        if list_models:
            _print_models(tuple(profiles or ()), json_output)
            return
        from kvtool.estimate.estimator import EstimateRequest, estimate

        request = EstimateRequest(
            model=model,
            config=config,
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            heads=heads,
            hidden=hidden,
            dtype=dtype,
            seq_lens=_int_list(seq_len, "--seq-len"),
            batches=_int_list(batch, "--batch"),
            kv_dtype=kv_dtype,
            tp=tp,
            pp=pp,
            gpu=gpu,
            gpu_memory=gpu_memory,
            kv_memory=kv_memory,
            gpu_memory_utilization=gpu_memory_utilization,
            reserve=reserve,
            block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            quantization=quantization,
            enforce_eager=enforce_eager,
            activation_memory=activation_memory,
            non_torch_memory=non_torch_memory,
            cudagraph_memory=cudagraph_memory,
            compare=compare,
            profile_dirs=tuple(profiles or ()),
        )
        result = estimate(request)
        if json_output:
            from kvtool.cli.output import print_json

            print_json(result)
        else:
            from kvtool.cli.output import stdout_console
            from kvtool.estimate.render import render_estimate

            console = stdout_console()
            console.highlight = False  # numbers are formatted already; skip rich's regex highlighter
            render_estimate(result, console)
            from kvtool.cli.output import warn

            for warning in result.warnings:  # --json carries them in "warnings" and keeps stderr empty
                warn(warning)

    @app.command("models")
    @handle_errors
    def models_command(
        json_output: JsonOpt = False,
        profiles: ProfilesOpt = None,
    ) -> None:
        """List the model and GPU profiles that 'kvtool estimate' knows."""
        _print_models(tuple(profiles or ()), json_output)


def _print_models(dirs: tuple[str, ...], json_output: bool) -> None:
    from kvtool.estimate.profiles import list_gpus, model_catalog

    models, gpus = model_catalog(dirs), list_gpus(dirs)
    if json_output:
        from kvtool.cli.output import print_json

        print_json({"models": models, "gpus": gpus})
    else:
        from kvtool.cli.output import stdout_console
        from kvtool.estimate.render import render_models

        render_models(models, gpus, stdout_console())
