"""`kvtool repro --target` on decoders of the shapes real code has (tests/data/repro/decoders.py): gpt-fast
preallocated KVCache modules, litgpt per-block caches, slot pools, per-head views, Hugging Face Llama and
Mistral (DynamicCache, StaticCache, sliding window) with random weights from a tiny local config.

Every correct decoder passes every check; every buggy one fails the check that names its bug.  Positions in
the expected evidence are derived by hand from the workload (kvtool.repro.workload: r0 has a 5-token prompt,
so position 5 is its first decode token).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK
from kvtool.repro.target import CHECK_NAMES, check_target
from tests.support import DATA

REPRO = DATA / "repro"


@pytest.fixture(autouse=True)
def decoders_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPRO))
    for name in ("decoders", "repro_targets"):
        sys.modules.pop(name, None)
    yield
    for name in ("decoders", "repro_targets"):
        sys.modules.pop(name, None)


def _check(spec: str, **kwargs):
    torch.set_num_threads(1)
    return check_target(spec, interleavings=kwargs.pop("interleavings", 2), **kwargs)


def _by_name(result, name):
    return next(c for c in result.checks if c.name == name)


CORRECT = [
    "decoders:gptfast",  # preallocated KVCache modules, index_copy_ at input_pos
    "decoders:gptfast_on",  # a factory taking device and dtype
    "decoders:nextpos",  # the adapter tracks the next position in its cache dict
    "decoders:headviews",  # per-head views of one [B, H, S, D] buffer
    "decoders:expand_batch",  # batch caches allocated per row
    "decoders:slot_pool",  # one pool, a slot per request, freed by kvtool_end_request
    "decoders:litgpt",  # one KVCache module per block, input_pos_maxp1
    "decoders:reporting",  # a cache with kvtool_tensors() and kvtool_valid_length()
    "decoders:hf_adapter",  # a token adapter over LlamaForCausalLM with its own DynamicCache
    "decoders:hf_llama",  # the bare PreTrainedModel, driven natively
]


@pytest.mark.parametrize("spec", CORRECT)
def test_correct_decoders_pass_every_check(spec):
    result = _check(spec)
    assert result.failed_checks == (), [(c.name, c.message, c.evidence) for c in result.checks if not c.passed]
    assert [c.name for c in result.checks] == list(CHECK_NAMES)
    assert not any(c.skipped for c in result.checks)  # token and HF targets take batches: all 7 checks ran


# (factory, the check that names the bug, a piece of its evidence)
BUGGY = [
    # `[KVCache(...)] * n_layer`: every layer the same object
    ("decoders:gptfast_shared_layer_cache", "no-aliasing", "r0 cache[1] is the same object as cache[0]"),
    # causal mask built for the new tokens as if they started at 0: wrong from the first decode token
    ("decoders:gptfast_mask_ignores_offset", "consistency", "r0: first differs at position 5 (decode)"),
    # rotary ids restarting at 0 for each new token: the prompt is right, the first decode token is not
    ("decoders:gptfast_rope_restart", "consistency", "r0: first differs at position 5 (decode)"),
    # layer i reads the cache of layer i - 1
    ("decoders:gptfast_layer_index", "consistency", "r0: first differs at position 5 (decode)"),
    # a memo keyed by prompt length: r3 has r0's length and other tokens
    ("decoders:gptfast_memo_by_prompt_length", "isolation", "r3 (r0's length)"),
    # the next position taken as the last written index: decode token 1 overwrites the last prompt token
    ("decoders:nextpos_last_index", "consistency", "r0: first differs at position 5 (decode)"),
    # heads as views of one [B, S, D] buffer (the article's opening bug)
    ("decoders:headviews_inplace", "no-aliasing", "cache[0].k_heads[0], cache[0].k_heads[1], cache[0].k_heads[2]"),
    # batch rows from expand: one memory
    ("decoders:expand_batch_alias", "batch", "its 2 rows along dim 0 are one memory (stride 0"),
    # a slot pool handing out 2 rows round robin to 6 live requests
    ("decoders:slot_pool_overlap", "no-shared-storage", "share storage"),
    # gpt-fast as written: the caches live on the model, every request uses them
    ("decoders:instance_cache", "isolation", "first: r"),
    # a cache reporting its valid length, not advanced by decode steps: after r0's prompt and 1 decode token
    ("decoders:reporting_stale_length", "cache-length", "r0 cache.L0.k: reports 5 tokens held after 6 tokens seen"),
    # input_pos_maxp1 without the + 1: the last prompt token (position 4) no longer sees itself in a chunk
    ("decoders:litgpt_maxp1", "consistency", "r0: first differs at position 4 (prompt)"),
    # the prompt on the training path: the cache never holds it
    ("decoders:litgpt_training_path", "consistency", "r0: first differs at position 5 (decode)"),
    (
        "decoders:hf_adapter_rope_restart",
        "consistency",
        "first diverging: cache tensor cache.layers[0].keys from position 5",
    ),
    ("decoders:hf_adapter_training_path", "consistency", "left the cache empty"),
    # a PreTrainedModel that drops attention_mask: r0's 5-token prompt is padded by 3 to r1's 8 (padding-mask)
    ("decoders:hf_llama_ignores_padding", "batch", "left-padded batch: r0 (3 pad positions) differs from r0 alone"),
    # a PreTrainedModel subclass, driven natively: the first diverging layer comes from hidden_states
    (
        "decoders:hf_llama_rope_restart",
        "consistency",
        "first diverging: the output of layer 0 (hidden_states[1]) from position 5",
    ),
]


@pytest.mark.parametrize("spec, check, evidence", BUGGY, ids=[b[0].split(":")[1] for b in BUGGY])
def test_each_bug_fails_the_check_that_names_it(spec, check, evidence):
    result = _check(spec)
    assert check in result.failed_checks
    found = _by_name(result, check)
    assert any(evidence in line for line in found.evidence), found.evidence


def test_never_filled_cache_is_named_by_cache_length():
    # litgpt's training path for the prompt: after r0's 5-token prompt none of its 5 positions was written.
    result = _check("decoders:litgpt_training_path")
    lines = _by_name(result, "cache-length").evidence
    assert lines[0].startswith(
        "r0 cache[0].k: preallocated along dim 2 (capacity 32): 5 of the first 5 positions never written after "
        "5 tokens seen (all zeros)"
    )
    assert lines[0].endswith("(and 23 more like it)")  # k and v of 2 layers of 6 requests, collapsed


def test_hf_training_path_cache_reports_its_length():
    # DynamicCache.get_seq_length() after r0's prompt (skipped the cache) and one decode token: 1, not 6.
    result = _check("decoders:hf_adapter_training_path")
    assert (
        _by_name(result, "cache-length")
        .evidence[0]
        .startswith("r0 cache.layers[0].keys: reports 1 tokens held after 6 tokens seen")
    )


@pytest.mark.parametrize("folder", ["hf_llama", "hf_mistral"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hf_folders_with_random_weights_pass(folder, cache):
    result = _check(f"hf:{REPRO / folder}", hf_cache=cache)
    assert result.failed_checks == (), [(c.name, c.evidence) for c in result.checks if not c.passed]
    assert result.protocol == "hf" and result.vocab_size == 128  # config.json
    assert result.built.startswith("random weights (seed 0) from ")
    shapes = result.cache_notes[0]
    # transformers 5.19 cache_utils: DynamicSlidingWindowLayer keeps the last sliding_window - 1 tokens,
    # StaticSlidingWindowLayer preallocates sliding_window; StaticCache preallocates max_cache_len (the longest
    # request, r5: 10 + 4 = 14 tokens); DynamicLayer holds the 9 tokens r0 has seen.  num_key_value_heads 2,
    # head_dim 64 / 4 = 16.
    want = {
        ("hf_llama", "dynamic"): "[1, 2, 9, 16]",
        ("hf_llama", "static"): "[1, 2, 14, 16]",
        ("hf_mistral", "dynamic"): "[1, 2, 3, 16]",
        ("hf_mistral", "static"): "[1, 2, 4, 16]",
    }[(folder, cache)]
    assert f"cache.layers[0].keys {want}" in shapes


def test_what_was_skipped_is_said(run_cli):
    # The slot pool's cache is a dict with the slot number: an int, not looked into.
    result = run_cli("repro", "--target", "decoders:slot_pool", "--interleavings", "2", "--json")
    assert result.exit_code == EXIT_OK, result.stdout
    notes = json.loads(result.stdout)["target"]["cache_notes"]
    assert "skipped cache['slot']: an int" in notes


def test_checks_are_streamed_on_stdout_as_they_finish(run_cli):
    result = run_cli("repro", "--target", "decoders:gptfast_rope_restart", "--interleavings", "2")
    assert result.exit_code == EXIT_CHECK_FAILED
    lines = result.stdout.splitlines()
    assert lines[0] == "kvtool repro --target decoders:gptfast_rope_restart: checks as they finish"
    statuses = [line.split(":")[0] for line in lines[1:] if not line.startswith(" ")][: len(CHECK_NAMES)]
    assert statuses == [
        "pass determinism",
        "pass isolation",
        "FAIL consistency",
        "pass no-shared-storage",
        "pass no-aliasing",
        "pass cache-length",
        "pass batch",
    ]
    assert "6 of 7 checks passed; failed: consistency" in result.stdout


def test_ctrl_c_prints_what_finished_and_exits_130(run_cli):
    result = run_cli("repro", "--target", "repro_targets:ctrl_c", "--interleavings", "2")
    assert result.exit_code == EXIT_INTERRUPTED
    assert "pass determinism: the same request twice" in result.stdout
    assert "1 of 1 checks passed (interrupted: the checks above finished)" in result.stdout
    assert result.stderr.endswith("Error: interrupted\n")
    as_json = run_cli("repro", "--target", "repro_targets:ctrl_c", "--interleavings", "2", "--json")
    assert as_json.exit_code == EXIT_INTERRUPTED
    target = json.loads(as_json.stdout)["target"]
    assert target["interrupted"] is True and [c["name"] for c in target["checks"]] == ["determinism"]


def test_hf_folder_from_the_cli(run_cli):
    result = run_cli("repro", "--target", f"hf:{REPRO / 'hf_mistral'}", "--interleavings", "2", "--json")
    assert result.exit_code == EXIT_OK, result.stdout
    target = json.loads(result.stdout)["target"]
    assert target["module_type"] == "MistralForCausalLM" and target["passed"] is True


def test_hf_folder_without_config_is_an_input_error(run_cli, tmp_path):
    # a missing input file is exit 3 (README "Exit codes"; estimate --config DIR without config.json exits 3)
    result = run_cli("repro", "--target", f"hf:{tmp_path}")
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr == (
        f"Error: no config.json in '{tmp_path}' (--target)\nTip: hf:DIR names a local model folder\n"
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        # transformers' "OSError: It looks like the config file ... is not a valid JSON file", exit 2, for both
        ("", "the file is empty"),
        ("{bad", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ("[1]", "config.json must hold a JSON object"),
    ],
)
def test_hf_folder_with_a_bad_config_is_an_input_error(run_cli, tmp_path, text, line):
    (tmp_path / "config.json").write_text(text)
    result = run_cli("repro", "--target", f"hf:{tmp_path}")
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr.splitlines()[0] == f"Error: {line} ({tmp_path / 'config.json'})"


def test_package_of_the_active_environment_is_found(run_cli, tmp_path, monkeypatch):
    # kvtool installed apart (pipx) while the user's package lives in their activated virtualenv.
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "userpkg_i10.py").write_text(
        "import torch\nfrom repro_targets import Attention\n\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return Attention()\n"
    )
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("userpkg_i10", None)
    result = run_cli("repro", "--target", "userpkg_i10:make", "--interleavings", "2", "--json")
    sys.modules.pop("userpkg_i10", None)
    assert result.exit_code == EXIT_OK, result.stderr
    notes = json.loads(result.stdout)["target"]["cache_notes"]
    assert notes[0].startswith(f"imported from the active environment ({site})")


def test_missing_package_tip_names_python_m(run_cli, monkeypatch):
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    result = run_cli("repro", "--target", "not_installed_pkg_i10:make")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1] == (
        "Tip: run kvtool with your environment's Python: python -m kvtool repro --target not_installed_pkg_i10:make "
        "(or pip install kvtool into that environment)"
    )


@pytest.mark.parametrize("spec", ["decoders:gptfast", "decoders:litgpt", f"hf:{REPRO / 'hf_mistral'}"])
def test_no_false_alarm_in_bfloat16(spec):
    # bfloat16 tolerances (rtol 1.6e-2, atol 1e-2: kvtool.repro.checks.TOLERANCES); the caches follow the model's
    # dtype (gpt-fast and litgpt allocate them in it).
    result = _check(spec, dtype="bfloat16")
    assert result.failed_checks == (), [(c.name, c.message) for c in result.checks if not c.passed]


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        ("decoders:gptfast_rope_restart", "consistency"),
        # (the tiny HF Llama's rotary bug moves its logits by ~0.003, below bfloat16's resolution: float32 only)
    ],
)
def test_bugs_still_caught_in_bfloat16(spec, check):
    # consistency and batch compare two computation paths with bfloat16's tolerance scaled by sqrt(layers)
    # (kvtool.repro.checks.path_tolerance, set from a correct 16-layer model's 0.039 on a real H200); rotary ids
    # restarting at 0 must still fail there.
    result = _check(spec, dtype="bfloat16")
    assert check in result.failed_checks, [(c.name, c.message) for c in result.checks]


def test_path_tolerance_scales_bfloat16_by_depth():
    from kvtool.repro.checks import TOLERANCES, path_tolerance

    # sqrt(16) = 4: 0.016 x 4 = 0.064 and 0.01 x 4 = 0.04 (hand computation); float32 is never loosened
    tol = path_tolerance("bfloat16", 16)
    assert (round(tol.rtol, 6), round(tol.atol, 6)) == (0.064, 0.04)
    assert path_tolerance("float32", 16) == TOLERANCES["float32"]
    assert path_tolerance("bfloat16", 1) == TOLERANCES["bfloat16"]
