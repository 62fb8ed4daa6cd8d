"""A client's glob pattern with braces left the project unseen: the lexical confinement
folds `..` as text, and in `{../../etc/*,x}` the first `..` is part of the name `{..`,
so the pattern read as inside the project. Gemini CLI 0.61.0's `glob` and
`read_many_files` hand their patterns to node's glob (isaacs/node-glob), which expands
braces and follows `..` and absolute alternatives: in trusted mode they listed (or read)
files outside the project. A client path with braces is now confined in every brace
alternative too (`_paths.brace_alternatives`), wherever client paths are confined: the
hooks of every client and the permission prompt. (Claude Code 2.1.197's `Glob` hands its
pattern to ripgrep as a `--glob` filter of the files below its search directory, which a
brace cannot widen; its pattern is confined the same way, as one rule for every client.)

The hook endpoints as the clients call them; the prompt live, through daphne and the
official MCP client."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.models import Status, ToolCall
from dispatcher.tools._paths import brace_alternatives, lexical_path_violation
from tests.redteam.test_prompt_paths import _prompt
from tests.support.coding_agent_hooks import (
    GEMINI_URL,
    PROJECT,
    gemini_decision,
    gemini_tool,
    post,
    sid,
)
from tests.support.factories import make_agent
from tests.support.live import LiveStack

ESCAPES = ("{../../etc/*,x}", "src/{..,.}/../../*.txt", "{/etc/*,x}", "{,../.ssh/*}")


@pytest.mark.django_db
@pytest.mark.parametrize("pattern", ESCAPES)
def test_gemini_clis_glob_with_a_brace_alternative_outside_is_denied(pattern: str) -> None:
    fx = make_agent(mode="trusted")
    session = sid()
    verdict, reason = gemini_decision(
        post(GEMINI_URL, fx, gemini_tool(session, "glob", {"pattern": pattern}))
    )
    assert verdict == "deny", reason
    assert "brace alternative" in reason and "outside the project" in reason
    call = ToolCall.objects.get(session__external_id=session)
    assert call.status == Status.DENIED and call.decided_by == "guard:workspace_confinement"

    read = gemini_tool(session, "read_many_files", {"include": ["README.md", pattern]})
    verdict, reason = gemini_decision(post(GEMINI_URL, fx, read))
    assert verdict == "deny" and "brace alternative" in reason, reason


@pytest.mark.django_db
def test_gemini_clis_glob_with_braces_inside_the_project_is_allowed() -> None:
    fx = make_agent(mode="trusted")
    for pattern in ("src/**/*.{ts,tsx}", "{src,tests}/**/*.py", f"{PROJECT}/{{a,b}}/../x"):
        body = gemini_tool(sid(), "glob", {"pattern": pattern})
        assert gemini_decision(post(GEMINI_URL, fx, body))[0] == "allow", pattern


@pytest.mark.live
def test_the_prompts_glob_with_a_brace_alternative_outside_is_denied(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    fx = make_agent(mode="trusted", workspace=str(project))
    answer = _prompt(live_stack, fx, "Glob", {"pattern": "{../../etc/*,x}"})
    assert answer["behavior"] == "deny", answer
    assert "brace alternative '../../etc/*'" in answer["message"]
    inside = {"pattern": "**/*.{ts,tsx}", "path": str(project)}
    assert _prompt(live_stack, fx, "Glob", inside) == {"behavior": "allow", "updatedInput": inside}


def test_brace_alternatives_expand_as_a_glob_does() -> None:
    assert brace_alternatives("a/{b,c/d}/e") == ("a/b/e", "a/c/d/e")
    assert brace_alternatives("a{b,c{d,e}}f") == ("abf", "acdf", "acef")
    assert brace_alternatives("{{a,b}}") == ("{a}", "{b}")
    for literal in ("{a}", "{1..3}", "{a,b", "x}y"):
        assert brace_alternatives(literal) == (literal,)
    assert brace_alternatives("{a,b}" * 11) is None  # 2,048 alternatives: not checked
    reason = lexical_path_violation("{a,b}" * 11, "/home/dev/project")
    assert reason is not None and "more brace alternatives than Harness checks" in reason
    assert lexical_path_violation("{" * 300_000, "/home/dev/project") is not None
