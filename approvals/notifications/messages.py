"""What each channel says about an ask: built from the stored request, never from the
agent's text as markup. Slack text is escaped (&, <, >) and agent data sits in code
blocks; email is plain text; the webhook body is JSON.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.urls import reverse

from approvals.display import visible
from audit.masking import mask_secrets, mask_text, premask_arguments

from ..models import ApprovalRequest

SLACK_TEXT_LIMIT = 2800  # a Block Kit text field holds 3000 characters
PUSH_TEXT_LIMIT = 300
MAX_SLACK_LINKS = 10
# Said instead of one-tap links to a recipient who lacks a required second factor
# (approvals.links.links_for): a link would decide nothing for them.
SECOND_FACTOR_FIRST = (
    "You must set up a second factor (an authenticator app or a passkey) before you can "
    "decide: this organization requires one."
)


def cannot_approve(approval: ApprovalRequest) -> str:
    """Said instead of one-tap links to a person told of a quorum whose approval would fill
    none of its open places (services.links_of): what it needs, and where to look."""
    if approval.groups:
        needs = " and ".join(f"{n} of the group '{g}'" for g, n in approval.counts().items())
        if approval.anyone:
            needs += f" and {approval.anyone} more from any reviewer"
    elif approval.group:
        needs = f"{approval.approvals_required} from the group '{approval.group}'"
    else:
        needs = f"{approval.approvals_required} from distinct reviewers"
    return (
        f"You cannot approve this call: it needs approvals ({needs}; so far "
        f"{approval.progress()}) that yours would not count towards. You are told because "
        "no one who may decide it can give them: open the call to see it and who can "
        "approve it; you can deny it there."
    )


def detail_url(approval: ApprovalRequest) -> str:
    return settings.HARNESS_PUBLIC_URL.rstrip("/") + reverse("approvals:detail", args=[approval.pk])


def one_line(text: object) -> str:
    r"""`text` on one line of a message: invisible characters escaped as the queue shows
    them (`visible`), and its line breaks and tabs as `\n` and `\t`."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def summary(approval: ApprovalRequest) -> str:
    """One line: what asks. Names come from the registry and the database, not the model;
    an agent's name may still be its client's choice (an OAuth client's registered name),
    so none of it is ever more than that one line (an email's first line, its subject, a
    push's title)."""
    call = approval.call
    text = f"{one_line(call.session.agent.name)} asks to run {one_line(call.name)}"
    effect = one_line(preview_summary(approval))
    return f"{text}. {effect}" if effect else text


def preview_summary(approval: ApprovalRequest) -> str:
    """ "This command would: change 2 files, create 1" for a previewed command, else ""."""
    preview = (approval.presentation or {}).get("preview") or {}
    if preview.get("summary"):
        return str(preview["summary"]) + (
            "" if preview.get("appliable") else " (will run for real)"
        )
    return str(preview.get("note", ""))


def shown(text: str) -> str:
    """`text` as a message through a channel outside Harness shows it (email, Slack,
    push): with secret-looking values masked as the audit log masks them. The call's page
    shows the exact bytes to a signed-in reviewer; a webhook, the operator's own
    receiver, gets them too (`call_fields`: the digest is of them)."""
    return mask_text(text)


def shown_arguments(raw: str) -> str:
    """A call's raw arguments as such a message shows them: masked as the audit log's
    copy is (`premask_arguments`: the decoded values too)."""
    try:
        decoded = json.loads(raw)
    except ValueError:
        decoded = None
    return str(premask_arguments(raw, decoded if isinstance(decoded, dict) else None))


def what_it_does(approval: ApprovalRequest) -> str:
    """The diff, the command line, or the arguments, as the queue shows them (text),
    secrets masked (`shown`)."""
    return shown(_what_it_does(approval))


