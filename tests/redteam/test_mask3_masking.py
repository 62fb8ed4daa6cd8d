"""Harness's own tokens (hro_, hrr_, hrn_) in the forms red team rt2mask2 still found in
clear (a differential over real dumps), each made by the real program an agent runs:

- a narrow `od` (`-w1`, `-w2`) without `-v`: od writes `*` for a line equal to the one
  before it, so a token holding a repeated character (about every other one) had a line
  missing and was read as no whole token;
- `od -t d1`, `od -t u1` (signed and unsigned decimal bytes), `od -t x4`, `od -t x8`
  (words of 4 and 8 bytes in the host's, little-endian, order);
- `hexdump -e` with the common custom formats (`16/1 "%02x"` with or without a newline,
  its last line padded with spaces; `1/1 "%02x\\n"`, one byte a line; `"%_p"`, the
  characters), each writing `*` for a repeated block, with no offset to count it by;
- base64 of UTF-16 text (`iconv -t UTF-16LE | base64`);
- base64 wrapped narrower than 16 characters a line (`base64 -w 4` to `-w 15`);
- URL-encoding applied twice (`%2568%2572...`);
- `fold -w N`, N up to 7, inside a unified diff (each line's `+`) or an indented listing.

Each is masked only when the whole token is there, as before: ordinary text in the same
forms stays as it is (test_ordinary_text_in_these_forms_is_kept counts them).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from audit.masking import mask_text
from tests.redteam.test_leftweb_masking import MARKER, _random_body, _token
from tests.redteam.test_rt2mask_masking import ORDINARY, _png

PREFIXES = ("hro_", "hrr_", "hrn_")


def _secret(token: str) -> str:
    return token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]


def _run(command: list[str] | str, data: bytes) -> str:
    done = subprocess.run(
        command, input=data, capture_output=True, check=True, shell=isinstance(command, str)
    )
    return done.stdout.decode("latin-1")


def _plain_marker(token: str) -> str:
    found = MARKER.search(mask_text(token))
    assert found is not None
    return found.group()


def _repeating_token(prefix: str, i: int) -> str:
    """A token whose body holds runs a narrow dump collapses (`QQQQ`, `abab`), at a place
    that moves with i; real tokens hold such runs by chance (a doubled character in about
    every other one)."""
    while True:
        body = _random_body()
        at = 3 + (i * 5) % 30
        body = body[:at] + "QQQQ" + body[at + 4 : at + 9] + "abab" + body[at + 13 :]
        assert len(body) == 43
        if any(c.islower() for c in body) and any(c.isupper() for c in body):
            break
    if prefix == "hrn_":
        return f"hrn_{secrets.token_hex(4)}_{body}"
    return prefix + body


def _tokens(n: int = 12) -> list[str]:
    """Random tokens and tokens holding repeated runs, of each prefix."""
    return [
        _token(PREFIXES[i % 3]) if i % 2 else _repeating_token(PREFIXES[i % 3], i) for i in range(n)
    ]


def _data(token: str, i: int) -> bytes:
    return ("x" * (i % 9) + "TOKEN=" + token + "\nmore text after it\n").encode()


def _no_window(secret: bytes, shown: bytes, token: str, masked: str, size: int = 6) -> None:
    """No `size` bytes of the secret part in what the masked dump shows."""
    for k in range(len(secret) - size):
        assert secret[k : k + size] not in shown, (token, masked)


# --- od and hexdump fields -----------------------------------------------------------------

_OD_CHAR_NAMES = {"\\0": "\x00", "\\n": "\n", "sp": " ", "nl": "\n", "nul": "\x00"}


def _field(kind: str, field: str) -> bytes:
    """The bytes one field of a dump stands for (a masked field: NULs)."""
    size = {"x2": 2, "x4": 4, "x8": 8}.get(kind, 1)
    if "*" in field:
        return bytes(size)
    if kind in ("x1", "x2", "x4", "x8"):
        return bytes.fromhex(field)[::-1]
    if kind == "o1":
        return bytes([int(field, 8)])
    if kind in ("d1", "u1"):
        return bytes([int(field) % 256])
    char = _OD_CHAR_NAMES.get(field, field)
    return char.encode("latin-1") if len(char) == 1 else b"\x01"


def _od_shown(masked: str, kind: str, offsets: bool = True) -> bytes:
    """The bytes the fields of a masked od dump show (a `*` line shows none)."""
    shown = b""
    for line in MARKER.sub("", masked).splitlines():
        parts = line.split()
        if offsets:
            parts = parts[1:]
        shown += b"".join(_field(kind, part) for part in parts if part != "*")
    return shown


NARROW_OD = [
    (["od", "-w1", "-c"], "c"),
    (["od", "-w2", "-c"], "c"),
    (["od", "-w1", "-t", "x1"], "x1"),
    (["od", "-w2", "-t", "x1"], "x1"),
    (["od", "-w1", "-b"], "o1"),
    (["od", "-w2", "-x"], "x2"),
    (["od", "-w1", "-a"], "c"),
    (["od", "-A", "x", "-w1", "-t", "x1"], "x1"),
    (["od", "-A", "d", "-w2", "-c"], "c"),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize(("command", "kind"), NARROW_OD, ids=lambda c: " ".join(c))
def test_a_token_in_a_narrow_od_dump_with_collapsed_lines_is_masked(
    command: list[str], kind: str
) -> None:
    for i, token in enumerate(_tokens()):
        dump = _run(command, _data(token, i))
        masked = mask_text(dump)
        assert _plain_marker(token) in masked, (token, dump)
        _no_window(_secret(token).encode(), _od_shown(masked, kind), token, masked)


WIDE_OD = [
    (["od", "-t", "d1"], "d1"),
    (["od", "-t", "u1"], "u1"),
    (["od", "-An", "-t", "d1"], "d1"),
    (["od", "-t", "x4"], "x4"),
    (["od", "-t", "x8"], "x8"),
    (["od", "-An", "-t", "x4"], "x4"),
    (["od", "-t", "x2"], "x2"),
    (["od", "-w8", "-t", "u1"], "u1"),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize(("command", "kind"), WIDE_OD, ids=lambda c: " ".join(c))
def test_a_token_in_a_decimal_or_wide_word_od_dump_is_masked(command: list[str], kind: str) -> None:
    offsets = "-An" not in command
    for i, token in enumerate(_tokens()):
        dump = _run(command, _data(token, i))
        masked = mask_text(dump)
        assert _plain_marker(token) in masked, (token, dump)
        _no_window(_secret(token).encode(), _od_shown(masked, kind, offsets), token, masked)


HEXDUMP_E = [
    ['16/1 "%02x"'],
    ['16/1 "%02x" "\\n"'],
    ['1/1 "%02x\\n"'],
    ['"%_p"'],
    ['16/1 "%_p" "\\n"'],
]


def _hexdump_shown(masked: str, form: str) -> bytes:
    text = MARKER.sub("", masked)
    if "%02x" in form:
        return bytes.fromhex(re.sub(r"[^0-9a-f]|\*\*", "", text)[: len(text) // 2 * 2])
    return re.sub(r"\*\n", "", text).encode("latin-1")


@pytest.mark.backend_independent
@pytest.mark.parametrize("form", HEXDUMP_E, ids=lambda f: f[0])
def test_a_token_in_a_hexdump_custom_format_is_masked(form: list[str]) -> None:
    for i, token in enumerate(_tokens()):
        dump = _run(["hexdump", "-e", *form], _data(token, i))
        masked = mask_text(dump)
        assert MARKER.search(masked), (token, dump)
        if "QQQQ" not in token and "%_p" not in form[0]:  # (`*`: a count not shown)
            assert _plain_marker(token) in masked, (token, dump)
        shown = _hexdump_shown(masked, form[0])
        _no_window(_secret(token).encode(), shown, token, masked)


# --- base64 -----------------------------------------------------------------------------


def _base64_pieces(secret: bytes, size: int = 8) -> list[str]:
    """The base64 characters only the secret's bytes decide, at each alignment, in both
    alphabets, as pieces of `size`."""
    pieces = []
    for skip in range(3):
        part = base64.b64encode(secret[skip:]).decode()[:-4]
        for piece in (part, part.translate(str.maketrans("+/", "-_"))):
            pieces += [piece[k : k + size] for k in range(0, len(piece) - size, 4)]
    return pieces


def _base64_hidden(token: str, masked: str, encoding: str) -> None:
    """The token's marker is there, and no piece of base64 standing for 6 of its secret
    characters (8 base64 characters; of UTF-16 text, 16: 8 stood for 3 characters, which
    the text around the token may hold too, `xTO` of `xxxTOKEN=`, one token in 200)."""
    assert _plain_marker(token) in masked, (token, masked)
    joined = re.sub(r"\s|\\[rn]", "", masked)
    size = 16 if encoding.startswith("utf-16") else 8
    for piece in _base64_pieces(_secret(token).encode(encoding), size):
        assert piece not in joined, (token, masked)


BASE64_WRAPS: list[Callable[[str], str]] = [
    str,
    lambda text: json.dumps({"stdout": text}),
    lambda text: text.replace("\n", "\r\n"),
    lambda text: "".join("    " + line for line in text.splitlines(True)),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    ("encoding", "command"),
    [
        ("utf-16-le", "iconv -f UTF-8 -t UTF-16LE | base64"),
        ("utf-16-le", "iconv -f UTF-8 -t UTF-16LE | base64 -w0"),
        ("utf-16-be", "iconv -f UTF-8 -t UTF-16BE | base64"),
        ("utf-16-le", "iconv -f UTF-8 -t UTF-16 | base64 -w 64"),
        ("utf-16-le", "iconv -f UTF-8 -t UTF-16LE | base64 -w 8"),
    ],
    ids=lambda c: c,
)
def test_a_token_in_base64_of_utf16_text_is_masked(encoding: str, command: str) -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        written = _run(command, _data(token, i))
        for wrap in BASE64_WRAPS:
            text = wrap(written)
            masked = mask_text(text)
            _base64_hidden(token, masked, encoding)
            assert masked.count("\n") == text.count("\n"), (text, masked)


@pytest.mark.backend_independent
@pytest.mark.parametrize("width", range(4, 16))
def test_a_token_in_base64_wrapped_narrower_than_16_is_masked(width: int) -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        written = _run(["base64", "-w", str(width)], _data(token, i))
        for wrap in BASE64_WRAPS:
            text = wrap(written)
            masked = mask_text(text)
            _base64_hidden(token, masked, "utf-8")
            assert masked.count("\n") == text.count("\n"), (text, masked)


# --- URL-encoding twice ---------------------------------------------------------------------


@pytest.mark.backend_independent
def test_a_token_url_encoded_twice_is_masked() -> None:
    for i in range(12):
        token = _token(PREFIXES[i % 3])
        every = "".join(f"%{b:02X}" for b in token.encode())
        twice = urllib.parse.quote(every, safe="")
        assert twice.startswith("%2568%2572")
        for text in (
            twice,
            twice.lower(),
            f"https://sso.example/login?next=https%3A%2F%2Fa.example%2Fcb%3Ft%3D{twice}%26x%3D1",
            json.dumps({"url": f"https://a.example/r?u={twice}"}),
            urllib.parse.quote(twice, safe=""),  # (three times: %252568)
        ):
            masked = mask_text(text)
            assert _plain_marker(token) in masked, (token, text)
            read = urllib.parse.unquote(urllib.parse.unquote(urllib.parse.unquote(masked)))
            secret = _secret(token)
            for k in range(len(secret) - 8):
                assert secret[k : k + 8] not in read, (token, masked)


# --- fold in a diff or indented ---------------------------------------------------------------


def _diff(tmp_path: Path, new: str) -> str:
    (tmp_path / "a").write_text("")
    (tmp_path / "b").write_text(new)
    done = subprocess.run(
        ["diff", "-u", str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    return done.stdout


@pytest.mark.backend_independent
@pytest.mark.parametrize("width", range(1, 8))
def test_a_token_folded_narrow_in_a_diff_or_indented_is_masked(width: int, tmp_path: Path) -> None:
    for i in range(18):
        token = _token(PREFIXES[i % 3])
        pad = "y" * (i % width - 1) + "=" if i % width else ""  # (every place on the line)
        lead = ("", "x", "TOKEN=", "export A=")[i % 4] + pad
        after = ("\n", " end\n", "\nmore text after it\n")[i % 3]
        if after[1:2].isalnum() and (lead[-1:].isalnum() or (len(lead) + len(token)) % width == 0):
            # (run into words on both sides, or its own line break where fold would
            # break too: nothing says where it ends)
            after = "\n"
        folded = _run(["fold", "-w", str(width)], f"{lead}{token}{after}".encode())
        for text in (
            _diff(tmp_path, folded),
            "".join("    " + line for line in folded.splitlines(True)),
            "".join("\t" + line for line in folded.splitlines(True)),
            json.dumps({"preview": _diff(tmp_path, folded)}),
        ):
            masked = mask_text(text)
            # (after TOKEN= on the token's line, its value is masked as a token's)
            assert _plain_marker(token) in masked or (
                "TOKEN" in lead and "[masked:token#" in masked
            ), (token, text)
            joined = re.sub(r"\s|\\n|(?m:^[-+ ])", "", MARKER.sub("|", masked))
            secret = _secret(token)
            for k in range(len(secret) - 8):
                assert secret[k : k + 8] not in joined, (token, masked)


# --- what stays -----------------------------------------------------------------------------

WORDS = [
    *ORDINARY,
    b"Use hrr_ for refresh tokens and hro_ for access tokens; hrn_ for agents.\n",
    b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\nhro_\n\n\n\n\nzz\n",
    b"hro_AAAAAAAAAAAAAAAAAAAAAbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n",
]


def _ordinary_inputs() -> list[bytes]:
    inputs = [os.urandom(n) for n in (64, 1000, 4096)]
    inputs += [_png(w, h, os.urandom(3)) for w, h in ((16, 16), (40, 9))]
    return inputs + WORDS + [text.decode("latin-1").encode("utf-16-le") for text in WORDS]


@pytest.mark.backend_independent
def test_ordinary_text_in_these_forms_is_kept(tmp_path: Path) -> None:
    """Random binary, PNGs and ordinary words (with `hro_` and the like in them, runs of
    one letter) in each new form: none changes."""
    inputs = _ordinary_inputs()
    commands: list[list[str] | str] = [command for command, _ in NARROW_OD + WIDE_OD]
    commands += [["hexdump", "-e", *form] for form in HEXDUMP_E]
    commands += [["base64", "-w", str(width)] for width in (4, 7, 10, 15)]
    commands += ["iconv -f latin1 -t UTF-16LE | base64", "fold -w 3 | sed 's/^/    /'"]
    texts = [_run(command, data) for data in inputs for command in commands]
    for data in inputs:
        every = "".join(f"%{b:02X}" for b in data)
        texts.append(urllib.parse.quote(every, safe=""))
        texts.append(_diff(tmp_path, _run(["fold", "-w", "5"], data)))
    texts.append("".join(f"    {i}\n" for i in range(2000)))  # short indented lines
    texts.append("".join(f"+{w}\n" for w in ("hro_", "abc", "x") * 100))
    changed = [text for text in texts if mask_text(text) != text]
    assert len(texts) == len(inputs) * (len(commands) + 2) + 2
    assert changed == [], (len(changed), len(texts), changed[:2])


# --- time -----------------------------------------------------------------------------------


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
        "0000000 150\n*\n0000002 162\n",
        "0000000  104  114  111   95   65   65   65   65\n",
        "0000000 5f6f7268 41414141 41414141 41414141\n",
        "hro_AAAA*\nBBBB*\n",
        "68\n72\n*\n6f\n",
        "aHJv\nXEFB\nQUFB\n",
        "aABy\nAG8A\nXwBB\n",
        "%2568%2572%256F%255F%2541",
        "    hro_\n    AbCd\n    EfGh\n",
    ]
    base = min(_seconds(plain) for _ in range(3))
    for piece in pieces:
        text = (piece * (size // len(piece) + 1))[:size]
        took = min(_seconds(text) for _ in range(2))
        assert took < 20 * base + 0.5, (piece, took, base)
