"""Masking of secret-looking values in audit payloads.

The audit copy of a payload is what auditors, exports and replays read, and it is kept
forever; so secrets are masked before the event is hashed and stored. The live records
(the call's exact arguments, what the reviewer is shown, the digest) are not touched:
masking happens only on the way into the log. See docs/audit.md.
"""

from __future__ import annotations

import math
import re
from typing import Any

MASK = "[masked]"

# Key names whose value is a secret, compared after lower-casing and mapping "-" to "_".
# "token_prefix" or "max_tokens" do not match: the name must end with the secret word.
SECRET_KEY = re.compile(
    r"(^|_)(token|access_token|refresh_token|id_token|password|passwd|passphrase|pwd|secret"
    r"|secret_key|client_secret|api_key|apikey|authorization|auth|credentials?|private_key"
    r"|cookie|session_key)$"
)

_SECRET_WORD = (
    r"(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|passwd|pwd)"
)

# (pattern, replacement) applied to every string in the payload, in this order.
VALUE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # PEM private keys, whole.
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL
        ),
        MASK,
    ),
    # "password": "..." inside JSON text (raw arguments, tool output).
    (
        re.compile(r'("[\w.-]*' + _SECRET_WORD + r'"\s*:\s*)"(?:[^"\\]|\\.)+"', re.IGNORECASE),
        r'\1"' + MASK + '"',
    ),
    # Authorization: Bearer xyz / Basic xyz (headers, curl -H ...).
    (
        re.compile(r"\b(Bearer|Basic|Token)(\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
        r"\1\2" + MASK,
    ),
    # PASSWORD=..., api_key: ..., --token=... (shell, env files, config).
    (
        re.compile(
            r"(\b[\w-]*"
            + _SECRET_WORD
            + r"[\w-]*\s*[=:]\s*)(['\"]?)(?!\[masked\])[^\s'\"&;,]{4,}\2",
            re.IGNORECASE,
        ),
        r"\1\2" + MASK + r"\2",
    ),
    # Well-known key formats.
    (re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"), "sk-" + MASK),
    (re.compile(r"\b(hrn_[0-9a-f]{8}_)[A-Za-z0-9_-]{16,}"), r"\1" + MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), MASK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"), MASK),
]


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(key.lower().replace("-", "_")))


def mask_text(text: str) -> str:
    for pattern, replacement in VALUE_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def mask_secrets(value: Any) -> Any:
    """A copy of a JSON-like `value` with secret-looking values replaced by "[masked]"."""
    if isinstance(value, dict):
        return {
            k: (MASK if is_secret_key(str(k)) and v not in (None, "") else mask_secrets(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def storable(value: Any) -> Any:
    """A copy that reads back from the database exactly as written, so its hash stays valid.

    PostgreSQL's jsonb refuses NUL characters and NaN/Infinity and turns 1e+20 into an
    integer; such values are made plain here, before hashing.
    """
    if isinstance(value, dict):
        return {str(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and "e" in repr(value):
            return int(value)
    return value
