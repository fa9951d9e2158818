"""config.json reading rules (as vLLM reads them) and errors that name the file and the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.core.errors import InputFileError, KvtoolError
from kvtool.estimate.hf_config import load_config_path, parse_config

BASE = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32}


def parse(**extra):
    return parse_config({**BASE, **extra}, where="config.json")


def test_head_dim_explicit_wins_over_hidden_over_heads():
    assert parse().head_dim == 128
    assert parse(head_dim=256).head_dim == 256


@pytest.mark.parametrize("key", ["num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"])
def test_kv_head_keys(key):
    assert parse(**{key: 4}).num_kv_heads == 4


def test_no_kv_key_means_mha():
    assert parse().num_kv_heads == 32


def test_falcon_old_names_and_multi_query():
    spec = parse_config(
        {"model_type": "RefinedWebModel", "n_embd": 4544, "n_head": 71, "n_layer": 32, "multi_query": True}, where="c"
    )
    assert (spec.num_kv_heads, spec.head_dim, spec.num_layers) == (1, 64, 32)


def test_mla_latent_width():
    spec = parse(kv_lora_rank=512, qk_rope_head_dim=64, num_key_value_heads=32)
    assert spec.is_mla and spec.head_dim == 576 and spec.num_kv_heads == 1


def test_layer_types_override_family_rules():
    kinds = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    spec = parse(num_hidden_layers=6, layer_types=kinds, sliding_window=512)
    assert spec.layer_kinds == ("sliding", "sliding", "full") * 2 and spec.sliding_window == 512


def test_use_sliding_window_false_means_none():
    spec = parse(model_type="qwen2", sliding_window=131072, use_sliding_window=False, max_window_layers=28)
    assert set(spec.layer_kinds) == {"full"} and spec.sliding_window is None


def test_mistral_rule_every_layer_and_gemma3_pattern():
    assert set(parse(model_type="mistral", sliding_window=4096).layer_kinds) == {"sliding"}
    spec = parse(num_hidden_layers=12, sliding_window=1024, sliding_window_pattern=6)
    assert [i for i, k in enumerate(spec.layer_kinds) if k == "full"] == [5, 11]


def test_dtype_and_torch_dtype():
    assert parse(dtype="bfloat16").dtype == "bfloat16"  # transformers 5
    assert parse(torch_dtype="float16").dtype == "float16"  # older
    assert parse(dtype="bfloat16", torch_dtype="float32").dtype == "bfloat16"


def test_text_config_of_multimodal():
    spec = parse_config(
        {"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": {**BASE, "head_dim": 128}}, where="c"
    )
    assert spec.head_dim == 128 and spec.dtype == "bfloat16"


def test_missing_field_names_file_and_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 2}))
    data, file = load_config_path(tmp_path)
    with pytest.raises(InputFileError) as err:
        parse_config(data, where=str(file))
    assert str(file) in err.value.one_line() and "num_attention_heads" in err.value.one_line()


def test_wrong_type_names_the_field():
    with pytest.raises(InputFileError) as err:
        parse(num_key_value_heads="eight")
    assert "field num_key_value_heads" in err.value.one_line()


def test_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputFileError) as err:
        load_config_path(tmp_path / "config.json")
    assert "not valid JSON" in err.value.message and err.value.where.endswith("config.json")


def test_missing_dir_config(tmp_path):
    with pytest.raises(InputFileError):
        load_config_path(tmp_path)


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            sorted(BASE)
            + [
                "num_key_value_heads",
                "head_dim",
                "sliding_window",
                "layer_types",
                "kv_lora_rank",
                "dtype",
                "multi_query",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(-5, 5000),
            st.text(max_size=5),
            st.booleans(),
            st.lists(st.text(max_size=3), max_size=3),
        ),
    )
)
def test_random_configs_never_crash(data):
    try:
        parse_config(data, where="c")
    except KvtoolError:
        pass


def test_context_length_from_vllms_length_keys():
    # GPT-2's config.json (openai-community/gpt2): n_positions 1024, n_layer 12, n_head 12, n_embd 768 and no
    # max_position_embeddings; vLLM derives max_model_len 1024 from n_positions.
    gpt2 = {
        "model_type": "gpt2",
        "n_positions": 1024,
        "n_ctx": 1024,
        "n_layer": 12,
        "n_head": 12,
        "n_embd": 768,
        "vocab_size": 50257,
    }
    assert parse_config(gpt2, where="gpt2").max_position_embeddings == 1024
    # the smallest key wins (vLLM: "Choose the smallest max_length from the possible keys")
    both = {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "hidden_size": 64,
        "max_position_embeddings": 8192,
        "seq_length": 4096,
    }
    assert parse_config(both, where="x").max_position_embeddings == 4096


def test_phi_sliding_window_as_vllm_032_reads_it():
    # vLLM 0.32 (engine/arg_utils.py create_engine_config): without layer_types, CacheConfig.sliding_window is the
    # config's sliding_window and LlamaAttention (Phi3ForCausalLM is a LlamaForCausalLM) applies it to every layer;
    # with sliding_window null (microsoft/phi-4's config.json) every layer is full attention.
    from kvtool.estimate.hf_config import FULL, SLIDING, parse_config

    phi = {
        "model_type": "phi3",
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 10,
        "vocab_size": 100352,
        "max_position_embeddings": 16384,
        "sliding_window": None,
        "torch_dtype": "bfloat16",
    }
    assert set(parse_config(phi, where="phi-4").layer_kinds) == {FULL}
    # microsoft/Phi-3-mini-4k-instruct: sliding_window 2047 on every layer
    mini = {
        **phi,
        "sliding_window": 2047,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
    }
    spec = parse_config({**mini, "hidden_size": 3072}, where="phi-3-mini")
    assert set(spec.layer_kinds) == {SLIDING} and spec.sliding_window == 2047
