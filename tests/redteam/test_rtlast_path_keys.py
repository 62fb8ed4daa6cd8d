"""rtlast: an unlisted client tool's path-like keys (`base.is_path_key`) missed a key
naming a directory with a word before it: Claude Code 2.1's `Artifact` saves an asset
into the directory its `out_dir` names (action `read_asset`), and `out_dir` was neither a
key ending in path(s) nor one of the directory names, so in trusted mode, through the
hook, an asset saved into ~/.config/autostart was allowed."""

from __future__ import annotations

import uuid

import pytest

from dispatcher.tools.base import input_paths
from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent

ASSET = {"action": "read_asset", "url": "https://claude.ai/artifact/x", "asset_id": "a" * 32}


@pytest.mark.django_db
def test_the_hooks_unlisted_tool_saving_into_a_directory_outside_is_denied() -> None:
    fx = make_agent(mode="trusted")
    session = str(uuid.uuid4())
    for n, out_dir in enumerate(("/home/dev/.config/autostart", "~/.ssh", "../..")):
        body = claude.pre_tool_use(session, "Artifact", {**ASSET, "out_dir": out_dir}, f"t{n}")
        verdict, reason = claude.decision(claude.send(fx, body))
        assert verdict == "deny", (out_dir, reason)
    inside = {**ASSET, "out_dir": f"{claude.PROJECT}/assets"}
    body = claude.pre_tool_use(session, "Artifact", inside, "t9")
    assert claude.decision(claude.send(fx, body))[0] == "allow"


def test_directory_keys_with_a_word_before_them_are_read_as_paths() -> None:
    arguments = {
        "out_dir": "/a",
        "outputDirectory": "/b",
        "target-folder": "/c",
        "cache_dirs": ["/d"],
        "sortDirection": "asc",
    }
    assert sorted(input_paths(arguments)) == ["/a", "/b", "/c", "/d"]
