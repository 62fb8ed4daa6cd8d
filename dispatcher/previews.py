"""Previews in the call's lifecycle (issue 36; docs/security.md, "Previews").

At admission, a call of a previewable tool that asks is previewed first (`preview_for`):
its effect goes with the ask (the presentation carries its digest and summary, the
`Preview` row the whole effect), and the reviewer's approval binds to both digests.

In the worker, an approved call with a preview is `settled_by_preview`: under the
workspace's lock, the previewed effect is applied when nothing changed since (the
result is the previewed output), or, when the workspace changed, the call ends
`edited` and a linked new call is previewed and asks again (`_repreview`). A preview
that hit a limit or needed the network is not applied: the command runs as before,
under the same lock, and the model's result ends with a note saying so (`ran_instead`).
The audit's result event says which, with both digests.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from audit import kinds
from audit.models import AuditEvent
from dispatcher import transitions
from dispatcher.models import Preview, Status, ToolCall
from dispatcher.policy import effect_rules, layers
from dispatcher.policy.context import CallContext, Decision
from dispatcher.proposals import ProposedCall
from dispatcher.tools import messages, preview, preview_apply, workspace_lock
from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import Tool, ToolError
from dispatcher.tools.run_command import directory_identity, scrubbed_environment
from floor.compiled import Compiled

logger = logging.getLogger(__name__)

LOCK_WAIT = 2.0  # seconds admission waits for a busy workspace before asking unpreviewed


@dataclass
class Made:
    """A preview made at admission, not yet written (admission writes it with the call)."""

    effect: preview.Effect | None
    note: str
    # The directory the previewed command ran in, as the ask's presentation shows one
    # (run_command's `cwd` and `cwd_identity`): resolved under the lock it ran in.
    cwd: tuple[str, list[int] | None] | None = None

    def agree(self, presentation: dict[str, Any]) -> None:
        """Drop the effect when the ask shows another working directory than the one the
        command was previewed in: `cwd` was resolved before the preview waited for the
        workspace's lock (another call running) and the presentation after it, so a link
        on the way turned meanwhile (`sub -> dirA` to `dirB`) had the reviewer shown
        `dirB` and the effect made in `dirA` applied. The call asks without a preview
        then; approved, it runs for real, where it was shown (`Tool.changed_since`)."""
        if self.effect is None or self.cwd is None or "cwd_identity" not in presentation:
            return
        if self.cwd == (presentation.get("cwd"), presentation["cwd_identity"]):
            return
        preview.discard(self.effect.store)
        self.effect = None
        self.note = (
            "No preview: its working directory changed while it was previewed "
            f"(previewed in {self.cwd[0]}, now {presentation.get('cwd')})."
        )

    def presentation(self) -> dict[str, Any]:
        """What the ask's presentation (and its audit event) carries of the preview."""
        if self.effect is None:
            return {"digest": "", "summary": "", "appliable": False, "note": self.note}
        return {
            "digest": self.effect.digest,
            "summary": self.effect.summary(),
            "appliable": self.effect.appliable,
            "note": self.note,
        }

    @property
    def digest(self) -> str:
        return self.effect.digest if self.effect is not None else ""

    def lifted(self, ctx: CallContext, decision: Decision) -> Decision | None:
        """An effect rule's allow in place of the ask `decision`, or None."""
        if self.effect is None:
            return None
        document = {**self.effect.document(), "appliable": self.effect.appliable}
        return effect_rules.decide(ctx, decision, document, layers.stack(ctx))

    def row(self, call: ToolCall) -> Preview:
        effect = self.effect
        return Preview(
            call=call,
            command_digest=call.digest,
            effect_digest=effect.digest if effect else "",
            effect=effect.stored() if effect else {},
            appliable=bool(effect and effect.appliable),
            note=self.note,
            kept=bool(effect and effect.store),
        )


def preview_for(ctx: CallContext) -> Made | None:
    """The preview of an asking call, or None when its tool is not previewed (or previews
    are off). A preview that cannot be made is a Made without effect, saying why."""
    if not ctx.tool.previewable or not preview.enabled():
        return None
    argv = [str(word) for word in ctx.arguments.get(ctx.tool.command_argument or "argv", [])]
    try:
        with lock_within(lambda: workspace_lock.held(ctx.workspace, wait=False), LOCK_WAIT):
            # (resolved in the lock: what it names is what the preview runs in)
            cwd = resolve_in_workspace(ctx.workspace, str(ctx.arguments.get("cwd", ".")))
            ran_in = str(cwd), directory_identity(cwd)
            effect = preview.run_preview(
                argv, cwd=cwd, workspace=ctx.workspace, env=scrubbed_environment(ctx.workspace)
            )
    except TimeoutError:
        return Made(None, "No preview: another call was running in the workspace.")
    except ToolError as error:
        return Made(None, f"No preview: {error}")
    except OSError as error:  # a preview never breaks admission: the call asks without one
        logger.warning("preview of call %s failed: %s", ctx.call_id, error)
        return Made(None, f"No preview: it failed on this host ({error.strerror or error}).")
    except Exception:  # noqa: BLE001 - nor does anything else it raises (RecursionError
        # from a walk once failed the agent's whole message); logged, the call asks
        logger.exception("preview of call %s failed", ctx.call_id)
        return Made(None, "No preview: it failed on this host.")
    made = Made(effect, "" if effect.appliable else effect.why_not_appliable())
    made.cwd = ran_in
    return made


