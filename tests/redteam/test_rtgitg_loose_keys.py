"""Red team of the loose path keys of unlisted client tools (`base.is_loose_path_key`,
`base.looks_like_path`): a value read as a URL that still leaves the project through a
`..` part (`a://../../../../etc/cron.d/x`, which a client's lexical path join folds to
/etc/cron.d/x), a `file:` URL of one slash (`file:/etc/passwd`, as `new URL` and
`fileURLToPath` read it), the common `dst` key, and a key's last word with a number
(`src1`) were not confined."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent

OUTSIDE: tuple[dict[str, Any], ...] = (
    {"dest": "a://../../../../etc/cron.d/x"},
    {"output": "x-y://../../../../home/dev/.bashrc"},
    {"file": "file:/etc/passwd"},
    {"target": "FILE:/home/dev/.profile"},
    {"dst": "/etc/profile.d/x.sh"},
    {"copyDst": "../../etc/x"},
    {"src1": "/home/dev/.ssh/id_ed25519"},
    {"dest_2": "/etc/x"},
    {"to": ["out/a.md", "file:/etc/x"]},
)
INSIDE: tuple[dict[str, Any], ...] = (
    {"source": "https://example.com/a/../b"},
    {"file": f"file:{claude.PROJECT}/out/a.md"},
    {"dst": "out/report.md", "src1": "./a"},
    {"target": "es2020", "dst": "json", "to": "dev@example.com"},
)


@pytest.mark.django_db
def test_a_loose_key_leaving_the_project_through_a_url_form_or_another_key_is_denied() -> None:
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
