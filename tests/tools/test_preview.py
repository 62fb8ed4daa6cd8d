"""Previews of real commands in the real sandbox over real workspaces: what the effect
says, that the workspace is untouched, that applying gives exactly the previewed
workspace (bytes and modes), and that a changed world refuses the apply."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import preview, preview_apply, workspace_lock
from dispatcher.tools.run_command import scrubbed_environment
from tests.tools.support import require_bwrap


@pytest.fixture
def workspace(settings: Any, tmp_path: Path) -> Iterator[Path]:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW_TIMEOUT = 5
    settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
    root = tmp_path / "workspaces"
    settings.HARNESS_WORKSPACE_ROOT = root
    mine = root / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (mine / "src").mkdir()
    (mine / "src" / "a.py").write_text("print('a')\n")
    (mine / "src" / "b.py").write_text("print('b')\n")
    (mine / "blob.bin").write_bytes(bytes(range(256)) * 4)
    yield mine


def _preview(workspace: Path, argv: list[str]) -> preview.Effect:
    with workspace_lock.held(workspace):
        return preview.run_preview(
            argv, cwd=workspace, workspace=workspace, env=scrubbed_environment(workspace)
        )


def _tree(root: Path) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry below `root`: kind, mode, and bytes (files) or target (symlinks)."""
    found: dict[str, tuple[str, int, bytes | str]] = {}
    for top, directories, files in os.walk(root):
        for name in [*directories, *files]:
            path = Path(top, name)
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", stat.S_IMODE(info.st_mode), b"")
            else:
                found[rel] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
    return found


def _by_path(effect: preview.Effect) -> dict[str, dict[str, Any]]:
    return {change["path"]: change for change in effect.changes}


def _apply_matches_real_run(workspace: Path, argv: list[str], tmp_path: Path) -> preview.Effect:
    """Preview, check the workspace is untouched, apply; then run the command for real in
    a copy of the original and compare the two trees byte for byte, modes included."""
    twin = tmp_path / "workspaces" / "twin"
    subprocess.run(["cp", "-a", str(workspace), str(twin)], check=True)
    before = _tree(workspace)
    effect = _preview(workspace, argv)
    assert _tree(workspace) == before  # the preview wrote nothing
    with workspace_lock.held(workspace):
        preview_apply.apply(effect, workspace)
    from dispatcher.tools import sandbox

    env = scrubbed_environment(twin)
    limits = sandbox.Limits(timeout=20, output_chars=10_000)
    done = sandbox.run(argv, workspace=twin, cwd=twin, env=env, limits=limits)
    assert done.returncode == effect.exit_status
    assert _tree(workspace) == _tree(twin)
    preview.discard(effect.store)
    return effect


def test_sed_in_place_is_a_diff_and_applies_exactly(workspace: Path, tmp_path: Path) -> None:
    effect = _apply_matches_real_run(
        workspace, ["sed", "-i", "s/beta/BETA/", "notes.txt"], tmp_path
    )
    change = _by_path(effect)["notes.txt"]
    assert change["change"] == "changed"
    assert "-beta\n+BETA\n" in change["diff"]
    assert effect.summary() == "This command would: change 1 file"
    assert effect.exit_status == 0 and effect.appliable
    assert (workspace / "notes.txt").read_text() == "alpha\nBETA\ngamma\n"


def test_a_file_only_touched_is_shown_and_applies_its_time(workspace: Path, tmp_path: Path) -> None:
    # Its content and mode unchanged, a touched file was applied (its modification time
    # set, which make and other build tools read) but never shown: the effect said
    # "change no files".
    argv = ["touch", "-d", "2001-02-03 04:05:06 UTC", "notes.txt"]
    effect = _apply_matches_real_run(workspace, argv, tmp_path)
    change = _by_path(effect)["notes.txt"]
    assert change["change"] == "touched" and change["mtime_after"] == "2001-02-03 04:05:06 UTC"
    assert change["mtime_before"] != change["mtime_after"]
    assert effect.summary() == "This command would: touch 1 file"
    assert int((workspace / "notes.txt").stat().st_mtime) == 981173106
    # A file only read is not copied up: nothing to show.
    assert _preview(workspace, ["cat", "notes.txt"]).changes == []


