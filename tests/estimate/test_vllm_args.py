"""kvtool.estimate.vllm_args: real `vllm serve` command lines, copied verbatim from public issues (each cited), read
into kvtool's settings.  Expected values are read off each line by hand; where the issue also shows vLLM's own
"non-default args" log line, that is the reference (vLLM's own parse of the same line)."""

from __future__ import annotations

import pytest

from kvtool.core.errors import EXIT_INPUT, EXIT_USAGE, KvtoolError
from kvtool.estimate.vllm_args import human_readable_int, parse_vllm_serve, split_command_line


def read(line: str):
    return parse_vllm_serve(split_command_line(line))


def test_env_prefix_and_long_flags_issue_15469():
    # https://github.com/vllm-project/vllm/issues/15469
    line = read(
        "CUDA_VISIBLE_DEVICES=0,1 VLLM_USE_V1=1 VLLM_WORKER_MULTIPROC_METHOD=spawn vllm serve "
        "/home/work/anyujie/Qwen/Qwen2.5-VL-3B-Instruct --gpu-memory-utilization 0.9 --swap-space 16 "
        "--max-model-len 4096 --tensor-parallel-size 2 --port 8091 --disable-custom-all-reduce"
    )
    assert line.values() == {
        "model": "/home/work/anyujie/Qwen/Qwen2.5-VL-3B-Instruct",
        "gpu_memory_utilization": 0.9,
        "seq_len": "4096",
        "tp": 2,
    }
    assert line.ignored_flags == ("--swap-space", "--port", "--disable-custom-all-reduce")
    assert line.notes == ("environment ignored: CUDA_VISIBLE_DEVICES, VLLM_USE_V1, VLLM_WORKER_MULTIPROC_METHOD",)


QWEN3_VL_1492 = """\
# FP8 requires NVIDIA H100+ and CUDA 12+
python -m vllm.entrypoints.openai.api_server \\
  --model Qwen/Qwen3-VL-235B-A22B-Instruct\\
  --served-model-name Qwen/Qwen3-VL-235B-A22B-Instruct \\
  --tensor-parallel-size 8 \\
  --mm-encoder-tp-mode data \\
  --enable-expert-paralle \\
  --host 0.0.0.0 \\
  --port 22002 \\
  --dtype bfloat16 \\
  --gpu-memory-utilization 0.70 \\
  --quantization fp8 \\
  --distributed-executor-backend mp
"""


def test_api_server_module_comment_continuations_and_a_misspelt_flag_qwen3_vl_1492():
    # https://github.com/QwenLM/Qwen3-VL/issues/1492 (its --enable-expert-paralle typo is named, never a crash)
    line = read(QWEN3_VL_1492)
    assert line.values() == {
        "model": "Qwen/Qwen3-VL-235B-A22B-Instruct",
        "tp": 8,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.70,
        "quantization": "fp8",
    }
    assert "--enable-expert-paralle" in line.ignored_flags
    assert "--served-model-name" in line.ignored_flags
    assert line.notes == ()  # every word was a flag or its value


RING_1T_RECIPE = """\
vllm serve inclusionAI/Ring-1T-FP8 \\
  --trust-remote-code \\
  --tensor-parallel-size 8 \\
  --gpu-memory-utilization 0.97 \\
  --max_num_seqs 32 \\
  --kv-cache-dtype fp8 \\
  --compilation-config '{"use_inductor": false}' \\
  --served-model-name Ring-1T-FP8
"""


def test_underscore_names_and_a_json_flag_recipes_88():
    # https://github.com/vllm-project/recipes/pull/88 (vLLM reads --max_num_seqs as --max-num-seqs)
    line = read(RING_1T_RECIPE)
    assert line.values() == {
        "model": "inclusionAI/Ring-1T-FP8",
        "tp": 8,
        "gpu_memory_utilization": 0.97,
        "max_num_seqs": 32,
        "kv_dtype": "fp8",
    }
    assert line.ignored_flags == ("--trust-remote-code", "--compilation-config", "--served-model-name")
    assert line.notes == ()


