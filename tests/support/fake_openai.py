"""A fake OpenAI Responses API on loopback, for running the real Codex CLI offline.

`POST /v1/responses` with `"stream": true` answers as server-sent events, as the real API
does (response.created, response.output_item.added, response.output_item.done,
response.completed); `GET /v1/models` lists one model. The requests of the main loop get
the scripted steps in order (a function call, a custom tool call such as a freeform
`apply_patch`, or a text), then a closing text. Every request is recorded, so a test can
read what the model was told, e.g. the function_call_output Codex sent after a denial.
The server, its log and its script are fake_model.py's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_model import FakeModel, ModelHandler

MODEL = "gpt-5-codex"


@dataclass(frozen=True)
class Step:
    """One assistant turn: a function call (`tool`, `arguments`), a custom tool call
    (`tool`, `custom_input`), or a text."""

    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    custom_input: str | None = None
    text: str = ""


def call(name: str, **arguments: Any) -> Step:
    return Step(tool=name, arguments=arguments)


def custom_call(name: str, text: str) -> Step:
    return Step(tool=name, custom_input=text)


def say(text: str) -> Step:
    return Step(text=text)


class FakeOpenAI(FakeModel[Step]):
    """Start with `with FakeOpenAI([steps]) as api:`; `api.url` is the provider's base_url."""

    base_path = "/v1"

    # --- what the model was told ---------------------------------------------------------

    def tool_outputs(self) -> dict[str, str]:
        """call_id -> the output Codex sent back for it (function or custom tool call)."""
        outputs: dict[str, str] = {}
        for request in self.requests:
            for item in request.get("input", []):
                if isinstance(item, dict) and item.get("type") in (
                    "function_call_output",
                    "custom_tool_call_output",
                ):
                    output = item.get("output")
                    outputs[str(item.get("call_id"))] = (
                        output if isinstance(output, str) else json.dumps(output)
                    )
        return outputs

    def tool_names_offered(self) -> set[str]:
        names: set[str] = set()
        for request in self.requests:
            for tool in request.get("tools", []):
                if isinstance(tool, dict):
                    names.add(str(tool.get("name") or tool.get("type")))
        return names

    # --- answering --------------------------------------------------------------------------

    def say(self, text: str) -> Step:
        return say(text)

    def error(self, status: int) -> dict[str, Any]:
        if status == 404:
            return {"error": {"message": "not found", "type": "not_found"}}
        return {"error": {"message": "bad json", "type": "invalid_request"}}

    def answer_get(self, handler: ModelHandler, path: str) -> None:
        if path.endswith("/models"):
            handler.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            handler.send_json(404, self.error(404))

    def answer_post(self, handler: ModelHandler, path: str, body: dict[str, Any]) -> None:
        if not path.endswith("/responses"):
            handler.send_json(404, self.error(404))
            return
        events = _events(self.next_step(body), body)
        handler.send_events(
            f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode() for data in events
        )


def _item(step: Step) -> dict[str, Any]:
    item_id = uuid.uuid4().hex[:24]
    if step.tool and step.custom_input is not None:
        return {
            "type": "custom_tool_call",
            "id": "ctc_" + item_id,
            "call_id": "call_" + item_id,
            "name": step.tool,
            "input": step.custom_input,
            "status": "completed",
        }
    if step.tool:
        return {
            "type": "function_call",
            "id": "fc_" + item_id,
            "call_id": "call_" + item_id,
            "name": step.tool,
            "arguments": json.dumps(step.arguments),
            "status": "completed",
        }
    return {
        "type": "message",
        "id": "msg_" + item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": step.text, "annotations": []}],
    }


def _events(step: Step, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    response_id = "resp_" + uuid.uuid4().hex[:24]
    response = {
        "id": response_id,
        "object": "response",
        "model": body.get("model") or MODEL,
        "status": "in_progress",
        "output": [],
    }
    item = _item(step)
    yield {"type": "response.created", "response": response}
    yield {"type": "response.output_item.added", "output_index": 0, "item": item}
    if item["type"] == "message":
        text = step.text
        yield {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        }
    yield {"type": "response.output_item.done", "output_index": 0, "item": item}
    usage = {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 25,
    }
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    yield {"type": "response.completed", "response": done}
