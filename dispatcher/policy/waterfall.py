"""Stage 4, the pre-execute waterfall, and its listeners.

A listener is `(call, next) -> Decision`: it answers allow / deny / ask / cancel, or
passes on by returning `next(call)`. The chain is settings.HARNESS_PRE_EXECUTE, in order.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable

from django.conf import settings
from django.utils.module_loading import import_string

from dispatcher.policy import grants, layers
from dispatcher.policy.context import CallContext, Decision, Layer, Quorum
from dispatcher.policy.models import Mode, SessionGrant

logger = logging.getLogger(__name__)

Next = Callable[[CallContext], Decision]
Listener = Callable[[CallContext, Next], Decision]


def _end_of_chain(call: CallContext) -> Decision:
    return Decision(
        "deny", "policy:end", "No policy listener decided this call, so it is denied (fail closed)."
    )


def run_waterfall(call: CallContext, listeners: list[Listener] | None = None) -> Decision:
    """Run the waterfall. A listener that raises denies the call (fail closed)."""
    chain = (
        listeners
        if listeners is not None
        else [import_string(p) for p in settings.HARNESS_PRE_EXECUTE]
    )

    def step(index: int) -> Next:
        if index == len(chain):
            return _end_of_chain

        def run(c: CallContext) -> Decision:
            listener = chain[index]
            try:
                return listener(c, step(index + 1))
            except Exception:
                name = getattr(listener, "__name__", repr(listener))
                logger.exception("pre-execute listener %s failed", name)
                return Decision(
                    "deny",
                    f"listener:{name}",
                    f"Policy listener '{name}' failed; denied (fail closed).",
                )

        return run

    return step(0)(call)


def session_grants(call: CallContext, next: Next) -> Decision:
    """Grants a reviewer gave for the rest of a session ("allow this for the session"), the
    lowest layer of policy (dispatcher.policy.layers).

    An active grant of the call's session that matches (read as an allow rule, in its
    working directory, naming exactly its path: `grants.grant_matches`) allows, by
    "grant:<rule>". Never above a deny or ask rule of any layer (organization, team,
    owner): such a call passes on and user_rules decides it. Only in standard and trusted
    modes, after every ceiling: a session narrowed to read_only or locked since the grant
    is not widened by it. Guards still run after. A revoked grant is not read, so it stops
    at once.
    """
    if (
        not call.session_id
        or not call.may_have_grants
        or call.mode not in (Mode.STANDARD, Mode.TRUSTED)
    ):
        return next(call)
    texts = list(
        SessionGrant.objects.active()
        .filter(session_id=uuid.UUID(call.session_id), tool=call.name)
        .values_list("rule", flat=True)
    )
    rule = next_matching(texts, call)
    if rule is None:
        return next(call)
    if layers.blocks_grant(call).action is not None:
        return next(call)
    if layers.quorum_of(call) is not None:
        return next(call)  # one reviewer's grant never stands in for a quorum
    profile = call.profile
    return Decision(
        "allow",
        f"grant:{rule}",
        f"A reviewer allowed '{rule}' for the rest of this session (profile v{profile.version}).",
        rule=rule,
        layer="grant",
    )


def next_matching(texts: list[str], call: CallContext) -> str | None:
    """The first grant text that allows `call` (see grants.grant_matches)."""
    return next((text for text in texts if grants.grant_matches(text, call)), None)


def sandbox_bounds(call: CallContext) -> bool:
    """True when the program the call starts runs in the sandbox without network
    (`HARNESS_SANDBOX=bwrap`, `HARNESS_SANDBOX_NETWORK` off): what it can reach is bounded.
    Never for a tool the client runs itself (decide-only): Harness's sandbox is not there."""
    return (
        settings.HARNESS_SANDBOX == "bwrap"
        and not settings.HARNESS_SANDBOX_NETWORK
        and not call.tool.client_executed
    )


def user_rules(call: CallContext, next: Next) -> Decision:
    """The rules of every layer (organization, team, owner: dispatcher.policy.layers):
    deny rules of all layers first, then ask rules, then allow rules; the first match
    decides, the highest layer first, and the decision names the layer and its version.

    A command the reader cannot read completely never matches an allow rule. If no deny
    or ask rule caught it and the rest of the chain (trusted mode) would allow it, it runs
    only where the sandbox bounds it (`sandbox_bounds`); otherwise it is asked.
    """
    profile = call.profile
    found = layers.evaluate(call)
    verdict = found.verdict
    if verdict.action is not None and found.layer is not None:
        action, rule, layer = verdict.action, verdict.rule, found.layer
        reason = layers.rule_reason(layer, action, rule)
        if verdict.also:
            others = ", ".join(f"'{other}'" for other in verdict.also)
            reason += f" Other parts of the command were allowed by {others}."
        quorum = layers.quorum_of(call) if action == "ask" else None
        if quorum is not None:
            return _quorum_decision(*quorum, reason)
        return Decision(
            action,  # type: ignore[arg-type]
            f"rule:{action}:{rule}",
            reason,
            rule=rule,
            layer=layer.key,
            layer_version=layer.version,
        )
    decision = next(call)
    if verdict.unreadable is not None and decision.action == "allow":
        if sandbox_bounds(call):
            return dataclasses.replace(
                decision,
                reason=f"{decision.reason} The command could not be read completely "
                f"({verdict.unreadable}); it runs in the sandbox, without network.",
            )
        return Decision(
            "ask",
            "rule:unreadable-command",
            f"The command could not be read completely ({verdict.unreadable}), and no "
            f"sandbox bounds it, so no rule or mode may allow it without a reviewer "
            f"(profile v{profile.version}).",
        )
    return decision


