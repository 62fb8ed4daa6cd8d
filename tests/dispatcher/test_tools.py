"""The built-in tools, run for real on a temporary workspace (files and subprocesses)."""

from __future__ import annotations

import time
from pathlib import Path

import jsonschema
import pytest
from django.conf import settings

from dispatcher.tools.base import ExecutionContext, Tool, ToolError
from dispatcher.tools.delete_file import TOOL as DELETE_FILE
from dispatcher.tools.list_directory import TOOL as LIST_DIRECTORY
from dispatcher.tools.read_file import TOOL as READ_FILE
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.search_files import TOOL as SEARCH_FILES
from dispatcher.tools.write_file import TOOL as WRITE_FILE

ALL_TOOLS = [READ_FILE, WRITE_FILE, LIST_DIRECTORY, SEARCH_FILES, RUN_COMMAND, DELETE_FILE]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def make_ctx(
    workspace: Path, *, timeout: float = 10.0, output_limit: int = 10_000
) -> ExecutionContext:
    return ExecutionContext(
        workspace=workspace, call_id="t", timeout=timeout, output_limit=output_limit
    )


def run(tool: Tool, workspace: Path, **kwargs: object) -> object:
    return tool.execute(make_ctx(workspace), dict(kwargs))


# --- definitions ------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ALL_TOOLS, ids=lambda tool: tool.name)
def test_schema_is_a_closed_draft_2020_12_object(tool: Tool) -> None:
    jsonschema.Draft202012Validator.check_schema(tool.parameters)
    assert tool.parameters["type"] == "object"
    assert tool.parameters["additionalProperties"] is False
    for name in tool.path_arguments:
        assert name in tool.parameters["properties"]


def test_annotations_match_the_contract() -> None:
    assert READ_FILE.read_only and READ_FILE.is_concurrency_safe
    assert LIST_DIRECTORY.read_only and LIST_DIRECTORY.is_concurrency_safe
    assert SEARCH_FILES.read_only and SEARCH_FILES.is_concurrency_safe
    assert not WRITE_FILE.read_only and not WRITE_FILE.is_concurrency_safe
    assert DELETE_FILE.destructive and not DELETE_FILE.read_only
    assert RUN_COMMAND.open_world and not RUN_COMMAND.read_only
    assert not RUN_COMMAND.is_concurrency_safe
    assert RUN_COMMAND.command_argument == "argv"
    assert RUN_COMMAND.path_arguments == ("cwd",)
    assert RUN_COMMAND.timeout == 60


def test_run_command_schema_requires_a_non_empty_argv() -> None:
    validator = jsonschema.Draft202012Validator(RUN_COMMAND.parameters)
    assert not validator.is_valid({"argv": []})
    assert not validator.is_valid({"argv": ["ls"], "timeout": 5})  # the model never sets it
    assert validator.is_valid({"argv": ["ls", "-la"], "cwd": "src"})


# --- read_file --------------------------------------------------------------------------


