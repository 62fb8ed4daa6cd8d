"""Red team (rte): review of the merged fixes 729cd55..86bfdca. Each test is a hole the
reviewer found in a fix, reproduced with real requests and the real worker path."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from tests.tools.test_preview import workspace

__all__ = ["workspace"]


@pytest.mark.django_db
def test_an_edited_write_binds_to_the_file_the_editor_saw(agent: Any, reviewer: Any) -> None:
    """The reviewer sees a diff against notes.txt ("alpha/beta"), and edits the content.
    Before the edit, the file gained a line. The edit counts as the editor's approval and
    the replacement's presentation (and so its bound hash) was made at the edit, against
    the file the editor never saw: the worker wrote, dropping the line. The approved diff
    binds (7020d0c) only what a reviewer was shown; an edit approves what it was shown."""
    from django.test import Client

    from dispatcher import execution
    from dispatcher.models import AgentSession, Status, ToolCall
    from tests.approvals.conftest import ask, start_session
    from tests.approvals.test_edit import edit

    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    approval = ask(agent, {"path": "notes.txt", "content": "alpha\nBETA\n"}, session_id=session_id)
    assert "-beta" in approval.presentation["diff"]
    (workspace / "notes.txt").write_text("alpha\nbeta\nkeep: the editor never saw me go\n")
    client = Client()
    client.force_login(reviewer)
    response = edit(client, approval, content="alpha\nBeta\n")
    assert response.status_code == 200, response.content
    new = ToolCall.objects.get(edited_from=approval.call_id)
    if new.status == Status.QUEUED:
        execution.execute_call(str(new.pk))
    # What the editor approved ("beta" -> "Beta" against the file they saw), or nothing.
    assert "keep: the editor never saw me go" in (workspace / "notes.txt").read_text()
    assert new.status == Status.PENDING_APPROVAL  # asked again, with the diff as it is now
    assert "-keep: the editor never saw me go" in new.approval.presentation["diff"]


@pytest.mark.django_db
def test_an_edit_naming_another_existing_file_asks_again(agent: Any, reviewer: Any) -> None:
    """The editor saw a diff against notes.txt and edits the path to config.txt, which
    holds content nobody showed them: the edit is not their approval of overwriting it."""
    from django.test import Client

    from dispatcher.models import AgentSession, Status, ToolCall
    from tests.approvals.conftest import ask, start_session
    from tests.approvals.test_edit import edit

    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "notes.txt").write_text("alpha\n")
    (workspace / "config.txt").write_text("never shown\n")
    approval = ask(agent, {"path": "notes.txt", "content": "beta\n"}, session_id=session_id)
    client = Client()
    client.force_login(reviewer)
    arguments = '{"path": "config.txt", "content": "beta\\n"}'
    response = edit(client, approval, arguments=arguments)
    assert response.status_code == 200, response.content
    new = ToolCall.objects.get(edited_from=approval.call_id)
    assert new.status == Status.PENDING_APPROVAL
    assert "-never shown" in new.approval.presentation["diff"]


def test_give_to_sandbox_walks_a_deep_tree_under_the_usual_descriptor_limit(
    workspace: Path,
) -> None:
    """7f2ca0d replaced os.fwalk's recursion with a stack holding one open descriptor a
    level: a tree 1,200 deep needs 1,200 descriptors at once. Under the soft limit most
    hosts give a service (1024: systemd's default, a shell's ulimit -n), the walk raised
    EMFILE, and since the workspace's root is given last, at every run (each run failed,
    as RecursionError did before)."""
    import resource

    from dispatcher.tools import preview_apply, sandbox
    from tests.redteam.test_preview_effect_sweep import DEPTH, _deep_tree

    _deep_tree(workspace, None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        sandbox.give_to_sandbox(workspace)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        owner = sandbox._owner()
        leaf = workspace / "deep" / Path(*["a"] * (DEPTH - 1)) / "leaf.txt"
        given = (leaf.lstat().st_uid, leaf.lstat().st_gid) == owner
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
        try:
            preview_apply._remove_tree("deep", fd)
        finally:
            os.close(fd)
    assert owner is not None and given


def test_a_level_opened_again_must_be_the_directory_it_was(tmp_path: Path) -> None:
    """The bounded walk opens a far level again by name: a directory swapped meanwhile
    (for a symlink outside, or for another directory) is not walked."""
    from dispatcher.tools import sandbox

    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    fd = os.open(root, sandbox._WALK_FLAGS)
    child = os.open(root / "a", sandbox._WALK_FLAGS)
    stack = [
        sandbox._Level(root, fd, iter(()), sandbox._identity(fd)),
        sandbox._Level(root / "a", None, iter(()), sandbox._identity(child)),
    ]
    os.close(child)
    try:
        (root / "a").rename(root / "was-a")
        (root / "a").symlink_to(outside)
        assert not sandbox._reopen(stack) and len(stack) == 1
        (root / "a").unlink()
        (root / "a").mkdir()  # another directory under the same name
        stack.append(sandbox._Level(root / "a", None, iter(()), (0, 0)))
        assert not sandbox._reopen(stack) and len(stack) == 1
    finally:
        os.close(fd)


@pytest.mark.django_db(transaction=True)
def test_a_device_code_sent_by_several_requests_at_once_mints_one_token() -> None:
    """b6630e7: a device code is exchanged once (a conditional update). Six requests at
    the same moment: one pair of tokens, the others a 400, none a 500."""

    from oauth2_provider.models import AccessToken

    from tests.redteam.test_signin_sweep import approved_device, at_once, device_token

    codes, _agent = approved_device()
    answers = at_once(6, lambda: device_token(codes["device_code"]))
    assert len(answers) == 6, "a request raised (a 500)"
    codes_seen = sorted(a.status_code for a in answers)
    assert codes_seen == [200, 400, 400, 400, 400, 400], [a.content[:120] for a in answers]
    assert AccessToken.objects.count() == 1


def test_a_write_files_diff_and_its_bound_hash_come_from_one_read(tmp_path: Path) -> None:
    """present_write read the file twice: once for the diff, once for the hash the
    approval binds. Admission takes no workspace lock (a program of the session may be
    running), so a file changing between the two reads gave a diff of one content and
    the hash of another: the reviewer approved a diff against A, the worker's check
    passed against B, and B's lines went unseen. Here the file flips between A and B
    (atomic renames) while the diff is made; each diff must match its hash."""
    import hashlib
    import threading

    from dispatcher.tools.write_file import present_write

    a, b = "shown: A\n", "unseen: B\n"
    digests = {
        hashlib.sha256(a.encode()).hexdigest(): "-shown: A",
        hashlib.sha256(b.encode()).hexdigest(): "-unseen: B",
    }
    (tmp_path / "notes.txt").write_text(a)
    stop = threading.Event()

    def flip() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            spare = tmp_path / f".spare{n % 2}"
            spare.write_text(a if n % 2 else b)
            os.replace(spare, tmp_path / "notes.txt")

    flipper = threading.Thread(target=flip)
    flipper.start()
    torn = 0
    try:
        for _ in range(3000):
            shown = present_write({"path": "notes.txt", "content": "new\n"}, tmp_path)
            bound = shown["sha256_before"]
            if bound is not None and digests[bound] not in shown["diff"]:
                torn += 1
    finally:
        stop.set()
        flipper.join()
    assert torn == 0, f"{torn} of 3000 diffs were bound to content they did not show"


def nested_beside_a_victim(workspace: Path, own: str | None = None) -> tuple[Path, Path]:
    """Agent A's workspace A (given to the sandbox user) holding agent B's, A/x/B (with its
    file `secret` reading `own`, when given), beside a person's tree (victim/B/secret), and
    A/x-link, a symlink to that tree that A's program may exchange with A/x: (A, victim)."""
    from dispatcher.tools import sandbox

    victim = workspace.parent.parent / "victim"
    (victim / "B").mkdir(parents=True)
    (victim / "B" / "secret").write_text("the person's\n")
    a = workspace.parent / "A"
    (a / "x" / "B").mkdir(parents=True)
    if own is not None:
        (a / "x" / "B" / "secret").write_text(own)
    sandbox.give_to_sandbox(a)
    (a / "x-link").symlink_to(victim)
    return a, victim


