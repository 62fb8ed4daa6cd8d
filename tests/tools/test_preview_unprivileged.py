"""Previews when Harness does not run as root: the namespace is a user namespace of its
own (`unshare --user --map-root-user`), the overlay's lower layer the held workspace
(`lowerdir=/proc/self/cwd`) with `userxattr`. Everything else here runs as root, so the
preview runs in a child of this process that became an unprivileged user (65534, as
`setpriv --reuid=65534 --regid=65534 --clear-groups` would make it: this interpreter's
own files under /root are not that user's to read, so it is forked with them loaded, not
started again), over a workspace that user owns."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import preview, preview_apply, sandbox_cgroups
from dispatcher.tools.run_command import scrubbed_environment
from tests.tools.support import require_bwrap

NOBODY = 65534
OLD = 1_600_000_000  # the workspace's files' modification time (seconds)
TOUCHED = 1_700_000_000  # the time the command gives old.txt, its content unchanged

# What a user namespace must allow for the non-root preview: an unprivileged user maps
# itself to root there, mounts a tmpfs, and an overlay with userxattr on it (Linux 5.11+).
USERNS_PROBE = r"""
t=$(mktemp -d) && mount -t tmpfs probe "$t" && mkdir "$t/l" "$t/u" "$t/w" "$t/m" &&
mount -t overlay probe -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w,userxattr" "$t/m"
"""

COMMAND = [
    "sh",
    "-c",
    f"echo made > made.txt; echo delta >> notes.txt; touch -d @{TOUCHED} old.txt; "
    "rm gone.txt; mkdir -p build/out; echo bin > build/out/app; cat notes.txt",
]


def _user() -> int:
    """The unprivileged uid the previews run as: 65534 when the tests run as root."""
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def _as_user(work: Callable[[], Any]) -> Any:
    """`work()` run in a forked child of this process as uid and gid 65534 with no
    supplementary groups (when the tests run as root; else as they run); its JSON result,
    or its exception re-raised here as AssertionError with the child's traceback."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # An idle pool thread of an earlier test may live on; the child never uses it (it
        # starts programs, each a new process), so the fork cannot wait on it.
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        status = 1
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
            # what root's process found and keeps, found again as this user would
            sandbox_cgroups.root_for.cache_clear()
            try:
                answer = {"result": work()}
            except BaseException:
                answer = {"error": traceback.format_exc()}
            with os.fdopen(write, "w") as out:
                json.dump(answer, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as answer_pipe:
        text = answer_pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and text, f"the child ended {status}: {text}"
    answer = json.loads(text)
    if "error" in answer:
        raise AssertionError(f"as uid {_user()}:\n{answer['error']}")
    return answer["result"]


def _userns_problem() -> str | None:
    """Why an unprivileged user gets no user namespace with mounts here, or None."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", USERNS_PROBE]

    def attempt() -> str | None:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        return None if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"

    found: str | None = _as_user(attempt)
    return found


def _userns_switched_off() -> str | None:
    """The kernel setting that keeps unprivileged users from user namespaces, or None."""
    for name, off in (
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),  # Debian's older kernels
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),  # Ubuntu 23.10+
    ):
        with contextlib.suppress(OSError):
            if Path(name).read_text().strip() == off:
                return f"{name} is {off}"
    return None


def _require_userns() -> None:
    """Skip (saying why) unless an unprivileged user gets a user namespace with tmpfs and
    overlayfs mounts here. Under CI=true a machine whose kernel lets them (no setting
    switches them off) fails instead: there the test must run."""
    problem = _userns_problem()
    if problem is None:
        return
    message = (
        "Previews as a user other than root need unprivileged user namespaces with tmpfs "
        "and overlayfs mounts (Linux 5.11+, kernel.unprivileged_userns_clone=1, no AppArmor "
        f"userns restriction); here uid {_user()} got none: {problem}"
    )
    switched_off = _userns_switched_off()
    if os.environ.get("CI") == "true" and switched_off is None:
        pytest.fail("CI=true, no kernel setting switches user namespaces off, and " + message)
    pytest.skip(message + (f" ({switched_off})" if switched_off else ""))


@pytest.fixture
def unprivileged(settings: Any) -> Iterator[Path]:
    """A workspace of the unprivileged user's own, and Harness's data directory too, in
    directories that user can reach (pytest's tmp_path is root's alone)."""
    require_bwrap()
    _require_userns()
    top = Path(tempfile.mkdtemp(prefix="harness-unprivileged-"))
    try:
        for name in ("data", "workspaces/mine"):
            (top / name).mkdir(parents=True)
        settings.DATA_DIR = top / "data"
        settings.HARNESS_WORKSPACE_ROOT = top / "workspaces"
        settings.HARNESS_SANDBOX = "bwrap"
        settings.HARNESS_SANDBOX_NETWORK = False
        settings.HARNESS_PREVIEW_TIMEOUT = 10
        settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
        mine = top / "workspaces" / "mine"
        (mine / "notes.txt").write_text("alpha\nbeta\n")
        (mine / "old.txt").write_text("as it was\n")
        (mine / "gone.txt").write_text("to be removed\n")
        (mine / "src").mkdir()
        (mine / "src" / "a.py").write_text("print('a')\n")
        for path in [top, top / "data", top / "workspaces", *top.glob("workspaces/**/*")]:
            if os.geteuid() == 0:
                os.chown(path, NOBODY, NOBODY)
            if path.is_file():
                os.utime(path, (OLD, OLD))
        yield mine
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _tree(root: Path) -> dict[str, Any]:
    """Every entry below `root`: kind, owner, mode, bytes and modification time."""
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        content = path.read_text() if stat.S_ISREG(info.st_mode) else ""
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        found[str(path.relative_to(root))] = [
            kind,
            info.st_uid,
            stat.S_IMODE(info.st_mode),
            content,
            info.st_mtime_ns if kind == "file" else 0,
        ]
    return found


def test_a_preview_as_an_unprivileged_user_shows_the_effect_and_leaves_the_workspace(
    unprivileged: Path,
) -> None:
    """run_preview as uid 65534 (the `unshare --user` branch): the reviewer sees what the
    command created, changed, touched and deleted, what it printed; the workspace is as
    it was; and applying the effect (as that user) gives what the command would have."""
    workspace = unprivileged
    before = _tree(workspace)

    def previewed() -> dict[str, Any]:
        assert os.geteuid() == _user() != 0
        effect = preview.run_preview(
            COMMAND, cwd=workspace, workspace=workspace, env=scrubbed_environment(workspace)
        )
        seen = {"effect": effect.document(), "appliable": effect.appliable}
        seen["namespace"] = preview._namespace_prefix()  # the branch this user takes
        seen["summary"], seen["after_preview"] = effect.summary(), _tree(workspace)
        seen["why_not"] = "" if effect.appliable else effect.why_not_appliable()
        if effect.appliable:
            preview_apply.apply(effect, workspace)
            preview.discard(effect.store)
        seen["after_apply"] = _tree(workspace)
        return seen

    seen = _as_user(previewed)
    effect = seen["effect"]
    assert seen["namespace"] == [
        ["unshare", "--user", "--map-root-user", "--mount", "--net", "--propagation", "private"],
        ",userxattr",
    ]
    assert seen["after_preview"] == before  # the preview wrote nothing to the workspace
    assert seen["appliable"], seen["why_not"]
    assert effect["exit_text"] == "0" and effect["output"] == "alpha\nbeta\ndelta\n", effect
    changes = {change["path"]: change for change in effect["changes"]}
    assert {path: change["change"] for path, change in changes.items()} == {
        "made.txt": "created",
        "notes.txt": "changed",
        "old.txt": "touched",
        "gone.txt": "deleted",
        "build": "created",
        "build/out": "created",
        "build/out/app": "created",
    }, effect["changes"]
    assert "+delta" in changes["notes.txt"]["diff"], changes["notes.txt"]
    assert seen["summary"] == "This command would: change 1 file, create 2, delete 1, touch 1"
    assert not effect["network_attempted"] and not effect["limit"], effect
    after = seen["after_apply"]  # the apply: exactly what the command would have done
    assert after["made.txt"][1:4] == [_user(), 0o644, "made\n"], after
    assert after["notes.txt"][3] == "alpha\nbeta\ndelta\n"
    assert after["old.txt"][3:] == ["as it was\n", TOUCHED * 10**9], after["old.txt"]
    assert after["build/out/app"][3] == "bin\n" and after["build/out"][1] == _user()
    assert "gone.txt" not in after and after["src/a.py"] == before["src/a.py"]