def test_read_file_returns_header_and_text(workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\nthree\n")
    assert run(READ_FILE, workspace, path="a.txt") == "a.txt (lines 1-3 of 3)\none\ntwo\nthree\n"


def test_read_file_offset_and_limit_select_lines(workspace: Path) -> None:
    (workspace / "a.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    result = run(READ_FILE, workspace, path="a.txt", offset=4, limit=2)
    assert result == "a.txt (lines 4-5 of 10)\nline 4\nline 5\n"


def test_read_file_offset_past_the_end_is_a_tool_error(workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\n")
    with pytest.raises(ToolError, match="past the end"):
        run(READ_FILE, workspace, path="a.txt", offset=5)


def test_read_file_caps_output_with_a_note(workspace: Path) -> None:
    (workspace / "big.txt").write_text("x" * 5000)
    result = READ_FILE.execute(make_ctx(workspace, output_limit=100), {"path": "big.txt"})
    assert isinstance(result, str)
    assert result.startswith("big.txt (lines 1-1 of 1)\n")
    header_length = len("big.txt (lines 1-1 of 1)\n")
    hidden = 5000 + header_length - 100
    assert result.endswith(f"\n[truncated: {hidden} more characters; use offset/limit]")


def test_read_file_missing_file_names_path_and_suggests_list_directory(workspace: Path) -> None:
    with pytest.raises(ToolError, match=r"'nope\.txt' does not exist.*list_directory"):
        run(READ_FILE, workspace, path="nope.txt")


@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n\x00\x00", b"caf\xe9 latin-1"])
def test_read_file_refuses_binary_and_non_utf8(workspace: Path, data: bytes) -> None:
    (workspace / "blob").write_bytes(data)
    with pytest.raises(ToolError, match="UTF-8"):
        run(READ_FILE, workspace, path="blob")


def test_read_file_refuses_a_directory(workspace: Path) -> None:
    (workspace / "src").mkdir()
    with pytest.raises(ToolError, match="is a directory"):
        run(READ_FILE, workspace, path="src")


def test_read_file_body_refuses_symlink_outside_workspace(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    (workspace / "link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ToolError, match="outside the session workspace"):
        run(READ_FILE, workspace, path="link.txt")


# --- write_file -------------------------------------------------------------------------


def test_write_file_creates_parents_and_reports_bytes(workspace: Path) -> None:
    result = run(WRITE_FILE, workspace, path="src/pkg/mod.py", content="héllo\n")
    assert result == "Wrote 7 bytes to src/pkg/mod.py"
    assert (workspace / "src/pkg/mod.py").read_text(encoding="utf-8") == "héllo\n"


def test_write_file_overwrites(workspace: Path) -> None:
    (workspace / "a.txt").write_text("old")
    run(WRITE_FILE, workspace, path="a.txt", content="new")
    assert (workspace / "a.txt").read_text() == "new"


def test_write_file_refuses_a_directory(workspace: Path) -> None:
    (workspace / "src").mkdir()
    with pytest.raises(ToolError, match="is a directory"):
        run(WRITE_FILE, workspace, path="src", content="x")


def test_write_file_body_refuses_escape(workspace: Path, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="outside the session workspace"):
        run(WRITE_FILE, workspace, path="../escaped.txt", content="x")
    assert not (tmp_path / "escaped.txt").exists()


def test_write_file_presents_a_diff_of_an_existing_file(workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 1\ny = 2\n")
    shown = WRITE_FILE.present_call({"path": "a.py", "content": "x = 1\ny = 3\n"}, workspace)
    assert shown["kind"] == "diff"
    assert shown["path"] == "a.py"
    assert shown["new_file"] is False
    assert "--- a/a.py\n+++ b/a.py\n" in shown["diff"]
    assert "-y = 2\n+y = 3\n" in shown["diff"]


def test_write_file_presents_a_new_file_as_all_additions(workspace: Path) -> None:
    shown = WRITE_FILE.present_call({"path": "new.txt", "content": "a\nb\n"}, workspace)
    assert shown["new_file"] is True
    assert shown["diff"].startswith("--- /dev/null\n+++ b/new.txt\n")
    assert "+a\n+b\n" in shown["diff"]


def test_write_file_presentation_never_reads_outside(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("TOP SECRET\n")
    shown = WRITE_FILE.present_call({"path": "../secret.txt", "content": "x\n"}, workspace)
    assert "TOP SECRET" not in shown["diff"]
    assert shown["new_file"] is True


# --- list_directory ---------------------------------------------------------------------


def test_list_directory_sorts_and_marks_directories(workspace: Path) -> None:
    (workspace / "b.txt").write_text("")
    (workspace / "a").mkdir()
    (workspace / "c.py").write_text("")
    assert run(LIST_DIRECTORY, workspace) == ". (3 entries)\na/\nb.txt\nc.py"


def test_list_directory_nested_and_empty(workspace: Path) -> None:
    (workspace / "src" / "empty").mkdir(parents=True)
    assert run(LIST_DIRECTORY, workspace, path="src") == "src (1 entries)\nempty/"
    assert run(LIST_DIRECTORY, workspace, path="src/empty") == "src/empty (empty directory)"


def test_list_directory_caps_entries(workspace: Path) -> None:
    for n in range(1005):
        (workspace / f"f{n:04}").write_text("")
    result = run(LIST_DIRECTORY, workspace)
    assert isinstance(result, str)
    assert result.endswith("[truncated: 5 more entries; list a subdirectory]")
    assert "f0999" in result and "f1000" not in result


def test_list_directory_errors(workspace: Path) -> None:
    (workspace / "a.txt").write_text("")
    with pytest.raises(ToolError, match="does not exist"):
        run(LIST_DIRECTORY, workspace, path="missing")
    with pytest.raises(ToolError, match="use read_file|Use read_file"):
        run(LIST_DIRECTORY, workspace, path="a.txt")


# --- search_files -----------------------------------------------------------------------


def test_search_files_finds_matches_with_relative_paths(workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("import os\ndef main():\n    pass\n")
    (workspace / "notes.md").write_text("def is not code here\n")
    result = run(SEARCH_FILES, workspace, pattern=r"^def ")
    assert result == "notes.md:1: def is not code here\nsrc/app.py:2: def main():"


def test_search_files_glob_and_path_filter(workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("TODO fix\n")
    (workspace / "src" / "app.js").write_text("TODO fix\n")
    (workspace / "top.py").write_text("TODO fix\n")
    assert run(SEARCH_FILES, workspace, pattern="TODO", glob="*.py", path="src") == (
        "src/app.py:1: TODO fix"
    )


def test_search_files_skips_binary_files(workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"needle\x00\x01")
    (workspace / "text.txt").write_text("needle\n")
    assert run(SEARCH_FILES, workspace, pattern="needle") == "text.txt:1: needle"


def test_search_files_caps_matches(workspace: Path) -> None:
    (workspace / "many.txt").write_text("hit\n" * 500)
    result = run(SEARCH_FILES, workspace, pattern="hit")
    assert isinstance(result, str)
    assert result.count("many.txt:") == 200
    assert result.endswith("[truncated: more than 200 matches; narrow the pattern, path or glob]")


def test_search_files_invalid_regex_is_a_tool_error(workspace: Path) -> None:
    with pytest.raises(ToolError, match=r"Invalid regular expression '\(unclosed'.*missing \)"):
        run(SEARCH_FILES, workspace, pattern="(unclosed")


def test_search_files_no_match_is_not_an_error(workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello\n")
    assert "No matches" in str(run(SEARCH_FILES, workspace, pattern="absent"))


def test_search_files_does_not_follow_links_outside(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("needle\n")
    (workspace / "dirlink").symlink_to(outside)
    (workspace / "filelink.txt").symlink_to(outside / "secret.txt")
    assert "No matches" in str(run(SEARCH_FILES, workspace, pattern="needle"))


# --- run_command ------------------------------------------------------------------------


def test_run_command_returns_exit_code_and_output(workspace: Path) -> None:
    result = run(RUN_COMMAND, workspace, argv=["/usr/bin/python3", "-c", "print(1)"])
    assert result == "exit code 0\n1\n"


def test_run_command_runs_python3_from_path(workspace: Path) -> None:
    assert run(RUN_COMMAND, workspace, argv=["python3", "-c", "print(1)"]) == "exit code 0\n1\n"


def test_run_command_non_zero_exit_is_a_result(workspace: Path) -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = run(RUN_COMMAND, workspace, argv=["python3", "-c", script])
    assert isinstance(result, str)
    assert result.startswith("exit code 3\n")
    assert "out" in result and "err" in result


def test_run_command_runs_in_cwd_inside_workspace(workspace: Path) -> None:
    (workspace / "sub").mkdir()
    result = run(RUN_COMMAND, workspace, argv=["pwd"], cwd="sub")
    assert result == f"exit code 0\n{(workspace / 'sub').resolve()}\n"


def test_run_command_cwd_outside_is_refused_by_the_body(workspace: Path) -> None:
    with pytest.raises(ToolError, match="outside the session workspace"):
        run(RUN_COMMAND, workspace, argv=["pwd"], cwd="..")


def test_run_command_missing_program_is_a_tool_error(workspace: Path) -> None:
    with pytest.raises(ToolError, match="'no-such-program-xyz' was not found"):
        run(RUN_COMMAND, workspace, argv=["no-such-program-xyz"])


@pytest.mark.heavy
def test_run_command_timeout_kills_the_process_group(workspace: Path) -> None:
    # The child proves it survived by writing a file (its pid may be in another namespace).
    script = "(sleep 1; touch survived) & wait"
    ctx = make_ctx(workspace, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        RUN_COMMAND.execute(ctx, {"argv": ["sh", "-c", script]})
    assert time.monotonic() - started < 15  # at the timeout (not 3 s: a loaded host's start)
    time.sleep(1.5)
    assert not (workspace / "survived").exists(), "a background child survived the timeout"


def test_a_program_that_closes_its_output_before_exiting_is_not_reported_killed(
    workspace: Path,
) -> None:
    # As coreutils do in their exit handler (cat, pwd): the pipe closes before the exit.
    script = "exec >&- 2>&-; sleep 0.3; exit 3"
    assert run(RUN_COMMAND, workspace, argv=["sh", "-c", script]) == "exit code 3\n"


def test_a_program_that_closes_its_output_and_keeps_running_is_stopped_at_the_timeout(
    workspace: Path,
) -> None:
    ctx = make_ctx(workspace, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        RUN_COMMAND.execute(ctx, {"argv": ["sh", "-c", "exec >&- 2>&-; sleep 30"]})
    assert time.monotonic() - started < 15  # at the timeout, not the sleep's 30 s (3 s once)


def test_run_command_kills_background_children_after_exit(workspace: Path) -> None:
    script = "(sleep 1; touch survived) & echo started"
    assert run(RUN_COMMAND, workspace, argv=["sh", "-c", script]) == "exit code 0\nstarted\n"
    time.sleep(1.5)
    assert not (workspace / "survived").exists(), "a background child outlived the call"


def test_run_command_scrubs_the_environment(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_SECRET", "hunter2")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    result = run(RUN_COMMAND, workspace, argv=["env"])
    assert isinstance(result, str)
    assert "hunter2" not in result and "HARNESS_SECRET" not in result
    assert "GITHUB_TOKEN" not in result and "DJANGO" not in result
    names = {line.split("=", 1)[0] for line in result.splitlines()[1:] if line}
    # bubblewrap sets PWD, to the directory the command runs in.
    # git's own settings: no per-user configuration, no bare
    # repository it is not pointed at (run_command.scrubbed_environment)
    git = {"GIT_CONFIG_GLOBAL", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0"}
    caches = {"XDG_CACHE_HOME", "npm_config_cache"}  # (HOME is read-only)
    assert names - {"PWD"} == {"PATH", "HOME", "LANG", "TERM"} | git | caches
    assert "PWD" not in names or f"PWD={workspace.resolve()}" in result
    # the run's own, empty (not the workspace the agent writes): the sandbox's, or with
    # the sandbox off a directory made for this run alone
    home = next(line for line in result.splitlines() if line.startswith("HOME="))
    if settings.HARNESS_SANDBOX == "off":
        assert Path(home.removeprefix("HOME=")).name.startswith("harness-home-"), home
    else:
        assert home == "HOME=/run/home"
    assert "LANG=C.UTF-8" in result and "TERM=dumb" in result


def test_run_command_caps_output(workspace: Path) -> None:
    ctx = make_ctx(workspace, output_limit=100)
    result = RUN_COMMAND.execute(ctx, {"argv": ["python3", "-c", "print('y' * 5000)"]})
    assert isinstance(result, str)
    assert result.startswith("exit code 0\n" + "y" * 100 + "\n[truncated: about 4901 more bytes")


def test_run_command_stdin_is_empty(workspace: Path) -> None:
    assert run(RUN_COMMAND, workspace, argv=["cat"]) == "exit code 0\n"


def test_run_command_presents_argv_cwd_and_shell_text(workspace: Path) -> None:
    (workspace / "src").mkdir()
    shown = RUN_COMMAND.present_call(
        {"argv": ["git", "commit", "-m", "a b"], "cwd": "src"}, workspace
    )
    assert shown == {
        "kind": "command",
        "argv": ["git", "commit", "-m", "a b"],
        "cwd": str((workspace / "src").resolve()),
        "text": "git commit -m 'a b'",
        # the directory shown, bound by identity (run_command.changed_since)
        "cwd_identity": [(workspace / "src").stat().st_dev, (workspace / "src").stat().st_ino],
    }
    assert RUN_COMMAND.present_call({"argv": ["ls"]}, workspace)["cwd"] == str(workspace.resolve())


# --- delete_file ------------------------------------------------------------------------


def test_delete_file_removes_a_file(workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    assert run(DELETE_FILE, workspace, path="a.txt") == "Deleted a.txt"
    assert not (workspace / "a.txt").exists()


def test_delete_file_refuses_directories_and_missing_files(workspace: Path) -> None:
    (workspace / "src").mkdir()
    with pytest.raises(ToolError, match="is a directory"):
        run(DELETE_FILE, workspace, path="src")
    assert (workspace / "src").is_dir()
    with pytest.raises(ToolError, match="does not exist"):
        run(DELETE_FILE, workspace, path="gone.txt")


def test_delete_file_removes_a_symlink_not_its_target(workspace: Path) -> None:
    (workspace / "target.txt").write_text("keep")
    (workspace / "link.txt").symlink_to(workspace / "target.txt")
    run(DELETE_FILE, workspace, path="link.txt")
    assert not (workspace / "link.txt").is_symlink()
    assert (workspace / "target.txt").read_text() == "keep"


def test_delete_file_body_refuses_escape(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "victim.txt").write_text("x")
    with pytest.raises(ToolError, match="outside the session workspace"):
        run(DELETE_FILE, workspace, path="../victim.txt")
    assert (tmp_path / "victim.txt").exists()
