"""Red team of wt-mask2 (Harness masks its own tokens in more forms, with pre-checks that
skip what cannot hold one). Differential testing against the masking before it (random
tokens, dumped by the real programs, in 12 wrappings) found one form it masked that
mask2 left in clear, and its base64 form missed the base64 that `base64` itself writes:

- `xxd -e` of UTF-16 text: the little-endian reading was gated on a reversed `hr`
  (`7268`), but UTF-16's `h` and `r` are 2 bytes apart (`00720068`, `68007200`), so the
  token's bytes were shown in hex and in the ASCII column (`h.r.o._.`).
- base64 wrapped in lines (`base64`'s 76 characters a line, `openssl base64`'s 64,
  `base64 -w N`, as text, JSON text, CRLF, indented): only unbroken runs of 63
  characters were read, and the prefix's text (`aHJvX`) was split by the line break as
  often as not.
- `xxd -b -g2` (and wider groups): the bytes of a group are written with no space
  between them, read as no dump line.

Each is masked only when the whole token is there, as before: ordinary base64 and dumps
stay as they are.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections.abc import Callable

import pytest

from audit.masking import mask_text
from tests.redteam.test_leftweb_masking import MARKER, _token
from tests.redteam.test_rt2mask_masking import ORDINARY, _png

PREFIXES = ("hro_", "hrr_", "hrn_")


def _secret(token: str) -> str:
    return token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]


def _run(command: list[str], data: bytes) -> str:
    done = subprocess.run(command, input=data, capture_output=True, check=True)
    return done.stdout.decode("latin-1")


def _plain_marker(token: str) -> str:
    found = MARKER.search(mask_text(token))
    assert found is not None
    return found.group()


# --- xxd -e of UTF-16 text ----------------------------------------------------------------

_XXD_LINE = re.compile(r"^[0-9a-f]{8}: ((?:[0-9a-f]{4,16} ?)+)  ", re.MULTILINE)


def _xxd_e_read(masked: str, encoding: str) -> str:
    """The text an `xxd -e` dump's hex groups stand for (each group's bytes reversed back)."""
    data = b""
    for line in _XXD_LINE.finditer(masked):
        for group in line.group(1).split():
            data += bytes.fromhex(group)[::-1]
    return data.decode(encoding, errors="replace")


@pytest.mark.backend_independent
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize(
    "options", [["-e"], ["-e", "-g8"], ["-e", "-c8"], ["-e", "-c4"]], ids=" ".join
)
def test_a_utf16_token_in_an_xxd_e_dump_is_masked(encoding: str, options: list[str]) -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        data = ("x" * (i % 6) + "TOKEN=" + token + "\n").encode(encoding)
        masked = mask_text(_run(["xxd", *options], data))
        assert _plain_marker(token) in masked, (token, masked)
        secret = _secret(token)
        read = _xxd_e_read(masked, encoding)
        column = re.sub(r"[.\s]", "", "".join(line[-20:] for line in masked.splitlines()))
        for k in range(len(secret) - 8):
            assert secret[k : k + 8] not in read, (token, masked)
            assert secret[k : k + 8] not in column, (token, masked)


# --- xxd -b with groups ------------------------------------------------------------------

BINARY_GROUPED = [["xxd", "-b", "-g2"], ["xxd", "-b", "-g3"], ["xxd", "-b", "-g4", "-c8"]]


@pytest.mark.backend_independent
@pytest.mark.parametrize("encoding", ["utf-8", "utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("command", BINARY_GROUPED, ids=" ".join)
def test_a_token_in_a_grouped_binary_dump_is_masked(command: list[str], encoding: str) -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        data = ("x" * (i % 6) + "TOKEN=" + token + "\n").encode(encoding)
        masked = mask_text(_run(command, data))
        assert _plain_marker(token) in masked, (token, masked)
        bits = re.sub("[^01]", "", masked)
        secret = _secret(token).encode(encoding)
        for k in range(0, len(secret) - 8, 2):
            assert "".join(f"{b:08b}" for b in secret[k : k + 8]) not in bits, (token, masked)
        column = re.sub(r"[.\s]", "", "".join(line[-12:] for line in masked.splitlines()))
        for k in range(len(_secret(token)) - 8):
            assert _secret(token)[k : k + 8] not in column, (token, masked)


@pytest.mark.backend_independent
def test_ordinary_grouped_binary_dumps_are_kept() -> None:
    inputs = [os.urandom(n) for n in (64, 1000)]
    inputs += [_png(16, 16, os.urandom(3)), *ORDINARY]
    inputs += [text.decode("latin-1").encode("utf-16-le") for text in ORDINARY]
    texts = [_run(command, data) for data in inputs for command in BINARY_GROUPED]
    changed = [text for text in texts if mask_text(text) != text]
    assert len(texts) == len(inputs) * 3
    assert changed == [], (len(changed), changed[:2])


# --- base64 wrapped in lines ----------------------------------------------------------------

WRAPPERS: list[Callable[[str], str]] = [
    str,
    lambda text: json.dumps({"stdout": text}),
    lambda text: text.replace("\n", "\r\n"),
    lambda text: "data: |\n" + "".join("    " + line for line in text.splitlines(True)),
]


def _encoded_secret(secret: str) -> list[str]:
    """What base64 of the secret writes whatever the bytes around it: its middle
    characters at each of the 3 alignments, in both alphabets."""
    out = []
    for align in range(3):
        encoded = base64.b64encode(bytes(align) + secret.encode() + bytes(3)).decode()
        middle = encoded[4 : 4 * (len(secret) // 3) - 4]
        out += [middle, middle.translate(str.maketrans("+/", "-_"))]
    return out


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "command",
    [["base64"], ["base64", "-w", "64"], ["base64", "-w", "20"], ["basenc", "--base64url"]],
    ids=" ".join,
)
def test_a_token_in_base64_wrapped_in_lines_is_masked(command: list[str]) -> None:
    for i in range(24):
        token = _token(PREFIXES[i % 3])
        data = ("k: " * (i % 8) + "\n" + token + "\nmore text after it\n").encode()
        written = _run(command, data)
        assert written.count("\n") > 1
        for wrap in WRAPPERS:
            text = wrap(written)
            masked = mask_text(text)
            assert _plain_marker(token) in masked, (token, text)
            # the lines are kept (a marker where the secret's characters were)
            assert masked.count("\n") == text.count("\n"), (text, masked)
            joined = re.sub(r"\s|\\[rn]", "", masked)
            for middle in _encoded_secret(_secret(token)):
                for k in range(0, len(middle) - 12, 4):
                    assert middle[k : k + 12] not in joined, (token, masked)


@pytest.mark.backend_independent
def test_ordinary_wrapped_base64_is_kept() -> None:
    """Base64 of random bytes, of PNGs, of ordinary text with `hro_` and the like in it, as
    `base64` wraps it (76, 64, 20 characters a line), as text and as JSON text, and lines
    of long identifiers: none changes."""
    inputs = [os.urandom(n) for n in (64, 1000, 4096)]
    inputs += [_png(w, h, os.urandom(3)) for w, h in ((16, 16), (40, 9))]
    inputs += ORDINARY + [b"".join(ORDINARY)]
    texts = []
    for data in inputs:
        for width in ("76", "64", "20"):
            written = _run(["base64", "-w", width], data)
            texts += [written, json.dumps({"stdout": written})]
    texts.append("\n".join(f"synchro_primitives_for_lock_manager_{i}" for i in range(50)))
    changed = [text for text in texts if mask_text(text) != text]
    assert len(texts) == len(inputs) * 6 + 1
    assert changed == [], (len(changed), changed[:2])


def _seconds(text: str) -> float:
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
    began = time.thread_time()
    mask_text(text)
    return time.thread_time() - began


@pytest.mark.backend_independent
def test_1mb_of_lines_read_as_wrapped_base64_takes_about_as_long_as_plain() -> None:
    size = 1024 * 1024
    plain = ("lorem ipsum dolor sit amet consectetur " * (size // 39 + 1))[:size]
    pieces = [
        "A" * 16 + "\n",
        "  " + "a" * 16 + "\n",
        "x" * 17 + "\r\n",
        "A" * 16 + "\\n",
        "A" * 15 + "aHJ\nvX\n",  # a prefix's text split by a line break, again and again
        "hybl" * 16 + "\n",
        "00000000: 00720068 005f006f  h.r.o._.\n",
    ]
    base = min(_seconds(plain) for _ in range(3))
    for piece in pieces:
        text = (piece * (size // len(piece) + 1))[:size]
        took = min(_seconds(text) for _ in range(2))
        assert took < 20 * base + 0.5, (piece, took, base)
