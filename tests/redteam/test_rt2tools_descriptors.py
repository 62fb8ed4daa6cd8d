"""The O_PATH descriptors HARNESS_SANDBOX_READ_ONLY entries are bound by reach no program
and outlive no run (red team of the entries bound by descriptor; passed before: it keeps
the docs' claim true).

A descriptor of a host directory left open in the sandbox is a way out of it (openat of
`..` from it walks the host's tree, whatever the sandbox's root). bwrap closes each
--ro-bind-fd descriptor once it has mounted it; this process closes its own after the
run. Checked with many entries (a file among them, one named with `..` and `//`, one
listed twice) for a command, a stdio server and a preview."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from dispatcher.tools import preview, sandbox_servers, workspace_lock
from dispatcher.tools.run_command import scrubbed_environment
from tests.tools.test_sandbox_read_only_entries import TOOL, _sh, layout, owner

__all__ = ["layout", "owner"]  # the fixtures, used by name

# every descriptor the program holds, but the one the loop's glob reads /proc/self/fd with
FDS = 'for f in /proc/self/fd/*; do [ -e "$f" ] && echo "FD ${f##*/} $(readlink "$f")"; done'


def _entries(layout: dict[str, Path], settings: Any) -> Path:
    shared, entry = layout["shared"], layout["entry"]
    (shared / "file.txt").write_text("a file\n")
    for n in range(40):
        (shared / f"more{n}").mkdir()
    settings.HARNESS_SANDBOX_READ_ONLY = [
        str(entry),
        str(shared / "file.txt"),
        f"{entry}/../tools//",
        str(entry),
        *(str(shared / f"more{n}") for n in range(40)),
    ]
    return entry


def _held(layout: dict[str, Path]) -> list[str]:
    """The descriptors of this process that lead into the entries' directory. (Not the
    whole list, before and after: this xdist worker's other threads open and close their
    own meanwhile; CI saw two of them closed during a run.)"""
    shared = os.path.realpath(layout["shared"])
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own, gone)
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target == shared or target.startswith(shared + "/"):
                held.append(f"{fd} -> {target}")
    return held


def _only_standard(out: str) -> None:
    seen = [line.split()[1] for line in out.splitlines() if line.startswith("FD ")]
    assert set(seen) <= {"0", "1", "2"}, out


def test_a_command_holds_no_entrys_descriptor(layout: dict[str, Path], settings: Any) -> None:
    entry = _entries(layout, settings)
    assert _held(layout) == []
    out = _sh(layout["workspace"], f'{FDS}; cat "{entry}/tool.txt" "{entry.parent}/file.txt"')
    assert TOOL in out and "a file" in out, out
    _only_standard(out)
    assert _held(layout) == []


def test_a_server_holds_no_entrys_descriptor(layout: dict[str, Path], settings: Any) -> None:
    _entries(layout, settings)
    assert _held(layout) == []
    with contextlib.ExitStack() as held:
        argv = sandbox_servers.sandboxed_argv(["/bin/sh", "-c", FDS], [], held)
        done = subprocess.run(
            argv,
            env=sandbox_servers.LAUNCHER_ENVIRONMENT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
    out = done.stdout.decode()
    assert "FD 0 " in out, (out, done.stderr)
    _only_standard(out)
    assert _held(layout) == []


def test_a_preview_holds_no_entrys_descriptor(layout: dict[str, Path], settings: Any) -> None:
    _entries(layout, settings)
    settings.HARNESS_PREVIEW_TIMEOUT = 10
    settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
    workspace = layout["workspace"]
    assert _held(layout) == []
    with workspace_lock.held(workspace):
        effect = preview.run_preview(
            ["sh", "-c", FDS],
            cwd=workspace,
            workspace=workspace,
            env=scrubbed_environment(workspace),
        )
    try:
        assert "FD 0 " in effect.output, effect.output
        _only_standard(effect.output)
    finally:
        preview.discard(effect.store)
    assert _held(layout) == []
