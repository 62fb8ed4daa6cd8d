"""A client's path with white space around it is confined as the client reads it. Claude
Code trims a path before it reads it (its `expandPath`: `path.trim()`, then `~/` is the
home directory and an absolute path is itself), while the lexical confinement of a
decide-only call read " /etc/hosts" as a relative path, `<project>/ /etc/hosts`, inside
the project: through the permission prompt, in trusted mode, an `Edit` of /etc/hosts or a
`Grep` of ~/.aws was allowed. (Claude Code shows hooks and the prompt its Edit's path
expanded, unless the path is longer than 4,096 characters; Grep's and Glob's `path` it
shows as the model wrote it.) Such a path is now refused, as `~` and control characters
are, wherever a client's paths are confined (the hooks' too).

Live: daphne and the official MCP client, as Claude Code calls the prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.models import Status, ToolCall
from dispatcher.tools._paths import lexical_path_violation, lexical_relative
from tests.redteam.test_prompt_paths import _edit, _prompt
from tests.support.factories import make_agent
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


def test_a_path_the_client_trims_out_of_the_workspace_is_denied(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    fx = make_agent(mode="trusted", workspace=str(project))

    # What Claude Code reads as /etc/hosts (trimmed, then the slashes folded).
    hosts = " " + "/" * 4100 + "etc/hosts"
    answer = _prompt(live_stack, fx, "Edit", _edit(hosts))
    assert answer["behavior"] == "deny", answer
    assert "white space" in answer["message"]
    call = ToolCall.objects.filter(session__agent=fx.agent).latest("created_at")
    assert call.status == Status.DENIED and call.decided_by == "guard:workspace_confinement"

    for path in (" ~/.aws", "\u00a0/etc", "/etc "):
        answer = _prompt(live_stack, fx, "Grep", {"pattern": "key", "path": path})
        assert answer["behavior"] == "deny", (path, answer)

    # A plain path inside the project is allowed as before.
    inside = {"pattern": "key", "path": str(project / "src")}
    assert _prompt(live_stack, fx, "Grep", inside)["behavior"] == "allow"


@pytest.mark.parametrize("value", [" /etc/hosts", "\u00a0/etc", " ~/.aws", "x ", "\u3000x"])
def test_white_space_around_a_client_path_is_refused(value: str) -> None:
    assert lexical_relative(value, "/home/dev/project") is None
    reason = lexical_path_violation(value, "/home/dev/project")
    assert reason is not None and "white space" in reason
