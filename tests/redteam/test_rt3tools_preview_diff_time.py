"""A previewed command's effect is diffed in bounded time, however many files it changes
(red team of the bounded reviewer diffs, dispatcher.tools.diffs).

The diffs of one MultiEdit share one `diffs.Budget`, but a preview gave each changed file
a budget of its own: a command asking to rewrite N files of lines the model chose
(`0 1 0 1 ...` into `0 0 1 1 ...`, 200 lines each, about 0.13 s of difflib apiece here)
held the web thread that admitted it about N x 0.13 s before the call was asked (the
upper layer holds up to 8,000 files: some 17 minutes; 300 files: about 40 s). Now one
budget serves the whole effect: past it, a file's changed part is shown whole."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.models import Preview
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_preview_approval import _workspace
from tests.support.factories import AgentFixture
from tests.tools.support import previews_as_root

pytestmark = pytest.mark.django_db

FILES = 300
OLD = "".join(f"{i % 2}\n" for i in range(200))
NEW = "".join(f"{(i // 2) % 2}\n" for i in range(200))


def test_a_preview_of_many_crafted_changes_is_asked_at_once(
    agent: AgentFixture, settings: Any
) -> None:
    previews_as_root(settings, timeout=30)
    session_id = start_session(agent)
    workspace: Path = _workspace(agent)
    (workspace / "d").mkdir(mode=0o777)
    for index in range(FILES):
        path = workspace / "d" / f"f{index}"
        path.write_text(OLD)
        os.chmod(path, 0o666)  # noqa: S103 - the sandbox user rewrites it
    program = f"import pathlib\nfor p in pathlib.Path('d').iterdir(): p.write_text({NEW!r})"
    started = time.monotonic()
    approval = ask(
        agent, {"argv": ["python3", "-c", program]}, session_id=session_id, name="run_command"
    )
    took = time.monotonic() - started
    preview = Preview.objects.get(call=approval.call)
    assert preview.appliable, preview.note
    changes = [c for c in preview.effect["changes"] if c["path"].startswith("d/f")]
    assert len(changes) == FILES
    assert took < 15, f"the ask took {took:.1f} s: its diffs held the web thread"
    for change in changes:  # (each diff true: the old lines removed, the new added)
        diff = change["diff"]
        assert diff.count("\n-") + diff.count("\n+") >= 2, diff[:200]
