"""A fake Anthropic Messages API on loopback, for running the real Claude Code CLI offline.

It answers the way the real API does: `POST /v1/messages` with `"stream": true` as
server-sent events (message_start, content_block_start, content_block_delta with
text_delta or input_json_delta, content_block_stop, message_delta, message_stop), without
`stream` as one JSON message; `POST /v1/messages/count_tokens` with a token count. The
main loop's requests (those offering tools) get the scripted steps in order (a tool call
or a text), then a closing text; requests without tools (titles, summaries) get a short
text. Every request is recorded, so a test can read what the model was told, e.g. the
tool_result Claude Code sent after a denial. The server, its log and its script are
fake_model.py's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_model import FakeModel, ModelHandler

MODEL = "claude-sonnet-4-5-20250929"


@dataclass(frozen=True)
class Step:
    """One assistant turn: a tool call (`tool` and `input`) or a text."""

    tool: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def tool_use(name: str, **arguments: Any) -> Step:
    return Step(tool=name, input=arguments)


def say(text: str) -> Step:
    return Step(text=text)


class FakeAnthropic(FakeModel[Step]):
    """Start with `with FakeAnthropic([steps]) as api:`; `api.url` is ANTHROPIC_BASE_URL."""

    # --- what the model was told ---------------------------------------------------------

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool_result block Claude Code sent back, in order (last request wins)."""
        results: dict[str, dict[str, Any]] = {}
        for request in self.main_requests():
            for message in request.get("messages", []):
                content = message.get("content")
                if message.get("role") != "user" or not isinstance(content, list):
                    continue
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        results[block.get("tool_use_id", "")] = block
        return list(results.values())

    def tool_names_offered(self) -> set[str]:
        return {tool.get("name", "") for r in self.main_requests() for tool in r["tools"]}

    # --- answering --------------------------------------------------------------------------

    def say(self, text: str) -> Step:
        return say(text)

    def error(self, status: int) -> dict[str, Any]:
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return {"type": "error", "error": {"type": kind}}

    def answer_get(self, handler: ModelHandler, path: str) -> None:
        handler.send_json(200, {"data": [], "has_more": False}, _request_id())

    def answer_post(self, handler: ModelHandler, path: str, body: dict[str, Any]) -> None:
        if path.endswith("/count_tokens"):
            count = {"input_tokens": max(1, len(json.dumps(body)) // 4)}
            handler.send_json(200, count, _request_id())
        elif not path.endswith("/messages"):
            handler.send_json(404, self.error(404), _request_id())
        elif body.get("stream"):
            step = self.next_step(body)
            chunks = (
                f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
                for event, data in _events(step, body)
            )
            handler.send_events(chunks, _request_id())
        else:
            handler.send_json(200, _message(self.next_step(body), body), _request_id())


def _request_id() -> dict[str, str]:
    return {"request-id": "req_" + uuid.uuid4().hex[:12]}


def _usage(output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": 20,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _block(step: Step) -> dict[str, Any]:
    if step.tool:
        return {
            "type": "tool_use",
            "id": "toolu_" + uuid.uuid4().hex[:24],
            "name": step.tool,
            "input": step.input,
        }
    return {"type": "text", "text": step.text}


def _message(step: Step, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or MODEL,
        "content": [_block(step)],
        "stop_reason": "tool_use" if step.tool else "end_turn",
        "stop_sequence": None,
        "usage": _usage(5),
    }


def _events(step: Step, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    message = _message(step, body)
    block = message["content"][0]
    yield (
        "message_start",
        {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
    )
    if block["type"] == "tool_use":
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
        )
        text = json.dumps(block["input"])
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    else:
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        delta = {"type": "text_delta", "text": block["text"]}
        yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
    )
    yield "message_stop", {"type": "message_stop"}
