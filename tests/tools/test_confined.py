"""The file tools against a workspace that changes under them (red-team finding "paths").

An agent's own program can swap a directory `x` of a checked path for a symlink to a
directory outside the workspace between the tool's check and its I/O. Each tool is
tested at that exact moment (the swap is done right after the tool's check returns) and
then against a real race (another process flipping `x` as fast as it can): nothing
outside may be read, written, listed or deleted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dispatcher.tools import _confined, delete_file, list_directory, read_file, search_files
from dispatcher.tools import write_file as write_file_module
from dispatcher.tools.base import ExecutionContext, ToolError

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

SECRET = "OUTSIDE-SECRET"
# the refusals: the path changed under the tool, or (checked again) now leads outside
REFUSED = "changed while the tool was using it|outside the session workspace"
INSIDE = "inside-text"


class Scene:
    """ws/x is a real directory; outside/ holds what must never be touched."""

    def __init__(self, tmp_path: Path) -> None:
        self.ws = tmp_path / "ws"
        self.outside = tmp_path / "outside"
        for directory in (self.ws / "x", self.outside):
            directory.mkdir(parents=True)
            (directory / "secret.txt").write_text(
                f"{SECRET if directory == self.outside else INSIDE}\n"
            )
            (directory / "victim.txt").write_text("keep me\n")
        (self.outside / "outside-only.txt").write_text("listed only outside\n")
        self.swapped = False

    def swap(self) -> None:
        """x becomes a symlink to outside/ (the real directory moves to x.real)."""
        if not self.swapped:
            self.swapped = True
            (self.ws / "x").rename(self.ws / "x.real")
            (self.ws / "x").symlink_to(self.outside)

    def untouched(self) -> bool:
        return (
            sorted(p.name for p in self.outside.iterdir())
            == [
                "outside-only.txt",
                "secret.txt",
                "victim.txt",
            ]
            and (self.outside / "secret.txt").read_text() == f"{SECRET}\n"
        )

    def ctx(self) -> ExecutionContext:
        return ExecutionContext(workspace=self.ws, call_id="t", timeout=10, output_limit=100_000)


@pytest.fixture(params=["openat2", "walk"])
def scene(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scene:
    """Both backends of `_confined`: openat2(2), and the O_NOFOLLOW walk used without it."""
    if request.param == "walk":
        monkeypatch.setattr(_confined, "_openat2_works", False)
    return Scene(tmp_path)


def swap_after_check(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, scene: Scene, *, calls: int = 1
) -> None:
    """The swap, done just after the tool's workspace check returns (its last check:
    delete_file checks the path, then its directory)."""
    done = 0
    for name in ("resolve_in_workspace", "path_violation"):
        check = getattr(module, name, None)
        if check is None:
            continue

        def checked_then_swapped(*args: Any, _check: Callable[..., Any] = check) -> Any:
            nonlocal done
            result = _check(*args)
            done += 1
            if done == calls:
                scene.swap()
            return result

        monkeypatch.setattr(module, name, checked_then_swapped)


# --- the exact moment, per tool -----------------------------------------------------------


def test_read_file_does_not_read_through_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, read_file, scene)
    with pytest.raises(ToolError, match=REFUSED) as caught:
        read_file.TOOL.execute(scene.ctx(), {"path": "x/secret.txt"})
    assert SECRET not in str(caught.value)
    assert scene.swapped and scene.untouched()


def test_write_file_does_not_write_through_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, write_file_module, scene)
    with pytest.raises(ToolError, match=REFUSED):
        write_file_module.TOOL.execute(scene.ctx(), {"path": "x/new.txt", "content": "pwned"})
    assert scene.swapped and scene.untouched()


def test_write_file_does_not_create_parents_through_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, write_file_module, scene)
    with pytest.raises(ToolError, match=REFUSED):
        write_file_module.TOOL.execute(scene.ctx(), {"path": "x/new/dir/f.txt", "content": "p"})
    assert scene.swapped and scene.untouched()


def test_write_file_overwrite_does_not_follow_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, write_file_module, scene)
    with pytest.raises(ToolError, match=REFUSED):
        write_file_module.TOOL.execute(scene.ctx(), {"path": "x/secret.txt", "content": "p"})
    assert scene.swapped and scene.untouched()


def test_present_write_does_not_show_a_file_behind_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, write_file_module, scene)
    shown = write_file_module.present_write({"path": "x/secret.txt", "content": "new\n"}, scene.ws)
    assert SECRET not in str(shown)
    assert shown["new_file"] is True
    assert scene.swapped and scene.untouched()


def test_delete_file_does_not_delete_through_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, delete_file, scene, calls=2)
    with pytest.raises(ToolError, match=REFUSED):
        delete_file.TOOL.execute(scene.ctx(), {"path": "x/victim.txt"})
    assert scene.swapped and scene.untouched()
    assert (scene.ws / "x.real" / "victim.txt").exists()


def test_list_directory_does_not_list_a_swapped_directory(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, list_directory, scene)
    with pytest.raises(ToolError, match=REFUSED) as caught:
        list_directory.TOOL.execute(scene.ctx(), {"path": "x"})
    assert "outside-only" not in str(caught.value)
    assert scene.swapped


def test_search_files_does_not_search_a_swapped_start(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_after_check(monkeypatch, search_files, scene)
    try:
        result = str(
            search_files.TOOL.execute(scene.ctx(), {"pattern": "SECRET|inside", "path": "x"})
        )
    except ToolError as error:
        result = str(error)
    assert SECRET not in result
    assert scene.swapped


def test_search_files_does_not_read_a_file_behind_a_directory_swapped_mid_walk(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap lands while the walk is inside x: after a file's path was checked (the
    old per-file check) or once the walk holds x open."""
    real_resolve = pathlib.Path.resolve
    real_fwalk = os.fwalk

    def resolve_then_swap(self: Path, strict: bool = False) -> Path:
        resolved = real_resolve(self, strict=strict)
        if resolved.parent == scene.ws / "x":
            scene.swap()
        return resolved

    def fwalk_then_swap(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for item in real_fwalk(*args, **kwargs):
            if Path(item[0]).name == "x":
                scene.swap()
            yield item

    monkeypatch.setattr(pathlib.Path, "resolve", resolve_then_swap)
    monkeypatch.setattr(os, "fwalk", fwalk_then_swap)
    result = str(search_files.TOOL.execute(scene.ctx(), {"pattern": "SECRET|inside"}))
    assert SECRET not in result
    assert scene.swapped


# --- the primitives ------------------------------------------------------------------------


def test_open_beneath_refuses_a_symlink_anywhere_in_the_path(scene: Scene) -> None:
    scene.swap()
    for path in (scene.ws / "x" / "secret.txt", scene.ws / "x"):
        with pytest.raises(OSError) as caught:
            _confined.open_beneath(scene.ws, path, _confined.READ)
        assert _confined.changed(caught.value)


def test_open_beneath_refuses_a_path_outside_the_root(scene: Scene) -> None:
    for path in (scene.outside / "secret.txt", scene.ws / ".." / "outside" / "secret.txt"):
        with pytest.raises(OSError) as caught:
            _confined.open_beneath(scene.ws, path, _confined.READ)
        assert caught.value.errno == errno.EXDEV


def test_open_beneath_reads_a_plain_path_and_the_root(scene: Scene) -> None:
    with _confined.opened(scene.ws, scene.ws.resolve() / "x" / "secret.txt", _confined.READ) as fd:
        assert _confined.read_at_most(fd, 100) == f"{INSIDE}\n".encode()
    with _confined.opened(scene.ws, scene.ws.resolve(), _confined.READ) as fd:
        assert "x" in os.listdir(fd)


def test_directory_beneath_creates_missing_parents_but_not_through_a_symlink(scene: Scene) -> None:
    with _confined.directory_beneath(scene.ws, scene.ws.resolve() / "a" / "b", create=True):
        pass
    assert (scene.ws / "a" / "b").is_dir()
    scene.swap()
    new = scene.ws.resolve() / "x" / "new"
    with pytest.raises(OSError) as caught, _confined.directory_beneath(scene.ws, new, create=True):
        pass
    assert _confined.changed(caught.value)
    assert scene.untouched()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="openat2 is Linux-only")
