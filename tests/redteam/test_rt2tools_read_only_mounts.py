"""A HARNESS_SANDBOX_READ_ONLY entry holding a mount of the host's kernel filesystems
(red team of the entries bound by descriptor).

bwrap binds an entry with every mount beneath it. The judge refused an entry that is,
lies in or holds /proc, /sys, /dev or /run by path, but not a directory holding such a
mount elsewhere: a build chroot listed as an entry, its `proc` mounted there (schroot
does so while a session is open), showed every sandboxed program the host's /proc (every
host process's command line, other agents' commands among them), and a bind of /run or
/dev/shm in it the host's sockets and shared memory. Now such an entry is refused (no program runs while it is listed);
an entry holding an ordinary mount is shown as before."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox
from tests.redteam.test_rtsandnr_unprivileged_entries import _sh as _sh_as
from tests.redteam.test_rtsandnr_unprivileged_entries import top
from tests.tools.test_preview_unprivileged import NOBODY, _as_user
from tests.tools.test_sandbox_read_only_entries import TOOL, _sh, layout, owner

__all__ = ["layout", "owner", "top"]  # the fixtures, used by name


@pytest.fixture
def mounted(layout: dict[str, Path]) -> Iterator[list[Path]]:
    """Mounts made in the entry; unmounted at the end."""
    points: list[Path] = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False)


def _mount(points: list[Path], point: Path, *args: str) -> None:
    point.mkdir()
    subprocess.run(["mount", *args, str(point)], check=True)
    points.append(point)


def test_an_entry_holding_the_hosts_proc_is_refused(
    layout: dict[str, Path], mounted: list[Path]
) -> None:
    entry = layout["entry"]
    _mount(mounted, entry / "proc", "-t", "proc", "proc")
    host_init = Path("/proc/1/cmdline").read_bytes().split(b"\0")[0].decode()
    out = _sh(layout["workspace"], f'tr "\\0" " " < "{entry}/proc/1/cmdline"; echo')
    assert host_init not in out, out
    assert out.startswith("refused:") and "no program runs" in out, out
    assert f"holds {entry}/proc, a mount of the host's proc" in out, out
    assert sandbox.read_only_problem(str(entry)) == (
        f"holds {entry}/proc, a mount of the host's proc"
    )


def test_an_entry_holding_a_bind_of_the_hosts_dev_shm_is_refused(
    layout: dict[str, Path], mounted: list[Path]
) -> None:
    # a tmpfs, told by its device: the one mounted at the host's /dev/shm
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    if not any(line.split()[4] == "/dev/shm" for line in mountinfo):  # noqa: S108
        pytest.skip("/dev/shm is no mount of its own here")  # noqa: S108
    entry = layout["entry"]
    _mount(mounted, entry / "shm", "--bind", "/dev/shm")  # noqa: S108
    assert sandbox.read_only_problem(str(entry)) == (
        f"holds {entry}/shm, a mount of the host's kernel or socket directories"
    )
    assert "no program runs" in _sh(layout["workspace"], "true")


def test_an_entry_holding_an_ordinary_mount_is_shown(
    layout: dict[str, Path], mounted: list[Path], settings: Any
) -> None:
    entry = layout["entry"]
    _mount(mounted, entry / "cache", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs")
    assert sandbox.read_only_problem(str(entry)) is None
    out = _sh(layout["workspace"], f'cat "{entry}/tool.txt"; ls -d "{entry}/cache"')
    assert TOOL in out and f"{entry}/cache" in out, out


def test_unprivileged_an_entry_holding_the_hosts_proc_is_refused(top: Path, settings: Any) -> None:
    # Harness not root: bwrap binds the entry, its proc mount with it, in a user namespace
    if os.geteuid() != 0:
        pytest.skip("needs root to mount proc in a directory root owns")
    entry = top / "opt" / "chroot"
    (entry / "proc").mkdir(parents=True)
    (top / "mine").mkdir()
    os.chown(top / "mine", NOBODY, NOBODY)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
    host_init = Path("/proc/1/cmdline").read_bytes().split(b"\0")[0].decode()
    subprocess.run(["mount", "-t", "proc", "proc", str(entry / "proc")], check=True)
    try:
        out = _as_user(lambda: _sh_as(top / "mine", f'tr "\\0" " " < "{entry}/proc/1/cmdline"'))
    finally:
        subprocess.run(["umount", "-l", str(entry / "proc")], check=False)
    assert host_init not in out, out
    assert out.startswith("refused:") and f"holds {entry}/proc, a mount of the host's proc" in out
