"""Deny and ask rules on reading also bind search_files and list_directory (issue 11, item 5):
a search or a listing never shows what a read would be denied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher import pipeline
from dispatcher.policy.context import CallContext, Profile
from dispatcher.policy.results import hide_read_denied
from dispatcher.policy.rules import evaluate
from dispatcher.tools.base import ExecutionContext, Tool
from dispatcher.tools.list_directory import TOOL as LIST_DIRECTORY
from dispatcher.tools.read_file import TOOL as READ_FILE
from dispatcher.tools.search_files import TOOL as SEARCH_FILES

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "secrets" / "deep").mkdir(parents=True)
    (root / "src").mkdir()
    (root / ".env").write_text("TOKEN=root-secret\n")
    (root / "src" / ".env").write_text("TOKEN=src-secret\n")
    (root / "src" / "app.py").write_text("TOKEN = read_from_env()\n")
    (root / "secrets" / "key.txt").write_text("TOKEN=key\n")
    (root / "secrets" / "deep" / "more.txt").write_text("TOKEN=deeper\n")
    (root / "config.txt").symlink_to(root / "src" / ".env")
    return root


def make_call(tool: Tool, arguments: dict[str, Any], workspace: Path, **rules: Any) -> CallContext:
    return CallContext(
        call_id="t",
        session_id="s",
        tool=tool,
        name=tool.name,
        arguments=arguments,
        workspace=workspace,
        mode="standard",
        username="u",
        agent_name="a",
        profile=Profile(
            mode="standard",
            allow=tuple(rules.get("allow", ())),
            ask=tuple(rules.get("ask", ())),
            deny=tuple(rules.get("deny", ())),
        ),
    )


def decide(tool: Tool, arguments: dict[str, Any], workspace: Path, **rules: Any) -> str | None:
    call = make_call(tool, arguments, workspace, **rules)
    lists = {key: rules.get(key, []) for key in ("allow", "ask", "deny")}
    return evaluate(call, **lists).action


RULE_CASES = [
    # (deny rule, tool, path, action the rule gives)
    ("read_file(**/.env)", SEARCH_FILES, ".env", "deny"),
    ("read_file(**/.env)", SEARCH_FILES, "src/.env", "deny"),
    ("read_file(**/.env)", SEARCH_FILES, "config.txt", "deny"),  # a link to src/.env
    ("read_file(**/.env)", SEARCH_FILES, ".", None),  # filtered from the results instead
    ("read_file(**/.env)", LIST_DIRECTORY, "src", None),
    ("read_file(secrets/**)", LIST_DIRECTORY, "secrets", "deny"),  # all it holds is denied
    ("read_file(secrets/**)", SEARCH_FILES, "secrets", "deny"),
    ("read_file(secrets/**)", SEARCH_FILES, "secrets/deep", "deny"),
    ("read_file(secrets/**)", SEARCH_FILES, "./secrets/", "deny"),
    ("read_file(secrets/**)", SEARCH_FILES, "src", None),
    ("read_file(secrets/**)", LIST_DIRECTORY, ".", None),
    ("read_file(secrets)", LIST_DIRECTORY, "secrets/deep", "deny"),  # inside a denied dir
    ("read_file(**)", SEARCH_FILES, ".", "deny"),
    ("read_file", SEARCH_FILES, "src", "deny"),  # a bare read_file rule binds every search
    ("read_file", LIST_DIRECTORY, ".", "deny"),
    ("read_file(path:*.env)", SEARCH_FILES, ".env", None),  # an argument rule is not a path
    ("write_file(**)", SEARCH_FILES, ".env", None),  # only read rules bind
]


@pytest.mark.parametrize(("rule", "tool", "path", "expected"), RULE_CASES)
def test_read_rules_bind_searches_and_listings(
    workspace: Path, rule: str, tool: Tool, path: str, expected: str | None
) -> None:
    arguments = {"pattern": "TOKEN", "path": path} if tool is SEARCH_FILES else {"path": path}
    assert decide(tool, arguments, workspace, deny=[rule]) == expected
    ask = "ask" if expected else None
    assert decide(tool, arguments, workspace, ask=[rule]) == ask


def test_a_search_without_a_path_is_a_search_of_the_workspace(workspace: Path) -> None:
    assert decide(SEARCH_FILES, {"pattern": "x"}, workspace, deny=["read_file(**)"]) == "deny"
    assert decide(SEARCH_FILES, {"pattern": "x"}, workspace, deny=["read_file(src/**)"]) is None


def test_an_allow_rule_on_reading_does_not_widen_searches(workspace: Path) -> None:
    arguments = {"pattern": "TOKEN", "path": "src"}
    assert decide(SEARCH_FILES, arguments, workspace, allow=["read_file(**)"]) is None
    assert decide(READ_FILE, {"path": "src/app.py"}, workspace, allow=["read_file(**)"]) == "allow"


def run(tool: Tool, arguments: dict[str, Any], workspace: Path) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=10, output_limit=100_000)
    return str(tool.execute(ctx, arguments))


def test_search_results_hide_files_a_read_rule_denies(workspace: Path) -> None:
    arguments = {"pattern": "TOKEN", "path": "."}
    raw = run(SEARCH_FILES, arguments, workspace)
    assert "root-secret" in raw and "src-secret" in raw  # what the tool alone would show
    call = make_call(SEARCH_FILES, arguments, workspace, deny=["read_file(**/.env)"])
    shown = hide_read_denied(call, raw)
    # .env, src/.env and config.txt (a link to src/.env) are hidden
    assert "root-secret" not in shown and "src-secret" not in shown
    assert "src/app.py:1: TOKEN = read_from_env()" in shown
    assert "secrets/key.txt:1: TOKEN=key" in shown
    assert shown.endswith("[3 result(s) hidden: reading them is denied or needs approval "
                          "('read_file(**/.env)')]")  # fmt: skip


def test_ask_rules_hide_results_too(workspace: Path) -> None:
    arguments = {"pattern": "TOKEN", "path": "."}
    call = make_call(SEARCH_FILES, arguments, workspace, ask=["read_file(secrets/**)"])
    shown = hide_read_denied(call, run(SEARCH_FILES, arguments, workspace))
    assert "TOKEN=key" not in shown and "deeper" not in shown
    assert "root-secret" in shown and "2 result(s) hidden" in shown


def test_a_file_name_holding_a_line_number_cannot_smuggle_a_result(workspace: Path) -> None:
    (workspace / "a:1: b").mkdir()
    (workspace / "a:1: b" / ".env").write_text("TOKEN=smuggled\n")
    arguments = {"pattern": "TOKEN", "path": "."}
    call = make_call(SEARCH_FILES, arguments, workspace, deny=["read_file(**/.env)"])
    shown = hide_read_denied(call, run(SEARCH_FILES, arguments, workspace))
    assert "smuggled" not in shown


def test_listings_hide_entries_a_read_rule_denies(workspace: Path) -> None:
    call = make_call(LIST_DIRECTORY, {"path": "src"}, workspace, deny=["read_file(**/.env)"])
    raw = run(LIST_DIRECTORY, {"path": "src"}, workspace)
    assert ".env" in raw.split("\n")
    shown = hide_read_denied(call, raw)
    assert shown.split("\n")[1:] == ["app.py", "[1 result(s) hidden: reading them is denied "
                                     "or needs approval ('read_file(**/.env)')]"]  # fmt: skip
    root = make_call(LIST_DIRECTORY, {}, workspace, deny=["read_file(**/.env)"])
    entries = hide_read_denied(root, run(LIST_DIRECTORY, {}, workspace)).split("\n")
    assert ".env" not in entries and "config.txt" not in entries and "src/" in entries


def test_results_are_untouched_without_read_rules(workspace: Path) -> None:
    arguments = {"pattern": "TOKEN", "path": "."}
    raw = run(SEARCH_FILES, arguments, workspace)
    for rules in ({}, {"deny": ["write_file(**)"]}, {"allow": ["read_file(**)"]}):
        assert hide_read_denied(make_call(SEARCH_FILES, arguments, workspace, **rules), raw) == raw
    other = make_call(READ_FILE, {"path": ".env"}, workspace, deny=["read_file(**/.env)"])
    assert hide_read_denied(other, "TOKEN=root-secret") == "TOKEN=root-secret"


def test_the_filter_is_in_the_post_execute_stage(workspace: Path) -> None:
    arguments = {"pattern": "TOKEN", "path": "."}
    call = make_call(SEARCH_FILES, arguments, workspace, deny=["read_file(**/.env)"])
    content = pipeline.post_execute(call, run(SEARCH_FILES, arguments, workspace))
    assert "root-secret" not in content and "3 result(s) hidden" in content
