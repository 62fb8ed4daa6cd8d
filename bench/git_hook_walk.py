"""What the file tools' hook check costs (sandbox_git.hook_paths, once per write_file or
delete_file no person approved), and what a memo keyed by the workspace's state could
save of it. Prints figures; gates nothing.

    .venv/bin/python -m bench.git_hook_walk [FILES] [PER_DIRECTORY] [ROUNDS]

The memo's key is what the walk reads that a change could touch: every directory of the
workspace (a `.git` or a bare repository may appear in any: its ctime changes), and the
files the guard reads (here only `.git/config`, `.git/index` and `HEAD`; the guard reads
more). `key` times the cheapest such key, one lstat per directory: what a memo would
cost on every hit at the least.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dispatcher.tools import sandbox_git


def build(root: Path, files: int, per_directory: int) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for n in range(files):
        directory = root / "src" / f"d{n // per_directory // 50}" / f"e{n // per_directory}"
        if n % per_directory == 0:
            directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}.txt").write_text("x\n")


def directories_of(root: Path) -> list[str]:
    """Every directory of the workspace but inside `.git`: what a memo would store."""
    found = []
    for directory, names, _ in os.walk(root):
        found.append(directory)
        names[:] = [name for name in names if name != ".git"]
    return found


def key(root: Path, directories: list[str]) -> list[tuple[int, int, int]]:
    """One lstat per stored directory (no listing: a new entry changes its directory's
    ctime) and the few git files: a lower bound of a key's cost."""
    paths = [*directories, *(str(root / ".git" / name) for name in ("config", "index", "HEAD"))]
    out = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            out.append((info.st_ino, info.st_ctime_ns, info.st_mtime_ns))
    return out


def timed(function: object, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    files = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    per_directory = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary) / "ws"
        root.mkdir()
        build(root, files, per_directory)
        stored = directories_of(root)
        directories = len(stored)
        hooks = timed(lambda: sandbox_git.hook_paths(root), rounds)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            walk = timed(lambda: sandbox_git._git_entries(fd, None, before=True, bare=[]), rounds)
        finally:
            os.close(fd)
        lower = timed(lambda: key(root, stored), rounds)
    print(f"workspace: {files} files in {directories} directories")
    print(f"hook_paths (guard, all of it): {hooks * 1000:8.1f} ms")
    print(f"  of which the walk for .git:   {walk * 1000:8.1f} ms")
    print(f"memo key, lower bound:          {lower * 1000:8.1f} ms")
    print(f"saved per hit at most:          {(hooks - lower) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
