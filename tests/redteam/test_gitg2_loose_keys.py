"""Red team of the loose path keys of unlisted client tools (`base.input_paths`): a value
nested in an object or a list of objects under a loose key (`{"target": {"value":
"/etc/x"}}`) was not read, and the call was allowed. Real hook endpoint."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dispatcher.tools.base import MAX_INPUT_VALUES
from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent

OUTSIDE: tuple[dict[str, Any], ...] = (
    {"target": {"value": "/etc/cron.d/x"}},
    {"dest": [{"name": "a", "where": "../../home/dev/.bashrc"}]},
    {"outputs": {"main": {"to": "x", "at": ["out/a.md", "file:/etc/profile.d/x.sh"]}}},
    {"copyTo": [[{"p": "~/.ssh/authorized_keys"}]]},
)
INSIDE: tuple[dict[str, Any], ...] = (
    {"target": {"value": "es2020", "dir": "out/build"}},
    {"source": [{"kind": "user", "url": "https://example.com/a/../b"}]},
)


@pytest.mark.django_db
def test_a_path_nested_under_a_loose_key_is_confined() -> None:
    fx = make_agent(mode="trusted")
    session = str(uuid.uuid4())
    for n, tool_input in enumerate(OUTSIDE):
        body = claude.pre_tool_use(session, "Publish", tool_input, f"o{n}")
        verdict, reason = claude.decision(claude.send(fx, body))
        assert verdict == "deny", (tool_input, reason)
        assert "outside the project" in reason, (tool_input, reason)
    for n, tool_input in enumerate(INSIDE):
        body = claude.pre_tool_use(session, "Publish", tool_input, f"i{n}")
        verdict, reason = claude.decision(claude.send(fx, body))
        assert verdict == "allow", (tool_input, reason)


@pytest.mark.django_db
def test_an_input_too_large_to_read_whole_is_denied() -> None:
    """Past MAX_INPUT_VALUES values the input is not read further: denied, not allowed
    with what was read so far."""
    fx = make_agent(mode="trusted")
    tool_input = {"target": [{"v": "a"}] * (MAX_INPUT_VALUES // 2 + 1)}
    body = claude.pre_tool_use(str(uuid.uuid4()), "Publish", tool_input, "big")
    verdict, reason = claude.decision(claude.send(fx, body))
    assert verdict == "deny", reason
    assert "more than" in reason and "values" in reason, reason
