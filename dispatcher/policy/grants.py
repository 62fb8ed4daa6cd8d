"""Session grants: "approve and allow for the rest of this session", and their revocation.

A grant is the narrowest allow rule naming one approved call (its exact command with its
working directory, or its exact path), scoped to that call's session. Each change is one
transaction with its audit event.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import uuid

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit import kinds
from audit.services import record_event
from dispatcher.errors import ServiceError
from dispatcher.policy import rules
from dispatcher.policy.context import CallContext
from dispatcher.policy.models import SessionGrant
from dispatcher.tools._paths import lexical_relative
from dispatcher.tools.base import command_argv

GLOB = re.compile(r"([*?\[])")


def _command_word(word: str) -> str:
    """A command-pattern word matching exactly `word` (glob characters bracketed)."""
    return shlex.quote(GLOB.sub(r"[\1]", word))


def _path_pattern(path: str) -> str:
    """A gitignore pattern anchored at the workspace root naming exactly `path`."""
    escaped = re.sub(r"([*?\[\\])", r"\\\1", path)
    return escaped if "/" in path and not path.startswith(("!", "#")) else "/" + escaped


def narrow_rule(ctx: CallContext) -> str:
    """The narrowest rule that allows the call `ctx` again: its exact command or its exact path.

    Raises ServiceError when the call cannot be named that narrowly (no command or single
    path argument, or a rule that would not match the call itself).
    """
    tool, args, name = ctx.tool, ctx.arguments, ctx.name
    alone = "Approve it without a session grant."
    if tool.command_argument:
        argv = command_argv(tool, args)
        if tool.command_shell and argv:  # one shell string: its words, if it is one command
            try:
                argv = shlex.split(argv[2])
            except ValueError:
                argv = None
        if not argv:
            raise ServiceError(f"This '{name}' call has no command to grant. {alone}")
        specifier = " ".join(_command_word(word) for word in argv)
    elif len(tool.path_arguments) == 1 and isinstance(args.get(tool.path_arguments[0]), str):
        path = posixpath.normpath(args[tool.path_arguments[0]])
        if tool.client_executed:  # the client's path, relative to its project directory
            path = lexical_relative(path, ctx.workspace) or path
        if path.startswith(("/", "..", "~")) or path == ".":
            raise ServiceError(f"'{path}' is not a path inside the workspace. {alone}")
        specifier = _path_pattern(path)
    else:
        raise ServiceError(
            f"'{name}' takes no command or single path, so no narrow rule fits. {alone}"
        )
    text = f"{name}({specifier})"
    if rules.validate_rules({"allow": [text]}) or not _allows(text, ctx):
        raise ServiceError(f"No exact rule can name this call ('{text}' does not). {alone}")
    return text


def _allows(text: str, ctx: CallContext) -> bool:
    try:
        return rules.parse_rule(text).matches(ctx, "allow")
    except rules.RuleError:
        return False


def grant_for_session(*, ctx: CallContext, actor: User) -> SessionGrant:
    """Allow calls like the call `ctx` for the rest of its session (see narrow_rule).

    Idempotent: an active grant with the same rule in the session is returned as it is.
    Must be called inside the transaction of the approval it comes with, or alone.
    Raises ServiceError when no narrow rule fits.
    """
    rule = narrow_rule(ctx)
    session_id = uuid.UUID(ctx.session_id)
    with transaction.atomic():
        existing = SessionGrant.objects.filter(
            session_id=session_id, rule=rule, revoked_at__isnull=True
        ).first()
        if existing is not None:
            return existing
        grant = SessionGrant.objects.create(
            session_id=session_id,
            rule=rule,
            tool=ctx.name,
            call_id=ctx.call_id,
            granted_by=actor,
        )
        record_event(
            kind=kinds.GRANT_CREATED,
            actor=f"user:{actor.get_username()}",
            subject=f"grant:{grant.pk}",
            session_id=ctx.session_id,
            payload={
                "grant_id": grant.pk,
                "rule": rule,
                "tool": ctx.name,
                "call_id": ctx.call_id,
                "session_id": ctx.session_id,
            },
        )
    return grant


def revoke_grant(*, grant_id: int, actor: User) -> bool:
    """Revoke a grant; the session's next call no longer sees it. False if already revoked.

    Raises ServiceError when there is no such grant.
    """
    with transaction.atomic():
        grant = SessionGrant.objects.filter(pk=grant_id).first()
        if grant is None:
            raise ServiceError("This grant does not exist.")
        done = SessionGrant.objects.filter(pk=grant_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=actor
        )
        if done:
            record_event(
                kind=kinds.GRANT_REVOKED,
                actor=f"user:{actor.get_username()}",
                subject=f"grant:{grant.pk}",
                session_id=grant.session_id,
                payload={
                    "grant_id": grant.pk,
                    "rule": grant.rule,
                    "session_id": str(grant.session_id),
                },
            )
    return bool(done)
