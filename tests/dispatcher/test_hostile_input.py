"""A thousand hostile requests: every answer is a clear 4xx or a normal result, never a 500."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from django.test import Client

from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

SCALARS: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    1e308,
    "",
    "x",
    "\u202e",
    "<script>",
    "../../etc/passwd",
    "a" * 5000,
    "\ud800",
    "\x00",
    "NaN",
    [],
    {},
]
NAMES = ["read_file", "write_file", "run_command", "nope", "", "READ_FILE", "x" * 300, 5, None]


def scalar(rng: random.Random) -> Any:
    return rng.choice(SCALARS)


def value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return scalar(rng)
    if roll < 0.75:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["path", "argv", "content", "x", ""]): value(rng, depth + 1)
        for _ in range(rng.randint(0, 3))
    }


def call(rng: random.Random, i: int) -> Any:
    shape = rng.randint(0, 3)
    ident = rng.choice([f"c{i}", "", None, 7, "i" * 250]) if rng.random() < 0.15 else f"c{i}"
    if shape == 0:
        return {"id": ident, "name": rng.choice(NAMES), "arguments": value(rng)}
    if shape == 1:
        arguments = rng.choice(
            [json.dumps(value(rng)), "{", "NaN", '{"a": NaN}', "[" * 50, value(rng)]
        )
        return {
            "id": ident,
            "type": "function",
            "function": {"name": rng.choice(NAMES), "arguments": arguments},
        }
    if shape == 2:
        return {"type": "tool_use", "id": ident, "name": rng.choice(NAMES), "input": value(rng)}
    return value(rng)


def body(rng: random.Random, i: int) -> bytes:
    kind = rng.randint(0, 9)
    calls = [call(rng, i * 10 + k) for k in range(rng.randint(0, 3))]
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
    if kind == 1:
        return b"[" * rng.choice([10, 2000, 100000])
    if kind == 2:
        return json.dumps({"calls": calls})[: rng.randint(0, 40)].encode()
    if kind == 3:
        return b'{"calls": [{"id": "s", "name": "read_file", "arguments": {"path": "\\ud800"}}]}'
    if kind == 4:
        return b'{"calls": [{"id": "n", "name": "read_file", "arguments": {"path": "a\\u0000b"}}]}'
    if kind == 5:
        return b'{"calls": [{"id": "f", "name": "read_file", "arguments": {"limit": NaN}}]}'
    if kind == 6:
        return json.dumps({"role": "assistant", "tool_calls": calls}, default=str).encode(
            "utf-8", "surrogatepass"
        )
    if kind == 7:
        return json.dumps({"role": "assistant", "content": calls}, default=str).encode(
            "utf-8", "surrogatepass"
        )
    if kind == 8:
        return json.dumps(value(rng), default=str).encode("utf-8", "surrogatepass")
    return json.dumps({"calls": calls}, default=str).encode("utf-8", "surrogatepass")


@pytest.mark.heavy
def test_a_thousand_hostile_requests_get_no_500(client: Client, agent: AgentFixture) -> None:
    rng = random.Random(20261130)
    session = client.post(
        "/api/v1/sessions", "{}", content_type="application/json", headers=agent.headers
    ).json()
    urls = [
        f"/api/v1/sessions/{session['id']}/calls",
        f"/api/v1/sessions/{session['id']}/calls?wait=-5",
        f"/api/v1/sessions/{session['id']}/calls?wait=abc",
        "/api/v1/sessions/not-a-uuid/calls",
        "/api/v1/sessions",
    ]
    statuses: dict[int, int] = {}
    for i in range(1000):
        url = urls[0] if i % 4 else rng.choice(urls)
        headers = (
            agent.headers
            if i % 50
            else {"Authorization": rng.choice(["Bearer ", "Bearer \x00", "x"])}
        )
        response = client.post(url, body(rng, i), content_type="application/json", headers=headers)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (i, response.status_code, response.content[:300])
        assert response["Content-Type"].startswith("application/json")
        assert b"Traceback" not in response.content
    assert statuses.get(400) and statuses.get(422) and (statuses.get(200) or statuses.get(202))
