"""A scripted agent (no LLM) that walks through what Harness decides, printing each result.

It talks to Harness only through `dispatcher.client`, in all three dialects, the way a real
agent loop would. With `auto_approve_as`, it approves its own pending calls in-process
through `approvals.services.decide` (tests, CI, a non-interactive demo); without it, it
waits for a reviewer in the browser.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dispatcher.gateways.client import HarnessClient, HarnessError, Result

RULE = "-" * 72
MCP_TOOL = "demo__word_count"


async def _mcp_call(
    base_url: str, token: str, name: str, arguments: dict[str, Any]
) -> tuple[bool, Any]:
    """List the tools over MCP, then call `name` if it is offered. The SDK's client probes
    `server/discover` first, so against Harness it speaks the stateless 2026-07-28
    revision (no initialize, no Mcp-Session-Id): its calls join the agent's run."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)
    )
    async with http, Client(streamable_http_client(base_url + "/mcp/", http_client=http)) as mcp:
        names: set[str] = set()
        cursor = None
        while True:
            page = await mcp.list_tools(cursor=cursor)
            names |= {tool.name for tool in page.tools}
            cursor = page.next_cursor
            if not cursor:
                break
        if name not in names:
            return False, None
        return True, await mcp.call_tool(name, arguments)


class Out(Protocol):
    """Where the demo prints: sys.stdout or a management command's self.stdout."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


def _openai(name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_" + uuid.uuid4().hex[:12],
                "type": "function",
                "function": {"name": name, "arguments": text},
            }
        ],
    }


def _anthropic(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "text": f"I'll call {name}."},
            {
                "type": "tool_use",
                "id": "toolu_" + uuid.uuid4().hex[:12],
                "name": name,
                "input": arguments,
            },
        ],
    }


def _native(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "calls": [{"id": "demo-" + uuid.uuid4().hex[:12], "name": name, "arguments": arguments}]
    }


DIALECTS: dict[str, Callable[..., dict[str, Any]]] = {
    "openai": _openai,
    "anthropic": _anthropic,
    "native": _native,
}


def _clip(text: str | None, limit: int = 400) -> str:
    text = (text or "").rstrip()
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more chars]"


def approve_pending(result: Result, username: str, out: Out) -> None:
    """Approve every pending call of `result` as `username`, the way a reviewer would."""
    from django.contrib.auth import get_user_model

    from approvals.models import ApprovalRequest
    from approvals.services import DecisionRefused, decide
    from dispatcher.models import ToolCall

    user = get_user_model().objects.get(username=username)
    for call in result.pending:
        if call["status"] != "pending_approval":
            continue
        row = ToolCall.objects.get(pk=call["id"])
        approval = ApprovalRequest.objects.get(call_id=row.pk)
        preview = approval.presentation.get("preview") or {}
        if preview.get("summary"):
            out.write(f"  (the reviewer sees, above the command: {preview['summary']})\n")
        if approval.needs_key("approve"):
            # A step-up rule: no approval without a passkey, and the demo holds none.
            try:
                decide(approval_id=approval.pk, user=user, approve=True, digest=row.digest)
            except DecisionRefused as refused:
                out.write(f"  (auto-approve refused: {refused})\n")
            decide(
                approval_id=approval.pk,
                user=user,
                approve=False,
                digest=row.digest,
                feedback="The demo's reviewer holds no passkey, so it cannot approve this.",
            )
            out.write(f"  (denied {call['name']} as reviewer '{username}' instead)\n")
            continue
        decide(
            approval_id=approval.pk,
            user=user,
            approve=True,
            digest=row.digest,
            feedback="Approved automatically by the demo (--auto-approve-as).",
            effect_digest=approval.effect_digest,  # the previewed effect it was shown
        )
        out.write(f"  (auto-approved {call['name']} as reviewer '{username}')\n")


class DemoAgent:
    def __init__(
        self,
        client: HarnessClient,
        *,
        out: Out = sys.stdout,
        auto_approve_as: str | None = None,
        dashboard: str = "http://127.0.0.1:8000",
    ) -> None:
        self.client = client
        self.out = out
        self.auto_approve_as = auto_approve_as
        self.dashboard = dashboard.rstrip("/")
        self.step = 0

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def call(
        self, label: str, expect: str, dialect: str, name: str, arguments: Any
    ) -> dict[str, Any]:
        """Submit one call in `dialect`, wait for it (and its reviewer), print what happened."""
        self.step += 1
        message = DIALECTS[dialect](name, arguments)
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
        self.say(RULE)
        self.say(f"[{self.step}] {label}  ({dialect} dialect)")
        self.say(f"    {name}({shown})  -- expect: {expect}")
        result = self.client.submit(message, wait=2)  # an ask is known at once
        if not result.done:
            if result.pending[0]["status"] == "pending_approval":
                self._review(result, name)
            result = self.client.wait_for(message)
        call = result.calls[0]
        self.say(
            f"    => status={call['status']} decision={call['decision']} "
            f"decided_by={call['decided_by']} is_error={call['is_error']}"
        )
        if call["reason"]:
            reason = _clip(call["reason"], 300).replace("\n", "\n            ")
            self.say(f"    reason: {reason}")
        self.say("    result for the model:")
        for line in _clip(call["content"]).splitlines() or [""]:
            self.say("      | " + line)
        self._check_results_shape(dialect, result)
        return call

    def _review(self, result: Result, name: str) -> None:
        """An asked call: approve it in-process, or tell the person at the browser what to do."""
        if self.auto_approve_as:
            approve_pending(result, self.auto_approve_as, self.out)
            return
        pending = result.pending[0]
        self.say(
            f"    Waiting for a reviewer: open {self.dashboard}/approvals/ and approve "
            f"{name} (call {pending['id']}); sign in as reviewer / reviewer."
        )
        if "passkey" in pending.get("reason", ""):
            local = self.dashboard.replace("127.0.0.1", "localhost")
            self.say(
                f"    This call needs a passkey (step-up): sign in at {local}/ "
                "(WebAuthn needs a host name), add a passkey on your page "
                "(your name, top right), then approve it there."
            )

    def mcp_call(self, label: str, name: str, arguments: dict[str, Any]) -> bool | None:
        """One call through the MCP gateway (/mcp/) with the official `mcp` client; None
        when the bundled MCP server is not registered on this Harness."""
        self.step += 1
        self.say(RULE)
        self.say(f"[{self.step}] {label}  (MCP, streamable HTTP at /mcp/)")
        self.say(f"    {name}({json.dumps(arguments)})  -- expect: allowed")
        try:
            offered, result = asyncio.run(
                _mcp_call(self.client.base_url, self.client.token, name, arguments)
            )
        except Exception as exc:  # noqa: BLE001 - the demo reports any failure
            self.say(f"    => the MCP gateway failed: {type(exc).__name__}: {exc}")
            return False
        if not offered:
            self.say(f"    (skipped: '{name}' is not offered here; `make demo` registers it)")
            return None
        text = "\n".join(c.text for c in result.content if c.type == "text")
        self.say(f"    => isError={result.is_error}")
        self.say("    result for the model:")
        for line in _clip(text).splitlines() or [""]:
            self.say("      | " + line)
        return result.is_error is False and "words" in text

    def _check_results_shape(self, dialect: str, result: Result) -> None:
        first = result.results[0]
        key = {"openai": "tool_call_id", "anthropic": "content", "native": "id"}[dialect]
        assert key in first, f"unexpected {dialect} result shape: {first}"

    def run(self) -> bool:
        """Run every scenario; True when each ended as expected."""
        session = self.client.start_session(title="Harness demo: allow, ask, deny, reject")
        self.say(f"Session {session['id']} in mode '{session['mode']}'")
        self.say(f"Workspace: {session['workspace']}")
        names = [t["name"] for t in self.client.tools("native")]
        self.say(f"Tools offered to the model: {', '.join(names)}")
        note = f"demo-{session['id'][:8]}.txt"
        ok = [self._scenario(scenario, note) for scenario in SCENARIOS]
        mcp = self.mcp_call(
            "ALLOW over MCP: a tool of the bundled upstream MCP server",
            MCP_TOOL,
            {"text": "The model proposes;\nHarness decides and executes."},
        )
        if mcp is not None:
            ok.append(mcp)
            self.say(
                f"    {'OK' if mcp else 'UNEXPECTED'}: read-only upstream tool, run by the worker"
            )
        self.say(RULE)
        self.say(f"Demo finished: {sum(ok)}/{len(ok)} scenarios ended as expected.")
        self.say(f"Audit trail: {self.dashboard}/audit/sessions/{session['id']}/")
        return all(ok)

    def _scenario(self, scenario: Scenario, note: str) -> bool:
        """Submit one scenario's call; True when it ended as the scenario expects."""
        arguments = scenario.arguments(note)
        call = self.call(
            scenario.label, scenario.expect, scenario.dialect, scenario.tool, arguments
        )
        wanted = scenario.status if isinstance(scenario.status, tuple) else (scenario.status,)
        good = call["status"] in wanted and (not scenario.is_error or bool(call["is_error"]))
        self.say(f"    {'OK' if good else 'UNEXPECTED'}: {scenario.outcome}")
        return good