def quorum_of(call: CallContext) -> Quorum | None:
    """The strictest quorum ask rule of any layer matching `call`, or None
    (dispatcher.policy.layers.quorum_of, without the layer)."""
    found = layers.quorum_of(call)
    return found[0] if found is not None else None


def _quorum_decision(quorum: Quorum, layer: Layer, reason: str) -> Decision:
    who = f" from the group '{quorum.group}'" if quorum.group else ""
    count = f"{quorum.approvals} approval{'s' if quorum.approvals > 1 else ''}"
    if quorum.groups:
        counts = " and ".join(f"{n} of the group '{g}'" for g, n in quorum.groups)
        anyone = quorum.approvals - sum(n for _, n in quorum.groups)
        if anyone > 0:
            counts += f" and {anyone} more from any reviewer ({count} in all)"
        reason += f" It needs approvals from distinct reviewers: {counts}."
    elif quorum.approvals > 1 or quorum.group:
        reason += f" It needs {count} from distinct reviewers{who}."
    if quorum.step_up:
        verdicts = " and ".join(f"{v}s" if v == "deny" else "approvals" for v in quorum.step_up)
        reason += f" Its {verdicts} must be signed with a reviewer's passkey (step-up)."
    return Decision(
        "ask",
        f"rule:ask:{quorum.rule}",
        reason,
        rule=quorum.rule,
        approvals=quorum.approvals,
        group=quorum.group,
        layer=layer.key,
        layer_version=layer.version,
        step_up=quorum.step_up,
        groups=quorum.groups,
    )


def permission_mode(call: CallContext, next: Next) -> Decision:
    """The mode's answer, built on tool annotations, never on tool names. Always decides."""
    decision = _mode_answer(call)
    ceiling = layers.ceiling_of(call)
    if ceiling is None:
        return decision
    return dataclasses.replace(
        decision,
        reason=decision.reason + layers.ceiling_note(call),
        layer=ceiling.key,
        layer_version=ceiling.version,
    )


def _mode_answer(call: CallContext) -> Decision:
    tool, mode, by = call.tool, call.mode, f"mode:{call.mode}"
    if mode == Mode.LOCKED:
        return Decision("deny", by, "The session is in locked mode: no tool runs.")
    if mode == Mode.READ_ONLY:
        if tool.read_only:
            return Decision(
                "allow", by, f"'{tool.name}' is read-only and the session is in read_only mode."
            )
        return Decision(
            "deny", by, f"The session is in read_only mode and '{tool.name}' can change things."
        )
    if mode == Mode.STANDARD:
        if tool.read_only:
            return Decision("allow", by, f"'{tool.name}' is read-only; standard mode runs reads.")
        if tool.destructive and not settings.HARNESS_ALLOW_DESTRUCTIVE:
            return Decision(
                "deny", by, f"'{tool.name}' is destructive; standard mode denies destructive tools."
            )
        return Decision(
            "ask", by, f"'{tool.name}' can change things; standard mode asks a reviewer."
        )
    if mode == Mode.TRUSTED:
        return Decision(
            "allow",
            by,
            "The session is in trusted mode: tools run unless a rule or guard stops them.",
        )
    return Decision("deny", by, f"Unknown permission mode '{mode}'; denied (fail closed).")


def run_guards(call: CallContext) -> list[tuple[str, str]]:
    """Stage 5: run every guard; return (guard name, reason) for each that denies.

    A guard that raises counts as a denial: guards only ever take permission away.
    """
    reasons: list[tuple[str, str]] = []
    for path in settings.HARNESS_GUARDS:
        guard = import_string(path)
        name = path.rsplit(".", 1)[-1]
        try:
            reason = guard(call)
        except Exception as exc:
            logger.exception("guard %s failed", name)
            reason = f"Guard '{name}' failed ({type(exc).__name__}); denied (fail closed)."
        if reason:
            reasons.append((name, reason))
    return reasons
