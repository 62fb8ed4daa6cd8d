"""Harness's own tokens (hro_, hrr_, hrn_) in the forms the masking still left in clear
(docs/audit.md listed them as known), each made by the real program or encoder:

- dumps: `od -b` and `hexdump -b` (octal bytes), `od -a` (named characters), `xxd -b`
  (binary), `od -An -c` indented, a dump indented with a tab and shown by `cat -A`
  (the indent is `^I`).
- a token encoded as a whole: base64 (standard and URL-safe, at each of the 3 alignments
  of its first byte, alone or inside longer base64: base64 of JSON, `kubectl get secret
  -o yaml`, an HTTP Basic header's `user:token`), URL-encoding of every character
  (`%68%72%6F%5F...`), HTML character references escaped twice (`&amp;#104;`).

Each is masked only when the whole token is there, as before: ordinary text in the same
forms stays as it is (test_ordinary_text_in_these_forms_is_kept counts them).
"""

from __future__ import annotations

import base64
import functools
import html
import json
import random
import re
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from audit import masking
from audit.masking import mask_text
from tests.redteam.test_leftclear_masking import _not_in_dump
from tests.redteam.test_leftweb_masking import MARKER, _hidden, _token
from tests.redteam.test_rt2mask_masking import ORDINARY, _png

PREFIXES = ("hro_", "hrr_", "hrn_")


def _secret(token: str) -> str:
    return token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]


def _run(command: list[str], data: bytes, tmp_path: Path) -> str:
    path = tmp_path / "dumped"
    path.write_bytes(data)
    done = subprocess.run([*command, str(path)], capture_output=True, check=True)
    return done.stdout.decode("latin-1")


def _piped(command: list[str], text: str) -> str:
    done = subprocess.run(command, input=text.encode("latin-1"), capture_output=True, check=True)
    return done.stdout.decode("latin-1")


def _swept(
    tmp_path: Path, command: list[str], wrap: Callable[[str], str] = str
) -> Iterator[tuple[str, str]]:
    """A fresh token of each prefix at each of 18 alignments, alone at the file's end or
    followed by more text, dumped and wrapped."""
    for i in range(36):
        token = _token(PREFIXES[i % 3])
        after = "\n" if i % 2 else "\nmore text after it\n"
        data = ("x" * (i % 18) + "TOKEN=" + token + after).encode()
        yield token, wrap(_run(command, data, tmp_path))


def _digits_hidden(token: str, masked: str, digits: str, width: int) -> None:
    """No 6 bytes of the secret part written as fields of `digits` (octal, binary)."""
    written = re.sub(f"[^{digits}]", "", masked)
    base = len(digits)
    secret = _secret(token).encode()
    for i in range(len(secret) - 6):
        field = "".join(_in_base(b, base, width) for b in secret[i : i + 6])
        assert field not in written, (token, masked)


def _in_base(value: int, base: int, width: int) -> str:
    out = ""
    for _ in range(width):
        value, digit = divmod(value, base)
        out = str(digit) + out
    return out


def _masked(token: str, masked: str) -> None:
    assert MARKER.findall(mask_text(token))[0] in masked, (token, masked)
    secret = _secret(token)
    characters = re.sub(r"\s", "", masked)  # (one character per field)
    for i in range(len(secret) - 8):
        assert secret[i : i + 8] not in characters, (token, masked)


# --- dumps ------------------------------------------------------------------------------

OCTAL = [["od", "-b"], ["od", "-An", "-b"], ["hexdump", "-b"], ["od", "-b", "-w8"]]


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", OCTAL, ids=" ".join)
def test_a_token_in_an_octal_dump_is_masked(command: list[str], tmp_path: Path) -> None:
    for token, dump in _swept(tmp_path, command):
        masked = mask_text(dump)
        _masked(token, masked)
        _digits_hidden(token, masked, "01234567", 3)


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", [["xxd", "-b"], ["xxd", "-b", "-c8"]], ids=" ".join)
def test_a_token_in_a_binary_dump_is_masked_in_every_column(
    command: list[str], tmp_path: Path
) -> None:
    for token, dump in _swept(tmp_path, command):
        masked = mask_text(dump)
        _masked(token, masked)
        _digits_hidden(token, masked, "01", 8)
        columns = "".join(
            MARKER.sub("", line).rstrip().rsplit("  ", 1)[-1] for line in masked.splitlines()
        )
        for i in range(len(_secret(token)) - 8):
            assert _secret(token)[i : i + 8] not in columns, (token, masked)


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", [["od", "-a"], ["od", "-An", "-a"]], ids=" ".join)
def test_a_token_in_a_dump_of_named_characters_is_masked(
    command: list[str], tmp_path: Path
) -> None:
    for token, dump in _swept(tmp_path, command):
        _masked(token, mask_text(dump))
    # UTF-16 text: a `nul` beside each character
    token = _token()
    data = ("TOKEN=" + token + "\n").encode("utf-16-le")
    _masked(token, mask_text(_run(command, data, tmp_path)))


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", [["od", "-An", "-c"], ["od", "-c"]], ids=" ".join)
def test_an_indented_dump_of_characters_is_masked(command: list[str], tmp_path: Path) -> None:
    for indent in ("    ", "  ", "\t", "   "):
        for token, dump in _swept(tmp_path, command, functools.partial(_indent, indent)):
            _masked(token, mask_text(dump))


