"""Review of the loose path keys: the whole keys (`outfile`, `infile`, `srcfile` ...)
with a number after them (`outfile2`, `infile_1`) were not confined, though a number
after a word key (`src1`, `dest_2`) was (docs/claude-code.md: "a trailing number aside");
nor were the path-like keys with one (`file_path_2`, `outDir1`)."""

from __future__ import annotations

import uuid

import pytest

from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent


@pytest.mark.django_db
def test_a_whole_loose_key_with_a_number_after_it_is_confined() -> None:
    fx = make_agent(mode="trusted")
    session = str(uuid.uuid4())
    for n, key in enumerate(
        ("outfile2", "infile_1", "srcFile3", "savefile-2", "file_path_2", "outDir1")
    ):
        body = claude.pre_tool_use(session, "Publish", {key: "/etc/cron.d/x"}, f"o{n}")
        verdict, reason = claude.decision(claude.send(fx, body))
        assert verdict == "deny", (key, reason)
        assert "outside the project" in reason, (key, reason)
    body = claude.pre_tool_use(session, "Publish", {"outfile2": "out/a.md"}, "i0")
    assert claude.decision(claude.send(fx, body))[0] == "allow"
