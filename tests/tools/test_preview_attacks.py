"""A red team's attacks on previews (issue 36), as an agent that controls every argument
of run_command and every byte its command writes. Each attack runs a real program in the
real preview sandbox over a real workspace; the ones that once worked fail now, and the
ones that always failed are kept here so that they stay failing."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from dispatcher.policy import effect_rules
from dispatcher.tools import preview, preview_apply, workspace_lock
from tests.tools.test_preview import _by_path, _preview, _tree, workspace

__all__ = ["workspace"]  # the fixture, shared with test_preview


def _apply(effect: preview.Effect, workspace: Path) -> None:
    with workspace_lock.held(workspace):
        preview_apply.apply(effect, workspace)


def _forged_upper_layer() -> bytes:
    """A tar that, read as the last member per path, says "nothing", and applied member by
    member deletes src/ and makes the workspace world-writable."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, mode in (
            (".", tarfile.DIRTYPE, 0o777),
            ("./src", tarfile.CHRTYPE, 0),  # a whiteout: src and all it holds removed
            ("./src", tarfile.DIRTYPE, 0o755),
            (".", tarfile.DIRTYPE, 0o755),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, mode
            tar.addfile(info)
    return buffer.getvalue()


def test_the_program_cannot_write_the_kept_upper_layer(workspace: Path) -> None:
    """The namespace's own descriptors (the upper layer's tar, the facts, the network
    counters) were inherited by the sandboxed program: it wrote a tar of its own choosing
    first, which the reviewer saw as no change and the apply turned into a deletion."""
    (workspace / "forged.tar").write_bytes(_forged_upper_layer())
    os.chmod(workspace, 0o700)
    effect = _preview(
        workspace,
        ["sh", "-c", "echo $(ls /proc/self/fd); cat forged.tar >&5; echo 'status 0' >&6"],
    )
    assert effect.output.splitlines()[0] == "0 1 2 3"  # 5, 6 and 7 closed (3: ls's own)
    assert effect.changes == []
    _apply(effect, workspace)
    assert (workspace / "src" / "a.py").exists()
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700
    preview.discard(effect.store)


def test_an_upper_layer_naming_a_path_twice_is_refused(workspace: Path, tmp_path: Path) -> None:
    """GNU tar of a directory names each path once; a tar that does not is not read (its
    shown effect would be the last member's, its applied effect every member's)."""
    forged = tmp_path / "upper.tar"
    forged.write_bytes(_forged_upper_layer())
    with pytest.raises(preview.PreviewUnavailable, match="twice"):
        preview.read_changes(forged, workspace)


def test_a_name_that_is_not_utf8_or_holds_a_newline(
    workspace: Path, settings: Any, tmp_path: Path
) -> None:
    """A file name of raw bytes (not UTF-8) failed admission (the effect's digest could
    not be taken): now there is no preview, and the call asks saying why. A newline in a
    name is shown and applied as it is."""
    settings.DATA_DIR = tmp_path / "data"  # its own preview store, to see nothing kept
    argv = ["sh", "-c", "printf x > \"$(printf 'bad\\377name')\""]
    with pytest.raises(preview.PreviewUnavailable, match="not UTF-8"):
        _preview(workspace, argv)
    assert os.listdir(preview.store_root()) == ["mnt"]  # nothing kept
    effect = _preview(workspace, ["sh", "-c", "printf x > 'two\nlines'"])
    assert _by_path(effect)["two\nlines"]["change"] == "created"
    _apply(effect, workspace)
    assert (workspace / "two\nlines").read_text() == "x"
    preview.discard(effect.store)


def test_a_hard_link_out_of_an_effect_rules_paths_is_not_allowed(workspace: Path) -> None:
    """`ln src/a.py build/a.py` shows as "create build/a.py", but what is applied links it
    with src/a.py, a path `write: build/**` does not name: a later write to build/a.py by
    a run for real changes src/a.py. The change names its link, and the rule asks."""
    (workspace / "build").mkdir()
    effect = _preview(workspace, ["ln", "src/a.py", "build/a.py"])
    links = {frozenset((c["path"], c["link"])) for c in effect.changes if "link" in c}
    assert links == {frozenset(("build/a.py", "src/a.py"))}  # in the tar's own order
    rule = effect_rules.parse("effect(write: build/**)")
    assert not rule.allows({**effect.document(), "appliable": effect.appliable})
    inside = _preview(workspace, ["sh", "-c", "echo x > build/one; ln build/one build/two"])
    assert rule.allows({**inside.document(), "appliable": inside.appliable})
    for done in (effect, inside):
        preview.discard(done.store)


