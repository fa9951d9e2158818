"""Secrets kept out of messages and files: credentials in URLs masked, known keys replaced.

Every message that prints a URL or an endpoint the user gave passes it through :func:`redact_url`, so a
``user:password@`` part never reaches an error line, a warning, a log or a written file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
# scheme://USERINFO@ : the userinfo ends at the last '@' of the authority, which ends at the first '/', '?' or '#'
# (RFC 3986 3.2; urllib.parse.urlsplit splits the netloc at its last '@' too, so a raw '@' in a password is masked
# whole); matched anywhere in a text, so a URL inside a longer message is masked as well
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#]*@")


def redact_url(text: str) -> str:
    """``text`` with the userinfo of every URL in it (``user:password@``, ``token@``) replaced by ``***@``.

    ``http://u:pw@host:8000/v1`` -> ``http://***@host:8000/v1``; text without credentials is returned unchanged.
    """
    return _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def without_secrets(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every occurrence of each secret (an API key) replaced by ``***``, and URLs redacted: for
    messages that quote what a server answered (an OpenAI-style 401 names the key it refused)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return redact_url(text)