def _indent(indent: str, dump: str) -> str:
    return _indented(dump, indent)


def _indented(dump: str, indent: str) -> str:
    return "".join(indent + line for line in dump.splitlines(True))


DUMPS = [["xxd"], ["xxd", "-p"], ["hexdump", "-C"], ["od", "-c"], ["od", "-x"], ["od", "-b"]]


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", DUMPS, ids=" ".join)
def test_a_tab_indented_dump_through_cat_a_is_masked(command: list[str], tmp_path: Path) -> None:
    """`cat -A` shows the tab as `^I`."""
    for token, dump in _swept(
        tmp_path, command, lambda d: _piped(["cat", "-A"], _indented(d, "\t"))
    ):
        masked = mask_text(dump)
        assert "^I" in dump
        _masked(token, masked)
        if command != ["od", "-b"]:
            _not_in_dump(token, masked)


# --- a token encoded as a whole ---------------------------------------------------------


def _encodings(token: str) -> Iterator[tuple[str, str]]:
    """(the text holding the token encoded, the base64 characters of its secret part)."""
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for before in ("", "u", "us"):
            for after in ("", "\n", '"}'):
                data = (before + token + after).encode()
                encoded = encode(data).decode()
                yield encoded, encoded
                yield encoded.rstrip("="), encoded
        document = json.dumps({"apiVersion": "v1", "kind": "Config", "token": token})
        encoded = encode(document.encode()).decode()
        yield f'{{"config": "{encoded}"}}', encoded
        yield f"data:application/json;base64,{encoded}", encoded
    yaml = f"apiVersion: v1\ndata:\n  ci-hook: {base64.b64encode(token.encode()).decode()}\n"
    yield yaml, yaml
    basic = base64.b64encode(f"deploy-bot:{token}".encode()).decode()
    yield f"curl -sS -H 'Authorization: Basic {basic}' https://ci.example/api", basic
    yield json.dumps({"headers": [["Authorization", "Basic " + basic]]}), basic


def _base64_hidden(token: str, masked: str, encoded: str) -> None:
    """No 8 base64 characters that only the secret part's bytes decide, at any alignment."""
    assert MARKER.findall(mask_text(token))[0] in masked, (token, masked)
    secret = _secret(token).encode()
    for skip in range(3):
        part = base64.b64encode(secret[skip:]).decode()[:-4]
        for piece in (part, part.translate(str.maketrans("+/", "-_"))):
            for i in range(0, len(piece) - 8, 4):
                assert piece[i : i + 8] not in masked, (token, masked, encoded)


@pytest.mark.backend_independent
def test_a_token_in_base64_is_masked() -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        for text, encoded in _encodings(token):
            _base64_hidden(token, mask_text(text), encoded)


@pytest.mark.backend_independent
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16"])
def test_a_token_of_utf16_text_through_cat_a_is_masked(encoding: str) -> None:
    """`cat -A` (and `cat -v`) show each NUL byte as `^@`: `h^@r^@o^@_^@...`."""
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        for command in (["cat", "-A"], ["cat", "-v"]):
            data = f"TOKEN={token}\nnext line\n".encode(encoding).decode("latin-1")
            shown = _piped(command, data)
            masked = mask_text(shown)
            assert MARKER.findall(mask_text(token))[0] in masked, (token, masked)
            assert _secret(token)[:8] not in masked.replace("^@", ""), (token, masked)


@pytest.mark.backend_independent
def test_a_url_encoded_token_is_masked() -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        every = "".join(f"%{b:02X}" for b in token.encode())
        for text in (
            every,
            every.lower(),
            f"https://hooks.example/cb?t={every}&x=1",
            "%68%72" + urllib.parse.quote(token[2:], safe=""),  # (the prefix only)
            json.dumps({"url": f"https://a.example/login?next={every}"}),
        ):
            _hidden(token, mask_text(text))


@pytest.mark.backend_independent
def test_a_token_in_html_references_escaped_twice_is_masked() -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        decimal = "".join(f"&#{ord(c)};" for c in token)
        hexes = "".join(f"&#x{ord(c):x};" for c in token)
        for text in (html.escape(decimal), html.escape(hexes), html.escape(html.escape(decimal))):
            _hidden(token, mask_text(f"<pre>{text}</pre>"))


