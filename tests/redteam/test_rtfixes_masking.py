"""Red-team rtfixes: Harness's tokens with JSON escapes (audit.masking) attacked with the
escape forms the fix did not name. What held; the forms it leaves are in the report."""

from __future__ import annotations

import json

import pytest

from audit.masking import mask_text

TOKEN = "hro_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_ab"
PLAIN = mask_text(TOKEN)


def _escaped(text: str, i: int, backslashes: int = 1, upper: bool = False) -> str:
    code = f"{ord(text[i]):04X}" if upper else f"{ord(text[i]):04x}"
    return text[:i] + "\\" * backslashes + "u" + code + text[i + 1 :]


@pytest.mark.parametrize(
    "text",
    [
        _escaped(TOKEN, 10, upper=True),  # \u0047: upper-case hex digits
        _escaped(TOKEN, 3, upper=True),  # hro\u005F
        _escaped(TOKEN, 0, backslashes=8),  # four levels of JSON text in JSON text
        _escaped(TOKEN, 20, backslashes=8),
        "".join(f"\\u{ord(c):04x}" for c in TOKEN),  # every character escaped
        "\\ud83d\\ude00" + TOKEN,  # after a surrogate pair's escapes
        "https:\\/\\/h\\/?t=" + TOKEN,  # after JSON's escaped slashes
        "%22" + _escaped(TOKEN, 5),  # a URL-encoded quote, then an escaped body
        json.dumps(json.dumps(json.dumps({"t": _escaped(TOKEN, 3)}))),
        "abc" + _escaped(TOKEN, 0),  # an escaped first letter needs no boundary
    ],
)
def test_escaped_tokens_are_masked_as_the_plain_one(text: str) -> None:
    masked = mask_text(text)
    assert "[masked:harness-oauth-token" in masked, masked
    assert PLAIN.split("_", 1)[1] in masked  # the marker is the plain token's
    assert "Yz0123" not in masked
