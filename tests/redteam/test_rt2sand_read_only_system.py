"""Red team of the sandbox (rt2sand): a HARNESS_SANDBOX_READ_ONLY entry never shows the
sandbox the host's /proc, /sys, /dev, /run, /tmp, or the whole host.

rtsand refused an entry programs could redirect and one inside Harness's state; any
other was bound, after the sandbox's own /proc, /dev and /tmp: "/proc" replaced the
sandbox's /proc with the host's, and a sandboxed program read every host process's
command line (another agent's command, a worker's, this test's own); "/" showed the whole
host, its /proc, /run and /home included. A server's paths refused these already
(sandbox_servers.KERNEL_AND_SOCKET_DIRS, "/"). Through run_command in the real sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND


@pytest.mark.parametrize("entry", ["/proc", "/", "/proc/", "/usr/../proc"])
def test_an_entry_shows_no_host_process(
    sandboxed_workspace: Path, settings: Any, entry: str
) -> None:
    settings.HARNESS_SANDBOX_READ_ONLY = [entry]
    ctx = ExecutionContext(
        workspace=sandboxed_workspace, call_id="rt2sand", timeout=30, output_limit=20_000
    )
    look = f"tr '\\0' ' ' < /proc/{os.getpid()}/cmdline; ls /proc | grep -c '^[0-9]'"
    try:
        seen = str(RUN_COMMAND.execute(ctx, {"argv": ["sh", "-c", look]}))
    except ToolError as refused:
        seen = str(refused)
    assert "pytest" not in seen, seen  # this test's own command line, read from the host
    assert f"HARNESS_SANDBOX_READ_ONLY entry {entry} " in seen, seen


@pytest.mark.parametrize("entry", ["/sys", "/dev", "/run", "/tmp", "/var", "/sys/class"])  # noqa: S108
def test_an_entry_of_the_kernel_or_the_sandbox_own_is_refused(
    sandboxed_workspace: Path, settings: Any, entry: str
) -> None:
    settings.HARNESS_SANDBOX_READ_ONLY = [entry]
    ctx = ExecutionContext(
        workspace=sandboxed_workspace, call_id="rt2sand", timeout=30, output_limit=20_000
    )
    with pytest.raises(ToolError, match=f"HARNESS_SANDBOX_READ_ONLY entry {entry} "):
        RUN_COMMAND.execute(ctx, {"argv": ["true"]})


def test_an_admin_entry_is_still_bound(
    sandboxed_workspace: Path, settings: Any, tmp_path: Path
) -> None:
    tool = tmp_path / "opt-tool"
    tool.mkdir()
    (tool / "README").write_text("A TOOLCHAIN\n")
    tool.chmod(0o755)
    for parent in tool.parents:  # (readable by the sandbox user on the way)
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(tool)]
    ctx = ExecutionContext(
        workspace=sandboxed_workspace, call_id="rt2sand", timeout=30, output_limit=20_000
    )
    out = str(RUN_COMMAND.execute(ctx, {"argv": ["cat", str(tool / "README")]}))
    assert out.startswith("exit code 0") and "A TOOLCHAIN" in out, out
