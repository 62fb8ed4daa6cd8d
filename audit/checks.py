"""Start-up checks of the audit key and checkpoints (no database access)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from .signing import MIN_KEY_LENGTH

KEY_HINT = "Generate one with: python -c 'import secrets; print(secrets.token_hex(32))'."


@register()
def check_audit_key(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    key = settings.HARNESS_AUDIT_KEY
    if key and len(key) < MIN_KEY_LENGTH:
        return [
            Error(
                f"HARNESS_AUDIT_KEY is shorter than {MIN_KEY_LENGTH} characters.",
                hint=KEY_HINT,
                id="audit.E001",
            )
        ]
    if key:
        return []
    messages: list[CheckMessage] = []
    if os.environ.get("DATABASE_URL"):
        messages.append(
            Warning(
                "HARNESS_AUDIT_KEY is not set: chain heads are signed with a key file in the "
                "data directory, which every process must share and the database's users "
                "must not reach.",
                hint="Set HARNESS_AUDIT_KEY, the same in every process. " + KEY_HINT,
                id="audit.W001",
            )
        )
    path = Path(settings.HARNESS_AUDIT_KEY_FILE)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return messages  # created, owner only, on first use
    if mode & 0o077:
        messages.append(
            Warning(
                f"The audit key file {path} can be read by others (mode {mode:o}).",
                hint=f"chmod 600 {path}",
                id="audit.W002",
            )
        )
    return messages


@register()
def check_deactivation_steps(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Each HARNESS_DEACTIVATION_STEPS and HARNESS_TEAM_LEFT_STEPS entry imports to a
    callable: a deactivation or a removal that cannot run a step fails (its transaction
    rolls back), so a bad name must fail here."""
    from django.utils.module_loading import import_string

    problems: list[CheckMessage] = []
    named = (
        ("HARNESS_DEACTIVATION_STEPS", "(*, user, actor, sponsor) -> dict", "audit.E010"),
        ("HARNESS_TEAM_LEFT_STEPS", "(*, team, user, actor) -> dict", "audit.E011"),
    )
    for setting, signature, check_id in named:
        for path in getattr(settings, setting):
            try:
                ok = callable(import_string(path))
            except ImportError as error:
                ok, reason = False, str(error)
            else:
                reason = "not callable"
            if not ok:
                problems.append(
                    Error(
                        f"{setting} '{path}': {reason}.",
                        hint=f"Name functions `{signature}` (settings.py).",
                        id=check_id,
                    )
                )
    return problems


@register()
def check_export_shares(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A person's and a team's share of the export slots (audit.export.Slots) are below
    HARNESS_MAX_EXPORTS: a share at or above it (or none, 0) lets one person, or one team's
    auditors, hold every slot and have every other auditor's export refused (a team's set
    at or above it, every slot but the last, which is kept for a team holding none: two
    teams' auditors then hold them all)."""
    cap = settings.HARNESS_MAX_EXPORTS
    if not cap:
        return []  # no cap: nobody's exports can use up the others'
    shares = (
        ("HARNESS_MAX_EXPORTS_PER_PERSON", "one person", "audit.W003"),
        ("HARNESS_MAX_EXPORTS_PER_TEAM", "one team's auditors", "audit.W004"),
    )
    messages: list[CheckMessage] = []
    for setting, who, check_id in shares:
        share = getattr(settings, setting)
        if share and share < cap:
            continue
        said = "0 (no share of its own)" if not share else str(share)
        messages.append(
            Warning(
                f"{setting} is {said}, not below HARNESS_MAX_EXPORTS ({cap}): {who} may "
                "stream every audit export this web process allows at once, and every "
                "other auditor's export is refused while they do.",
                hint=f"Set {setting} between 1 and {cap - 1}"
                + (" (and HARNESS_MAX_EXPORTS above 1)." if cap == 1 else "."),
                id=check_id,
            )
        )
    return messages
