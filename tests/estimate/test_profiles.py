"""Profile loading: every built-in profile validates; unknown keys and wrong types are rejected with file+field."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kvtool.core.errors import InputFileError, UsageError
from kvtool.estimate.profiles import builtin_dir, find_gpu, find_model, list_gpus, list_models, model_spec
from tests.support import REPO_ROOT

REQUIRED_MODELS = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mistral-7b-v0.1",
    "mixtral-8x7b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "gemma-2-9b",
    "gemma-3-27b",
    "phi-3-mini",
    "falcon-7b",
    "deepseek-v2-lite",
    "deepseek-v3",
]
REQUIRED_GPUS = [
    "A10",
    "A10G",
    "L4",
    "L40",
    "L40S",
    "RTX-3090",
    "RTX-4090",
    "RTX-PRO-6000",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H100-PCIe",
    "H100-NVL",
    "H20",
    "H200",
    "B200",
    "GB200",
    "MI250X",
    "MI300X",
    "MI325X",
]


def test_builtin_profiles_all_load_and_cite_their_source():
    names = {p.name for p in list_models()}
    assert set(REQUIRED_MODELS) <= names
    for profile in list_models():
        model_spec(profile)
        text = open(profile.file, encoding="utf-8").read()
        assert f"huggingface.co/{profile.hf_repo}" in text  # the source comment
    assert set(REQUIRED_GPUS) <= {g.name for g in list_gpus()}


def test_gpu_sizes_are_what_the_driver_reports():
    # vLLM multiplies the total the driver reports to CUDA by gpu_memory_utilization, and logs it: an H100 80GB
    # logs "total_gpu_memory (79.22GiB)" (github.com/vllm-project/vllm/pull/12126 and pull/10511).  deviceQuery on
    # an A100-SXM4-40GB: "42298834944 bytes" (github.com/bottlerocket-os/bottlerocket/pull/3873).  PyTorch OOM
    # messages on L40S: "total capacity of 44.42 GiB" (github.com/stepfun-ai/Step-Video-T2V/issues/8).
    assert find_gpu("h100-80gb").memory_bytes == int(79.22 * 1024**3)
    assert find_gpu("A100-40GB").memory_bytes == 42_298_834_944
    assert find_gpu("L40S").memory_bytes == int(44.42 * 1024**3)
    # rocm-smi on an MI300X: 205,822,885,888 bytes of VRAM
    assert find_gpu("MI300X").memory_bytes == 205_822_885_888
    for gpu in list_gpus():
        # the driver keeps a little of what nvidia-smi shows: under 3 % (0.3-0.7 GiB) on every card with both figures
        if gpu.nvidia_smi_mib is not None:
            shown = gpu.nvidia_smi_mib * 1024**2
            assert shown * 0.97 <= gpu.memory_bytes < shown, gpu.name
        assert gpu.evidence, gpu.name  # every profile cites its public evidence
    assert find_gpu("h100").name == "H100-80GB"  # alias


def test_gpu_bandwidth_and_dense_peaks():
    # NVIDIA H100 SXM datasheet: 3.35 TB/s; BF16 1,979 TFLOPS *with sparsity*, so 989.4 dense; FP8 3,958 sparse.
    h100 = find_gpu("H100-80GB")
    assert h100.memory_bandwidth_gb_s == 3350
    assert h100.peak_dense_tflops.for_dtype("bfloat16") == 989.4
    assert h100.peak_dense_tflops.fp8 == 1978.9
    # the A100 has no FP8 tensor cores (A100 datasheet)
    assert find_gpu("A100-80GB").peak_dense_tflops.for_dtype("fp8_e4m3") is None
    for gpu in list_gpus():
        assert gpu.memory_bandwidth_gb_s and gpu.peak_dense_tflops.bf16, gpu.name


def test_gpu_profile_rejects_bad_tflops(tmp_path):
    bad = write(
        tmp_path / "gpus" / "x.yaml",
        """\
        name: X
        memory: 10GiB
        peak_dense_tflops: {bf16: -1}
        """,
    )
    with pytest.raises(InputFileError) as err:
        find_gpu("X", [tmp_path])
    assert "peak_dense_tflops.bf16" in err.value.where
    write(bad, "name: X\nmemory: 10GiB\npeak_dense_tflops: {fp4: 1}\n")
    with pytest.raises(InputFileError) as err:
        find_gpu("X", [tmp_path])
    assert "unknown dtype 'fp4'" in err.value.message


def test_unknown_model_suggests_closest():
    with pytest.raises(UsageError) as err:
        find_model("llama2-7b")
    assert "llama-2-7b" in err.value.tip


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


MY_MODEL = """\
    name: my-model
    hf_repo: me/my-model
    config:
      hidden_size: 1024
      num_hidden_layers: 4
      num_attention_heads: 8
      num_key_value_heads: 2
      torch_dtype: bfloat16
