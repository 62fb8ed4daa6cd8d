"""Harness's own tokens (hro_, hrr_, hrn_) in forms the masking missed, each made by a
real program an agent runs or a real encoder (shown beside each case):

- split by a line break: Python's textwrap.fill (break_long_words, break_on_hyphens: the
  default, used by argparse's and click's help) and coreutils' `fold` wrap a token in
  the middle with a bare newline; JSON text of that holds `\\n`. The part before the
  break was shorter than the 32 characters the rule wanted, so nothing was masked.
  (JSON encoders, repr, pprint, PyYAML and `printf %q` never split a token: checked.)
- 16 or more backslashes before a `\\u` escape: the fifth level of JSON text inside JSON
  text (json.dumps five times); the rule read at most 8.
- `\\x` escapes: `$'\\x68ro_...'` and `printf '\\x68ro_...'` are the token to bash (run
  below); the rule read only `\\u`.
- right after a word character: `grep --color=always` prints ESC[K just before the
  match (the `K` is a word character), and a bytes repr of a length-prefixed hrn token
  is `\\x00\\x00\\x008hrn_...`. Such a token is masked when it is one whole token (its
  exact length, not part of a longer word) of upper and lower case letters, so that
  words such as `synchro_...` stay.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import secrets
import struct
import subprocess
import textwrap
import time

import pytest
from django.test import Client

from audit.masking import mask_text
from audit.models import AuditEvent
from tests.redteam.test_audit_log_attacks import _api, _streamed
from tests.support.factories import AgentFixture, make_user, unique

MARKER = re.compile(r"\[masked:[^\]]+\]")


def _random_body() -> str:
    while True:  # a real token's body: 43 characters, upper and lower case letters
        body = secrets.token_urlsafe(32)
        if any(c.isupper() for c in body) and any(c.islower() for c in body):
            return body


def _token(prefix: str = "hro_") -> str:
    if prefix == "hrn_":
        return f"hrn_{secrets.token_hex(4)}_{_random_body()}"
    return prefix + _random_body()


_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def seeded_token(rng: random.Random, prefix: str) -> str:
    """A token as Harness makes one (43 characters of base64url, upper and lower case
    letters; an agent's: 8 hex digits before them), from `rng` (tests/redteam/conftest.py's
    seeded generator: a failure is run again with its seed)."""
    while True:
        body = "".join(rng.choice(_ALPHABET) for _ in range(43))
        if any(c.isupper() for c in body) and any(c.islower() for c in body):
            break
    return f"hrn_{rng.getrandbits(32):08x}_{body}" if prefix == "hrn_" else prefix + body


def _hidden(token: str, masked: str, like: str | None = None) -> None:
    """No piece of the token's secret part (8 characters or more) is left in `masked`,
    and its markers are those of `like` (the same text with the token written whole and
    plain), or the plain token's."""
    secret = token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]
    for i in range(0, len(secret) - 8):
        assert secret[i : i + 8] not in masked, (secret[i : i + 8], masked)
    expected = MARKER.findall(mask_text(token if like is None else like))
    assert expected and set(expected) <= set(MARKER.findall(masked)), (expected, masked)


# --- split by a line break -------------------------------------------------------------


