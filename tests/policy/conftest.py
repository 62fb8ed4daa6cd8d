"""Helpers for permissions tests: admins, sessions and calls through the real agent API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture, make_user, unique


@pytest.fixture
def admin(db: None) -> User:
    return make_user(unique("admin"), groups=("admin",))


def start_session(fx: AgentFixture, title: str = "perm") -> str:
    response = Client().post(
        "/api/v1/sessions",
        data=json.dumps({"title": title}),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def submit(
    fx: AgentFixture, session_id: str, call_id: str, name: str, arguments: dict[str, Any]
) -> ToolCall:
    """POST one native call; return the stored call."""
    body = {"calls": [{"id": call_id, "name": name, "arguments": arguments}]}
    response = Client().post(
        f"/api/v1/sessions/{session_id}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code in (200, 202), response.content
    return ToolCall.objects.get(pk=response.json()["calls"][0]["id"])