"""


def test_user_directory_option_and_env(tmp_path, monkeypatch):
    write(tmp_path / "mine" / "models" / "my-model.yaml", MY_MODEL)
    write(tmp_path / "mine" / "gpus" / "toy.yaml", "name: toy\nmemory: 1GiB\n")
    spec = model_spec(find_model("my-model", [tmp_path / "mine"]))
    assert (spec.num_kv_heads, spec.head_dim) == (2, 128)
    assert find_gpu("toy", [tmp_path / "mine"]).memory_bytes == 1024**3
    with pytest.raises(UsageError):
        find_model("my-model")
    monkeypatch.setenv("KVTOOL_PROFILES", str(tmp_path / "mine"))
    assert find_model("my-model").hf_repo == "me/my-model"


def test_user_profile_overrides_builtin(tmp_path):
    write(tmp_path / "models" / "llama-2-7b.yaml", MY_MODEL.replace("my-model", "llama-2-7b"))
    assert find_model("llama-2-7b", [tmp_path]).hf_repo == "me/llama-2-7b"


def test_alias_lookup_honours_overrides(tmp_path):
    # profiles/gpus/h100-80gb.yaml names the aliases h100 and h800; a user profile of the same name without them
    # replaces it whole (earlier directories override later ones), so its aliases go with it
    write(tmp_path / "gpus" / "mine.yaml", "name: H100-80GB\nmemory: 1GiB\naliases: [h800]\n")
    assert find_gpu("h800", [tmp_path]).memory_bytes == 1024**3
    with pytest.raises(UsageError, match="unknown GPU 'h100'"):
        find_gpu("h100", [tmp_path])
    assert find_gpu("h100-nvl", [tmp_path]).name == "H100-NVL"  # the other built-in profiles stay
    # an alias found without reading every profile is the one the full scan finds (every name and alias)
    every = {key for p in list_gpus() for key in (p.name, *p.aliases)}
    assert all(find_gpu(key).name in {p.name for p in list_gpus() if key in (p.name, *p.aliases)} for key in every)


@pytest.mark.parametrize(
    "text, field",
    [
        (MY_MODEL + "    colour: red\n", "field colour"),
        (MY_MODEL.replace("    hf_repo: me/my-model\n", ""), "field hf_repo"),
        (MY_MODEL.replace("name: my-model", "name: 7"), "field name"),
        (MY_MODEL + "      num_kv_head: 2\n", "field config.num_kv_head"),
        (MY_MODEL.replace("num_hidden_layers: 4", "num_hidden_layers: four"), "field num_hidden_layers"),
        ("name: [unclosed\n", "not valid YAML"),
        ("- a list\n", "YAML mapping"),
    ],
)
def test_bad_profiles_name_file_and_field(tmp_path, text, field):
    file = write(tmp_path / "models" / "my-model.yaml", text)
    with pytest.raises(InputFileError) as err:
        model_spec(find_model("my-model", [tmp_path]))
    assert str(file) in err.value.one_line() and field in err.value.one_line()


def test_bad_gpu_memory(tmp_path):
    write(tmp_path / "gpus" / "toy.yaml", "name: toy\nmemory: lots\n")
    with pytest.raises(InputFileError) as err:
        find_gpu("toy", [tmp_path])
    assert "field memory" in err.value.one_line()


def test_missing_profile_dir_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        find_model("x", [tmp_path / "nope"])


def test_profiles_load_after_non_editable_install(tmp_path):
    # A plain (non-editable) install into a target directory, run from another directory.
    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "--target",
            str(target),
            str(REPO_ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (target / "kvtool" / "profiles" / "models" / "llama-2-7b.yaml").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    run = subprocess.run(
        [sys.executable, "-m", "kvtool", "estimate", "--model", "llama-2-7b", "--seq-len", "2048", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert '"kv_bytes": 1073741824' in run.stdout
    assert str(target) in run.stdout  # the installed profile was read, not the source tree


def test_builtin_dir_in_source_tree():
    assert (builtin_dir() / "models" / "llama-2-7b.yaml").is_file()


def test_falcon_context_is_transformers_default():
    # tiiuae/falcon-7b's config.json has no max_position_embeddings; transformers' FalconConfig defaults it to
    # 2048, and vLLM derives max_model_len from that config object.
    assert model_spec(find_model("falcon-7b")).max_position_embeddings == 2048
