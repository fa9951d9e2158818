"""Rich tables for ``kvtool estimate`` and ``kvtool models`` (JSON comes from the same dataclasses)."""

from __future__ import annotations

from kvtool.core.format import fmt_bytes as _bytes
from kvtool.core.format import fmt_count, fmt_plural
from kvtool.core.units import GB, GIB
from kvtool.estimate.estimator import EstimateResult


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:,.2f} GiB"


def _n(x: int | None) -> int:
    """A capacity figure, set whenever a budget is (the JSON keeps None where there is none)."""
    return 0 if x is None else x


def render_estimate(result: EstimateResult, console, *, verbose: bool = False) -> None:
    """The answer first, then the formula, the budget and what fits; ``verbose`` adds how each was counted.

    The default screen: the headline, the layer formulas, the KV cache, the budget, the blocks and the longest
    request, the verdict and what would fit (and the --seq-len/--batch sweep or --compare table when asked).
    ``verbose`` adds the per-token bytes, the weights, the reserve terms, the pipeline stages, what vLLM would log,
    how the blocks were counted, the defaults used and the source.  ``--json`` keeps everything.
    """
    r = result
    console.print(headline(r) if r.fits is not None else kv_headline(r))
    console.print(_estimate_table(r, verbose))
    if r.fits is not None:
        _verdict(r, console)
    if r.suggestions:
        console.print("Would fit: " + "; ".join(r.suggestions) + ".")
    if r.sweep:
        render_sweep(result, console)
    if r.compare:
        render_compare(result, console)
    for note in r.notes:
        console.print(f"Note: {note}", style="dim")
    if verbose:
        console.print("Defaults used: " + ("; ".join(r.defaults) if r.defaults else "none"), style="dim")
        console.print(f"Source: {r.source}", style="dim")
    else:
        console.print("More with -v: weights, reserve, defaults, source (--json: all)", style="dim")


