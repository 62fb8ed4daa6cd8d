"""A fake Gemini API (generativelanguage) on loopback, for running the real Gemini CLI offline.

`POST /v1beta/models/{model}:streamGenerateContent?alt=sse` answers as server-sent events,
as the real API does (`data: {candidates: [...], usageMetadata: ...}` chunks);
`:generateContent` answers one JSON response and `:countTokens` a count. The requests of
the main loop (those offering tools) get the scripted steps in order (a functionCall or a
text), then a closing text; requests without tools (Gemini CLI's routing and checks) get
a short JSON text. Every request is recorded, so a test can read what the model was told,
e.g. the functionResponse Gemini CLI sent after a denial. The server, its log and its
script are fake_model.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_model import FakeModel, ModelHandler

# What Gemini CLI's utility requests (its model router, its next-speaker check) parse.
UTILITY_ANSWER = json.dumps(
    {
        "reasoning": "A short test task.",
        "model_choice": "flash",
        "complexity_reasoning": "A short test task.",
        "complexity_score": 1,
        "next_speaker": "user",
    }
)


@dataclass(frozen=True)
class Step:
    """One model turn: a function call (`tool`, `args`) or a text."""

    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def call(name: str, **args: Any) -> Step:
    return Step(tool=name, args=args)


def say(text: str) -> Step:
    return Step(text=text)


class FakeGemini(FakeModel[Step]):
    """Start with `with FakeGemini([steps]) as api:`; `api.url` is GOOGLE_GEMINI_BASE_URL."""

    utility_answer = UTILITY_ANSWER

    # --- what the model was told ---------------------------------------------------------

    def function_responses(self) -> list[dict[str, Any]]:
        """Every functionResponse Gemini CLI sent back, in order (the last request's)."""
        found: list[dict[str, Any]] = []
        for request in self.main_requests()[-1:]:
            for content in request.get("contents", []):
                for part in content.get("parts", []):
                    if isinstance(part, dict) and "functionResponse" in part:
                        found.append(part["functionResponse"])
        return found

    def tool_names_offered(self) -> set[str]:
        names: set[str] = set()
        for request in self.main_requests():
            for tool in request.get("tools", []):
                for declaration in tool.get("functionDeclarations", []) or []:
                    names.add(declaration.get("name", ""))
        return names

    # --- answering --------------------------------------------------------------------------

    def say(self, text: str) -> Step:
        return say(text)

    def error(self, status: int) -> dict[str, Any]:
        return {"error": {"code": status, "message": "not found" if status == 404 else "bad json"}}

    def answer_get(self, handler: ModelHandler, path: str) -> None:
        handler.send_json(200, {"models": []})

    def answer_post(self, handler: ModelHandler, path: str, body: dict[str, Any]) -> None:
        if path.endswith(":countTokens"):
            handler.send_json(200, {"totalTokens": max(1, len(json.dumps(body)) // 4)})
        elif path.endswith(":streamGenerateContent"):
            chunks = _chunks(self.next_step(body))
            handler.send_events(f"data: {json.dumps(chunk)}\r\n\r\n".encode() for chunk in chunks)
        elif path.endswith(":generateContent"):
            handler.send_json(200, _response(self.next_step(body)))
        else:
            handler.send_json(404, self.error(404))


def _usage() -> dict[str, int]:
    return {"promptTokenCount": 20, "candidatesTokenCount": 5, "totalTokenCount": 25}


def _response(step: Step) -> dict[str, Any]:
    part: dict[str, Any] = (
        {"functionCall": {"name": step.tool, "args": step.args}}
        if step.tool
        else {"text": step.text}
    )
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": _usage(),
        "modelVersion": "gemini-2.5-pro",
    }


def _chunks(step: Step) -> Iterator[dict[str, Any]]:
    if step.tool:
        yield _response(step)
        return
    half = len(step.text) // 2
    for piece, last in ((step.text[:half], False), (step.text[half:], True)):
        chunk = _response(say(piece))
        if not last:
            del chunk["candidates"][0]["finishReason"]
        yield chunk