def test_openat2_is_used_on_this_kernel(tmp_path: Path) -> None:
    """The development kernel has openat2 (5.6+); the walk is only the fallback."""
    fd = _confined._openat2(os.open(tmp_path, os.O_RDONLY), ".", _confined.READ, 0)
    assert fd is not None
    os.close(fd)
    assert _confined._openat2_works


# --- a real race ---------------------------------------------------------------------------

FLIPPER = """
import os, sys, time
os.chdir(sys.argv[1])
os.symlink(sys.argv[2], "x.link")
made = 0
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    try:
        os.replace("x", "x.dir"); os.replace("x.link", "x")
        os.replace("x", "x.link"); os.replace("x.dir", "x")
    except OSError:  # write_file made a directory x while x was missing: move it aside
        while os.path.lexists("x.dir"):
            made += 1
            try:
                if os.path.islink("x"):
                    os.replace("x", "x.link")
                elif os.path.lexists("x"):
                    os.rename("x", f"made.{made}")
                os.replace("x.dir", "x")
            except OSError:
                pass
"""

RACE_SECONDS = 0.7


def escaped_read(scene: Scene) -> bool:
    try:
        return SECRET in str(read_file.TOOL.execute(scene.ctx(), {"path": "x/secret.txt"}))
    except ToolError:
        return False