@pytest.mark.parametrize("lane", ["run", "preview"])
def test_a_nested_workspace_flipped_to_a_symlink_between_check_and_resolve(
    workspace: Path, lane: str
) -> None:
    """1c8fe7a/bc53f82: a nested workspace reached through a symlink a program could have
    placed is refused (refuse_redirected walks the path with lstat), then run() resolves
    the path again (workspace.resolve()) and gives and binds what that finds. Agent A's
    program swaps A/x between a real directory and a symlink to a person's tree
    (renameat2 RENAME_EXCHANGE, so a check sees a directory and the resolve a symlink):
    agent B's run (workspace A/x/B) gives the person's tree to the sandbox user and binds
    it as B's workspace."""
    import ctypes
    import threading
    import time

    from dispatcher.tools import preview, sandbox
    from dispatcher.tools.sandbox import Limits

    owner = sandbox._owner()
    if owner is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace)
    os.lchown(a / "x-link", *owner)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def flip() -> None:  # what agent A's program does, in a loop
        while not stop.is_set():
            libc.renameat2(-100, str(a / "x").encode(), -100, str(a / "x-link").encode(), 2)

    nested = a / "x" / "B"
    limits = Limits(5, 100)
    exchange = (str(a / "x").encode(), str(a / "x-link").encode())
    assert libc.renameat2(-100, exchange[0], -100, exchange[1], 2) == 0
    with pytest.raises(sandbox.ToolError, match="symlink"):  # a standing symlink: refused
        sandbox.run(["true"], workspace=nested, cwd=nested, env={}, limits=limits)
    assert libc.renameat2(-100, exchange[0], -100, exchange[1], 2) == 0
    assert (victim / "B").lstat().st_uid != owner[0]
    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if (victim / "B").lstat().st_uid == owner[0]:
                break
            with contextlib.suppress(Exception):
                if lane == "run":
                    sandbox.run(["true"], workspace=nested, cwd=nested, env={}, limits=limits)
                else:
                    made = preview.run_preview(["true"], cwd=nested, workspace=nested, env={})
                    preview.discard(made.store)
    finally:
        stop.set()
        flipper.join()
    assert (victim / "B").lstat().st_uid != owner[0], "the person's tree was given away"
