"""profiles/parsed.json: the built-in profiles parsed ahead of time, so that an estimate never imports PyYAML.

The reference is PyYAML itself: every recorded value must be what its safe loader makes of the same text.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import yaml

from kvtool.estimate import parsed_profiles, profiles
from tests.support import REPO_ROOT

SOURCE = REPO_ROOT / "profiles"


def test_parsed_json_is_current():
    # the file is what the generator makes of the YAML profiles now (else: python -m kvtool.estimate.parsed_profiles)
    assert parsed_profiles.main(["--check"]) == 0


def test_every_builtin_profile_is_recorded_as_pyyaml_reads_it():
    recorded = json.loads((SOURCE / "parsed.json").read_text(encoding="utf-8"))["profiles"]
    files = sorted(SOURCE.glob("*/*.yaml"))
    assert len(recorded) == len(files) >= 40  # 20 GPUs, 20 models
    for file in files:
        text, value = recorded[f"{file.parent.name}/{file.name}"]
        assert text == file.read_text(encoding="utf-8")
        assert json.loads(value) == yaml.safe_load(text), file


def test_a_profile_edited_since_is_read_from_its_yaml(tmp_path, monkeypatch):
    root = tmp_path / "profiles"
    shutil.copytree(SOURCE, root)
    monkeypatch.setattr(profiles, "builtin_dir", lambda: root)
    assert profiles.find_gpu("h100").memory_bytes == round(79.22 * 1024**3)  # recorded: from parsed.json
    edited = root / "gpus" / "h100-80gb.yaml"
    edited.write_text(edited.read_text(encoding="utf-8").replace("memory: 79.22GiB", "memory: 1GiB"))
    assert profiles.find_gpu("h100").memory_bytes == 1024**3  # the text differs from the recorded one: the YAML
    (root / "parsed.json").write_text("not json")
    parsed_profiles._entries.cache_clear()  # read once per process
    assert parsed_profiles._entries(root / "parsed.json") == {}
    assert profiles.find_model("llama-2-7b").hf_repo == "meta-llama/Llama-2-7b-hf"  # a broken cache: the YAML


def test_estimate_imports_no_yaml():
    # the built-in profiles of the source tree (an installed kvtool ships them as kvtool.profiles, parsed.json too)
    code = (
        "import sys, os\n"
        "from pathlib import Path\n"
        "import kvtool.estimate.profiles as p\n"
        f"p.builtin_dir = lambda: Path({str(SOURCE)!r})\n"
        "from kvtool.cli import run\n"
        "sys.stdout = open(os.devnull, 'w')\n"
        "code = run(['estimate', '--model', 'llama-3.1-8b', '--gpu', 'H100'])\n"
        "sys.stderr.write(f'CODE {code} YAML {\"yaml\" in sys.modules}\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip().splitlines()[-1] == "CODE 0 YAML False", proc.stderr
