"""A small, dependency-free client for the Harness agent API (docs/api.md).

Only the standard library (urllib, json): copy this file next to any agent loop.

With the OpenAI SDK::

    from dispatcher.gateways.client import HarnessClient

    harness = HarnessClient("http://127.0.0.1:8000", token)
    session = harness.start_session(title="fix the tests")
    tools = harness.tools("openai")
    messages = [{"role": "user", "content": "List the workspace."}]
    while True:
        reply = openai.chat.completions.create(model=..., messages=messages, tools=tools)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        result = harness.wait_for(message)  # waits for reviewers if a call asks
        messages.extend(result.results)  # [{"role": "tool", "tool_call_id", "content"}, ...]

With the Anthropic SDK::

    tools = harness.tools("anthropic")
    while True:
        reply = anthropic.messages.create(model=..., max_tokens=..., messages=messages,
                                          tools=tools)
        message = {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
        messages.append(message)
        if reply.stop_reason != "tool_use":
            break
        result = harness.wait_for(message)
        messages.extend(result.results)  # [{"role": "user", "content": [tool_result, ...]}]

Or natively: ``harness.submit({"calls": [{"id": "c1", "name": "read_file",
"arguments": {"path": "README.md"}}]})``; its ``results`` are ``[{"id", "content",
"is_error"}]``.

``submit`` waits at most ``wait`` seconds (the server caps one request at 60) and returns
whatever is terminal by then; ``wait_for`` resubmits the same message (which creates
nothing new) until every call is terminal. Every HTTP error raises ``HarnessError``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

MAX_WAIT = 60.0
TERMINAL = frozenset(
    {
        "rejected",
        "denied",
        "cancelled",
        "expired",
        "completed",
        "timed_out",
        "outcome_unknown",
        "reported",
        "unreported",
        "edited",
    }
)


class HarnessError(Exception):
    """An HTTP error from Harness, with the code and message of its JSON error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass
class Result:
    """One submission's state: `calls` as Harness sees them, `results` in the request's dialect.

    `results` holds only the terminal calls: an OpenAI list of tool messages, an Anthropic
    list of one user message, or a native list of {"id", "content", "is_error"}. Append them
    to the model's messages when `done`.
    """

    calls: list[dict[str, Any]]
    results: list[dict[str, Any]]
    done: bool

    @property
    def pending(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["status"] not in TERMINAL]


class HarnessClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 30) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.session_id: str | None = None

    # --- HTTP -----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        wait: float = 0,
    ) -> tuple[int, Any]:
        url = self.base_url + "/api/v1" + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (http only)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout + wait) as response:  # noqa: S310
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)["error"]
                code, message = str(err.get("code", "http_error")), str(err.get("message", ""))
            except (ValueError, KeyError, TypeError):
                code, message = "http_error", raw.decode(errors="replace")[:500] or exc.reason
            raise HarnessError(exc.code, code, message) from None

    # --- API ------------------------------------------------------------------------------

    def start_session(self, title: str = "", mode: str | None = None) -> dict[str, Any]:
        """Start a session that later `submit` calls use; returns {"id", "mode", "workspace"}."""
        body: dict[str, Any] = {"title": title}
        if mode:
            body["mode"] = mode
        _, session = self._request("POST", "/sessions", body)
        self.session_id = session["id"]
        return session  # type: ignore[no-any-return]

    def tools(self, format: str = "native") -> list[dict[str, Any]]:
        """The tool list, ready for the SDK's `tools=` ("native", "openai" or "anthropic")."""
        _, tools = self._request("GET", "/tools", params={"format": format})
        return tools  # type: ignore[no-any-return]

    def submit(
        self, message: dict[str, Any], wait: float = 30, *, session_id: str | None = None
    ) -> Result:
        """Submit one assistant message's tool calls; wait up to `wait` s (max 60) for results."""
        session = session_id or self.session_id
        if session is None:
            raise ValueError("No session: call start_session() first or pass session_id.")
        wait = max(0.0, min(float(wait), MAX_WAIT))
        status, payload = self._request(
            "POST", f"/sessions/{session}/calls", message, params={"wait": wait}, wait=wait
        )
        results = payload.get("results") or []
        if isinstance(results, dict):  # Anthropic: one user message, when it has any block
            results = [results] if results.get("content") else []
        return Result(calls=payload["calls"], results=results, done=status == 200)

    def wait_for(
        self,
        message: dict[str, Any],
        timeout: float | None = None,
        *,
        session_id: str | None = None,
    ) -> Result:
        """Submit `message`, then resubmit it (creating nothing) until every call is terminal.

        Each request long-polls up to 60 s on the server; no busy loop. Returns the last
        state when `timeout` seconds pass first (check `.done`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = MAX_WAIT if deadline is None else deadline - time.monotonic()
            result = self.submit(
                message, wait=max(0.0, min(MAX_WAIT, remaining)), session_id=session_id
            )
            if result.done or (deadline is not None and time.monotonic() >= deadline):
                return result

    def get_call(self, call_id: str, wait: float = 0) -> dict[str, Any]:
        """One call's state; with `wait`, long-polls until it is terminal (max 60 s)."""
        wait = max(0.0, min(float(wait), MAX_WAIT))
        _, call = self._request("GET", f"/calls/{call_id}", params={"wait": wait}, wait=wait)
        return call  # type: ignore[no-any-return]

    def cancel(self, call_id: str) -> dict[str, Any]:
        """Cancel a call pending approval (409 HarnessError when it is no longer pending)."""
        _, call = self._request("POST", f"/calls/{call_id}/cancel", {})
        return call  # type: ignore[no-any-return]

    def session(self, session_id: str | None = None) -> dict[str, Any]:
        """A session with its calls."""
        _, data = self._request("GET", f"/sessions/{session_id or self.session_id}")
        return data  # type: ignore[no-any-return]
