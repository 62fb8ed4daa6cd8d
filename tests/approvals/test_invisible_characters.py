"""What a reviewer reads: every invisible or layout-changing character of the Unicode
database Python ships is shown escaped, decided from its properties, never a hand list.

The oracle below is written from the Unicode rules (UAX #44, DerivedCoreProperties'
Default_Ignorable_Code_Point and PropList.txt rows), independently of approvals.display.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
from django.test import Client

from approvals import display
from tests.approvals.conftest import ask
from tests.support.factories import AgentFixture, make_user, unique

# PropList.txt (Unicode 15): Other_Default_Ignorable_Code_Point and Variation_Selector.
OTHER_DEFAULT_IGNORABLE = [
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x2065, 0x2065),
    (0x3164, 0x3164),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0000),
    (0xE0002, 0xE001F),
    (0xE0080, 0xE00FF),
    (0xE01F0, 0xE0FFF),
]
VARIATION_SELECTOR = [(0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF)]
HANGUL_FILLERS = [0x115F, 0x1160, 0x3164, 0xFFA0]
BIDI_CONTROLS = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}
MARKS = [0x200E, 0x200F, 0x061C]  # LRM, RLM, ALM
BRAILLE_BLANK = 0x2800
# Django's timesince writes a no-break space of its own ("0\xa0minutes ago").
TIMESINCE = re.compile(r"\d+\xa0(?:year|month|week|day|hour|minute)s?")


def expected_hidden() -> list[int]:
    """Every code point (all seventeen planes) a reviewer must see escaped."""
    listed = {
        code
        for low, high in OTHER_DEFAULT_IGNORABLE + VARIATION_SELECTOR
        for code in range(low, high + 1)
    }
    listed.update(HANGUL_FILLERS, MARKS, [BRAILLE_BLANK])
    hidden = []
    for code in range(0x110000):
        char = chr(code)
        category = unicodedata.category(char)
        if (
            code in listed
            or category in ("Cf", "Cs", "Zl", "Zp")
            or (category == "Cc" and char not in "\t\n")
            or (category == "Zs" and char != " ")
            or unicodedata.bidirectional(char) in BIDI_CONTROLS
        ):
            hidden.append(code)
    return hidden


def escaped(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


HIDDEN = expected_hidden()


@pytest.mark.backend_independent
def test_every_format_ignorable_bidi_and_space_like_code_point_is_escaped() -> None:
    assert unicodedata.unidata_version  # the database walked is the one Python ships
    assert len(HIDDEN) > 4000  # the default-ignorable ranges alone hold 4,000+
    text = "".join(chr(code) for code in HIDDEN)
    assert display.visible(text) == "".join(escaped(code) for code in HIDDEN)
    assert all(display.has_hidden(chr(code)) for code in HIDDEN)


@pytest.mark.backend_independent
def test_every_other_code_point_is_left_as_it_is() -> None:
    hidden = set(HIDDEN)
    text = "".join(chr(code) for code in range(0x110000) if code not in hidden)
    assert display.visible(text) == text


@pytest.mark.backend_independent
def test_the_format_characters_a_hand_list_missed_are_escaped() -> None:
    # Mongolian free variation selectors, the fourth of them new in Unicode 14, the
    # Arabic number signs, the musical symbol format controls, shorthand format controls.
    for code in (0x180B, 0x180C, 0x180D, 0x180F, 0x0600, 0x1D173, 0x1BCA0, 0x110BD, 0x00A0):
        assert display.visible(f'"admin{chr(code)}"') == f'"admin{escaped(code)}"'


def test_a_diff_shows_each_hidden_character_escaped_on_the_reviewers_page(
    agent: AgentFixture,
) -> None:
    """The finding: a diff showed "admin" while the file got "admin" + U+180B."""
    # (NUL is refused at the API, a surrogate is not JSON text: neither reaches a diff)
    shown = [code for code in HIDDEN if 0 < code <= 0xFFFF and not 0xD800 <= code <= 0xDFFF]
    lines = "".join(f"admin{chr(code)}\n" for code in shown)
    ask(agent, {"path": "users.txt", "content": lines})
    client = Client()
    client.force_login(make_user(unique("reviewer"), groups=("reviewer",)))
    page = client.get("/approvals/").content.decode()
    assert '<span class="add">+admin\\u180b</span>' in page
    for code in shown:
        assert f"admin{escaped(code)}" in page, escaped(code)
    page = TIMESINCE.sub("", page)  # Django's own "0\xa0minutes ago", never an argument's
    assert (
        sorted({f"U+{ord(c):04X}" for c in page if display.is_hidden(c) and c not in "\n\t"}) == []
    )