def test_rm_mkdir_mv_chmod_and_a_script(workspace: Path, tmp_path: Path) -> None:
    script = (
        "rm notes.txt; mkdir -p build/out/deep; mv src/b.py src/c.py; chmod 0700 src/a.py; "
        "printf 'one\\n' > build/one.txt; printf 'two\\n' > build/out/two.txt; "
        "head -c 300 /dev/zero > build/random.bin; ln -s one.txt build/link; echo done"
    )
    effect = _apply_matches_real_run(workspace, ["sh", "-c", script], tmp_path)
    changes = _by_path(effect)
    assert changes["notes.txt"]["change"] == "deleted"
    assert changes["src/b.py"]["change"] == "deleted"
    assert changes["src/c.py"]["change"] == "created"
    assert changes["src/a.py"]["change"] == "mode"
    assert (changes["src/a.py"]["mode_before"], changes["src/a.py"]["mode_after"]) == (
        "0644",
        "0700",
    )
    assert changes["build/out/deep"]["kind"] == "dir"
    assert changes["build/random.bin"]["binary"] is True
    assert changes["build/random.bin"]["size_after"] == 300
    assert changes["build/link"]["target"] == "one.txt"
    assert effect.output.strip() == "done"
    counts = effect.counts()
    assert (counts["created"], counts["deleted"], counts["mode"]) == (5, 2, 1)


def test_rm_r_of_a_directory_lists_each_file(workspace: Path, tmp_path: Path) -> None:
    effect = _apply_matches_real_run(workspace, ["rm", "-r", "src"], tmp_path)
    deleted = {c["path"] for c in effect.changes if c["change"] == "deleted"}
    assert deleted == {"src", "src/a.py", "src/b.py"}
    assert not (workspace / "src").exists()
    assert effect.summary() == "This command would: delete 2 files"


def test_git_commit_all(workspace: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(workspace), "GIT_CONFIG_COUNT": "1"}
    env |= {"GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    for argv in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@example.com"],
        ["git", "config", "user.name", "T"],
        ["git", "add", "."],
        ["git", "commit", "-qm", "one"],
    ):
        subprocess.run(argv, cwd=workspace, check=True, env=env)
    (workspace / "notes.txt").write_text("changed\n")
    subprocess.run(["chown", "-R", "harness-sandbox:", str(workspace)], check=False)
    effect = _preview(workspace, ["git", "commit", "-qam", "two"])
    paths = _by_path(effect)
    assert ".git/index" in paths and paths[".git/index"]["binary"] is True
    assert any(p.startswith(".git/objects/") for p in paths)
    with workspace_lock.held(workspace):
        preview_apply.apply(effect, workspace)
    log = subprocess.run(
        ["git", "log", "--format=%s"], cwd=workspace, env=env, capture_output=True, text=True
    )
    assert log.stdout.split() == ["two", "one"]
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=workspace, env=env, capture_output=True, text=True
    )
    assert status.stdout == ""
    preview.discard(effect.store)


def test_a_loop_hits_the_time_limit(workspace: Path) -> None:
    effect = _preview(workspace, ["sh", "-c", "echo started; touch made; while :; do :; done"])
    assert effect.limit == "time"
    assert not effect.appliable
    assert "time limit" in effect.why_not_appliable()
    assert "started" in effect.output
    assert "made" in _by_path(effect)
    preview.discard(effect.store)


