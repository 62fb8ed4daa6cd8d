"""An unlisted client tool's input was read for paths only under keys ending in path(s),
dir(s), directory, folder(s) or cwd (`base.is_path_key`): a tool of a later client
version writing through `target`, `dest`, `output`, `to` ... (`{"target":
"/home/dev/.bashrc"}`) was allowed in trusted mode, through the hook, with its path
unread. Such keys (`base.is_loose_path_key`: the whole key or its last word) now have
their string values confined when they look like a path (`base.looks_like_path`); a
value that looks like none (`"es2020"`, `"a@b.c"`, a URL, a sentence) is not read."""

from __future__ import annotations

import uuid

import pytest

from dispatcher.tools.base import input_paths, is_loose_path_key, looks_like_path
from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent

OUTSIDE = ("/home/dev/.bashrc", "~/.ssh/authorized_keys", "../../etc/cron.d/x", " /etc/hosts")
KEYS = ("target", "src", "source", "dest", "destination", "file", "filename", "output")
KEYS += ("out", "input", "from", "to", "copy_target", "saveTo", "output-file", "outfile")


@pytest.mark.django_db
def test_the_hooks_unlisted_tool_writing_through_a_loose_key_outside_is_denied() -> None:
    fx = make_agent(mode="trusted")
    session = str(uuid.uuid4())
    n = 0
    for key in KEYS:
        for value in OUTSIDE:
            n += 1
            body = claude.pre_tool_use(session, "Publish", {key: value}, f"t{n}")
            verdict, reason = claude.decision(claude.send(fx, body))
            assert verdict == "deny", (key, value, reason)
            assert "outside the project" in reason or "'~'" in reason or "white space" in reason
    # nested, in a list, a file URL
    for n, tool_input in enumerate(
        (
            {"steps": [{"action": "copy", "dest": "/etc/profile.d/x.sh"}]},
            {"to": ["out/a.md", "/var/../etc/x"]},
            {"target": "file:///home/dev/.profile"},
        )
    ):
        body = claude.pre_tool_use(session, "Publish", tool_input, f"n{n}")
        assert claude.decision(claude.send(fx, body))[0] == "deny", tool_input


@pytest.mark.django_db
def test_loose_keys_that_name_no_path_or_one_inside_are_allowed() -> None:
    fx = make_agent(mode="trusted")
    session = str(uuid.uuid4())
    for n, tool_input in enumerate(
        (
            {"target": "es2020", "source": "user", "input": "yes", "to": "dev@example.com"},
            {"from": "2024-01-01", "output": "json", "out": 3, "file": None},
            {"source": "https://example.com/a/b", "input": "compare a/b and c/d"},
            {"input": "first line\n/etc/passwd\n", "target": {"kind": "page"}},
            {"resource": "/subscriptions/x", "profile": "/default", "photo": "/p.png"},
            {"target": f"{claude.PROJECT}/out/report.md", "dest": "out/a.md", "src": "./a"},
        )
    ):
        body = claude.pre_tool_use(session, "Publish", tool_input, f"a{n}")
        verdict, reason = claude.decision(claude.send(fx, body))
        assert verdict == "allow", (tool_input, reason)


def test_which_keys_and_values_are_read() -> None:
    for key in (*KEYS, "dataSource", "move_from", "outputFile", "destFile", "files"):
        assert is_loose_path_key(key), key
    for key in ("resource", "profile", "photo", "layout", "timeout", "format", "auto"):
        assert not is_loose_path_key(key), key
    assert looks_like_path("file://localhost/etc/x") == "/etc/x"
    for value in ("es2020", "a@b.c", "https://x/y", "a sentence / with a slash", "x\ny/z"):
        assert looks_like_path(value) is None, value
    arguments = {"dest": "/a", "n": [{"to": ["b/c", "/d", 4]}], "input": "no"}
    assert input_paths(arguments) == ("/a", "b/c", "/d")
