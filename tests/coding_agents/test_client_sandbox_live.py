"""The printed settings really turn on each client's own sandbox (issue 30, 3a): with the
pinned CLIs, a command Harness allows (a rule `Bash(touch *)`: Harness reads no paths in a
command's words) writes inside the project, and the same command writing outside it fails
because the client's sandbox refuses it: Claude Code's Bash with the `sandbox` settings
claude_code_settings prints, and Codex run without --dangerously-bypass-approvals-and-
sandbox with the `sandbox_mode` codex_settings prints.

The target outside the project is not under /tmp: both sandboxes let a command write
temporary files there. If a client's sandbox cannot run on this machine the test says so:
it skips with the client's own words outside CI, and fails under CI=true.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.models import Status
from tests.coding_agents.test_claude_code_live import (  # noqa: F401 - fixtures
    Claude,
    calls_of,
    claude,
    claude_cli,
    result_for,
    text_of,
)
from tests.coding_agents.test_codex_live import (  # noqa: F401 - fixtures
    Codex,
    allow,
    codex,
    codex_cli,
    told,
)
from tests.support.factories import AgentFixture
from tests.support.fake_anthropic import tool_use
from tests.support.fake_openai import call
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.client_program]

REFUSED = ("Read-only file system", "Permission denied", "Operation not permitted")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the project and outside /tmp, as another repository would be."""
    directory = ROOT / "var" / "client-sandbox" / uuid.uuid4().hex
    directory.mkdir(parents=True)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
    shutil.rmtree(f"{directory}-home", ignore_errors=True)


def unavailable(text: str, client: str) -> None:
    """Skip (fail under CI=true) when the client says its sandbox cannot run here."""
    lowered = text.lower()
    if "sandbox" in lowered and any(
        word in lowered for word in ("unavailable", "not available", "not supported", "failed to")
    ):
        message = f"{client}'s own sandbox cannot run on this machine: {text[-600:]}"
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)


def test_claude_code_bash_cannot_write_outside_the_project(
    claude: Claude,  # noqa: F811 - the fixture imported above
    live_agent: AgentFixture,
    outside: Path,
) -> None:
    allow(live_agent, "Bash(touch *)")
    escaped = outside / "escaped.txt"
    result, fake = claude.run(
        [tool_use("Bash", command="touch inside.txt"), tool_use("Bash", command=f"touch {escaped}")]
    )
    inside_told, outside_told = text_of(result_for(fake, 0)), text_of(result_for(fake, 1))
    unavailable(inside_told + outside_told, "Claude Code")
    assert (claude.project / "inside.txt").exists(), inside_told
    assert not escaped.exists(), outside_told
    assert any(word in outside_told for word in REFUSED), outside_told
    # Harness allowed both: the refusal is the client's sandbox, not Harness.
    assert [(c.status, c.decided_by) for c in calls_of(result)] == [
        (Status.REPORTED, "rule:allow:Bash(touch *)")
    ] * 2


def test_codex_without_its_bypass_flag_cannot_write_outside_the_project(
    codex: Codex,  # noqa: F811 - the fixture imported above
    live_agent: AgentFixture,
    outside: Path,
) -> None:
    allow(live_agent, "Bash(touch *)")
    escaped = outside / "escaped.txt"
    # The project and CODEX_HOME where a developer's are (~/src/x, ~/.codex), not under
    # /tmp: Codex's sandbox gives the command a /tmp of its own, and Codex puts the alias it
    # starts its sandbox helper by (codex-linux-sandbox) in CODEX_HOME.
    base = outside.parent / f"{outside.name}-home"
    codex.home, codex.project = base / ".codex", base / "project"
    codex.home.mkdir(parents=True)
    codex.project.mkdir()
    fake = codex.run(
        [
            call("exec_command", cmd="touch inside.txt"),
            call("exec_command", cmd=f"touch {escaped}"),
        ],
        own_sandbox=True,
    )
    outputs = told(fake)
    unavailable(" ".join(outputs), "Codex")
    assert (codex.project / "inside.txt").exists(), outputs[0]
    assert not escaped.exists(), outputs
    assert any(word in outputs[-1] for word in REFUSED), outputs
    assert [c.decided_by for c in codex.calls()] == ["rule:allow:Bash(touch *)"] * 2