def _running(word: str) -> list[int]:
    """Processes of this machine whose command line holds `word`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and word.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_output_past_the_cap_ends_the_preview_and_everything_it_started(
    workspace: Path, settings: Any
) -> None:
    # `timeout` made itself a process group of its own, so stopping the preview for its
    # output left the program running until the time limit, and the call waiting for it.
    # (A 30 s limit, not 5 s: a loaded host's sandboxed start took more than half of 5 s.)
    settings.HARNESS_PREVIEW_TIMEOUT = 30
    word = f"{os.getpid() % 9000 + 1000}.5"  # a `sleep` no other test runs
    effect = _preview(workspace, ["sh", "-c", f"head -c 9000000 /dev/zero; sleep {word}"])
    assert effect.limit == "output"
    assert effect.seconds < 15  # well under the 30 s time limit
    deadline = time.monotonic() + 10
    while _running(f"sleep {word}") and time.monotonic() < deadline:
        time.sleep(0.05)  # a killed process is gone once the kernel has reaped it
    assert _running(f"sleep {word}") == []
    preview.discard(effect.store)


def test_a_write_past_the_size_cap(workspace: Path) -> None:
    effect = _preview(workspace, ["sh", "-c", "head -c 8000000 /dev/zero > big; echo $?"])
    assert effect.limit == "size"
    assert not effect.appliable
    assert not (workspace / "big").exists()
    preview.discard(effect.store)


def test_a_network_attempt_is_seen_and_fails(workspace: Path) -> None:
    code = (
        "import socket\n"
        "try:\n socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        "except OSError as e:\n print('failed', e.errno)\n"
    )
    effect = _preview(workspace, ["python3", "-c", code])
    assert effect.network_attempted
    assert "failed" in effect.output
    assert not effect.appliable
    assert "network" in effect.summary()
    quiet = _preview(workspace, ["true"])
    assert not quiet.network_attempted and quiet.changes == []
    for done in (effect, quiet):
        preview.discard(done.store)


def test_a_changed_file_refuses_the_apply(workspace: Path) -> None:
    effect = _preview(workspace, ["sed", "-i", "s/alpha/ALPHA/", "notes.txt"])
    (workspace / "src" / "a.py").write_text("print('changed meanwhile')\n")
    with workspace_lock.held(workspace), pytest.raises(preview_apply.NotAppliable) as refused:
        preview_apply.apply(effect, workspace)
    assert "changed since the preview" in str(refused.value)
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"
    preview.discard(effect.store)
    assert not Path(effect.store).exists()


def test_the_digest_covers_the_effect(workspace: Path) -> None:
    one = _preview(workspace, ["sed", "-i", "s/alpha/A/", "notes.txt"])
    two = _preview(workspace, ["sed", "-i", "s/alpha/B/", "notes.txt"])
    assert one.digest != two.digest
    stored = one.stored()
    assert preview_apply.effect_from(stored).digest == one.digest
    stored["changes"][0]["diff"] = "forged"
    with pytest.raises(preview_apply.NotAppliable):
        preview_apply.effect_from(stored)
    for done in (one, two):
        preview.discard(done.store)
        assert not Path(done.store).exists()


def test_bad_preview_settings_fail_at_start_up(settings: Any) -> None:
    from dispatcher import checks

    settings.HARNESS_PREVIEW_TIMEOUT = 0
    settings.HARNESS_PREVIEW_MAX_BYTES = 1000
    errors = checks.check_previews()
    assert [e.id for e in errors] == ["dispatcher.E045", "dispatcher.E045"]
    assert "HARNESS_PREVIEW_TIMEOUT must be a positive number" in errors[0].msg


def test_a_symlink_swapped_for_a_directory_never_reads_or_writes_the_host(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "etc").symlink_to("/etc")
    shadow = _host_file_state(Path("/etc/shadow"))
    effect = _apply_matches_real_run(
        workspace, ["sh", "-c", "rm etc && mkdir etc && echo mine > etc/shadow"], tmp_path
    )
    changes = _by_path(effect)
    etc = [(c["change"], c["kind"]) for c in effect.changes if c["path"] == "etc"]
    assert sorted(etc) == [("created", "dir"), ("deleted", "symlink")]
    assert changes["etc/shadow"]["change"] == "created"
    assert changes["etc/shadow"]["diff"].endswith("+mine\n")
    assert "root:" not in str(effect.document())  # the host's file was never read
    assert (workspace / "etc" / "shadow").read_text() == "mine\n"
    assert _host_file_state(Path("/etc/shadow")) == shadow


def _host_file_state(path: Path) -> bytes | tuple[int, int, int]:
    """What `path` holds, or, where this user may not read it (/etc/shadow when the tests
    run unprivileged), its inode, size and modification time: a write changes either."""
    if os.access(path, os.R_OK):
        return path.read_bytes()
    info = path.stat()
    return info.st_ino, info.st_size, info.st_mtime_ns


def test_a_fifo_is_shown_and_makes_the_effect_run_for_real(workspace: Path) -> None:
    effect = _preview(workspace, ["mkfifo", "pipe"])
    assert _by_path(effect)["pipe"]["kind"] == "special"
    assert not effect.appliable and "special file" in effect.why_not_appliable()
    preview.discard(effect.store)