# --- what stays -------------------------------------------------------------------------

WORDS = [
    *ORDINARY,
    b"Use hrr_ for refresh tokens and hro_ for access tokens; hrn_ for agents.\n",
    b"plain text with \ttabs\tand a caf\xc3\xa9 and 150 162 157 numbers\n",
]


@pytest.mark.backend_independent
def test_ordinary_text_in_these_forms_is_kept(tmp_path: Path) -> None:
    """Random binary, PNGs and ordinary words (with `hro_` and the like in them) in each
    new dump form and encoding: none changes."""
    # (seeded: random bytes base64-encoded are, now and then, a secret key's very shape,
    # which the masker rightly hides: os.urandom's 64 bytes were, once, on CI)
    rng = random.Random(2026_12_07)
    inputs = [rng.randbytes(n) for n in (64, 1000, 4096)]
    inputs += [_png(w, h, rng.randbytes(3)) for w, h in ((16, 16), (40, 9))]
    inputs += WORDS + [text.decode("latin-1").encode("utf-16-le") for text in WORDS]
    commands = [*OCTAL, ["od", "-a"], ["xxd", "-b"], ["od", "-An", "-c"]]
    wrappers: list[Callable[[str], str]] = [
        str,
        lambda dump: _indented(dump, "    "),
        lambda dump: _piped(["cat", "-A"], _indented(dump, "\t")),
        lambda dump: json.dumps({"stdout": dump}),
    ]
    texts = [
        wrap(_run(command, data, tmp_path))
        for data in inputs
        for command in commands
        for wrap in wrappers
    ]
    for data in inputs:
        texts.append(base64.b64encode(data).decode())
        texts.append(base64.urlsafe_b64encode(b"x" + data).decode())
        texts.append("".join(f"%{b:02X}" for b in data))
        texts.append(html.escape("".join(f"&#{b};" for b in data)))
        if b"\x00" in data:  # (binary, UTF-16 text: `^@` for each NUL)
            texts.append(_piped(["cat", "-A"], data.decode("latin-1")))
    changed = [text for text in texts if mask_text(text) != text]
    nuls = sum(b"\x00" in data for data in inputs)
    assert len(texts) == len(inputs) * (len(commands) * len(wrappers) + 4) + nuls
    assert changed == [], (len(changed), len(texts), changed[:2])


# --- time ----------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
    began = time.thread_time()
    mask_text(text)
    return time.thread_time() - began


@pytest.mark.backend_independent
def test_1mb_of_these_forms_takes_about_as_long_as_plain() -> None:
    size = 1024 * 1024
    plain = ("lorem ipsum dolor sit amet consectetur " * (size // 39 + 1))[:size]
    pieces = [
        "0000000 150 162 157 137 101 101 101 101 101 101 101 101 101 101 101 150\n",
        "00000000: 01101000 01110010 01101111 01011111 01000001 01000001  hro_AA\n",
        "   h nul   r nul   o nul   _ nul   A nul   A nul   A nul   A nul\n",
        "^I00000000: 6872 6f5f 4141 4141 4141 4141 4141 4141  hro_AAAAAAAAAAAA$\n",
        "aHJvXhyb1ocm9f",  # base64 of a token's prefix, at each alignment, again and again
        "aHJvX" + "A" * 58 + " ",
        "%68%72%6F%5F%41",
        "&amp;#104;&amp;#114;&amp;#111;&amp;#95;",
        "0000068 zzzz 6872 0068\n",
    ]
    base = min(_seconds(plain) for _ in range(3))
    for piece in pieces:
        text = (piece * (size // len(piece) + 1))[:size]
        took = min(_seconds(text) for _ in range(2))
        assert took < 20 * base + 0.5, (piece, took, base)


class _NotRead:
    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        raise AssertionError("a dump's lines were looked for")


@pytest.mark.backend_independent
def test_numbered_lines_are_not_read_as_a_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 KB of numbered lines (an ask's file content, as it is and as JSON text) holds
    `0068` and `6872` (where a dump's `hr` may start) but no dump line: the dumps'
    patterns are not run over it (they made masking it take twice as long)."""
    content = "".join(f"{i * 8:07d} " + "z" * 92 + "\n" for i in range(1024))
    numbered = json.dumps({"path": "notes/a.txt", "content": content})
    assert "0068" in numbered and "6872" in numbered
    monkeypatch.setattr(masking, "_DUMP_RUNS", dict.fromkeys(masking._DUMP_RUNS, _NotRead()))
    assert mask_text(numbered) == numbered
    assert mask_text(content) == content
