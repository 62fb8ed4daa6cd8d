"""Signatures over chain heads, with a key that is not in the database.

The hash chains prove that nobody edited the log *without recomputing it*. Someone who can
write to the database can recompute every hash and the head as well; what they cannot do
without the key is sign the new head. So each chain's head (its last seq and hash) carries
an HMAC-SHA256 signature, and so does every line of a checkpoint file (audit.checkpoints).

The key is `HARNESS_AUDIT_KEY` (at least 32 characters). Without it, a key file in the data
directory (`HARNESS_AUDIT_KEY_FILE`, default `<data dir>/audit.key`) is created on first use,
readable by its owner only: good for the embedded default on one machine, not for
production, where every process must share one key that the database cannot reach
(docs/security.md, "Audit log").

A signature reads `hmac-sha256:<key id>:<hex digest>`; the key id (a hash of the key, not
the key) lets a verifier say "signed with another key" rather than "forged".
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from django.conf import settings

SCHEME = "hmac-sha256"
MIN_KEY_LENGTH = 32


class AuditKeyError(Exception):
    """The audit key cannot be read or is unusable. The message says how to fix it."""


def audit_key() -> bytes:
    """The key heads are signed with (raises AuditKeyError when it cannot be read)."""
    return _key(settings.HARNESS_AUDIT_KEY, str(settings.HARNESS_AUDIT_KEY_FILE))


@functools.cache
def _key(configured: str, key_file: str) -> bytes:
    if configured:
        if len(configured) < MIN_KEY_LENGTH:
            raise AuditKeyError(
                f"HARNESS_AUDIT_KEY is shorter than {MIN_KEY_LENGTH} characters; set a long "
                "random value (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)."
            )
        return configured.encode()
    return _key_file(Path(key_file))


def _key_file(path: Path) -> bytes:
    """The key in `path`, created (mode 0600, atomically) when it does not exist yet."""
    try:
        text = secret_file(path, "audit key")
    except OSError as error:
        raise AuditKeyError(
            f"Cannot read or create the audit key file {path}: {error}. Set "
            "HARNESS_AUDIT_KEY or make the data directory writable."
        ) from error
    if len(text) < MIN_KEY_LENGTH:
        raise AuditKeyError(
            f"The audit key file {path} holds fewer than {MIN_KEY_LENGTH} characters; "
            "restore it from your backup (or set HARNESS_AUDIT_KEY)."
        )
    return text.encode()


def secret_file(path: Path, what: str) -> str:
    """The secret stored in `path`, created with 64 random hex digits when the file does
    not exist yet (mode 0600, linked into place atomically: another process that creates
    it at the same moment wins or loses as a whole, never half a key). Raises OSError when
    it can be neither read nor created. Used for the audit key and, on the embedded
    default, Django's SECRET_KEY (harness_site.settings)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    text = secrets.token_hex(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:
        text = path.read_text().strip()  # another process was first: use theirs
    finally:
        temporary.unlink()
    return text


def key_id(key: bytes | None = None) -> str:
    """A short public name of the key (the first 16 hex digits of a hash of it)."""
    key = audit_key() if key is None else key
    return hashlib.sha256(b"harness-audit-key-id\n" + key).hexdigest()[:16]


def _message(kind: str, *fields: object) -> bytes:
    return "\n".join([f"harness-audit-{kind}:v1", *map(str, fields)]).encode()


def sign(kind: str, *fields: object, key: bytes | None = None) -> str:
    """The signature of `fields` (a head: chain, seq, hash; a checkpoint adds its time)."""
    key = audit_key() if key is None else key
    digest = hmac.new(key, _message(kind, *fields), hashlib.sha256).hexdigest()
    return f"{SCHEME}:{key_id(key)}:{digest}"


def sign_head(chain: str, seq: int, head_hash: str) -> str:
    return sign("head", chain, seq, head_hash)


class Mismatch(str):
    """Why a signature does not verify (a str); `other_key` when it names another key."""

    other_key: str

    def __new__(cls, text: str, other_key: str = "") -> Mismatch:
        instance = super().__new__(cls, text)
        instance.other_key = other_key
        return instance


def check(signature: str, kind: str, *fields: object, key: bytes | None = None) -> Mismatch | None:
    """None when `signature` signs `fields` with this key, else why not."""
    key = audit_key() if key is None else key
    if not signature:
        return Mismatch("not signed")
    scheme, _, rest = signature.partition(":")
    signed_by, _, _ = rest.partition(":")
    if scheme != SCHEME:
        return Mismatch(f"signed with an unknown scheme '{scheme[:20]}'")
    if signed_by != key_id(key):
        return Mismatch(
            f"signed with another key (key id {signed_by[:16]}; this key's id is {key_id(key)})",
            other_key=signed_by[:16],
        )
    if not hmac.compare_digest(signature, sign(kind, *fields, key=key)):
        return Mismatch("the signature does not match (forged or changed without the key)")
    return None


def wrong_key_message(other: str) -> str:
    return (
        f"Every signature was made with another key (key id {other}), not with this one "
        f"(key id {key_id()}). Verify with the key the log was written with: set "
        "HARNESS_AUDIT_KEY (or HARNESS_AUDIT_KEY_FILE) as the writing processes have it. "
        "If they have this key, the heads were rewritten by someone without it: verify "
        "against a checkpoint file (--against) to tell."
    )