def _what_it_does(approval: ApprovalRequest) -> str:
    p = approval.presentation or {}
    if p.get("kind") == "diff":
        # The path is the agent's argument, line breaks and all: on one line wherever it
        # is named (its diff's header too), so it writes no line of its own (an email's
        # "Approve:" line above the real one-tap links)
        path = str(p.get("path", ""))
        diff = str(p.get("diff", "") or "(no change)")
        if path and one_line(path) != path:
            diff = diff.replace(path, one_line(path))
        return f"Change to {one_line(path)}:\n{diff}"
    if p.get("kind") == "command":
        effect = preview_summary(approval)
        # each word masked as itself: in the JSON text a script's line breaks are `\n`
        # escapes, and `\nDB_PASSWORD=...` read as one word kept the password (rt11)
        argv = mask_secrets(p.get("argv", []))
        return (effect + "\n" if effect else "") + (
            f"Command: {json.dumps(argv, ensure_ascii=False)}\nin {one_line(p.get('cwd', ''))}"
        )
    return f"Arguments: {shown_arguments(approval.call.raw_arguments)}"


def call_fields(approval: ApprovalRequest) -> dict[str, Any]:
    call = approval.call
    return {
        "id": str(call.pk),
        "tool": call.name,
        "tool_use_id": call.tool_use_id,
        "arguments": call.raw_arguments,  # as logged: the bytes the digest is of
        "digest": call.digest,
        "agent": call.session.agent.name,
        "session": str(call.session_id),
        "presentation": approval.presentation,
    }


def webhook_body(
    approval: ApprovalRequest, event: str, links: list[dict[str, str]], delivery_id: str
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event": f"approval.{event}",
        "delivery": delivery_id,
        "approval_id": approval.pk,
        "call": call_fields(approval),
        "why": approval.reason,
        "asked_by": approval.asked_by,
        "approvals_required": approval.approvals_required,
        "group": approval.group,
        "groups": approval.groups,
        "expires_at": approval.expires_at.isoformat(),
        "url": detail_url(approval),
    }
    if event in ("asked", "escalated"):  # (an escalation asks its next tier, with their links)
        body["links"] = links
    else:
        body["outcome"] = outcome(approval)
    return body


def outcome(approval: ApprovalRequest) -> dict[str, Any]:
    call = approval.call
    return {
        "status": call.status,
        "decision": approval.decision or call.decision,
        "decided_by": call.decided_by.removeprefix("user:"),
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
    }


def outcome_text(approval: ApprovalRequest) -> str:
    o = outcome(approval)
    who = f" by {o['decided_by']}" if o["decided_by"] else ""
    return f"Now {str(o['status']).replace('_', ' ')}{who}."


# --- Slack --------------------------------------------------------------------------------


def slack_escape(text: str) -> str:
    """Slack's three control characters, and a code fence an agent could close."""
    text = visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("```", "`\u200b``")


def slack_text(approval: ApprovalRequest) -> str:
    """A Slack message's top-level text (what its notifications show): the summary,
    escaped as the blocks are (Slack reads it as mrkdwn: an agent's name could otherwise
    mention `<!channel>` or show a link of its choosing)."""
    return slack_escape(summary(approval))


def _code(text: str) -> str:
    text = slack_escape(text)
    if len(text) > SLACK_TEXT_LIMIT:
        text = text[:SLACK_TEXT_LIMIT] + "\n… (shortened: open the call to read all of it)"
    return f"```{text}```"


