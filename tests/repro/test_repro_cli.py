"""`kvtool repro` through the real entry point: --list, --json, --target, usage errors and exit codes."""

from __future__ import annotations

import json
import sys

import pytest

from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE
from kvtool.repro.scenarios import SCENARIO_NAMES
from tests.support import DATA, heavy_modules_loaded_by

TARGETS = DATA / "repro"


@pytest.fixture
def targets_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TARGETS))
    sys.modules.pop("repro_targets", None)
    yield
    sys.modules.pop("repro_targets", None)


def test_list_names_every_scenario_without_torch():
    codes, stdout, heavy = heavy_modules_loaded_by(["repro", "--list"], ["repro", "--help"], modules=("torch",))
    assert codes == [0, 0]
    for name in SCENARIO_NAMES:
        assert name in stdout
    assert heavy == []


def test_help(run_cli):
    result = run_cli("repro", "--help")
    assert result.exit_code == 0
    for option in ("--target", "--interleavings", "--dtype", "--device", "--json", "--list"):
        assert option in result.stdout


def test_default_run_json_passes(run_cli):
    result = run_cli("repro", "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["scenarios"]] == list(SCENARIO_NAMES)
    assert data["interleavings"] == 200 and data["device"] in ("cpu", "cuda") and data["target"] is None
    for s in data["scenarios"]:
        for side in ("buggy", "fixed"):
            for key in ("detected", "allclose", "max_abs_diff", "shared_storage", "interleaving_mismatches"):
                assert key in s[side]
        assert s["buggy"]["detected"] is True and s["fixed"]["detected"] is False
        assert s["fixed"]["interleaving_mismatches"] == 0
        assert s["buggy"]["cache_tensors"][0]["data_ptr"] > 0


def test_named_scenarios_table(run_cli):
    result = run_cli("repro", "layer-index", "rope-offset", "--interleavings", "5", "--seed", "3")
    assert result.exit_code == EXIT_OK, result.stderr
    assert "layer-index" in result.stdout and "rope-offset" in result.stdout
    assert "shared-instance-cache" not in result.stdout
    assert "2 of 2 scenarios" in result.stdout
    assert "rtol 0.0001, atol 1e-05" in result.stdout


def test_dtype_tolerances_shown(run_cli):
    result = run_cli("repro", "prealloc-slice", "--dtype", "bfloat16", "--interleavings", "5", "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    data = json.loads(result.stdout)
    assert data["dtype"] == "bfloat16" and data["tolerance"]["rtol"] == 1.6e-2


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-scenario"], "Error: unknown scenario 'no-such-scenario' (NAME)"),
        (["--interleavings", "0"], "Error: --interleavings must be between 1 and 10,000, got 0 (--interleavings)"),
        (["--interleavings", "-1"], "Error: --interleavings must be between 1 and 10,000, got -1 (--interleavings)"),
        # uncapped, 10**12 ran for practically ever (about 19 ms an interleaving of the seven scenarios)
        (
            ["--interleavings", str(10**12)],
            "Error: --interleavings must be between 1 and 10,000, got 1,000,000,000,000 (--interleavings)",
        ),
        (
            ["--interleavings", "10001"],
            "Error: --interleavings must be between 1 and 10,000, got 10,001 (--interleavings)",
        ),
        (
            ["--target", "x:y", "--interleavings", str(10**12)],
            "Error: --interleavings must be between 1 and 10,000, got 1,000,000,000,000 (--interleavings)",
        ),
        (["--seed", "-1"], "Error: --seed must be between 0 and 4611686018427387904, got -1 (--seed)"),
        (
            ["--seed", str(2**64)],
            "Error: --seed must be between 0 and 4611686018427387904, got 18446744073709551616 (--seed)",
        ),
        (["--dtype", "float16"], "Error: unknown dtype 'float16'; use one of float32, float64, bfloat16 (--dtype)"),
        (["--device", "tpu"], "Error: unknown device 'tpu'; use cpu or cuda (--device)"),
        (["layer-index", "--target", "x:y"], "Error: give scenario names or --target, not both (--target)"),
        (
            ["--target", "no_colon"],
            "Error: --target must look like package.module:factory or hf:DIR, got 'no_colon' (--target)",
        ),
        (["--d-model", "8"], "Error: --d-model only applies with --target (--d-model)"),
    ],
)
def test_usage_errors(run_cli, args, message):
    result = run_cli("repro", *args)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.splitlines()[0] == message
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_the_most_interleavings_are_accepted_and_stated_in_the_help(run_cli, monkeypatch):
    # 10,000 (docs/repro.md) reaches the scenario; each scenario then runs one interleaving, to keep the test short
    import kvtool.repro.run as run

    asked: list[int] = []
    real = run.run_scenario

    def one_interleaving(name, **options):
        asked.append(options["interleavings"])
        return real(name, **{**options, "interleavings": 1})

    monkeypatch.setattr(run, "run_scenario", one_interleaving)
    result = run_cli("repro", "layer-index", "--interleavings", "10000", "--device", "cpu", "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    assert asked == [10_000] and json.loads(result.stdout)["interleavings"] == 10_000
    help_text = " ".join(run_cli("repro", "--help").stdout.replace("│", " ").split())
    assert "(default 200; 10 for a --target; at most 10,000)" in help_text


def test_cuda_asked_but_absent(run_cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_cli("repro", "--device", "cuda")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("Error: --device cuda asked, but this torch")
    assert "Tip: run with --device cpu" in result.stderr


def test_correct_target_passes(run_cli, targets_on_path):
    result = run_cli("repro", "--target", "repro_targets:correct", "--json", "--interleavings", "30")
    assert result.exit_code == EXIT_OK, result.stdout
    data = json.loads(result.stdout)
    assert data["scenarios"] == []  # with --target only the target is checked
    assert data["target"]["passed"] is True and data["target"]["failed_checks"] == []
    assert data["target"]["d_model"] == 16


def test_scratch_buffer_alias_is_caught(run_cli, targets_on_path):
    # Not a built-in: caches are views of one module-level scratch buffer.  Alone it is right.
    result = run_cli("repro", "--target", "repro_targets:scratch_alias", "--json", "--interleavings", "30")
    assert result.exit_code == EXIT_CHECK_FAILED
    target = json.loads(result.stdout)["target"]
    assert target["passed"] is False
    assert target["failed_checks"] == ["isolation", "no-shared-storage"]
    storage = next(c for c in target["checks"] if c["name"] == "no-shared-storage")
    assert any("r0 cache[0]" in line and "data_ptr" in line for line in storage["evidence"])


def test_module_state_cache_is_caught(run_cli, targets_on_path):
    # The article's bug under the fixed signature.  Its torch.cat makes a new tensor each step, so the
    # requests' final caches are distinct tensors (no shared bytes); the state shows in the outputs and the
    # cache length instead.
    result = run_cli("repro", "--target", "repro_targets:instance_cache", "--json", "--interleavings", "10")
    assert result.exit_code == EXIT_CHECK_FAILED
    target = json.loads(result.stdout)["target"]
    assert target["failed_checks"] == ["determinism", "isolation", "cache-length"]


def test_prints_of_the_target_go_to_stderr_and_json_stays_json(run_cli, targets_on_path):
    # A correct module that prints in its factory and in every forward: stdout must stay one JSON object.
    result = run_cli("repro", "--target", "repro_targets:chatty", "--json", "--interleavings", "3")
    assert result.exit_code == EXIT_OK, result.stderr
    assert json.loads(result.stdout)["target"]["passed"] is True
    assert result.stderr.startswith("loading chatty attention\ncache k (1, 2, 5, 8) data_ptr 0x")


def test_a_cache_object_is_looked_into(run_cli, targets_on_path):
    # The cache as a class with k and v attributes (here __slots__), not a tuple or dict: correct, so clean.
    result = run_cli("repro", "--target", "repro_targets:object_cache", "--json", "--interleavings", "5")
    assert result.exit_code == EXIT_OK, result.stdout
    storage = next(c for c in json.loads(result.stdout)["target"]["checks"] if c["name"] == "no-shared-storage")
    # k and v of each of the 6 requests (kvtool.repro.workload: r0..r5)
    assert storage["message"] == "12 cache tensors of 6 live requests: no shared bytes"


def test_a_cache_without_tensors_names_its_type(run_cli, targets_on_path):
    result = run_cli("repro", "--target", "repro_targets:handle_cache", "--json", "--interleavings", "5")
    assert result.exit_code == EXIT_CHECK_FAILED
    target = json.loads(result.stdout)["target"]
    assert target["failed_checks"] == ["no-shared-storage", "cache-length"]
    storage = next(c for c in target["checks"] if c["name"] == "no-shared-storage")
    assert storage["message"] == (
        "the returned caches hold no tensors of 2 or more dimensions (kvtool looks inside tuples, lists, dicts, "
        "object attributes, nn.Module buffers and transformers caches; the caches are of type int)"
    )


def test_trimmed_cache_is_caught_by_cache_length(run_cli, targets_on_path):
    result = run_cli("repro", "--target", "repro_targets:trimmed", "--interleavings", "10")
    assert result.exit_code == EXIT_CHECK_FAILED
    assert "cache-length" in result.stdout
    # r0: prompt 5 + 4 tokens = 9 seen, the cache keeps 8.
    assert "r0 cache[0]: shape [1, 2, 8, 8] after 9 tokens seen" in result.stdout


def test_exception_in_forward_fails_the_checks_with_its_message(run_cli, targets_on_path):
    result = run_cli("repro", "--target", "repro_targets:raising", "--json", "--interleavings", "5")
    assert result.exit_code == EXIT_CHECK_FAILED
    target = json.loads(result.stdout)["target"]
    assert "determinism" in target["failed_checks"]
    det = next(c for c in target["checks"] if c["name"] == "determinism")
    assert det["message"] == "forward raised RuntimeError: cache layout [B, H, S, d] not supported"


def test_nan_outputs_are_said_not_read_as_a_leak(run_cli, targets_on_path):
    # NaN never equals itself: determinism said "state survives between requests" of a stateless module
    result = run_cli("repro", "--target", "repro_targets:nan_outputs", "--json", "--interleavings", "5")
    assert result.exit_code == EXIT_CHECK_FAILED
    target = json.loads(result.stdout)["target"]
    det = next(c for c in target["checks"] if c["name"] == "determinism")
    assert det["message"] == (
        "forward returned NaN or inf for 5 new token(s) after 0 seen; outputs that are not finite cannot be compared"
    )


def test_d_model_from_option(run_cli, targets_on_path):
    missing = run_cli("repro", "--target", "repro_targets:no_d_model")
    assert missing.exit_code == EXIT_USAGE
    assert missing.stderr.splitlines() == [
        "Error: cannot tell d_model of target 'repro_targets:no_d_model': the module has no positive integer "
        "d_model attribute (--target)",
        "Tip: pass --d-model N",
    ]
    given = run_cli("repro", "--target", "repro_targets:no_d_model", "--d-model", "16", "--interleavings", "5")
    assert given.exit_code == EXIT_OK, given.stdout


@pytest.mark.parametrize(
    "spec, start",
    [
        ("no_such_pkg.mod:make", "Error: cannot import module 'no_such_pkg.mod' of target 'no_such_pkg.mod:make'"),
        ("repro_targets:missing", "Error: target 'repro_targets:missing': 'repro_targets' has no attribute"),
        ("repro_targets:not_a_module", "Error: factory of target 'repro_targets:not_a_module' returned int"),
        ("repro_targets:NOT_CALLABLE", "Error: target 'repro_targets:NOT_CALLABLE' is not callable"),
        (
            "repro_targets:exits",
            "Error: factory of target 'repro_targets:exits' raised SystemExit: no GPU found, exiting",
        ),
        (
            "repro_targets:broken_factory",
            "Error: factory of target 'repro_targets:broken_factory' raised FileNotFoundError: weights.pt not found",
        ),
    ],
)
def test_bad_targets_are_usage_errors(run_cli, targets_on_path, spec, start):
    result = run_cli("repro", "--target", spec)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith(start)
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_target_that_exits_at_import_is_a_usage_error_not_its_exit_code(run_cli, targets_on_path, monkeypatch):
    # argparse at import sees kvtool's argv and exits 2 after printing its usage (the user's own stderr).
    # sys.argv is set to what the kvtool console script sees: under a bare `pytest` it would parse cleanly.
    monkeypatch.setattr("sys.argv", ["kvtool", "repro", "--target", "argparse_at_import:make"])
    result = run_cli("repro", "--target", "argparse_at_import:make")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.splitlines()[-1] == (
        "Error: cannot import module 'argparse_at_import' of target 'argparse_at_import:make': SystemExit: 2 (--target)"
    )
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_unimportable_target_in_a_fresh_interpreter():
    from tests.support import run_subprocess

    proc = run_subprocess("repro", "--target", "no_such_pkg:factory")
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.startswith("Error: cannot import module 'no_such_pkg'")


def test_cache_scan_skips_modules_weights_and_cycles():
    # A cache object that refers to itself, to a Python module (with a tensor global, shared by design), to a
    # layer of the target (its weights, shared by design) and to a function: only its own tensor counts, and
    # each skipped object is named with its reason.
    import types

    import torch

    from kvtool.repro.cachewalk import scan_cache, weight_storages

    lib = types.ModuleType("rope_tables")
    lib.cos = torch.ones(64, 8)
    target = torch.nn.Linear(2, 2)

    class Cache:
        def __init__(self):
            self.k = torch.zeros(1, 2, 3, 4)
            self.me, self.lib, self.proj, self.fn = self, lib, target, print

    scan = scan_cache({"layer0": Cache()}, weight_storages(target))
    assert [t.path for t in scan.tensors] == ["cache['layer0'].k"]
    assert {(s.path, s.reason) for s in scan.skipped} == {
        ("cache['layer0'].lib", "a Python module (shared by design)"),
        ("cache['layer0'].proj.weight", "the target's weights (shared by design)"),
        ("cache['layer0'].proj.bias", "the target's weights (shared by design)"),
        ("cache['layer0'].fn", "a function or class"),
    }
    assert [(a.path, a.same_as) for a in scan.aliases] == [("cache['layer0'].me", "cache['layer0']")]


def test_hf_cache_is_never_ignored_silently(run_cli, targets_on_path):
    # --hf-cache without --target ran the scenarios, and on a non-transformers target did nothing, both silently
    # (--d-model without --target was already refused)
    alone = run_cli("repro", "--hf-cache", "static", "--json")
    assert (alone.exit_code, alone.stdout) == (EXIT_USAGE, "")
    assert alone.stderr == "Error: --hf-cache only applies with --target (--hf-cache)\n"
    plain = run_cli("repro", "--target", "repro_targets:correct", "--hf-cache", "static", "--json")
    assert (plain.exit_code, plain.stdout) == (EXIT_USAGE, "")
    assert plain.stderr == (
        "Error: --hf-cache applies to transformers models; target 'repro_targets:correct' is a Attention "
        "(--hf-cache)\nTip: drop --hf-cache: kvtool uses the cache the module makes\n"
    )


def test_the_summary_does_not_count_a_skipped_check_as_passed(run_cli, targets_on_path):
    # scratch_alias (embeds protocol): 4 checks pass, isolation and no-shared-storage fail, batch is skipped; the
    # summary said "5 of 7 checks passed"
    result = run_cli("repro", "--target", "repro_targets:scratch_alias", "--interleavings", "2")
    assert result.exit_code == EXIT_CHECK_FAILED
    assert "skip batch: not run: the embeds protocol is driven with batch 1" in result.stdout
    assert "\n4 of 7 checks passed, 1 skipped; failed: isolation, no-shared-storage\n" in result.stdout


def test_a_file_path_target_gets_the_module_name_to_use(run_cli):
    # the tip was to run kvtool with another Python, which cannot help: --target names a module, not a file
    path = TARGETS / "repro_targets.py"
    result = run_cli("repro", "--target", f"{path}:correct")
    assert (result.exit_code, result.stdout) == (EXIT_USAGE, "")
    assert result.stderr == (
        f"Error: cannot import module '{path}' of target '{path}:correct': ModuleNotFoundError: No module named "
        f"'{str(path).removesuffix('.py')}' (--target)\n"
        f"Tip: --target takes a module name, not a file path: cd {TARGETS} && kvtool repro --target "
        "repro_targets:correct\n"
    )


def test_an_output_not_shaped_batch_seq_fails_the_checks_saying_so(run_cli, targets_on_path):
    # a flat output was an IndexError traceback in the consistency check (torch.cat along dim 1)
    result = run_cli("repro", "--target", "repro_targets:scalar_out", "--json", "--interleavings", "2")
    assert result.exit_code == EXIT_CHECK_FAILED
    target = json.loads(result.stdout)["target"]
    consistency = next(c for c in target["checks"] if c["name"] == "consistency")
    # r0's prompt is 5 positions of d_model 16 (repro_targets.D_MODEL): 80 values flattened
    assert consistency["message"] == (
        "forward returned an output of shape [80] for inputs of shape [1, 5, 16]; expected [batch, seq, ...]"
    )


def test_a_misspelt_protocol_is_refused(run_cli, targets_on_path):
    # kvtool_protocol = "token" was driven as embeds, silently
    result = run_cli("repro", "--target", "repro_targets:typo_protocol")
    assert (result.exit_code, result.stdout) == (EXIT_USAGE, "")
    assert result.stderr == (
        "Error: TypoProtocolAttention.kvtool_protocol is 'token'; kvtool knows 'tokens' and 'embeds' (--target)\n"
        "Tip: see docs/repro.md, 'How kvtool calls it (protocols)'\n"
    )


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("--target", "repro_targets:huge"), "--target"),
        (("--target", "repro_targets:no_d_model", "--d-model", str(10**15)), "--d-model"),
    ],
)
def test_a_d_model_too_large_for_memory_is_one_line(run_cli, targets_on_path, args, where):
    # the allocator's RuntimeError was a traceback
    result = run_cli("repro", *args)
    assert (result.exit_code, result.stdout) == (EXIT_USAGE, "")
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("Error: cannot make the inputs of target 'repro_targets:")
    assert "(d_model 1000000000000000): RuntimeError: " in result.stderr
    assert result.stderr.endswith(f" ({where})\n")


def test_a_cache_nested_too_deep_is_skipped_and_said(run_cli, targets_on_path):
    # 5,000 nested lists were a RecursionError traceback in the cache walk
    result = run_cli("repro", "--target", "repro_targets:deep_cache", "--json", "--interleavings", "2")
    assert result.exit_code == EXIT_CHECK_FAILED and result.stderr == ""
    target = json.loads(result.stdout)["target"]
    assert any(note.endswith(": nested deeper than 64 levels") for note in target["cache_notes"])
    assert "Traceback" not in result.stdout