def _estimate_table(r: EstimateResult, verbose: bool):
    from kvtool.core.render import new_table

    heads = f"one latent of {r.head_dim}" if r.attention == "MLA" else f"{r.num_kv_heads} KV heads x {r.head_dim}"
    title = (
        f"KV cache of {r.model}: {r.attention}, {r.num_layers} layers, {heads}, "
        f"model {r.model_dtype} -> KV {r.kv_dtype}"
    )
    table = new_table(title=title, show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value")
    kinds = {
        "full": "full attention",
        "sliding": "sliding window",
        "chunked": "chunked local attention",
        "mla": "MLA latent",
        "mamba": "state layers",
    }
    for g in r.layer_groups:
        label = f"{kinds[g.kind]} ({g.num_layers} layers)"
        if g.window_tokens:
            label += f", window {g.window_tokens:,}"
        table.add_row(label, g.formula)
    if verbose:
        table.add_row("per token (1 sequence, all layers)", _bytes(r.bytes_per_token))
    s_b = f"KV cache, S={r.seq_len:,} x B={r.batch:,}"
    table.add_row(s_b + (" (all GPUs)" if r.tp > 1 else ""), _bytes(r.kv_bytes))
    if r.tp > 1:
        table.add_row(f"per GPU (tp {r.tp}, {r.kv_heads_per_gpu} KV heads each)", _bytes(r.kv_bytes_per_gpu))
    if r.weights_bytes is not None and r.language_model_weights_bytes_per_gpu is None:
        params = f"{fmt_count(r.weights_params)} parameters, " if r.weights_params else ""
        label = "weights (whole model, all GPUs)" if r.tp * r.pp > 1 else "weights"
        table.add_row(label, f"{_bytes(r.weights_bytes)} ({params}{r.weights_method})")
    if r.kv_budget_bytes is not None:
        _capacity_rows(table, r, verbose)
    _disagg_rows(table, r, verbose)
    _prefix_cache_rows(table, r, verbose)
    return table


def _prefix_cache_rows(table, r: EstimateResult, verbose: bool) -> None:
    """The prefix-cache unit: the shortest prompt that can hit and why; what other settings would make of it."""
    pc = r.prefix_cache
    if pc is None:
        return
    if pc.cache_hit_unit_tokens is None:
        table.add_row("prefix cache", f"off: {pc.why_off}")
    else:
        blocks = ", ".join(f"{g.kind} {g.block_size_tokens:,}" for g in pc.groups)
        mode = f", mamba_cache_mode {pc.mamba_cache_mode}" if pc.mamba_cache_mode else ""
        never = "" if pc.hit_possible_within_max_model_len else f"; none within max_model_len {r.seq_len:,}"
        table.add_row(
            "prefix-cache unit",
            f"hits in multiples of {pc.cache_hit_unit_tokens:,} tokens: a prompt needs {pc.min_prompt_tokens:,}+ "
            f"tokens sharing its first {pc.min_shared_prefix_tokens:,} (blocks: {blocks}; hash block "
            f"{pc.hash_block_size_tokens:,}{mode}){never}",
        )
    if verbose:
        table.add_row("prefix-cache rule", f"{pc.rule} [{pc.source}]")
    if pc.what_if and (verbose or pc.mamba_cache_mode is not None):
        table.add_row("prefix cache would be", "; ".join(pc.what_if))


def _disagg_rows(table, r: EstimateResult, verbose: bool) -> None:
    """Prefill/decode disaggregation: the handoff's bytes, the decode blocks in flight, the link a TTFT budget needs."""
    if r.handoff_bytes is None or r.handoff_bytes_per_gpu is None:
        return
    connector = f", {r.kv_connector} {r.kv_role}" if r.kv_connector else ""
    per_gpu = f" ({_bytes(r.handoff_bytes_per_gpu)} per decode GPU)" if r.tp > 1 else ""
    table.add_row(
        f"prefill -> decode handoff ({r.handoff_prompt_len:,} prompt tokens{connector})",
        f"{r.handoff_blocks:,} blocks of every layer = {_bytes(r.handoff_bytes)}{per_gpu}",
    )
    if r.transfer_blocks_in_flight is not None:
        table.add_row(
            "decode blocks held by transfers in flight",
            f"{r.transfers_in_flight:,} transfers x {r.handoff_blocks:,} blocks = {r.transfer_blocks_in_flight:,} blocks"
            + (f" of {_n(r.num_blocks) - 1:,}" if r.num_blocks is not None else ""),
        )
    if r.link_gb_s_for_ttft is not None:
        prefill = f" - prefill {r.prefill_ms:g} ms" if r.prefill_ms else ""
        table.add_row(
            f"link for TTFT {r.ttft_budget_ms:g} ms{prefill} (per GPU pair)", f"{r.link_gb_s_for_ttft:,.2f} GB/s"
        )
    if verbose:
        table.add_row("how the handoff was counted", r.handoff_method or "")


def _capacity_rows(table, r: EstimateResult, verbose: bool) -> None:
    """The budget and the blocks; with ``verbose`` also the reserve, pipeline stages and what vLLM would log."""
    if r.budget_method == "gpu":
        gpu = r.gpu or "GPU"
        if verbose:
            _weight_rows(table, r)
        table.add_row(
            "KV budget per GPU",
            f"{gpu} {_gib(r.gpu_memory_bytes)} x {r.gpu_memory_utilization:g} "
            f"- weights {_gib(r.weights_bytes_per_gpu)}{'' if verbose else _weight_sum(r, short=True)} - reserve {_gib(r.reserve_bytes)} "
            f"= {r.kv_budget_bytes:,} B ({_gib(r.kv_budget_bytes)})",
        )
        if r.activation_bytes is not None and verbose:
            table.add_row(
                f"reserve per GPU (vLLM {r.vllm_version} profiling)",
                f"model runner {r.model_runner}: activation peak {_gib(r.activation_bytes)} + non-torch {_gib(r.non_torch_bytes)} "
                f"+ CUDA graphs {_gib(r.cudagraph_bytes)} (each overridable: --activation-memory, "
                f"--non-torch-memory, --cudagraph-memory)",
            )
            _encoder_profiling_row(table, r)
    else:
        table.add_row("KV budget per GPU (--kv-memory)", _bytes(r.kv_budget_bytes))
    for st in r.stages if verbose else ():
        binding = " (sets capacity)" if st.num_blocks == r.num_blocks else ""
        table.add_row(
            f"pipeline stage {st.index} (per GPU){binding}",
            f"layers {st.first_layer}-{st.first_layer + st.num_layers - 1}, weights "
            f"{_gib(st.weights_bytes_per_gpu)}, KV budget {_gib(st.kv_budget_bytes)}, "
            f"{_n(st.num_blocks):,} blocks",
        )
    _speculative_rows(table, r, verbose)
    label = "blocks (one pool; every GPU holds its share of each)" if r.tp * r.pp > 1 else "blocks"
    table.add_row(label, f"{r.num_blocks:,} of {r.block_size} tokens = {r.kv_cache_tokens:,} tokens")
    if r.cpu_kv_blocks is not None and r.cpu_kv_tokens is not None:
        table.add_row(
            f"CPU tier (--kv-offloading-size {r.kv_offloading_size_gib:g} GiB, {r.kv_offloading_backend})",
            f"{r.cpu_kv_blocks:,} {'chunks' if r.kv_offloading_backend == 'lmcache' else 'blocks'} of "
            f"{r.cpu_kv_tokens_per_block} tokens ({_n(r.cpu_kv_bytes_per_block):,} B each) = {r.cpu_kv_tokens:,} tokens "
            f"(GPU + CPU: {_n(r.kv_cache_tokens) + r.cpu_kv_tokens:,} tokens)",
        )
        if verbose:
            table.add_row("how CPU blocks were counted", r.cpu_kv_method or "")
    table.add_row("blocks per request", f"{r.blocks_per_request:,} for {r.seq_len:,} tokens")
    if verbose and _n(r.max_batch) >= 1:
        table.add_row(
            "vLLM would log",
            f"KV cache size: {r.vllm_logged_tokens:,} tokens; Maximum concurrency for {r.seq_len:,} tokens "
            f"per request: {r.max_concurrency:.2f}x",
        )
    elif verbose:
        table.add_row(
            "vLLM would refuse to start",
            f"one request of {r.seq_len:,} tokens does not fit; the estimated maximum model length is "
            f"{r.max_seq_len:,} (KV cache size {r.vllm_logged_tokens:,} tokens, concurrency {r.max_concurrency:.2f}x)",
        )
    limit = (
        " (the model's context; sliding layers never run out)" if r.max_seq_len_limited_by == "model context" else ""
    )
    if _beyond_context(r):
        limit = f"; the model's context (max_position_embeddings) is only {r.max_position_embeddings:,}"
    table.add_row("longest single request", f"{r.max_seq_len:,} tokens (one block is vLLM's null block){limit}")
    if verbose:
        table.add_row("how blocks were counted", r.capacity_method or "")


def _weight_terms(r: EstimateResult) -> list[tuple[str, int]]:
    """The weights per GPU term by term (the language model always; the others where present)."""
    terms = [("language model", _n(r.language_model_weights_bytes_per_gpu))]
    if r.draft_weights_bytes_per_gpu:
        terms.append(("drafter", r.draft_weights_bytes_per_gpu))
    if r.encoder_weights_bytes:
        terms.append(("vision tower", r.encoder_weights_bytes))
    if r.lora_bytes is not None:
        terms.append(("LoRA", r.lora_bytes))
    if r.rotary_cache_bytes_per_gpu:
        terms.append(("rotary caches", r.rotary_cache_bytes_per_gpu))
    return terms


def _weight_sum(r: EstimateResult, *, short: bool) -> str:
    """`` (language model 7.23 + vision tower 0.78 + rotary caches 0.56)``: the terms the budget's weights add up
    from; empty when the language model is the only one."""
    terms = _weight_terms(r)
    if r.language_model_weights_bytes_per_gpu is None or len(terms) == 1:
        return ""
    parts = " + ".join(f"{name} {b / GIB:,.2f}" for name, b in terms)
    return f" ({parts})" if short else f" = {parts} GiB"


def _weight_rows(table, r: EstimateResult) -> None:
    """-v: the weights per GPU, their sum, and a row for each term with how it was counted and its override."""
    if r.language_model_weights_bytes_per_gpu is None:
        return
    table.add_row("weights per GPU", f"{_gib(r.weights_bytes_per_gpu)}{_weight_sum(r, short=False)}")
    params = f"{fmt_count(r.weights_params)} parameters, " if r.weights_params else ""
    drafter_whole = r.speculative.draft_weights_bytes if r.speculative else 0
    whole = (
        f"; whole model {_gib(r.weights_bytes - drafter_whole)}"
        if r.tp * r.pp > 1 and r.weights_bytes is not None
        else ""
    )
    table.add_row(
        "  language model",
        f"{_gib(r.language_model_weights_bytes_per_gpu)} ({params}{r.language_model_weights_method}{whole})",
    )
    sd = r.speculative
    if sd is not None and r.draft_weights_bytes_per_gpu is not None:
        table.add_row(
            "  drafter (--draft-memory)",
            f"{_gib(r.draft_weights_bytes_per_gpu)} ({sd.method}: {sd.draft_weights_method})",
        )
    if r.encoder_weights_bytes is not None and r.encoder_method is not None:
        table.add_row("  vision tower (--encoder-memory)", f"{_gib(r.encoder_weights_bytes)} ({r.encoder_method})")
    if r.lora_bytes is not None:
        table.add_row("  LoRA buffers (--lora-memory)", f"{_gib(r.lora_bytes)} = {r.lora_bytes:,} B ({r.lora_method})")
    if r.rotary_cache_bytes_per_gpu:
        table.add_row("  rotary caches", f"{_gib(r.rotary_cache_bytes_per_gpu)} ({_rotary_method(r)})")


def _rotary_method(r: EstimateResult) -> str:
    """The rotary caches' part of weights_method (appended last, after "; + ")."""
    method = r.weights_method or ""
    return method.rsplit("; + ", 1)[-1] if "rotary" in method else "rotary cos/sin caches"


def _encoder_profiling_row(table, r: EstimateResult) -> None:
    """-v: what the vision encoder's profiling run adds to the reserve, and the encoder cache budget vLLM logs."""
    if r.encoder_budget_tokens is None:
        return
    if not r.encoder_budget_tokens:
        table.add_row("  encoder profiling", "none (not profiled; see the vision tower's row)")
        return
    added = f"adds {_gib(r.encoder_activation_bytes)} to the activation peak; " if r.encoder_activation_bytes else ""
    table.add_row(
        "  encoder profiling",
        f"{added}vLLM would log 'Encoder cache will be initialized with a budget of {r.encoder_budget_tokens} tokens, "
        f"and profiled with {r.encoder_profiling_items} image items of the maximum feature size' (overridable within "
        "--activation-memory)",
    )


def _speculative_rows(table, r: EstimateResult, verbose: bool) -> None:
    """--speculative-config's drafter: its KV layers and bytes, state blocks, weights; vLLM's padding-layer lines."""
    sd = r.speculative
    if sd is not None:
        kv = (
            f"{sd.draft_kv_layers} draft {sd.draft_kv_kind} layer(s), {sd.draft_bytes_per_token_per_gpu:,} B per token "
            f"per GPU ({sd.draft_source})"
            if sd.draft_kv_layers
            else sd.draft_source
        )
        state = (
            f"; +{sd.speculative_state_blocks} state blocks per request in each state group"
            if sd.speculative_state_blocks
            else ""
        )
        if r.draft_weights_bytes_per_gpu is not None:
            weights = f"; drafter weights {_gib(r.draft_weights_bytes_per_gpu)} per GPU (--draft-memory)"
        else:
            weights = f"; drafter weights {_gib(sd.draft_weights_bytes)}, all GPUs ({sd.draft_weights_method})"
        table.add_row(
            f"speculative decoding ({sd.method}, {sd.num_speculative_tokens} tokens)", f"{kv}{state}{weights}"
        )
        if verbose:
            table.add_row(
                "how the drafter was counted",
                f"lookahead: the scheduler keeps {sd.num_speculative_tokens} slots a request within max_model_len, "
                "no blocks of their own (FullAttentionSpec.max_memory_usage_bytes); " + "; ".join(sd.rules),
            )
    for line in r.padding_log_lines:
        table.add_row("vLLM would warn (padding layers)", line)


def _requests(count: int) -> str:
    return fmt_plural(count, "request")


def _verdict(r: EstimateResult, console) -> None:
    """Fits / does not fit, in a sentence under the table."""
    if r.fits:
        longest = f"one request of up to {r.max_seq_len:,} tokens"
        if _beyond_context(r):
            longest = (
                f"one request of up to {r.max_position_embeddings:,} tokens, the model's context "
                f"(memory would hold {r.max_seq_len:,})"
            )
        console.print(
            f"[green]Fits[/green]: {_requests(r.batch)} of {r.seq_len:,} tokens {_fit_verb(r.batch)}; up to "
            f"{_requests(_n(r.max_batch))} of {r.seq_len:,} tokens, or {longest}."
        )
    elif r.max_seq_len == 0:
        console.print(
            f"[red]Does not fit[/red]: {max(_n(r.num_blocks), 0):,} blocks leave no room for even one request "
            f"(vLLM would refuse to start)."
        )
    else:
        fitting = [f"{_requests(_n(r.max_batch))} of {r.seq_len:,} tokens"] if r.max_batch else []
        if r.max_seq_len_at_batch:
            fitting.append(f"{r.batch:,} of {r.max_seq_len_at_batch:,} tokens")
        else:
            fitting.append(f"no length at which {_requests(r.batch)} {_fit_verb(r.batch)}")
        usable = max(_n(r.num_blocks) - 1, 0)
        console.print(
            f"[red]Does not fit[/red]: {_requests(r.batch)} of {r.seq_len:,} tokens {'needs' if r.batch == 1 else 'need'} "
            f"{fmt_plural(r.batch * _n(r.blocks_per_request), 'block')}; {usable:,} "
            f"{'is' if usable == 1 else 'are'} usable. Largest that fit: "
            f"{', or '.join(fitting)} (one request: {r.max_seq_len:,} tokens)."
        )


def _fit_verb(count: int) -> str:
    return "fits" if count == 1 else "fit"


def headline(r: EstimateResult) -> str:
    """The user's question answered first: "4 requests of 8,192 tokens fit: yes, up to 37"."""
    where = f" on {r.gpu}" if r.gpu else ""
    if r.tp * r.pp > 1:
        where += (
            f" x {r.tp * r.pp} ("
            + ", ".join(part for part in (f"tp {r.tp}" if r.tp > 1 else "", f"pp {r.pp}" if r.pp > 1 else "") if part)
            + ")"
        )
    asked = f"{_requests(r.batch)} of {r.seq_len:,} tokens{where} {_fit_verb(r.batch)}"
    if r.fits:
        return f"[bold]{asked}: [green]yes[/green], up to {_n(r.max_batch):,}[/bold]"
    if _n(r.max_batch) == 0 and r.max_seq_len:
        return f"[bold]{asked}: [red]no[/red]; longest that fits: {r.max_seq_len:,} tokens[/bold]"
    if _n(r.max_batch) == 0:
        return f"[bold]{asked}: [red]no[/red], not even one request: the KV budget holds no block to spare[/bold]"
    return f"[bold]{asked}: [red]no[/red], only {_n(r.max_batch):,} {'does' if r.max_batch == 1 else 'do'}[/bold]"


def kv_headline(r: EstimateResult) -> str:
    """Without a GPU the answer is the KV bytes: "KV cache of 1 request of 4,096 tokens: 2,147,483,648 B (...)"."""
    asked = f"{_requests(r.batch)} of {r.seq_len:,} tokens"
    per_gpu = f"; {_bytes(r.kv_bytes_per_gpu)} per GPU (tp {r.tp})" if r.tp > 1 else ""
    return f"[bold]KV cache of {asked}: {_bytes(r.kv_bytes)}{per_gpu}[/bold]"


def _beyond_context(r: EstimateResult) -> bool:
    """Memory would hold a longer request than the model's context allows."""
    return (
        r.max_seq_len is not None
        and r.max_position_embeddings is not None
        and r.max_seq_len > r.max_position_embeddings
    )


def render_sweep(result: EstimateResult, console) -> None:
    from kvtool.core.render import new_table

    table = new_table(title="Sweep (all GPUs)", header_style="bold", title_justify="left")
    for col in ("seq_len", "batch", "KV bytes", "GiB", "GB"):
        table.add_column(col, justify="right")
    has_cap = result.sweep[0].fits is not None
    if has_cap:
        table.add_column("fits")
        table.add_column("max concurrency", justify="right")
    for p in result.sweep:
        row = [
            f"{p.seq_len:,}",
            f"{p.batch:,}",
            f"{p.kv_bytes:,}",
            f"{p.kv_bytes / GIB:,.2f}",
            f"{p.kv_bytes / GB:,.2f}",
        ]
        if has_cap:
            row += ["yes" if p.fits else "no", f"{p.max_concurrency:.2f}x"]
        table.add_row(*row)
    console.print(table)


def render_compare(result: EstimateResult, console) -> None:
    from kvtool.core.render import new_table

    table = new_table(
        title=f"What if (S={result.seq_len:,}, B={result.batch:,}, all GPUs)", header_style="bold", title_justify="left"
    )
    for col in ("variant", "attention", "KV heads", "KV dtype", "bytes/token", "KV bytes", "GiB", "vs as-is"):
        table.add_column(col, justify="right" if col not in ("variant", "attention", "KV dtype") else "left")
    has_cap = result.compare[0].num_blocks is not None
    if has_cap:
        table.add_column("blocks", justify="right")
        table.add_column("max concurrency", justify="right")
    for row in result.compare:
        cells = [
            row.label,
            row.attention,
            str(row.kv_heads),
            row.kv_dtype,
            f"{row.bytes_per_token:,}",
            f"{row.kv_bytes:,}",
            f"{row.kv_bytes / GIB:,.2f}",
            f"{row.ratio_to_as_is:.3g}x",
        ]
        if has_cap:
            cells += [f"{row.num_blocks:,}", f"{row.max_concurrency:.2f}x"]
        table.add_row(*cells)
    console.print(table)


def render_models(models: list, gpus: list, console) -> None:
    from kvtool.core.render import new_table

    # The name is what the user types next: its column is never wrapped, and it is repeated in each part when a
    # narrow terminal splits the table (the Hugging Face repository then comes in a second part).
    table = new_table(
        title="Models (kvtool estimate --model NAME)",
        header_style="bold",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    table.add_column("name", no_wrap=True)
    for col in ("attention", "layers", "KV x dim", "dtype", "sliding/state", "params"):
        table.add_column(col, no_wrap=True)
    table.add_column("values from", no_wrap=True)
    for m in models:
        sliding = f"{m.sliding_layers}/{m.num_layers} x {m.sliding_window:,}" if m.sliding_layers else "-"
        if m.state_layers:
            sliding = f"{m.state_layers}/{m.num_layers} state"
        params = f"{m.published_params / 1e9:,.2f} B" if m.published_params else "-"
        row = [m.name, m.attention, str(m.num_layers), f"{m.num_kv_heads} x {m.head_dim}", m.dtype, sliding, params]
        table.add_row(*row, m.hf_repo)
    console.print(table)
    gt = new_table(
        title="GPUs (kvtool estimate --gpu NAME)",
        header_style="bold",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for col in ("name", "datasheet", "driver reports", "GB/s", "bf16 TFLOPS", "vendor"):
        gt.add_column(col, no_wrap=True)
    for g in gpus:
        bf16 = g.peak_dense_tflops.bf16
        gt.add_row(
            g.name,
            g.nominal_memory_text,
            f"{g.memory_bytes / GIB:,.2f} GiB",
            f"{g.memory_bandwidth_gb_s:,.0f}" if g.memory_bandwidth_gb_s else "",
            f"{bf16:,.0f}" if bf16 else "",
            g.vendor,
        )
    console.print(gt)