def test_many_empty_files_stop_at_the_inode_limit(workspace: Path) -> None:
    """Empty files cost a tmpfs no bytes: 50,000 of them with long names in 5 s made an
    80 MiB tar kept on disk and a 22 s admission. The tmpfs has MAX_ENTRIES inodes."""
    code = (
        "import os\nn = 0\ntry:\n while True:\n"
        "  d = 'd%d' % (n // 1000)\n  os.makedirs(d, exist_ok=True)\n"
        "  open(d + '/' + 'x' * 200 + str(n), 'w').close()\n  n += 1\n"
        "except OSError as e:\n print(n, e.strerror)\n"
    )
    effect = _preview(workspace, ["python3", "-c", code])
    assert effect.limit == "files"
    assert "No space left on device" in effect.output
    assert int(effect.output.split()[0]) < preview.MAX_ENTRIES
    assert not effect.appliable and "more files" in effect.why_not_appliable()
    assert effect.store == ""  # never applied, so not kept


def test_a_set_id_file_is_made_in_no_preview(workspace: Path) -> None:
    """`chmod 6755` on a copy of a program: the apply (as root) made a set-user-ID and
    set-group-ID file of the sandbox user's, and the page showed a created file's mode
    nowhere. The mode is in the effect, an effect with such a mode is never applied, and
    the seccomp filter now refuses the bits themselves (a real run made the file too:
    tests/redteam/test_rtsbx_setid.py), so the preview shows the copy as it stays."""
    effect = _preview(workspace, ["sh", "-c", "cp /bin/true su && chmod 6755 su"])
    assert _by_path(effect)["su"]["mode_after"] == "0755"
    assert "Operation not permitted" in effect.output
    assert effect.exit_status == 1
    preview.discard(effect.store)


def test_a_path_longer_than_path_max_is_never_half_applied(workspace: Path) -> None:
    """Twenty directories of 250-byte names, a file at the bottom: the apply wrote the
    rest and failed on that path (ENAMETOOLONG), leaving half an effect."""
    script = (
        "echo x > first; deep=$(printf 'y%.0s' $(seq 250)); "
        "for i in $(seq 20); do mkdir $deep && cd $deep || break; done; echo hi > f"
    )
    effect = _preview(workspace, ["sh", "-c", script])
    assert "first" in _by_path(effect)
    assert not effect.appliable and "longer" in effect.why_not_appliable()
    before = _tree(workspace)
    with workspace_lock.held(workspace), pytest.raises(preview_apply.NotAppliable):
        preview_apply.apply(effect, workspace)
    assert _tree(workspace) == before
    preview.discard(effect.store)


def test_kept_upper_layers_are_bounded(workspace: Path, monkeypatch: Any) -> None:
    """Every asking call kept its upper layer until decided (up to the cap each, 50 asks
    per agent): a preview that hit the cap is never applied and is not kept now, and past
    KEPT_FACTOR caps of kept layers a new call asks without a preview."""
    capped = _preview(workspace, ["sh", "-c", "head -c 8000000 /dev/zero > big"])
    assert capped.limit == "size" and capped.store == ""
    monkeypatch.setattr(preview, "KEPT_FACTOR", 1)
    # (a store of this test's own: layers other tests keep in the process's store until
    # their calls are decided count against the budget too)
    own = preview.store_root() / f"budget-{uuid.uuid4().hex}"
    monkeypatch.setattr(preview, "store_root", lambda: own)
    write = ["sh", "-c", "head -c 3000000 /dev/urandom > part"]
    first = _preview(workspace, write)
    second = _preview(workspace, write)
    with pytest.raises(preview.PreviewUnavailable, match="already hold"):
        _preview(workspace, write)
    for done in (first, second):
        preview.discard(done.store)
    preview.discard(_preview(workspace, write).store)


# --- Attacks that already failed, kept failing --------------------------------------------


