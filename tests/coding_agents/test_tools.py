"""Codex CLI's and Gemini CLI's tools as Harness tools: resolved only in their own
sessions, schemas that accept what each CLI sends, annotations, and the reading of a Codex
patch's file headers."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.checks import check_client_tools
from dispatcher.tools import codex, gemini, read_file
from dispatcher.tools.base import command_argv
from dispatcher.tools.codex import patch_paths
from dispatcher.tools.registry import get_tool, validator_for

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

# Tool inputs as Codex 0.171.0 sent them to its PreToolUse hook (measured).
CODEX_SENT = [
    ("Bash", {"command": "echo hi > out.txt"}),
    (
        "apply_patch",
        {"command": "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"},
    ),
]
# Tool inputs as Gemini CLI 0.61.0's model declarations define them (and as measured for
# run_shell_command and read_file).
GEMINI_SENT = [
    ("run_shell_command", {"command": "ls -la", "description": "List", "dir_path": "src"}),
    ("read_file", {"file_path": "/p/a.py", "start_line": 1, "end_line": 20}),
    ("read_many_files", {"include": ["src/**/*.py"], "exclude": ["**/test_*"]}),
    ("list_directory", {"dir_path": "/p", "ignore": ["*.pyc"]}),
    ("glob", {"pattern": "**/*.md", "dir_path": "/p"}),
    ("grep_search", {"pattern": "TODO", "dir_path": "/p", "include_pattern": "*.py"}),
    ("write_file", {"file_path": "/p/n.txt", "content": "x"}),
    ("replace", {"file_path": "/p/a.py", "instruction": "x", "old_string": "a", "new_string": "b"}),
    ("web_fetch", {"prompt": "Summarize https://example.com"}),
    ("google_web_search", {"query": "django"}),
    ("write_todos", {"todos": [{"description": "a", "status": "pending"}]}),
]


@pytest.mark.parametrize(
    "client, name, tool_input",
    [
        *(("codex", n, i) for n, i in CODEX_SENT),
        *(("gemini-cli", n, i) for n, i in GEMINI_SENT),
    ],
)
def test_the_schemas_accept_what_each_cli_sends(
    client: str, name: str, tool_input: dict[str, Any]
) -> None:
    tool = get_tool(name, client)
    assert tool is not None and tool.client_executed and tool.name == name
    assert list(validator_for(tool).iter_errors(tool_input)) == []
    assert list(validator_for(tool).iter_errors({**tool_input, "added_later": 1})) == []


def test_each_tool_set_resolves_only_in_its_own_sessions() -> None:
    assert (
        get_tool("apply_patch") is None
        and get_tool("apply_patch", "claude-code") is not codex.APPLY_PATCH
    )
    assert get_tool("apply_patch", "codex") is codex.APPLY_PATCH
    assert get_tool("run_shell_command", "gemini-cli") is gemini.RUN_SHELL_COMMAND
    assert get_tool("run_shell_command", "codex") is not gemini.RUN_SHELL_COMMAND
    # Gemini CLI's read_file is its own, not Harness's (which takes a relative `path`).
    assert get_tool("read_file", "gemini-cli") is gemini.READ_FILE
    assert get_tool("read_file") is read_file.TOOL
    assert get_tool("Bash", "codex") is codex.BASH and get_tool("Bash", "gemini-cli") is not None


def test_the_annotations_make_the_modes_right() -> None:
    for tool in (gemini.READ_FILE, gemini.READ_MANY_FILES, gemini.GLOB, gemini.GREP_SEARCH):
        assert tool.read_only
    for tool in (codex.BASH, codex.APPLY_PATCH, gemini.RUN_SHELL_COMMAND, gemini.WRITE_FILE):
        assert not tool.read_only
    assert gemini.WEB_FETCH.open_world and not gemini.WEB_FETCH.read_only
    mcp = get_tool("mcp__github__create_issue", "codex")
    assert mcp is not None and mcp.open_world and not mcp.read_only
    assert get_tool("mcp_github_create_issue", "gemini-cli").open_world  # type: ignore[union-attr]
    assert get_tool("not a name", "codex") is None and get_tool("x/y", "gemini-cli") is None


def test_shell_tools_are_read_as_bash_strings() -> None:
    assert command_argv(codex.BASH, {"command": "ls && make"}) == ["bash", "-c", "ls && make"]
    assert command_argv(gemini.RUN_SHELL_COMMAND, {"command": "ls"}) == ["bash", "-c", "ls"]


def test_the_tool_sets_pass_the_start_up_check() -> None:
    assert check_client_tools() == []


# --- A Codex patch's file headers ----------------------------------------------------------------


def test_every_file_header_of_a_patch_is_read_in_order() -> None:
    patch = (
        "*** Begin Patch\n"
        "*** Update File: src/a.py\n"
        "*** Move to: src/b.py\n"
        "@@ def f():\n"
        "-    return 1\n"
        "+    return 2\n"
        "*** End of File\n"
        "*** Add File: docs/x.md\n"
        "+# X\n"
        "+*** Add File: /etc/not-a-header (content of docs/x.md)\n"
        "*** Delete File: old.txt\n"
        "*** End Patch"
    )
    assert patch_paths(patch) == ("src/a.py", "src/b.py", "docs/x.md", "old.txt")


@pytest.mark.parametrize(
    "patch, error",
    [
        ("", "must start with"),
        ("*** Begin Patch\n*** Add File: a\n+a", "must end with"),
        ("*** Begin Patch\n***Add File: /etc/x\n+a\n*** End Patch", "not a patch header"),
        ("*** Begin Patch\n*** Add File:\n*** End Patch", "names no file"),
        ("*** Begin Patch\n*** End Patch", "names no file"),
        (
            "*** Begin Patch\n" + "*** Delete File: a\n" * 501 + "*** End Patch",
            "more than 500 files",
        ),
    ],
)
def test_a_patch_that_cannot_be_read_completely_is_an_error(patch: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        patch_paths(patch)


def test_headers_are_trimmed_as_codex_trims_them_and_padded_paths_are_refused() -> None:
    patch = "  *** Begin Patch\n\t*** Update File: ../x.py  \n@@\n-a\n+b\n*** End Patch  \n"
    assert patch_paths(patch) == ("../x.py",)
    padded = "*** Begin Patch\n*** Update File:   ../x.py\n@@\n-a\n+b\n*** End Patch"
    with pytest.raises(ValueError, match="begins or ends with whitespace"):
        patch_paths(padded)  # Codex would use '  ../x.py', a directory named '  ..'
