"""The cgroups of sandboxed programs: how many processes, how much memory.

A call (or a long-running server) gets a fresh cgroup in each hierarchy that serves the
`pids` and `memory` controllers and that Harness may write to (cgroup v1 hierarchies, or
the v2 one, where a single cgroup carries both limits). The launcher shell writes its
own pid into each before it becomes prlimit and bwrap, so everything the program starts
is counted from the first instruction.

Without a pids cgroup, processes are bounded by RLIMIT_NPROC instead, which the kernel
never applies to uid 0 (the sandbox module therefore requires one when Harness is root).
Without a memory cgroup, memory is bounded by RLIMIT_AS per process.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "harness-sandbox"
CONTROLLERS = ("pids", "memory")


@dataclass(frozen=True)
class Cgroups:
    """The cgroups one sandbox runs in; None where no cgroup of that controller exists."""

    pids: Path | None = None
    memory: Path | None = None

    @property
    def paths(self) -> list[Path]:
        return list(dict.fromkeys(p for p in (self.pids, self.memory) if p is not None))


@contextlib.contextmanager
def for_call(processes: int, memory: int) -> Iterator[Cgroups]:
    """Fresh cgroups limited to `processes` (+ the wrappers) and `memory` bytes, removed
    when the block ends (once the killed processes are gone)."""
    made = make(processes, memory, name=uuid.uuid4().hex)
    try:
        yield made
    finally:
        for path in made.paths:
            _remove(path)


def make(processes: int, memory: int, *, name: str) -> Cgroups:
    """Cgroups called `name` under each writable root, with their limits written. A cgroup
    that is left behind (a server's, a killed worker's) is swept by a later start once
    empty and ten minutes old."""
    made: dict[Path, Path] = {}
    chosen: dict[str, Path | None] = {}
    for controller in CONTROLLERS:
        root = root_for(controller)
        if root is None:
            chosen[controller] = None
            continue
        if root not in made:
            _sweep(root)
            made[root] = root / name
            made[root].mkdir()
        path = made[root]
        if controller == "pids":
            (path / "pids.max").write_text(str(processes + 4))  # sh/prlimit/bwrap, pid 1
        else:
            _limit_memory(path, memory)
        chosen[controller] = path
    return Cgroups(pids=chosen["pids"], memory=chosen["memory"])


def _limit_memory(path: Path, memory: int) -> None:
    """The limit, and no swap beyond it (v1: memsw, set after the limit it must exceed)."""
    if (path / "memory.max").exists():  # v2
        (path / "memory.max").write_text(str(memory))
        with contextlib.suppress(FileNotFoundError):
            (path / "memory.swap.max").write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(memory))
    with contextlib.suppress(FileNotFoundError):  # no swap accounting on this kernel
        (path / "memory.memsw.limit_in_bytes").write_text(str(memory))


def oom_killed(path: Path | None) -> bool:
    """Whether the kernel killed a process of the memory cgroup `path` for its limit."""
    if path is None:
        return False
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        with contextlib.suppress(OSError):
            for line in (path / name).read_text().splitlines():
                key, _, count = line.partition(" ")
                if key == "oom_kill" and count.strip() not in ("", "0"):
                    return True
    return False


def _remove(path: Path) -> None:
    """rmdir once the killed processes are gone (the kernel reaps them asynchronously)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # left behind empty-to-be; harmless, and swept by a later start
            time.sleep(0.02)


@functools.cache
def root_for(controller: str) -> Path | None:
    """A directory where this process may create cgroups of `controller`, or None."""
    for candidate in _candidates(controller):
        root = candidate / PREFIX
        try:
            root.mkdir(exist_ok=True)
            if not (root / "cgroup.procs").exists():
                continue
            if (candidate / "cgroup.subtree_control").exists():  # cgroup v2
                with contextlib.suppress(OSError):
                    (candidate / "cgroup.subtree_control").write_text(f"+{controller}")
                (root / "cgroup.subtree_control").write_text(f"+{controller}")
            probe = Path(tempfile.mkdtemp(prefix="probe-", dir=root))
            try:
                if controller == "pids":
                    (probe / "pids.max").write_text("8")
                else:
                    _limit_memory(probe, 64 << 20)
            finally:
                probe.rmdir()
        except OSError:
            continue
        _sweep(root)
        return root
    return None


def _candidates(controller: str) -> Iterator[Path]:
    """This process's own cgroup in a v1 hierarchy of `controller`, or in the v2 one."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    own: dict[str, str] = {}
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else ["<v2>"]:
            own[name] = path.lstrip("/")
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and controller in options:
            yield Path(mountpoint) / own.get(controller, "")
        elif fstype == "cgroup2":
            base = Path(mountpoint) / own.get("<v2>", "")
            with contextlib.suppress(OSError):
                if controller in (base / "cgroup.controllers").read_text().split():
                    yield base


def _sweep(root: Path) -> None:
    """Remove cgroups that earlier runs left (a killed worker); busy or recent ones stay."""
    old = time.time() - 600
    for child in root.iterdir():
        with contextlib.suppress(OSError):
            if child.is_dir() and child.stat().st_mtime < old:
                child.rmdir()