@contextlib.contextmanager
def lock_within(
    lock: Callable[[], contextlib.AbstractContextManager[None]], seconds: float
) -> Iterator[None]:
    """Hold `lock()` (a lock entered without waiting: BlockingIOError while another holds
    it), trying again for up to `seconds`; TimeoutError past them."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with lock():
                yield
                return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError("the workspace is busy") from None
            time.sleep(0.05)


def record(made: list[tuple[ToolCall, Made]]) -> None:
    """Write the previews of calls just inserted (inside admission's transaction)."""
    if made:
        Preview.objects.bulk_create([m.row(call) for call, m in made])


# --- In the worker -------------------------------------------------------------------------


def lock_for(
    tool: Tool, workspace: Path, *, wait: bool = True
) -> contextlib.AbstractContextManager[None]:
    """The workspace lock a worker holds while a call runs: shared for concurrency-safe
    tools, exclusive for the rest (nothing of the session runs beside a change). Without
    `wait`, entering it raises BlockingIOError when another call holds it."""
    if not workspace.is_dir():
        return contextlib.nullcontext()
    return workspace_lock.held(workspace, shared=tool.is_concurrency_safe, wait=wait)


def kept_preview(call: ToolCall) -> Preview | None:
    if not call.name or call.status != Status.QUEUED:
        return None
    return Preview.objects.filter(call=call).exclude(effect_digest="").first()


def digests(row: Preview) -> dict[str, str]:
    return {"command_digest": row.command_digest, "effect_digest": row.effect_digest}


def settle(call: ToolCall, tool: Tool, row: Preview, workspace: Path) -> tuple[str, str]:
    """Under the workspace lock (the caller holds it): apply the previewed effect, or say
    what else. Returns ("applied", ""), ("gone", "") when another worker moved the call,
    ("repreview", why) when the workspace changed, or ("run", why) when the command must
    run for real (the preview hit a limit or needed the network)."""
    try:
        effect = preview_apply.effect_from(row.effect)
    except (preview_apply.NotAppliable, TypeError):
        effect = None
    if effect is None or effect.digest != row.effect_digest:  # fail closed: ask again
        return "repreview", "the stored effect does not match the approved effect digest"
    if not effect.appliable:
        return "run", _mark(row, Preview.Outcome.RAN, effect.why_not_appliable())
    # checked and applied from one descriptor of the workspace, never its path again (a
    # workspace nested in another agent's, whose program swaps a symlink onto its path)
    with contextlib.ExitStack() as stack:
        try:
            root_fd = stack.enter_context(preview_apply.held(workspace))
        except preview_apply.NotAppliable as error:
            return "repreview", str(error)
        return _apply_held(call, tool, row, effect, workspace, root_fd)


def _apply_held(
    call: ToolCall,
    tool: Tool,
    row: Preview,
    effect: preview.Effect,
    workspace: Path,
    root_fd: int,
) -> tuple[str, str]:
    """settle's check and apply, from the workspace's descriptor `root_fd`."""
    reason = preview_apply.check(effect, workspace, root_fd=root_fd)
    if reason is not None:
        return "repreview", reason
    if not transitions.claim(call, tool):
        return "gone", ""
    started = time.monotonic()
    outcome, content, failed = Preview.Outcome.APPLIED, preview_apply.result_text(effect), False
    try:  # checked above, same lock hold, same descriptor
        preview_apply.apply(effect, workspace, checked=True, root_fd=root_fd)
    except (OSError, preview_apply.NotAppliable) as error:
        # Something outside Harness changed the workspace under the lock: said, not hidden.
        outcome, failed = Preview.Outcome.APPLY_FAILED, True
        content = messages.apply_failed(call.name, str(error))
    with transaction.atomic():
        Preview.objects.filter(pk=row.pk).update(outcome=outcome, kept=False)
        transitions.finish(
            call,
            Status.COMPLETED,
            content,
            failed,
            time.monotonic() - started,
            audit={"effect": {"outcome": str(outcome), **digests(row)}},
        )
    preview.discard(effect.store)
    return "applied", ""


def _mark(row: Preview, outcome: str, note: str) -> str:
    Preview.objects.filter(pk=row.pk).update(outcome=outcome, note=note)
    row.outcome, row.note = outcome, note
    return note


def ran_instead(row: Preview | None, tool_name: str) -> tuple[dict[str, Any], str] | None:
    """For an approved call of `tool_name` with a preview (`row`) whose effect could not
    be applied, so the command ran for real (`settle`'s "run"): the result event's record
    of it (its code of why: Effect.not_appliable), and the note the model reads after the
    result (messages.ran_not_applied). None without a preview: no query either way."""
    if row is None:
        return None
    try:
        effect = preview_apply.effect_from(row.effect)
        code, why = effect.not_appliable()
    except (preview_apply.NotAppliable, TypeError, KeyError, ValueError):
        code, why = "", ""
    code, why = code or "unknown", why or "Harness could not tell why"
    audit = {"outcome": "ran", "previewed": True, "not_appliable": code, "note": row.note}
    return {"effect": {**audit, **digests(row)}}, messages.ran_not_applied(tool_name, why)


def changed_since_ask(call: ToolCall, tool: Tool, workspace: Path) -> str | None:
    """Under the workspace lock (the caller holds it), for a tool whose presentation shows
    the state it changes (`Tool.changed_since`: write_file's diff) and a call a reviewer
    approved: why the workspace is no longer as the approved ask showed it, or None. The
    ask's presentation is read from its `call.approval_requested` event (a call never
    asked has none: nothing to compare). Asked whether or not this process sees the
    workspace: an upstream tool's binds a definition, not the workspace (a worker that
    mounts no workspace ran it under a definition accepted after the ask), and a file
    tool's missing file is a changed one."""
    if tool.changed_since is None:
        return None
    rows = _ASK_PAYLOAD.tuples(f"call:{call.pk}", kinds.CALL_APPROVAL_REQUESTED)
    payload = rows[0][0] if rows else None
    presentation = (payload or {}).get("presentation")
    if not isinstance(presentation, dict):
        return None
    return tool.changed_since(call.arguments or {}, workspace, presentation)


# The payload of a call's latest event of a kind (its ask's, `changed_since_ask`), read on
# every approved file tool's run: compiled once (floor.compiled; its ORM build cost more
# CPU than the statement: docs/benchmarks.md).
_ASK_PAYLOAD = Compiled(
    lambda subject, kind: (
        AuditEvent.objects.filter(subject=subject, kind=kind)
        .order_by("-seq")
        .values_list("payload")[:1]
    )
)


def repreview(call: ToolCall, row: Preview | None, reason: str) -> ProposedCall | None:
    """The workspace changed since the approved preview (`row`), or since the approved
    ask's presentation (`changed_since_ask`, no row): the call ends `edited` (nothing
    applied, nothing run). Returns the linked new call (same arguments) the caller admits
    in its place, outside any transaction (its new preview must not hold the database's
    write lock), or None when the call was no longer queued."""
    replacement = _repreview_id(call)
    if not transitions.repreview_call(
        call=call,
        replacement=replacement,
        reason=reason,
        digests=digests(row) if row is not None else {},
        diff=row is None,
    ):
        return None
    if row is not None:
        Preview.objects.filter(pk=row.pk).update(outcome=Preview.Outcome.REPREVIEWED, kept=False)
        preview.discard(str(row.effect.get("store", "")))
    return ProposedCall(
        replacement, call.name, call.raw_arguments, call.arguments, edited_from=call.pk
    )


def _repreview_id(call: ToolCall) -> str:
    root = call.tool_use_id[:180]
    taken = set(
        ToolCall.objects.filter(
            session_id=call.session_id, tool_use_id__startswith=f"{root}#preview"
        ).values_list("tool_use_id", flat=True)
    )
    n = 1
    while f"{root}#preview{n}" in taken:
        n += 1
    return f"{root}#preview{n}"


ORPHAN_AGE = 3600.0  # seconds: a store no row names, older than this, is an orphan


def sweep() -> int:
    """Remove the kept upper layers of calls that ended (denied, expired, cancelled, run
    for real), and stores no call names (an admission that was rolled back) once they are
    an hour old: the reconciler calls it. Returns how many were removed."""
    removed = 0
    named: set[str] = set()
    for row in Preview.objects.filter(kept=True).select_related("call"):
        store = str(row.effect.get("store", ""))
        if row.call.is_terminal or row.outcome:
            preview.discard(store)
            Preview.objects.filter(pk=row.pk).update(kept=False)
            removed += 1
        else:
            named.add(store)
    root = preview.store_root()
    if root.is_dir():
        now = time.time()
        for path in root.iterdir():
            if path.name == "mnt" or str(path) in named:
                continue
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > ORPHAN_AGE:
                    preview.discard(str(path))
                    removed += 1
    return removed


def preview_setting_problems() -> list[str]:
    problems = []
    if float(settings.HARNESS_PREVIEW_TIMEOUT) <= 0:
        problems.append("HARNESS_PREVIEW_TIMEOUT must be a positive number of seconds")
    if int(settings.HARNESS_PREVIEW_MAX_BYTES) < 1 << 20:
        problems.append("HARNESS_PREVIEW_MAX_BYTES must be at least 1048576 (1 MiB)")
    return problems
