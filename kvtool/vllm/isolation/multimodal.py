"""The multimodal dimension of the isolation check: salt x image (and x adapter, x tenant) on a model that takes
images.

What a correct vLLM 0.32 does (vllm/v1/core/kv_cache_utils.py): ``generate_block_hash_extra_keys`` gives each
full block the extra keys ``lora + mm + cache_salt + prompt_embeds``; ``_gen_mm_extra_hash_keys`` adds
``("mm", mm_feature.identifier, offset - start_token_idx)`` for every image that overlaps the block (the
identifier is the image's content hash), and the salt enters the first block only (``("cache_salt", salt)`` when
``start_token_idx == 0``), reaching every later block through the parent hash.  So with the image at the start of
the prompt (it then lies in block 0, beside the salt):

- the same tenant, image and text must hit (the trial's control);
- another salt with the same image and text must miss;
- the same salt and text with another image must miss: the image's placeholder tokens are the same for every
  image, only the mm hash in the block key tells the two apart.

Requests go to ``POST /v1/chat/completions``: vLLM 0.32's ``/v1/completions`` takes token ids or prompt embeddings
and no image (vllm/entrypoints/openai/completion/protocol.py has no multimodal field).  One user message: the image
first, as ``image_url`` with a ``data:image/png;base64,...`` URL of a 64 x 64 PNG generated from the partition's
seed (:func:`image_png`, stdlib only), then the text, one word ``w<id>`` per token id of the probe
(:func:`kvtool.vllm.isolation.client.prompt_token_ids`).  A word-level tokenizer (the tiny test models) makes each
word one token; a real tokenizer splits them otherwise, so the verdicts take a control's expected reuse from its
own prompt length (:func:`control_expected_tokens`), not from the plan.

Whether the model takes images (:func:`detect_images`): vLLM 0.32's ``/v1/models`` carries no modality (its
entries hold id, root, parent, max_model_len, permission), so kvtool reads the model's config.json when it can
(the ``--model`` folder, or ``/v1/models``' ``root`` when that is a folder on this machine): no ``vision_config``
and no ``audio_config`` means the model takes no images, and nothing is probed.  Otherwise one probe with an image
and the same probe without it, under a salt of their own: the image counts when the first reports more prompt
tokens than the second; an HTTP 400 to the first means the model takes none (vLLM: "... is not a multimodal
model", "At most 0 image(s) may be provided in one prompt").  What decided it is recorded and reported.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtool.vllm.isolation.plan import Partition

if TYPE_CHECKING:
    from kvtool.vllm.isolation.client import Client
    from kvtool.vllm.isolation.plan import Plan, Probe

IMAGE_KIND = "image"  # Probe.kind of a chat request carrying its partition's image
CHAT_PATH = "/v1/chat/completions"
IMAGE_PX = 64  # the generated image's width and height
IMAGE_CELLS = 4  # cells per side, each a colour of its own
PROBE_WORDS = 8
MM_CONFIG_KEYS = ("vision_config", "audio_config")
# a chat template for a model folder without one (self-started only): vLLM's "string" content format, so vLLM
# puts the model's own image placeholder before the text (vllm/entrypoints/chat_utils.py)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
EMBEDS_NOT_COVERED = (
    "salt x prompt embeddings x image: not possible on vLLM 0.32, which takes prompt embeddings on /v1/completions "
    "only and images on /v1/chat/completions only"
)


@dataclasses.dataclass(frozen=True)
class ImageSupport:
    """Whether the served model takes images, and what showed it."""

    takes_images: bool | None  # None: could not tell (the probe failed for another reason)
    how: str  # the evidence, in words (shown as the dimension's first coverage line, or why it did not run)
    image_tokens: int | None = None  # prompt tokens the probe's image added (with image minus without)
    fix: str | None = None  # what makes the dimension run, when it could not
    not_covered: tuple[str, ...] = ()  # combinations the dimension could not run here, each with why


def image_png(seed: int, px: int = IMAGE_PX) -> bytes:
    """A ``px`` x ``px`` RGB PNG of IMAGE_CELLS x IMAGE_CELLS random colours (deterministic in the seed): PNG
    signature, IHDR (8-bit RGB), one zlib IDAT of filter-0 scanlines, IEND, each chunk with its CRC-32."""
    rng = random.Random(seed)
    colours = [bytes(rng.randrange(256) for _ in range(3)) for _ in range(IMAGE_CELLS * IMAGE_CELLS)]
    cell = max(1, px // IMAGE_CELLS)
    rows = []
    for y in range(px):
        row = b"".join(colours[min(y // cell, IMAGE_CELLS - 1) * IMAGE_CELLS + min(x // cell, IMAGE_CELLS - 1)]
                       for x in range(px))  # fmt: skip
        rows.append(b"\x00" + row)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", px, px, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def image_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(image_png(seed)).decode("ascii")


def _message(seed: int | None, text: str) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    if seed is not None:
        content.append({"type": "image_url", "image_url": {"url": image_url(seed)}})
    content.append({"type": "text", "text": text})
    return [{"role": "user", "content": content}]


def words(token_ids: list[int]) -> str:
    return " ".join(f"w{t}" for t in token_ids)


def chat_body(probe: Probe, plan: Plan, *, with_events: bool, base: str) -> dict[str, Any]:
    """The JSON body of one image probe: the partition's image, then the probe's words."""
    from kvtool.vllm.isolation.client import prompt_token_ids

    partition = probe.partition
    body: dict[str, Any] = {"model": partition.model or base, "max_tokens": 1, "temperature": 0.0,
                            "messages": _message(partition.image, words(prompt_token_ids(probe, plan)))}  # fmt: skip
    if partition.cache_salt is not None:
        body["cache_salt"] = partition.cache_salt
    if with_events:
        body["session_id"] = probe.session_id
        body["vllm_xargs"] = {"kv_cache_report_mode": "full"}
    return body


def control_expected_tokens(prompt_tokens: int | None, planned: int, block_size: int) -> int:
    """What an image trial's control must reuse: every full block of its prompt but the last token's
    ((prompt_tokens - 1) // block_size blocks; vLLM recomputes the last prompt token), from the prompt length the
    engine reported, which the image's placeholder tokens and the tokenizer decide; the plan's figure when unknown."""
    if prompt_tokens is None or prompt_tokens < 1:
        return planned
    return (prompt_tokens - 1) // block_size * block_size


def config_takes_images(model_dir: Path | str) -> tuple[bool, str] | None:
    """(takes images, why) from a model folder's config.json; None when there is none to read."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    found = [k for k in MM_CONFIG_KEYS if isinstance(config.get(k), dict)]
    if found:
        return True, f"its config.json ({path}) has a {found[0]}"
    return False, f"its config.json ({path}) has no vision_config or audio_config"


def has_chat_template(model_dir: Path) -> bool:
    """Whether the folder brings a chat template (transformers: chat_template.jinja / .json, or the tokenizer's or
    processor's config key)."""
    if any((model_dir / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    for name in ("tokenizer_config.json", "processor_config.json"):
        try:
            if "chat_template" in json.loads((model_dir / name).read_text(encoding="utf-8")):
                return True
        except (OSError, ValueError, TypeError):
            continue
    return False


def _prompt_tokens(text: str) -> int | None:
    try:
        usage = json.loads(text).get("usage") or {}
    except (ValueError, AttributeError):
        return None
    value = usage.get("prompt_tokens")
    return value if isinstance(value, int) else None


def detect_images(client: Client, config: tuple[bool, str] | None, run_id: str) -> ImageSupport:
    """Whether the served model takes images: from its config.json when known to take none, else by a probe (one
    chat request with an image, one without, under a salt of their own; both cached nowhere else)."""
    if config is not None and not config[0]:
        return ImageSupport(False, f"not covered: the model takes no images ({config[1]}; no image probe sent)")
    seed = int(run_id, 16) << 8
    salt = f"kvtool-{run_id}-image-probe"
    text = words([11 + n for n in range(PROBE_WORDS)])
    body = {"model": client.base_model, "max_tokens": 1, "temperature": 0.0, "cache_salt": salt}
    status, answer = client.post(CHAT_PATH, dict(body, messages=_message(seed, text)))
    known = f"; {config[1]}" if config else ""
    if status != 200:
        lowered = answer.lower()
        quoted = f"a probe with one {IMAGE_PX} px PNG answered HTTP {status}: {answer}"
        if status == 404 and "model" not in lowered:
            return ImageSupport(None, f"not covered: the endpoint has no {CHAT_PATH} ({quoted})",
                                fix="point --endpoint at an OpenAI-compatible server with the chat API")  # fmt: skip
        if "chat template" in lowered or "chat_template" in lowered or "tokenizer" in lowered:
            return ImageSupport(None, f"not covered: cannot probe images ({quoted})",
                                fix="serve a chat template (vLLM: --chat-template FILE) and a tokenizer")  # fmt: skip
        if status == 400:
            return ImageSupport(False, f"not covered: the model takes no images ({quoted}{known})")
        return ImageSupport(None, f"not covered: cannot probe images ({quoted})")
    with_image = _prompt_tokens(answer)
    status, plain = client.post(CHAT_PATH, dict(body, messages=_message(None, text)))
    without = _prompt_tokens(plain) if status == 200 else None
    if with_image is None or without is None:
        return ImageSupport(None, "not covered: the image probes did not report usage.prompt_tokens")
    added = with_image - without
    probe = f"a probe with one {IMAGE_PX} px PNG had {with_image} prompt tokens, {without} without it"
    if added <= 0:
        return ImageSupport(False, f"not covered: the endpoint ignores images ({probe}){known}")
    return ImageSupport(True, f"the model takes images: {probe} ({added} image tokens){known}", image_tokens=added)


def not_covered_combinations(support: ImageSupport, adapters: tuple[str, ...]) -> tuple[str, ...]:
    """The combinations with an image that this run cannot send, each with why."""
    if not support.takes_images:
        return ()
    return (EMBEDS_NOT_COVERED,) + (() if adapters else ("salt x adapter x image: no LoRA adapter served "
                                                          "(--adapter NAME)",))  # fmt: skip


def image_pairs(
    support: ImageSupport, adapters: tuple[str, ...], tenants: list[Partition], run_id: str
) -> tuple[list[tuple[Partition, Partition]], tuple[str, ...]]:
    """The pairs of the multimodal dimension, each with its case.

    Salts are those of the salt dimension's ``salt:a`` / ``salt:b``; images are two seeds of this run.  Every pair
    is run exact (the victim's text equals the prime's), so a victim may reuse nothing: the image sits in block 0."""
    if not support.takes_images:
        return [], ()
    seed = int(run_id, 16) << 8
    one, two = seed + 1, seed + 2
    sa, sb = f"kvtool-{run_id}-a", f"kvtool-{run_id}-b"
    pairs = [
        (Partition("salt:a+image:1", cache_salt=sa, image=one), Partition("salt:b+image:1", cache_salt=sb, image=one)),
        (Partition("salt:a+image:1", cache_salt=sa, image=one), Partition("salt:a+image:2", cache_salt=sa, image=two)),
        (Partition("image:1", image=one), Partition("salt:a+image:1", cache_salt=sa, image=one)),
    ]
    cases = ["two salts, one image", "one salt, two images", "no salt vs a salt, one image"]
    for name in adapters[:1]:
        pairs.append((Partition(f"salt:a+{name}+image:1", model=name, cache_salt=sa, image=one),
                      Partition(f"salt:b+{name}+image:1", model=name, cache_salt=sb, image=one)))  # fmt: skip
        cases.append("one adapter, two salts, one image")
        pairs.append((Partition(f"salt:a+{name}+image:1", model=name, cache_salt=sa, image=one),
                      Partition("salt:a+image:1", cache_salt=sa, image=one)))  # fmt: skip
        cases.append("one salt and image, adapter vs base")
    for a, b in zip(tenants[:1], tenants[1:2]):
        pairs.append((dataclasses.replace(a, label=f"{a.label}+image:1", image=one),
                      dataclasses.replace(b, label=f"{b.label}+image:1", image=one)))  # fmt: skip
        cases.append("two tenants (gateway salts), one image")
    return pairs, tuple(cases)