# The demo owner's step-up rule (run_demo sets it): writing this file needs a passkey.
STEP_UP_PATH = "release-plan.md"
STEP_UP_RULE = {"rule": f"write_file({STEP_UP_PATH})", "step_up": True}


@dataclass(frozen=True)
class Scenario:
    """One demo call: what it shows, how it is sent, and how it must end."""

    label: str
    expect: str
    dialect: str
    tool: str
    arguments: Callable[[str], Any]  # the session's note file name -> the arguments
    status: str | tuple[str, ...]  # the status it must end in (or any of them)
    outcome: str
    is_error: bool = False


SCENARIOS = (
    Scenario(
        "ALLOW: list the workspace",
        "allowed",
        "openai",
        "list_directory",
        lambda note: {"path": "."},
        "completed",
        "allowed by standard mode (read-only tool)",
    ),
    Scenario(
        "ALLOW, tool error: read a file that does not exist yet",
        "a useful error",
        "native",
        "read_file",
        lambda note: {"path": note},
        "completed",
        "ran, and the model gets an error it can act on",
        is_error=True,
    ),
    Scenario(
        "ASK: write a file (a reviewer must approve)",
        "approved, then written",
        "anthropic",
        "write_file",
        lambda note: {"path": note, "content": "Written by the Harness demo agent.\n"},
        "completed",
        "approved by a reviewer, then executed by the worker",
    ),
    Scenario(
        "ALLOW: read the file just written",
        "its content",
        "openai",
        "read_file",
        lambda note: {"path": note},
        "completed",
        "the content the approved write produced",
    ),
    Scenario(
        "ASK with step-up: write the release plan (approving needs a reviewer's passkey)",
        "approved with a passkey, or denied",
        "native",
        "write_file",
        lambda note: {"path": STEP_UP_PATH, "content": "Release on Friday.\n"},
        ("completed", "denied"),
        "a step-up rule: only an approval signed with a passkey lets it run",
    ),
    Scenario(
        "ASK with a preview: sed -i on the file (the reviewer sees its effect)",
        "previewed, approved, the previewed effect applied",
        "native",
        "run_command",
        lambda note: {"argv": ["sed", "-i", "s/demo agent/demo agent, edited by sed/", note]},
        "completed",
        "the reviewer saw 'This command would: change 1 file' and its diff; approving "
        "applied exactly that",
    ),
    Scenario(
        "DENY: delete a file",
        "denied by standard mode",
        "native",
        "delete_file",
        lambda note: {"path": note},
        "denied",
        "destructive tools are denied in standard mode",
    ),
    Scenario(
        "REJECT: an unknown tool",
        "rejected with a suggestion",
        "anthropic",
        "readFile",
        lambda note: {"path": note},
        "rejected",
        "unknown tool, with the closest name suggested",
    ),
    Scenario(
        "REJECT: invalid arguments",
        "rejected: path must be a string",
        "openai",
        "read_file",
        lambda note: '{"path": 5}',
        "rejected",
        "arguments do not match the schema",
    ),
    Scenario(
        "DENY: a path escape",
        "denied by the workspace guard",
        "native",
        "read_file",
        lambda note: {"path": "../../etc/passwd"},
        "denied",
        "the workspace confinement guard",
    ),
    Scenario(
        "DENY: a blocked command",
        "denied by the command guard",
        "anthropic",
        "run_command",
        lambda note: {"argv": ["sudo", "ls"]},
        "denied",
        "the command blocklist guard",
    ),
)


def run(
    url: str,
    token: str,
    *,
    out: Out = sys.stdout,
    auto_approve_as: str | None = None,
    dashboard: str | None = None,
) -> bool:
    client = HarnessClient(url, token)
    try:
        return DemoAgent(
            client, out=out, auto_approve_as=auto_approve_as, dashboard=dashboard or url
        ).run()
    except HarnessError as exc:
        out.write(f"Harness refused a request: {exc}\n")
        return False