def test_a_directory_swapped_for_a_symlink_after_the_check_is_never_followed(
    workspace: Path, tmp_path: Path
) -> None:
    """The check passed; then something outside the lock swaps src/ for a symlink to a
    host directory: the apply replaces the symlink with the directory the effect holds
    (descriptors, no symlink followed) and writes nothing outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    effect = _preview(workspace, ["sh", "-c", "echo planted > src/new.py"])
    with workspace_lock.held(workspace):
        assert preview_apply.check(effect, workspace) is None
        (workspace / "src").rename(workspace / "src-moved")
        (workspace / "src").symlink_to(outside)
        preview_apply.apply(effect, workspace, checked=True)
    assert list(outside.iterdir()) == []
    assert not (workspace / "src").is_symlink()
    assert (workspace / "src" / "new.py").read_text() == "planted\n"
    preview.discard(effect.store)


def test_a_symlink_made_by_the_command_is_applied_as_a_link_only(
    workspace: Path, tmp_path: Path
) -> None:
    """`ln -s HOSTDIR out; echo x > out/f`: in the preview the write went to the sandbox's
    own view (it failed or landed in the private /tmp); what is shown and applied is the
    symlink, never a file in the host directory."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    effect = _preview(workspace, ["sh", "-c", f"ln -s {outside} out; echo x > out/f; ls out"])
    assert [(c["path"], c["kind"]) for c in effect.changes] == [("out", "symlink")]
    _apply(effect, workspace)
    assert os.readlink(workspace / "out") == str(outside)
    assert list(outside.iterdir()) == []
    preview.discard(effect.store)


def test_two_previews_of_one_workspace_apply_once(workspace: Path) -> None:
    """Two calls of a session previewed over the same workspace: once the first is
    applied, the second's world changed and it is never applied."""
    one = _preview(workspace, ["sh", "-c", "echo one > shared.txt"])
    two = _preview(workspace, ["sh", "-c", "echo two > shared.txt; rm notes.txt"])
    _apply(one, workspace)
    with workspace_lock.held(workspace):
        assert preview_apply.check(two, workspace) == "the workspace changed since the preview"
    assert (workspace / "shared.txt").read_text() == "one\n"
    assert (workspace / "notes.txt").exists()
    for done in (one, two):
        preview.discard(done.store)


def test_a_file_changed_on_disk_with_its_mtime_put_back_is_seen(workspace: Path) -> None:
    """Same size, mtime restored: the ctime (and the content hash) still give it away."""
    effect = _preview(workspace, ["sed", "-i", "s/alpha/ALPHA/", "notes.txt"])
    target = workspace / "src" / "a.py"
    info = target.stat()
    target.write_text("print('A')\n")
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    with workspace_lock.held(workspace):
        assert preview_apply.check(effect, workspace) is not None
    preview.discard(effect.store)


def test_a_whiteout_or_socket_made_by_the_command(workspace: Path) -> None:
    """A character device 0:0 (which overlayfs reads as a deletion, and Linux lets anyone
    make) and a Unix socket: the seccomp filter refuses both in the preview as in a real
    run, and what is shown and applied is the deletion alone."""
    code = "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('sock')\n"
    script = f'rm notes.txt; mknod notes.txt c 0 0; python3 -c "{code}"'
    effect = _preview(workspace, ["sh", "-c", script])
    assert "mknod: notes.txt: Operation not permitted" in effect.output
    assert "PermissionError" in effect.output
    assert [(c["path"], c["change"]) for c in effect.changes] == [("notes.txt", "deleted")]
    _apply(effect, workspace)
    assert not os.path.lexists(workspace / "notes.txt")
    assert not os.path.lexists(workspace / "sock")
    preview.discard(effect.store)


@pytest.mark.parametrize(
    "script",
    [
        "mkdir -p build && mv src/a.py build/a.py",  # a rename: a delete outside build/
        "rm -r src; mkdir -p build",  # a delete counted as a write?
        "mkdir -p build && chmod 0777 src",  # a mode change outside
        "mkdir -p build && ln -s ../src build/src && echo x > build/src/x.py",  # through
        "mkdir -p build && echo x > ./build/../notes.txt",  # dots in the command's path
    ],
)
def test_an_effect_rule_does_not_allow_a_write_outside_its_paths(
    workspace: Path, script: str
) -> None:
    effect = _preview(workspace, ["sh", "-c", script])
    assert effect.appliable, effect.why_not_appliable()
    rule = effect_rules.parse("effect(write: build/**, network: none)")
    assert not rule.allows({**effect.document(), "appliable": effect.appliable})
    preview.discard(effect.store)


def test_an_effect_rule_allows_a_symlink_under_its_paths_but_not_what_goes_through(
    workspace: Path,
) -> None:
    rule = effect_rules.parse("effect(write: build/**)")
    made = _preview(workspace, ["sh", "-c", "mkdir build && ln -s ../src build/src"])
    assert rule.allows({**made.document(), "appliable": made.appliable})
    _apply(made, workspace)
    through = _preview(workspace, ["sh", "-c", "echo x > build/src/x.py"])
    assert [c["path"] for c in through.changes] == ["src/x.py"]
    assert not rule.allows({**through.document(), "appliable": through.appliable})
    for done in (made, through):
        preview.discard(done.store)


