"""Red team of the sandbox's start report (bwrap's --json-status-fd) where it was not yet
read: the preview. Real programs previewed in the real bwrap sandbox.

Found and closed here: the preview read a start failure from the namespace script's own
exit status (0), so a sandbox that could not start the command (bwrap's setup, a program
not there) was never read as one and the preview was appliable; read from the program's
status instead, the preview must still not take a program's own "bwrap: " line for
bubblewrap's, which bwrap's report on the start tells apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import preview, workspace_lock
from dispatcher.tools.run_command import scrubbed_environment


@pytest.fixture
def workspace(sandboxed_workspace: Path, settings: Any) -> Path:
    settings.HARNESS_PREVIEW_TIMEOUT = 5
    settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
    return sandboxed_workspace


def previewed(workspace: Path, argv: list[str], cwd: Path | None = None) -> preview.Effect:
    with workspace_lock.held(workspace):
        return preview.run_preview(
            argv, cwd=cwd or workspace, workspace=workspace, env=scrubbed_environment(workspace)
        )


def test_a_sandbox_that_could_not_start_the_command_is_not_an_appliable_preview(
    workspace: Path,
) -> None:
    # bwrap cannot enter the working directory: it says so and exits 1, nothing ran. The
    # preview read its start failure from the namespace script's exit status (0), so this
    # was an appliable preview of "exit 1" with bwrap's complaint for the program's output.
    effect = previewed(workspace, ["true"], cwd=workspace / "not-there")
    assert effect.output.startswith("bwrap: Can't chdir"), effect.output
    assert effect.limit == "start", effect.limit
    assert not effect.appliable
    assert effect.why_not_appliable() == "the command could not start in the preview"


def test_a_program_that_prints_bwraps_complaint_is_previewed_as_what_it_did(
    workspace: Path,
) -> None:
    # Its own "bwrap: ..." line and status 1 are not the sandbox failing to start: bwrap
    # said on its status descriptor that it executed the command.
    script = 'echo ran > proof; echo "bwrap: Can\'t mount proc on /newroot/proc"; exit 1'
    effect = previewed(workspace, ["sh", "-c", script])
    assert effect.limit == "", effect.limit
    assert effect.appliable
    assert effect.exit_status == 1
    assert [change["path"] for change in effect.changes] == ["proof"]
    assert not (workspace / "proof").exists()  # a preview writes nothing


def test_a_program_whose_whole_output_is_setprivs_complaint_is_previewed_as_what_it_did(
    workspace: Path,
) -> None:
    # As root setpriv starts the program; its "failed to execute ...: No such file or
    # directory" line as the whole output, with status 127, was taken for the program
    # missing (a preview that "could not start") after the program ran and wrote `proof`.
    # The sandbox's own lookup says so out of band now; a program really missing still is.
    (workspace / "forged").write_text(
        "#!/bin/sh\necho ran > proof\n"
        "echo 'setpriv: failed to execute ./forged: No such file or directory'\nexit 127\n"
    )
    (workspace / "forged").chmod(0o755)
    effect = previewed(workspace, ["./forged"])
    assert effect.limit == "", effect.limit
    assert effect.appliable
    assert effect.exit_status == 127
    assert [change["path"] for change in effect.changes] == ["proof"]
    missing = previewed(workspace, ["./not-there"])
    assert missing.limit == "start", missing.limit
    assert not missing.appliable
