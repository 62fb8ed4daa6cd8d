"""Claude Code's tools as Harness tools: resolved only in Claude Code sessions, schemas that
accept what Claude Code sends, annotations, lexical paths, presentation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from dispatcher.checks import check_client_tools
from dispatcher.tools import claude_code, read_file
from dispatcher.tools._paths import lexical_path_violation, lexical_relative
from dispatcher.tools.base import command_argv
from dispatcher.tools.registry import get_tool, rule_tool, validator_for

PROJECT = Path("/home/dev/project")

# Tool inputs exactly as Claude Code 2.1.328 sent them to its PreToolUse hook (measured).
SENT = [
    ("Bash", {"command": "echo hi > out.txt && cat out.txt", "description": "x"}),
    ("Read", {"file_path": "/p/out.txt"}),
    (
        "Edit",
        {"file_path": "/p/out.txt", "old_string": "hi", "new_string": "ho", "replace_all": False},
    ),
    ("Write", {"file_path": "/p/new.txt", "content": "x"}),
    ("Agent", {"description": "look", "prompt": "find it", "subagent_type": "general-purpose"}),
    ("TodoWrite", {"todos": [{"content": "a", "status": "pending", "activeForm": "Doing a"}]}),
    ("Glob", {"pattern": "**/*.py", "path": "/p"}),
    ("Grep", {"pattern": "def ", "path": "/p", "output_mode": "content", "-n": True}),
    ("WebFetch", {"url": "https://example.com", "prompt": "summarise"}),
    ("WebSearch", {"query": "django 6.1", "allowed_domains": ["djangoproject.com"]}),
    ("NotebookEdit", {"notebook_path": "/p/n.ipynb", "new_source": "x", "cell_id": "c1"}),
    ("MultiEdit", {"file_path": "/p/a.py", "edits": [{"old_string": "a", "new_string": "b"}]}),
    ("LS", {"path": "/p"}),
]


@pytest.mark.parametrize("name, tool_input", SENT)
def test_the_schemas_accept_what_claude_code_sends(name: str, tool_input: dict[str, Any]) -> None:
    tool = get_tool(name, "claude-code")
    assert tool is not None and tool.client_executed
    assert list(validator_for(tool).iter_errors(tool_input)) == []
    # Fields a later Claude Code adds are accepted too.
    assert list(validator_for(tool).iter_errors({**tool_input, "new_in_2_2": 1})) == []


def test_the_schemas_still_type_what_policy_reads() -> None:
    bash = get_tool("Bash", "claude-code")
    assert bash is not None and list(validator_for(bash).iter_errors({"command": ["ls"]}))
    read = get_tool("Read", "claude-code")
    assert read is not None and list(validator_for(read).iter_errors({"path": "x"}))


def test_claude_code_tools_resolve_only_in_claude_code_sessions() -> None:
    assert get_tool("Bash") is None and get_tool("Bash", "claude-code") is claude_code.BASH
    # A Harness tool's name there is an unknown Claude Code tool: generic, client-run, asks.
    generic = get_tool("read_file", "claude-code")
    assert generic is not None and generic is not read_file.TOOL
    assert generic.client_executed and not generic.read_only
    assert get_tool("Bash", "some-other-client") is None  # no tool set: nothing resolves


def test_annotations_make_the_modes_right() -> None:
    def tool(name: str) -> Any:
        return get_tool(name, "claude-code")

    for name in ("Read", "Glob", "Grep", "LS", "TodoWrite", "Agent", "Task"):
        assert tool(name).read_only, name
    for name in ("Bash", "Write", "Edit", "MultiEdit", "NotebookEdit", "WebFetch", "WebSearch"):
        assert not tool(name).read_only, name
    assert tool("WebFetch").open_world and tool("WebSearch").open_world
    assert tool("mcp__github__create_issue").open_world
    assert not tool("Skill").read_only  # an unknown name asks in standard mode
    assert tool("not a name") is None and tool("x" * 65) is None


@pytest.mark.django_db  # names with "__" may be upstream MCP tools: looked up in the sources
def test_rules_may_name_claude_code_tools_and_mcp_tools_but_not_typos() -> None:
    assert rule_tool("Bash") is claude_code.BASH
    assert rule_tool("mcp__github__get_issue") is not None
    assert rule_tool("Bsah") is None and rule_tool("Skill") is None


def test_bash_is_read_as_a_bash_c_string() -> None:
    assert command_argv(claude_code.BASH, {"command": "ls -la"}) == ["bash", "-c", "ls -la"]
    assert command_argv(claude_code.BASH, {"command": ["ls"]}) is None


@pytest.mark.parametrize(
    "value, relative",
    [
        ("/home/dev/project/src/a.py", "src/a.py"),
        ("/home/dev/project", "."),
        ("", "."),
        ("src/../README.md", "README.md"),
        ("//home/dev/project/x", "x"),
        ("/home/dev/project/../project/x", "x"),
        ("/home/dev/project-evil/x", None),
        ("/home/dev/project/../../etc/passwd", None),
        ("../x", None),
        ("/etc/passwd", None),
        ("~/x", None),
        ("a\x00b", None),
    ],
)
def test_paths_are_read_lexically_against_the_project(value: str, relative: str | None) -> None:
    assert lexical_relative(value, PROJECT) == relative
    assert (lexical_path_violation(value, PROJECT) is None) == (relative is not None)


def test_a_project_that_is_not_an_absolute_path_confines_everything_out() -> None:
    assert lexical_relative("x", Path("relative")) is None


def test_edit_is_shown_as_a_diff_and_bash_as_its_command() -> None:
    edit = claude_code.present_edit(
        {"file_path": "/home/dev/project/a.py", "old_string": "x = 1", "new_string": "x = 2"},
        PROJECT,
    )
    assert edit["diff"].splitlines()[:2] == ["--- a/a.py", "+++ b/a.py"]
    assert "-x = 1" in edit["diff"] and "+x = 2" in edit["diff"]
    bash = claude_code.present_bash({"command": "make", "dangerouslyDisableSandbox": True}, PROJECT)
    assert bash == {
        "kind": "shell",
        "command": "make",
        "description": "",
        "project": str(PROJECT),
        "background": False,
        "sandbox_disabled": True,
    }


def test_a_client_tool_set_that_is_not_one_fails_at_start_up() -> None:
    assert check_client_tools() == []
    with override_settings(
        HARNESS_CLIENT_TOOLS={"claude-code": "dispatcher.tools.claude_code.BASH"}
    ):
        assert [e.id for e in check_client_tools()] == ["dispatcher.E051"]
    with override_settings(HARNESS_CLIENT_TOOLS={"x": "dispatcher.tools.nope.TOOLSET"}):
        assert [e.id for e in check_client_tools()] == ["dispatcher.E050"]
