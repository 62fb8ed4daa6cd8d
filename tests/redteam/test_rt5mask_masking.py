"""A token folded narrower than 8 columns whose run of narrow lines starts the text (or a
line) with something put before fold's output on that first line only: a JSON string's
opening quote (`json.dumps` of `fold -w 1`'s output: `"h\\nr\\no\\n_...`), a label. That
first line is then no fold's width (`"h` beside lines of 1), and the token was read as
ending at a line break of the text's own and left whole in view; before this morning's
narrow-fold change it was masked.

Tokens are random from a seeded generator; the seed is printed, and HARNESS_MASK_SEED
runs the same tokens again (tests/redteam/conftest.py).
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from tests.redteam.test_leftweb_masking import seeded_token as _token
from tests.redteam.test_mask4_masking import PREFIXES, _assert_hidden, _fold

AFTERS = ("\n", " tail\n", "'\n", ")\n", "\n\nnext\n")


@pytest.mark.backend_independent
@pytest.mark.parametrize("width", range(1, 8))
def test_a_folded_token_in_a_json_string_is_masked(width: int, rng: random.Random) -> None:
    for prefix in PREFIXES:
        for lead in ("", "(", "'"):
            for after in AFTERS:
                token = _token(rng, prefix)
                text = json.dumps(_fold(f"{lead}{token}{after}", width))
                _assert_hidden(token, text, f"json of fold -w {width}")


@pytest.mark.backend_independent
def test_a_token_dumped_one_character_a_line_in_a_json_string_is_masked(
    rng: random.Random,
) -> None:
    for prefix in PREFIXES:
        for after in AFTERS:
            token = _token(rng, prefix)
            dump = subprocess.run(
                ["hexdump", "-v", "-e", '1/1 "%_p\\n"'],
                input=f"{token}{after}".encode(),
                capture_output=True,
                check=True,
            ).stdout.decode("latin-1")
            _assert_hidden(token, json.dumps(dump), "json of hexdump %_p")