def escaped_present(scene: Scene) -> bool:
    shown = write_file_module.present_write({"path": "x/secret.txt", "content": "n\n"}, scene.ws)
    return SECRET in str(shown)


def escaped_write(scene: Scene) -> bool:
    with contextlib.suppress(ToolError):
        write_file_module.TOOL.execute(scene.ctx(), {"path": "x/new.txt", "content": "pwned"})
    return (scene.outside / "new.txt").exists()


def escaped_delete(scene: Scene) -> bool:
    with contextlib.suppress(ToolError):
        delete_file.TOOL.execute(scene.ctx(), {"path": "x/victim.txt"})
    gone = not (scene.outside / "victim.txt").exists()
    if gone:
        (scene.outside / "victim.txt").write_text("keep me\n")
    return gone


def escaped_list(scene: Scene) -> bool:
    try:
        return "outside-only" in str(list_directory.TOOL.execute(scene.ctx(), {"path": "x"}))
    except ToolError:
        return False


def escaped_search(scene: Scene) -> bool:
    try:
        return SECRET in str(search_files.TOOL.execute(scene.ctx(), {"pattern": "SECRET"}))
    except ToolError:
        return False


@pytest.mark.parametrize(
    "attempt",
    [escaped_read, escaped_present, escaped_write, escaped_delete, escaped_list, escaped_search],
    ids=lambda attempt: attempt.__name__.removeprefix("escaped_"),
)
def test_no_escape_while_another_process_flips_the_directory(
    tmp_path: Path, attempt: Callable[[Scene], bool]
) -> None:
    """Another process (not a thread: the GIL would serialize it with the tool) swaps x
    for a symlink to outside/ and back as fast as it can while the tool runs again and
    again. Before the fix every tool here escaped within a fraction of a second."""
    scene = Scene(tmp_path)
    flipper = subprocess.Popen(
        [sys.executable, "-c", FLIPPER, str(scene.ws), str(scene.outside), str(RACE_SECONDS)]
    )
    tries = escapes = crashes = 0
    try:
        time.sleep(0.05)  # let it start flipping
        while flipper.poll() is None:
            tries += 1
            try:
                escapes += attempt(scene)
            except OSError:  # not a ToolError: the tool let an I/O error through
                crashes += 1
    finally:
        flipper.kill()
        flipper.wait()
    assert flipper.returncode == 0, "the flipper failed: the race did not run"
    assert tries > 20
    assert escapes == 0, f"{escapes} escapes in {tries} tries"
    assert crashes == 0, f"{crashes} unhandled OSErrors in {tries} tries"
    assert (scene.outside / "secret.txt").read_text() == f"{SECRET}\n"
    assert not (scene.outside / "new.txt").exists()
