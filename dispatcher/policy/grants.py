"""Session grants: "approve and allow for the rest of this session", and their revocation.

A grant is the narrowest allow rule naming one approved call, scoped to that call's
session: its exact command in its exact working directory (`run_command(make) in cwd a`;
no suffix means the workspace root), or its exact path (`write_file(src)` covers `src`,
never `src/**`). `grant_matches` is how a grant is read; each change is one transaction
with its audit event.
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
from dispatcher.policy import layers, rules
from dispatcher.policy.context import CallContext
from dispatcher.policy.models import SessionGrant
from dispatcher.tools._paths import lexical_relative
from dispatcher.tools.base import command_argv
from floor.errors import ServiceError

GLOB = re.compile(r"([*?\[])")
IN_CWD = " in cwd "


def _command_word(word: str) -> str:
    """A command-pattern word matching exactly `word` (glob characters bracketed)."""
    return shlex.quote(GLOB.sub(r"[\1]", word))


def _path_pattern(path: str) -> str:
    """A gitignore pattern anchored at the workspace root naming exactly `path`."""
    escaped = re.sub(r"([*?\[\\])", r"\\\1", path)
    return escaped if "/" in path and not path.startswith(("!", "#")) else "/" + escaped


def narrow_rule(ctx: CallContext) -> str:
    """The narrowest grant that allows the call `ctx` again: its exact command in its
    working directory, or its exact path.

    Raises ServiceError when the call cannot be named that narrowly (no command or single
    path argument, or a rule that would not match the call itself), or when a deny or ask
    rule of any layer matches the call (a grant would never apply: see layers).
    """
    tool, args, name = ctx.tool, ctx.arguments, ctx.name
    alone = "Approve it without a session grant."
    suffix = ""
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
        cwd = _directory_of(ctx)
        if cwd is None:
            raise ServiceError(f"The working directory is not inside the workspace. {alone}")
        suffix = "" if cwd == "." else IN_CWD + shlex.quote(cwd)
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
    rule = f"{name}({specifier})"
    text = rule + suffix
    if rules.validate_rules({"allow": [rule]}) or not grant_matches(text, ctx):
        raise ServiceError(f"No exact rule can name this call ('{text}' does not). {alone}")
    blocked = layers.blocks_grant(ctx)
    if blocked.action is not None and blocked.layer is not None:
        raise ServiceError(
            f"A session grant never lifts a deny or ask rule: '{blocked.verdict.rule}' in "
            f"{blocked.layer.whose} {blocked.action} list ({blocked.layer.label}) matches "
            f"this call. {alone}"
        )
    return text


def split_grant(text: str) -> tuple[str, str] | None:
    """(the rule, the working directory) of a grant's text; None when it is malformed.

    The rule ends at the parenthesis closing its first one (a rule's parentheses are
    balanced); what follows is nothing (the workspace root) or ` in cwd DIR`.
    """
    depth = 0
    for at, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ")" and depth == 0:
            rule, rest = text[: at + 1], text[at + 1 :]
            break
    else:
        return text, "."
    if not rest:
        return rule, "."
    if not rest.startswith(IN_CWD):
        return None
    try:
        words = shlex.split(rest[len(IN_CWD) :])
    except ValueError:
        return None
    return (rule, words[0]) if len(words) == 1 else None


def grant_matches(text: str, ctx: CallContext) -> bool:
    """Does the grant `text` allow the call `ctx`? Its rule must allow the call (read as
    an allow rule: an unreadable command never matches), a command must run in the
    grant's working directory, and a path rule names exactly its path, nothing under it.
    Symlinks count: a path or directory that now resolves elsewhere is not the same."""
    parsed = split_grant(text)
    if parsed is None:
        return False
    rule_text, cwd = parsed
    try:
        rule = rules.parse_rule(rule_text)
        if not rule.matches(ctx, "allow"):
            return False
        kind = None if rule.specifier is None else rules.specifier_kind(rule, ctx.tool)
    except rules.RuleError:
        return False
    if ctx.tool.command_argument:
        return _directory_of(ctx) == posixpath.normpath(cwd)
    if kind == "path":
        return _names_exactly(rule.specifier or "", ctx)
    return True


def _directory_of(ctx: CallContext) -> str | None:
    """The call's working directory relative to the workspace, when it is that directory
    both as written and with symlinks resolved; None otherwise."""
    value = ctx.arguments.get("cwd", ".")
    if not isinstance(value, str):
        return None
    given, resolved, _ = rules.path_reading(value, ctx.workspace)
    return given if given is not None and given == resolved else None


def _names_exactly(specifier: str, ctx: CallContext) -> bool:
    """The call's path arguments are all exactly the path the pattern `specifier` names."""
    exact = re.sub(r"\\(.)", r"\1", specifier).lstrip("/")
    readings = rules.path_readings(ctx.tool, ctx.arguments, ctx.workspace)
    return bool(readings) and all(
        given == exact and resolved == exact for given, resolved, _ in readings
    )


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