def slack_blocks(
    approval: ApprovalRequest, links: list[dict[str, str]], decided: bool = False
) -> list[dict[str, Any]]:
    call = approval.call
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": summary(approval)[:150]}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": f"*Why it asks:* {slack_escape(approval.reason)}"},
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": _code(what_it_does(approval))}},
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"SHA-256 `{call.digest}`"}],
        },
    ]
    if approval.is_quorum:
        text = f"Needs {approval.approvals_required} approvals"
        text += f" from {slack_escape(approval.group)}" if approval.group else ""
        if approval.groups:
            text = "Needs approvals from " + " and ".join(
                f"{n} of {slack_escape(g)}" for g, n in approval.counts().items()
            )
            if approval.anyone:
                text += (
                    f" and {approval.anyone} more from any reviewer "
                    f"({approval.approvals_required} in all)"
                )
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": text}]})
    if decided:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{outcome_text(approval)}*"}}
        )
        return blocks
    buttons: list[dict[str, Any]] = [
        {
            "type": "button",
            "text": {"type": "plain_text", "text": "Open"},
            "url": detail_url(approval),
        }
    ]
    deciding = [link for link in links if "approve" in link]
    for link in deciding[:MAX_SLACK_LINKS]:
        for verdict in ("approve", "deny"):
            buttons.append(
                {
                    "type": "button",
                    "text": {
                        "type": "plain_text",
                        "text": f"{verdict.title()} ({link['reviewer']})"[:75],
                    },
                    "url": link[verdict],
                    **({"style": "primary"} if verdict == "approve" else {"style": "danger"}),
                }
            )
    blocks.append({"type": "actions", "elements": buttons[:25]})
    onlookers = [link for link in links if "cannot_approve" in link]
    if onlookers:
        names = ", ".join(slack_escape(link["reviewer"]) for link in onlookers)
        text = f"{names}: {slack_escape(onlookers[0]['cannot_approve'])}"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": text}]})
    unready = [link for link in links if "second_factor_setup" in link]
    if unready:
        names = ", ".join(slack_escape(link["reviewer"]) for link in unready)
        setup = unready[0]["second_factor_setup"]
        text = f"{names}: {SECOND_FACTOR_FIRST} <{setup}|Set one up>, then open the call."
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": text}]})
    return blocks


# --- Email and push -------------------------------------------------------------------------


def email_subject(approval: ApprovalRequest) -> str:
    return f"[Harness] {summary(approval)}"[:200].replace("\n", " ").replace("\r", " ")


def email_body(approval: ApprovalRequest, links: dict[str, str] | None) -> str:
    lines = [
        summary(approval) + ".",
        "",
        f"Why it asks: {visible(approval.reason)}",
        "",
        visible(what_it_does(approval)),
        "",
        f"Arguments as logged, secrets masked: {visible(shown_arguments(approval.call.raw_arguments))}",
        f"SHA-256: {approval.call.digest}",
    ]
    if approval.is_quorum:
        lines.append(f"Needs {approval.approvals_required} approvals ({approval.progress()}).")
    lines += ["", f"Open the call: {detail_url(approval)}"]
    if approval.step_up:
        lines.append("Deciding it is signed with your passkey, on the call's page.")
    if links and "approve" in links:
        lines += [
            "",
            "One-tap links, for you only and usable once (each shows the call before you confirm):",
            f"Approve: {links['approve']}",
            f"Deny: {links['deny']}",
        ]
    elif links and "second_factor_setup" in links:
        lines += [
            "",
            f"{SECOND_FACTOR_FIRST} Set one up at {links['second_factor_setup']}, then open "
            "the call above or your approval queue.",
        ]
    elif links and "cannot_approve" in links:
        lines += ["", links["cannot_approve"]]
    return "\n".join(lines) + "\n"


def push_payload(approval: ApprovalRequest, links: dict[str, str]) -> str:
    """The push message: its actions open the recipient's one-tap links; for a recipient
    who must set up a second factor first there are none (harness-sw.js then offers no
    Approve or Deny), the body says so and `setup` is the set-up page."""
    body = visible(what_it_does(approval))
    if len(body) > PUSH_TEXT_LIMIT:
        body = body[:PUSH_TEXT_LIMIT] + "…"
    payload = {
        "title": summary(approval),
        "body": body,
        "url": detail_url(approval),
        "tag": f"harness-approval-{approval.pk}",
    }
    if "approve" in links:
        payload |= {"approve": links["approve"], "deny": links["deny"]}
    elif "cannot_approve" in links:
        payload["body"] = f"{links['cannot_approve']}\n{body}"
    else:
        payload["body"] = f"{SECOND_FACTOR_FIRST}\n{body}"
        payload["setup"] = links.get("second_factor_setup", "")
    return json.dumps(payload)
