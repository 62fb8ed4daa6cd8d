"""No host-only field of a tool can reach a model (docs/operations.md, "Tools")."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from django.test import Client

from dispatcher.tools.base import Tool, model_facing_schema
from dispatcher.tools.registry import all_tools
from tests.support.factories import AgentFixture

MODEL_FACING = {"name", "description", "parameters", "defer_loading"}
HOST_ONLY = {f.name for f in dataclasses.fields(Tool)} - MODEL_FACING


def leak_probe() -> Tool:
    """A tool whose host-only fields all carry a marker string."""
    return Tool(
        name="probe",
        description="probe",
        parameters={"type": "object"},
        output_schema={"LEAK": "output_schema"},
        timeout=123.456,
        open_world=True,
        path_arguments=("LEAK-path",),
        command_argument="LEAK-command",
    )


def test_host_only_fields_are_known() -> None:
    assert {
        "execute",
        "timeout",
        "is_concurrency_safe",
        "present_call",
        "output_schema",
        "read_only",
    } <= HOST_ONLY


@pytest.mark.parametrize("fmt", ["native", "openai", "anthropic"])
def test_model_facing_schema_never_carries_host_fields(fmt: str) -> None:
    text = json.dumps(model_facing_schema(leak_probe(), fmt))
    assert "LEAK" not in text and "123.456" not in text
    for field in HOST_ONLY:
        assert f'"{field}"' not in text


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["native", "openai", "anthropic"])
def test_tools_endpoint_shows_only_model_facing_fields(
    client: Client, agent: AgentFixture, fmt: str
) -> None:
    response = client.get("/api/v1/tools", {"format": fmt}, headers=agent.headers)
    assert response.status_code == 200
    tools: list[dict[str, Any]] = response.json()
    assert {t.name for t in all_tools()} == {
        (t["function"]["name"] if fmt == "openai" else t["name"]) for t in tools
    }
    for tool in tools:
        keys = set(tool["function"]) if fmt == "openai" else set(tool)
        allowed = {"name", "description", "parameters", "input_schema", "defer_loading"}
        assert keys <= allowed, keys - allowed
    text = json.dumps(tools)
    for field in HOST_ONLY - {"read_only"}:  # "read_only" may appear in descriptions
        assert f'"{field}"' not in text


@pytest.mark.django_db
def test_unknown_format_is_a_clear_error(client: Client, agent: AgentFixture) -> None:
    response = client.get("/api/v1/tools", {"format": "xml"}, headers=agent.headers)
    assert (
        response.status_code == 400
        and "native, openai or anthropic" in response.json()["error"]["message"]
    )