def _diff(old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a", "b"))


def _wrapped(token: str) -> list[tuple[str, str]]:
    """The token in text wrapped by real programs (each splits it), beside the text."""
    sentence = f"Use this access token for the hooks API: {token} (it expires in an hour)."
    filled = textwrap.fill(sentence, 40)  # narrower than the token: split
    indented = textwrap.fill(sentence, 36, subsequent_indent="    ")
    exported, assigned = f"export HARNESS_TOKEN={token}\n", f"token={token}\n"
    folded = subprocess.run(
        ["fold", "-w", "30"], input=exported, text=True, capture_output=True, check=True
    ).stdout
    narrow = subprocess.run(
        ["fold", "-w", "16"], input=assigned, text=True, capture_output=True, check=True
    ).stdout
    return [
        (sentence, filled),
        (sentence, indented),
        (exported, folded),
        (assigned, narrow),
    ]


@pytest.mark.backend_independent
@pytest.mark.parametrize("prefix", ["hro_", "hrr_", "hrn_"])
def test_a_token_wrapped_by_textwrap_or_fold_is_masked_in_every_form(prefix: str) -> None:
    token = _token(prefix)
    for whole, text in _wrapped(token):
        assert token not in text  # the programs did split it
        for form in (
            lambda t: t,
            lambda t: t.replace("\n", "\r\n"),  # the same, with CRLF line ends
            lambda t: json.dumps({"content": t}),  # the text in a call's arguments
            lambda t: json.dumps({"a": json.dumps({"content": t})}),  # a JSON file in them
            lambda t: _diff("", t),  # the preview of a file written (lines with `+`)
            lambda t: _diff(t, ""),  # of a file changed (lines with `-`)
            lambda t: json.dumps({"diff": _diff(t, "x\n")}),
        ):
            _hidden(token, mask_text(form(text)), like=form(whole))


@pytest.mark.backend_independent
def test_a_token_split_by_a_line_continuation_is_masked() -> None:
    token = _token()
    head, tail = token[:20], token[20:]
    for text in (
        f'curl -H "Authorization: Bearer {head}\\\n{tail}" http://h',  # shell `\` newline
        f'token: "{head}\\\n  {tail}"',  # YAML double-quoted, escaped line break
        f'T = "{head}\\\n{tail}"',  # Python string continuation
    ):
        whole = text.replace(f"{head}\\\n  ", head).replace(f"{head}\\\n", head)
        _hidden(token, mask_text(text), like=whole)
        # `\\\n` in JSON text
        _hidden(token, mask_text(json.dumps({"c": text})), like=json.dumps({"c": whole}))


@pytest.mark.backend_independent
def test_line_breaks_after_prefixed_words_that_are_no_token_are_kept() -> None:
    texts = [
        "hrr_rate\nheart_rate_reserve_values_computed_for_each",  # lower case only
        "hro_x\nabc",  # too short
        "hrr_Rate\nHeartRateReserveValuesComputedForEachPatientAndDay\n",  # too long
        "hro_Short\nWord\nAnother\nLine\nOf\nWords\nAnd\nMore\nWordsHere\nStill\n",
        "hrn_config\nLoaderSettingsForTheMainApplicationServerXYZ",  # no hex part
    ]
    for text in texts:
        assert mask_text(text) == text
        assert mask_text(json.dumps({"c": text})) == json.dumps({"c": text})


# --- 16 backslashes and more -----------------------------------------------------------


@pytest.mark.backend_independent
@pytest.mark.parametrize("levels", [5, 6])
def test_an_escaped_token_five_or_six_levels_of_json_deep_is_masked(levels: int) -> None:
    token = _token()
    escaped = token[:3] + "\\u005f" + token[4:20] + f"\\u00{ord(token[20]):02x}" + token[21:]
    text = '{"t": "' + escaped + '"}'
    for _ in range(levels - 1):
        text = json.dumps({"a": text})
    assert "\\" * (2 ** (levels - 1)) + "u005f" in text
    _hidden(token, mask_text(text))
    first = "\\" * (2 ** (levels - 1)) + "u0068" + token[1:]  # the first letter escaped
    _hidden(token, mask_text(f"x {first}"))


# --- \x escapes ------------------------------------------------------------------------


@pytest.mark.backend_independent
def test_a_token_written_with_x_escapes_is_masked() -> None:
    token = _token()
    x_first = "\\x68" + token[1:]
    x_body = token[:4] + "".join(f"\\x{ord(c):02x}" for c in token[4:14]) + token[14:]
    x_prefix = token[:3] + "\\x5F" + token[4:]
    for written in (x_first, x_body, x_prefix):
        # what bash makes of it: the token itself
        said = subprocess.run(
            ["bash", "-c", f"printf '%s' $'{written}'"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert said == token
        for text in (
            f"curl -H $'Authorization: Bearer {written}' http://h",
            f"printf '{written}' > ~/.token",
            json.dumps({"command": f"echo $'{written}'"}),  # `\\x68` in JSON text
            f"t = b'{written}'",  # Python bytes literal
        ):
            _hidden(token, mask_text(text))


# --- after a word character ------------------------------------------------------------


@pytest.mark.backend_independent
def test_a_token_right_after_a_word_character_is_masked() -> None:
    token, agent_token = _token(), _token("hrn_")
    colored = subprocess.run(
        ["grep", "--color=always", "hr[on]_[A-Za-z0-9_-]*"],
        input=f"token: {token}\nagent: {agent_token}\n",
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    assert f"\x1b[K{token}" in colored  # the K before the token: no word boundary
    length_prefixed = repr(struct.pack(">I", len(agent_token)) + agent_token.encode())
    assert "\\x008hrn_" in length_prefixed
    masked = mask_text(colored)
    _hidden(token, masked)
    _hidden(agent_token, masked)
    _hidden(agent_token, mask_text(length_prefixed))
    _hidden(agent_token, mask_text(json.dumps({"output": length_prefixed})))
    for text in (f"MY_TOKEN_{token}", f"x{token}", f"\x0b{token}", f"cache_key_{token}.json"):
        _hidden(token, mask_text(text))
        _hidden(token, mask_text(json.dumps({"t": text})))


@pytest.mark.backend_independent
def test_words_holding_hro_after_a_word_character_are_kept() -> None:
    for text in (
        "synchro_primitives_for_distributed_lock_managers",  # lower case
        "synchro_PrimitivesForDistributedLockManagersAndQueues",  # longer than a token
        "synchro_PrimitivesForDistributedLock",  # shorter
        "anachro_NISMS_IN_THE_LATE_MEDIEVAL_PERIOD_AND_AFTER",  # upper case
        "Mehrn_0a1b2c3d_synchronisation_of_all_the_things_we_do",
    ):
        assert mask_text(text) == text
        assert mask_text(json.dumps({"t": text})) == json.dumps({"t": text})


# --- time --------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
    began = time.thread_time()
    mask_text(text)
    return time.thread_time() - began


@pytest.mark.heavy
@pytest.mark.backend_independent
def test_masking_a_1mb_adversarial_text_takes_about_as_long_as_a_plain_one() -> None:
    size = 1024 * 1024
    # The plain text holds each rule's literal once, so every rule reads all of it.
    words = "the quick brown fox jumps over the lazy dog and runs away "
    plain = (f"hro_ \\u \\x {words}" + words * (size // len(words)))[:size]
    pieces = [
        "\\" * 17,
        "\\" * 16 + "u",
        "\\" * 16 + "x6",
        "hro_a\n",
        "hro_\\\n",
        "hro_a\\\\\\n ",
        "hro_" + "a" * 20 + "\n" + "b" * 20 + "\n",
        "-hro_a\n",
        "xhro_",
        "xhrn_00000000_",
        "hrn_0000\n",
        "Khro_" + "aB" * 30,
        "\\x68ro_",
        "\\\\\\\\x68",
        "\n" * 3 + " " * 16,
        "\\r\\n  ",
    ]
    adversarial = [(p, (p * (size // len(p) + 1))[:size]) for p in pieces]
    adversarial.append(("mix", ("".join(pieces) * (size // len("".join(pieces)) + 1))[:size]))
    base = min(_seconds(plain) for _ in range(3))
    for name, text in adversarial:
        took = _seconds(text)
        assert took < 20 * base + 0.5, (name, took, base)


# --- what an auditor is shown ------------------------------------------------------------


@pytest.mark.django_db
def test_tokens_in_these_forms_are_masked_in_the_stored_event_page_and_export(
    client: Client, agent: AgentFixture
) -> None:
    tokens = [_token(), _token("hrr_"), _token("hrn_"), _token()]
    colored = subprocess.run(
        ["grep", "--color=always", "hr[rn]_[A-Za-z0-9_-]*"],
        input=f"refresh: {tokens[1]}\nagent: {tokens[2]}\n",
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    nested = '{"t": "' + tokens[3][:3] + "\\u005f" + tokens[3][4:] + '"}'
    for _ in range(4):
        nested = json.dumps({"a": nested})  # the fifth level: 16 backslashes
    content = "\n".join(
        [
            textwrap.fill(f"Your access token is {tokens[0]} for an hour.", 30),
            colored,
            nested,
        ]
    )
    command = f"curl -H $'Authorization: Bearer \\x68{tokens[0][1:]}' https://h"
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    calls = {
        "calls": [
            {"id": "w1", "name": "write_file", "arguments": {"path": "t.txt", "content": content}},
            {"id": "s1", "name": "run_command", "arguments": {"command": command}},
        ]
    }
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)

    received = AuditEvent.objects.filter(session_id=sid, kind="call.received")
    assert received.count() == 2
    stored = json.dumps([e.payload for e in received])
    auditor = unique("aud")
    make_user(auditor, groups=("auditor",))
    browser = Client()
    browser.login(username=auditor, password="pw-" + auditor)
    page = browser.get(f"/audit/sessions/{sid}/")
    assert page.status_code == 200
    export = _streamed(browser.get(f"/audit/sessions/{sid}/export.jsonl"))
    for text in (stored, page.content.decode(), export):
        for token in tokens:
            secret = token.split("_", 2)[-1] if token.startswith("hrn_") else token[4:]
            for i in range(0, len(secret) - 8, 4):
                assert secret[i : i + 8] not in text, (token, text[:3000])
    assert "[masked:harness-oauth-token#" in stored and "[masked:harness-token#" in stored


@pytest.mark.backend_independent
def test_the_token_lengths_masking_reads_are_those_harness_makes() -> None:
    from agentauth.tokens import new_access_token, new_refresh_token
    from audit.masking import TOKEN_BODY
    from dispatcher.agents import _new_token

    assert len(new_access_token(None)) == 4 + TOKEN_BODY
    assert len(new_refresh_token(None)) == 4 + TOKEN_BODY
    token, prefix = _new_token()
    assert token == f"hrn_{prefix}_{token[13:]}" and len(token[13:]) == TOKEN_BODY


def test_a_token_textwrap_breaks_after_a_hyphen_is_masked() -> None:
    """textwrap breaks a long word after its hyphens as well as at the width, so a token
    of base64url holding a `-` (about every other one) could be wrapped with a middle
    line of three characters (`Y5-`), narrower than a split part may otherwise be: it was
    left in clear (a closing run's auditor-page test failed on such a random token)."""
    token = "hro_QcOVAY5-aWObPHjAZlo70YNNNPk8wEJgh0QnGLfonoY"
    wrapped = textwrap.fill(f"Your access token is {token} for an hour.", 30)
    assert "\nY5-\n" in wrapped
    assert token[4:12] not in mask_text(wrapped) and "Y5-\naWOb" not in mask_text(wrapped)
    # Any token, any width textwrap is used at, any place on the line.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for _ in range(150):
        body = "".join(secrets.choice(alphabet) for _ in range(43))
        if body.lower() == body or body.upper() == body:
            continue  # (no whole token: masked only when whole, see above)
        for width in (16, 20, 30, 40, 70):
            for lead in ("", "Your access token is ", "x "):
                out = mask_text(textwrap.fill(f"{lead}hro_{body} for an hour.", width))
                assert not any(body[i : i + 8] in out for i in range(0, 35, 4)), (width, out)
