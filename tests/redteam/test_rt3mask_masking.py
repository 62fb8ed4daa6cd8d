"""Red team of the third masking change (od -w1/-w2 `*` lines, od -t d1/x4/x8, hexdump -e,
narrow and UTF-16 base64, URL-encoding again, narrow folds): what it costs on texts built
to be slow, and a private key's header lines read once each."""

from __future__ import annotations

import subprocess
import time

import pytest

from audit.masking import TOKEN_BODY, mask_text


def seconds(text: str) -> tuple[float, str]:
    """How long masking `text` takes (the best of two: a loaded host's noise), and what
    it gives."""
    best, masked = float("inf"), text
    for _ in range(2):
        # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
        began = time.thread_time()
        masked = mask_text(text)
        best = min(best, time.thread_time() - began)
    return best, masked


def test_a_key_of_1mb_of_header_lines_is_read_at_once() -> None:
    """A PEM key's Proc-Type/DEK-Info lines were taken off the front of a list one by
    one (list.pop(0), quadratic): 1 MB of them held a masking thread for 3 s and more."""
    body = "DEK-Info: a\n" * 90_000 + ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" * 2 + "\n") * 4
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{body}-----END RSA PRIVATE KEY-----\n"
    took, masked = seconds(text)
    assert "MIIEvQIB" not in masked
    assert masked.startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert took < 1.5, took


def fold(text: str, width: int) -> str:
    """`text` as the real fold(1) wraps it."""
    return subprocess.run(
        ["fold", "-w", str(width)], input=text, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.parametrize("width", [1, 2, 3, 7])
def test_a_token_folded_narrow_with_a_line_starting_at_a_hyphen_is_masked(width: int) -> None:
    """A line of a narrow fold that starts with `-` (a token character: about one token in
    two, folded at 1) was read as a diff's mark, so the token looked too short to be one
    and was left whole in view (the change before masked it)."""
    at = width * (14 // width)  # (a line's first character, past the prefix)
    token = "hro_" + "aB3dE5gH7jK9mN1pQ2sT4vW6yZ8bC0eF2hJ4kM6nP8q"
    token = token[:at] + "-" + token[at + 1 :]
    assert len(token) == 4 + TOKEN_BODY
    text = "the key:\n" + fold(token + "\n", width) + "finished\n"
    masked = mask_text(text)
    assert "nP8q" not in masked.replace("\n", "") and "[masked:" in masked, masked


def test_1mb_of_narrow_diff_lines_of_prefixes_is_not_read_line_by_line() -> None:
    """`+h\\n+r\\n+o\\n+_\\n+A\\n+b\\n` repeated: each window's last characters were taken
    for a token's end, so every window of 1 MB was read line by line in Python."""
    text = ("+h\n+r\n+o\n+_\n+A\n+b\n" * 170_000)[:1_000_000]
    plain = min(
        seconds("the quick brown fox jumps over the lazy dog 1234\n" * 20_000)[0] for _ in range(2)
    )
    took, masked = seconds(text)
    assert masked == text
    assert took < max(12 * plain, 1.5), (took, plain)
