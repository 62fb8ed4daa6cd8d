"""A proposed call as every gateway hands it to admission, and its digest.

The digest is the SHA-256 of the canonical JSON of the arguments: the bytes a reviewer's
decision binds to, whatever dialect or protocol the call arrived in.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProposedCall:
    tool_use_id: str
    name: str
    raw_arguments: str  # exactly as received (OpenAI: the arguments string; else canonical JSON)
    arguments: dict[str, Any] | None  # None when the raw text is not a JSON object
    parse_error: str = ""
    # A reviewer's edit: the id of the call this one replaces (admitted like any other).
    edited_from: uuid.UUID | None = None
    # A decide-only call's directory on the client, as its hook reported it (`cwd`): not an
    # argument (it is no part of the digest), but where the client's shell runs the call.
    client_cwd: str = ""


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_of(call: ProposedCall) -> str:
    """SHA-256 of the canonical JSON of the arguments (of the raw text if it is not JSON)."""
    text = canonical_json(call.arguments) if call.arguments is not None else call.raw_arguments
    return hashlib.sha256(text.encode()).hexdigest()
