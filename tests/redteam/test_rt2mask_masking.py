"""Dumps of a file holding one of Harness's tokens in the forms the dump reading still left
in clear, each made by the real program (run below on files holding random tokens):

- `xxd -e` (and -g2, -g8): little-endian groups, the short last group right-aligned; the
  hex was read in the wrong order, so the ASCII column beside it stayed in clear too.
- a dump as JSON text: Claude Code's hook reports a Bash call's output as an object
  (`{"stdout": ...}`), which Harness keeps as JSON text (hooks.text_result), each line
  break a `\\n`; a dump of JSON text inside JSON text (`\\\\n`).
- an indented dump (`sed 's/^/    /'`, a Markdown code block), a dump through `cat -A`
  (each line ending with `$`).
- a dump of UTF-16 text (`iconv -t UTF-16LE`, BE, with a BOM): a NUL beside each byte.

Each is masked only when the whole token is there, as before: ordinary dumps, of random
binary, of a PNG, of source code and of UTF-16 text, through the same wrappers, stay as
they are (test_ordinary_dumps_in_these_forms_are_kept counts them).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from audit.masking import mask_text
from tests.redteam.test_leftclear_masking import _not_in_dump
from tests.redteam.test_leftweb_masking import MARKER, _token

PREFIXES = ("hro_", "hrr_", "hrn_")
DUMPS = [
    ["xxd"],
    ["xxd", "-p"],
    ["xxd", "-i"],
    ["hexdump", "-C"],
    ["od", "-t", "x1z"],
    ["od", "-A", "x", "-t", "x1z", "-w8"],
    ["od", "-c"],
    ["od", "-x"],
]


def _run(command: list[str], data: bytes, tmp_path: Path) -> str:
    path = tmp_path / "dumped"
    path.write_bytes(data)
    done = subprocess.run([*command, str(path)], capture_output=True, check=True)
    return done.stdout.decode("latin-1")


def _piped(command: list[str], text: str) -> str:
    done = subprocess.run(command, input=text.encode("latin-1"), capture_output=True, check=True)
    return done.stdout.decode("latin-1")


def _reversed_groups_not_in(token: str, masked: str) -> None:
    """No 6 bytes of the secret part in hex with each 4-byte group reversed (xxd -e)."""
    secret = token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]
    digits = re.sub(r"[^0-9a-f]", "", masked.lower())
    for skip in range(4):
        part = secret[skip:].encode()
        groups = [part[i : i + 4][::-1].hex() for i in range(0, len(part) - 3, 4)]
        for i in range(len(groups) - 1):
            assert groups[i] + groups[i + 1] not in digits, (token, masked)


def _masked_in_every_column(token: str, masked: str) -> None:
    _not_in_dump(token, masked)
    assert MARKER.findall(mask_text(token))[0] in masked, (token, masked)


def _swept(
    tmp_path: Path,
    command: list[str],
    wrap: Callable[[str], str] = str,
    encode: Callable[[str], bytes] = str.encode,
) -> Iterator[tuple[str, str]]:
    """A fresh token of each prefix at each of 18 alignments, each alone at the file's end
    (as a token file holds it) or followed by more text, dumped and wrapped."""
    for i in range(36):
        token = _token(PREFIXES[i % 3])
        after = "\n" if i % 2 else "\nmore text after it\n"
        dump = _run(command, encode("x" * (i % 18) + "TOKEN=" + token + after), tmp_path)
        yield token, wrap(dump)


@pytest.mark.backend_independent
@pytest.mark.parametrize("group", [[], ["-g2"], ["-g8"], ["-c32"], ["-c7", "-g1"]], ids=str)
def test_a_little_endian_xxd_dump_is_masked_in_every_column(
    group: list[str], tmp_path: Path
) -> None:
    for token, dump in _swept(tmp_path, ["xxd", "-e", *group]):
        masked = mask_text(dump)
        _masked_in_every_column(token, masked)
        _reversed_groups_not_in(token, masked)


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", DUMPS, ids=" ".join)
def test_a_dump_kept_as_json_text_is_masked_as_the_dump_is(
    command: list[str], tmp_path: Path
) -> None:
    for token, dump in _swept(tmp_path, command):
        # (a hook's report of a Bash call: the output as JSON text, then that inside JSON)
        once = json.dumps({"stdout": dump, "stderr": "", "interrupted": False})
        masked = json.loads(mask_text(once))["stdout"]  # (still JSON text)
        _masked_in_every_column(token, masked)
        twice = json.dumps({"content": once})
        _masked_in_every_column(
            token, json.loads(json.loads(mask_text(twice))["content"])["stdout"]
        )


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", DUMPS, ids=" ".join)
def test_an_indented_dump_or_one_through_cat_a_is_masked(
    command: list[str], tmp_path: Path
) -> None:
    wrappers: list[Callable[[str], str]] = [
        lambda dump: _piped(["sed", "s/^/    /"], dump),
        lambda dump: _piped(["sed", "s/^/\t/"], dump),
        lambda dump: _piped(["cat", "-A"], dump),
    ]
    for wrap in wrappers:
        if command == ["od", "-c"] and wrap is not wrappers[2]:
            continue  # (od -c's fields start with spaces: an indent is no offset's; see docs)
        for token, dump in _swept(tmp_path, command, wrap):
            _masked_in_every_column(token, mask_text(dump))


@pytest.mark.backend_independent
@pytest.mark.parametrize("encoding", ["UTF-16LE", "UTF-16BE", "UTF-16"])
@pytest.mark.parametrize("command", DUMPS, ids=" ".join)
def test_a_dump_of_utf16_text_is_masked(encoding: str, command: list[str], tmp_path: Path) -> None:
    def utf16(text: str) -> bytes:
        return _piped(["iconv", "-f", "UTF-8", "-t", encoding], text).encode("latin-1")

    for token, dump in _swept(tmp_path, command, encode=utf16):
        masked = mask_text(dump)
        assert MARKER.findall(mask_text(token))[0] in masked, (token, masked)
        secret = token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]
        spaced = re.sub(r"[\s.\\0]", "", masked)  # (the ASCII column without its NULs' dots)
        for i in range(len(secret) - 8):
            assert secret[i : i + 8] not in spaced, (token, masked)
        for nul in ("00", ""):
            for i in range(len(secret) - 6):
                window = secret[i : i + 6].encode()
                for hexes in (
                    nul.join(f"{b:02x}" for b in window) + nul,
                    nul + nul.join(f"{b:02x}" for b in window),
                ):
                    assert hexes not in re.sub(r"[^0-9a-f]", "", masked.lower()), (token, masked)


def _png(width: int, height: int, seed: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + (seed * (3 * width))[: 3 * width] for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


ORDINARY = [
    b"synchro_primitives_for_distributed_lock_managers\n",
    b"hrr_rate\nheart_rate_reserve_values_computed_for_each\n",
    b"<p>&#104;ello &#x77;orld, synchro_Primitives_For_Distributed_Lock_Managers_X</p>\n",
    b'char *s = "\\150\\145\\154\\154\\157"; /* hro_ is a prefix */\n',
    b'let s = "\\u{68}\\u{72}o_"; // hro_config_loader_settings_for_main_app\n',
    b'{"synchro_": 1, "hrn_abcdef01_": "x", "throughput": 7}\n',
    "Grüße, hro_ und hrr_: 68 72 6f 5f\n".encode(),
]


@pytest.mark.backend_independent
def test_ordinary_dumps_in_these_forms_are_kept(tmp_path: Path) -> None:
    """Dumps of random binary, of PNGs, of source code, of ordinary text in UTF-16, as
    they are, as JSON text, indented, through cat -A, with xxd -e: none changes."""
    inputs = [os.urandom(n) for n in (64, 1000, 4096)]
    inputs += [_png(w, h, os.urandom(3)) for w, h in ((16, 16), (40, 9))]
    inputs += ORDINARY + [text.decode("latin-1").encode("utf-16-le") for text in ORDINARY]
    wrappers: list[Callable[[str], str]] = [
        str,
        lambda dump: json.dumps({"stdout": dump}),
        lambda dump: _piped(["sed", "s/^/    /"], dump),
        lambda dump: _piped(["cat", "-A"], dump),
    ]
    commands = [*DUMPS, ["xxd", "-e"], ["xxd", "-e", "-g8"], ["hexdump"]]
    changed, total = [], 0
    for data in inputs:
        for command in commands:
            for wrap in wrappers:
                text = wrap(_run(command, data, tmp_path))
                total += 1
                if mask_text(text) != text:
                    changed.append((command, text))
    assert total == len(inputs) * len(commands) * len(wrappers)
    assert changed == [], (len(changed), total, changed[:2])


@pytest.mark.backend_independent
def test_1mb_of_json_escaped_and_little_endian_dump_lines_takes_about_as_long_as_plain() -> None:
    size = 1024 * 1024
    plain = ("lorem ipsum dolor sit amet consectetur " * (size // 39 + 1))[:size]
    line = "00000000  68 72 6f 5f 41 41 41 41  41 41 41 41 41 41 41 41  |hro_AAAAAAAAAAAA|\n"
    pieces = [
        json.dumps(line * 4)[:-1] + '", ',  # many short JSON strings of dump lines
        json.dumps(line)[1:-1],  # one long JSON string of them
        "00000000: 72683d4e 306e5f6f 32465370 41414141  N=hro_n0pSF2AAAA\n",
        "00000030: 6d306743     0a41                    Cg0mA.\n",
        "    00000000  68 00 72 00 6f 00 5f 00  41 00 41 00 41 00 41 00  |h.r.o._.A.A.A.A.|$\n",
        '"68\\n',
        "h\\\\n" * 7,
        '"\\\\\\n',
    ]
    base = min(_seconds(plain) for _ in range(3))
    for piece in pieces:
        text = (piece * (size // len(piece) + 1))[:size]
        took = _seconds(text)
        assert took < 20 * base + 0.5, (piece, took, base)


def _seconds(text: str) -> float:
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
    began = time.thread_time()
    mask_text(text)
    return time.thread_time() - began