def test_quoted_model_glm_29240():
    # https://github.com/vllm-project/vllm/pull/29240
    line = read(
        'vllm serve \\\n  "zai-org/GLM-4.6-FP8" \\\n  --tensor-parallel-size 8 \\\n  --tool-call-parser glm45 \\\n'
        "  --enable-auto-tool-choice \\\n  --enable-expert-parallel \\\n  --reasoning-parser glm45 \\\n"
        "  --max-model-len 32768"
    )
    assert line.values() == {"model": "zai-org/GLM-4.6-FP8", "tp": 8, "seq_len": "32768"}


def test_enforce_eager_deepseek_r1_339():
    # https://github.com/deepseek-ai/DeepSeek-R1/issues/339
    line = read(
        "vllm serve deepseek-ai/DeepSeek-R1-Distill-Qwen-32B --tensor-parallel-size 2 --max-model-len 32768 "
        "--enforce-eager"
    )
    assert line.values() == {
        "model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        "tp": 2,
        "seq_len": "32768",
        "enforce_eager": True,
    }
    assert line.ignored_flags == ()


def test_pipeline_parallel_api_server_10521():
    # https://github.com/vllm-project/vllm/issues/10521 (a trailing space, as posted)
    line = read(
        "CUDA_VISIBLE_DEVICES=0,1,2,3 python -m vllm.entrypoints.openai.api_server --model "
        "Meta-Llama-3.1-70B-Instruct-quantized.w8a8 --pipeline-parallel-size 4 --gpu-memory-utilization 0.9 "
        "--port 2198 --host 0.0.0.0 --served-model-name lianshan-llm-v1 "
    )
    assert line.values() == {
        "model": "Meta-Llama-3.1-70B-Instruct-quantized.w8a8",
        "pp": 4,
        "gpu_memory_utilization": 0.9,
    }


def test_underscore_tensor_parallel_15737():
    # https://github.com/vllm-project/vllm/issues/15737; its log's Namespace shows model='Qwen2.5-VL-32B-Instruct',
    # dtype='bfloat16'
    line = read(
        "python -m vllm.entrypoints.openai.api_server --model Qwen2.5-VL-32B-Instruct --port 8000 --host 0.0.0.0 "
        "--dtype bfloat16 --tensor_parallel_size 2 --limit-mm-per-prompt image=5,video=5"
    )
    assert line.values() == {"model": "Qwen2.5-VL-32B-Instruct", "dtype": "bfloat16", "tp": 2}
    assert line.settings[1].flag == "--tensor_parallel_size"


def test_short_tp_matches_vllms_own_non_default_args_36734():
    # https://github.com/vllm-project/vllm/pull/36734: vLLM logged for this line "non-default args: {...
    # 'max_model_len': 131072, ... 'tensor_parallel_size': 2, 'enable_prefix_caching': True, 'max_num_seqs': 16}"
    # (gpu_memory_utilization 0.9 is its default, so not listed there)
    line = read(
        "vllm serve Qwen/Qwen3.5-122B-A10B-GPTQ-Int4 --served-model-name Qwen3.5-27B-AWQ-4bit "
        "--gpu-memory-utilization 0.9 --port 8848 -tp 2 --max-model-len 131072 --enable-auto-tool-choice "
        "--tool-call-parser qwen3_coder --reasoning-parser qwen3 --max-num-seqs 16 --enable-prefix-caching"
    )
    assert line.values() == {
        "model": "Qwen/Qwen3.5-122B-A10B-GPTQ-Int4",
        "gpu_memory_utilization": 0.9,
        "tp": 2,
        "seq_len": "131072",
        "max_num_seqs": 16,
        "prefix_caching": True,
    }


def test_negative_boolean_forms_31588():
    # https://github.com/vllm-project/vllm/issues/31588
    line = read(
        "vllm serve openai-oss-120b --quantization mxfp4 \\\n"
        "    --enforce-eager --no-async-scheduling --no-enable-prefix-caching"
    )
    assert line.values() == {
        "model": "openai-oss-120b",
        "quantization": "mxfp4",
        "enforce_eager": True,
        "async_scheduling": False,
        "prefix_caching": False,
    }