def test_the_apply_never_writes_through_a_file_waiting_at_its_temporary_name(
    workspace: Path,
) -> None:
    """An earlier run left `build/.out.harness-apply` as a hard link to src/a.py. The
    apply of "create build/out" (all an effect rule `write: build/**` looks at) opened
    that name with O_TRUNC and wrote through it into src/a.py."""
    (workspace / "build").mkdir()
    os.link(workspace / "src" / "a.py", workspace / "build" / ".out.harness-apply")
    effect = _preview(workspace, ["sh", "-c", "echo replaced > build/out"])
    assert [c["path"] for c in effect.changes] == ["build/out"]
    assert effect_rules.parse("effect(write: build/**)").allows(
        {**effect.document(), "appliable": effect.appliable}
    )
    _apply(effect, workspace)
    assert (workspace / "src" / "a.py").read_text() == "print('a')\n"
    assert (workspace / "build" / "out").read_text() == "replaced\n"
    preview.discard(effect.store)


def test_a_file_with_a_255_byte_name_is_applied(workspace: Path) -> None:
    """The temporary name beside it was 16 bytes longer than the file's: a name of 240
    bytes or more failed the apply halfway (ENAMETOOLONG)."""
    name = "n" * 255
    effect = _preview(workspace, ["sh", "-c", f"echo first > a-first; echo x > {name}"])
    assert effect.appliable
    _apply(effect, workspace)
    assert (workspace / name).read_text() == "x\n"
    assert sorted(p.name for p in workspace.iterdir() if "harness" in p.name) == []
    preview.discard(effect.store)


def test_deleting_a_huge_file_never_reads_it_into_memory(workspace: Path) -> None:
    """`rm big` (or `: > big`, which overlayfs copies up without its data): the effect's
    "before" was the whole file read into memory at admission, whatever its size."""
    import resource

    with (workspace / "big").open("wb") as handle:
        handle.truncate(768 << 20)  # sparse: no disk, but 768 MiB to read
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    effect = _preview(workspace, ["sh", "-c", "rm big; : > notes.txt"])
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak  # KiB
    assert grown < 200 << 10, f"the preview grew the process by {grown >> 10} MiB"
    big = _by_path(effect)["big"]
    assert (big["change"], big["size_before"], big["diff"]) == ("deleted", 768 << 20, None)
    assert big["sha256_before"] and big["binary"] is True
    assert _by_path(effect)["notes.txt"]["diff"].startswith("--- before")
    _apply(effect, workspace)
    assert not (workspace / "big").exists()
    preview.discard(effect.store)


def test_huge_diffs_are_bounded_and_say_so(workspace: Path) -> None:
    """Deleting 40 one-line text files of 200 KiB made 8 MiB of diff in the effect (the
    database row, the digest, the reviewer's page), so large the page could not be read.
    Past DIFF_TOTAL a file shows sizes and hashes, marked as such."""
    for n in range(40):
        (workspace / f"min{n:02}.js").write_text("x" * (200 << 10))
    effect = _preview(workspace, ["sh", "-c", "rm min*.js"])
    diffs = [c for c in effect.changes if c.get("diff")]
    omitted = [c for c in effect.changes if c.get("diff_omitted")]
    assert sum(len(c["diff"]) for c in diffs) <= preview.DIFF_TOTAL
    assert len(diffs) + len(omitted) == 40 and omitted
    assert all(c["sha256_before"] and c["size_before"] == 200 << 10 for c in omitted)
    preview.discard(effect.store)


def test_a_program_that_ignores_signals_and_hides_in_a_new_session_is_stopped(
    workspace: Path,
) -> None:
    """SIGTERM ignored, a child in its own session still writing: the preview ends at its
    time limit (then SIGKILL, the sandbox's PID namespace gone), and nothing is applied."""
    import time

    script = (
        "trap '' TERM; setsid sh -c \"trap '' TERM; while :; do echo x >> late; sleep 0.1;"
        ' done" & while :; do sleep 1; done'
    )
    started = time.monotonic()
    effect = _preview(workspace, ["sh", "-c", script])
    assert time.monotonic() - started < 5 + 2 + 10
    assert effect.limit == "time" and not effect.appliable
    time.sleep(0.5)
    assert not (workspace / "late").exists()