def test_export_line_and_boolean_flag_without_value_4412():
    # https://github.com/vllm-project/vllm/pull/4412 (a comment's two-line launch)
    line = read(
        "export CUDA_VISIBLE_DEVICES=0,1\npython -m vllm.entrypoints.openai.api_server    \\\n"
        "        --model /home/models/Llama-2-7b-hf  \\\n        --dtype auto    \\\n"
        "        --pipeline-parallel-size 2    \\\n        --disable-log-requests"
    )
    assert line.values() == {"model": "/home/models/Llama-2-7b-hf", "dtype": "auto", "pp": 2}
    assert line.ignored_flags == ("--disable-log-requests",)


def test_container_arguments_alone_35720():
    # https://github.com/vllm-project/vllm/pull/35720: the arguments after the image vllm/vllm-openai:v0.16.0;
    # vLLM logged "non-default args: {... 'max_model_len': 4096, 'kv_cache_dtype': 'fp8'}"
    line = read("--model unsloth/Meta-Llama-3.1-8B-Instruct \\\n    --max-model-len 4096 \\\n    --kv-cache-dtype fp8")
    assert line.values() == {"model": "unsloth/Meta-Llama-3.1-8B-Instruct", "seq_len": "4096", "kv_dtype": "fp8"}


def test_the_whole_docker_line_is_refused_with_a_tip_35720():
    # https://github.com/vllm-project/vllm/pull/35720: `sudo docker run ... IMAGE --model ...` is not vllm serve
    with pytest.raises(KvtoolError) as err:
        read("sudo docker run \\\n    -i -t --rm \\\n    vllm/vllm-openai:v0.16.0 \\\n    --model x")
    assert err.value.exit_code == EXIT_USAGE
    assert err.value.message.startswith("not a vllm serve command line: sudo docker run -i")


def test_kv_cache_memory_bytes_and_no_prefix_caching_nvidia_container():
    # a public launch script (docker run nvcr.io/nvidia/vllm:26.06-py3 vllm serve ...), the vllm serve part;
    # 17179869184 bytes = 16 GiB
    line = read(
        "vllm serve nvidia/Qwen3-Next-80B-A3B-Instruct-NVFP4 \\\n  --gpu-memory-utilization 0.7 \\\n"
        "  --host 0.0.0.0 \\\n  --kv-cache-memory-bytes 17179869184 \\\n  --max-model-len 131072 \\\n"
        "  --max-num-seqs 1 \\\n  --no-enable-prefix-caching\n"
    )
    assert line.values()["kv_memory"] == "17179869184"
    assert line.values()["prefix_caching"] is False


def test_an_unexpanded_shell_variable_is_one_error_naming_the_flag_28621():
    # https://github.com/vllm-project/vllm/issues/28621, the first command as the shell sees it (its line after
    # --no-enable-prefix-caching lacks the backslash); copied, not run, so ${...} is not expanded
    text = (
        "vllm serve ${MODEL_PATH} \\\n        -tp 8 \\\n        --enable-expert-parallel \\\n"
        "        --enable-eplb \\\n        --trust_remote_code \\\n        --block-size 64 \\\n"
        '        --load-format "runai_streamer" \\\n'
        "        --model-loader-extra-config '{\"concurrency\":16}' \\\n"
        "        --max_model_len ${MAX_MODEL_SEQ_LEN} \\\n        --port 8021 \\\n        --no-enable-prefix-caching"
    )
    with pytest.raises(KvtoolError) as err:
        read(text)
    assert err.value.one_line() == (
        "--max_model_len takes a whole number, not '${MAX_MODEL_SEQ_LEN}' (the vllm serve line after --)"
    )
    expanded = read(text.replace("${MAX_MODEL_SEQ_LEN}", "94208"))  # the issue's export MAX_MODEL_SEQ_LEN=94208
    assert expanded.values() == {
        "model": "${MODEL_PATH}",
        "tp": 8,
        "block_size": 64,
        "seq_len": "94208",
        "prefix_caching": False,
    }
    # --enable-expert-parallel, --enable-eplb, --trust-remote-code take no value: nothing after them was eaten
    assert expanded.ignored_flags[:3] == ("--enable-expert-parallel", "--enable-eplb", "--trust-remote-code")


@pytest.mark.parametrize(
    ("text", "number"),
    # vllm/utils/argparse_utils.py human_readable_int (0.33.0), its docstring's examples and its rule
    [("1k", 1000), ("1K", 1024), ("25.6k", 25600), ("10G", 10 * 2**30), ("10g", 10**10), ("8192", 8192)],
)
def test_human_readable_int_as_vllm(text, number):
    assert human_readable_int(text, flag="--max-num-batched-tokens") == number


def test_binary_suffix_with_decimals_is_refused_as_vllm_does():
    with pytest.raises(KvtoolError, match="decimals are not allowed with the binary suffix K"):
        human_readable_int("1.5K", flag="--kv-cache-memory-bytes")


def test_flag_equals_value_and_the_last_one_wins():
    line = parse_vllm_serve(["vllm", "serve", "m", "--max-model-len=32k", "-tp", "2", "--tensor-parallel-size=4"])
    assert line.values() == {"model": "m", "seq_len": "32000", "tp": 4}
    assert line.notes == ("-tp 2 and --tensor-parallel-size 4 both given: the last wins",)


def test_disable_form_and_max_model_len_auto():
    # 0.33's EnableDisableAction pairs --enable-prefix-caching with --disable-prefix-caching; max_model_len auto
    # (-1) means vLLM fits it to memory, which kvtool does not: left to kvtool's default
    line = parse_vllm_serve(["vllm", "serve", "m", "--disable-prefix-caching", "--max-model-len", "auto"])
    assert line.values() == {"model": "m", "prefix_caching": False}


def test_dotted_json_keys_and_served_model_names_take_their_values():
    line = parse_vllm_serve(
        ["vllm", "serve", "m", "--compilation-config.level", "3", "--served-model-name", "a", "b", "-tp", "2"]
    )
    assert line.values() == {"model": "m", "tp": 2}
    assert line.ignored_flags == ("--compilation-config", "--served-model-name")
    # --speculative-config's dotted keys are read (issue 27; tests/estimate/test_spec_decode.py)
    spec = parse_vllm_serve(["vllm", "serve", "m", "--speculative-config.method", "ngram", "-tp", "2"])
    assert spec.values() == {"model": "m", "tp": 2, "speculative_config": '{"method": "ngram"}'}
    assert line.notes == ()


def test_two_different_models_are_a_usage_error():
    with pytest.raises(KvtoolError, match="two models"):
        parse_vllm_serve(["vllm", "serve", "a/b", "--model", "c/d"])


def test_shell_redirections_end_the_command():
    line = read("nohup vllm serve Qwen/Qwen3-8B --tensor_parallel_size 4 --port 8000 >/dev/null 2>&1 &")
    assert line.values() == {"model": "Qwen/Qwen3-8B", "tp": 4}


def test_config_yaml_is_read_and_the_command_line_wins(tmp_path):
    # vllm/utils/argparse_utils.py _pull_args_from_config (0.33.0): cli > config > defaults
    config = tmp_path / "serve.yaml"
    config.write_text("tensor-parallel-size: 4\nmax_model_len: 8192\nenable-prefix-caching: false\nport: 8000\n")
    line = parse_vllm_serve(["vllm", "serve", "m", "--config", str(config), "-tp", "2"])
    assert line.values() == {"model": "m", "tp": 2, "seq_len": "8192", "prefix_caching": False}
    assert "--port" in line.ignored_flags


def test_a_missing_config_yaml_is_an_input_error(tmp_path):
    with pytest.raises(KvtoolError) as err:
        parse_vllm_serve(["vllm", "serve", "m", "--config", str(tmp_path / "none.yaml")])
    assert err.value.exit_code == EXIT_INPUT


def test_a_boolean_given_a_word_is_refused():
    with pytest.raises(KvtoolError, match="--enforce-eager is on or off, not 'maybe'"):
        parse_vllm_serve(["vllm", "serve", "m", "--enforce-eager=maybe"])
