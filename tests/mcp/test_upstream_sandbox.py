"""stdio upstream servers run in the bubblewrap sandbox: a real server written with the
`mcp` SDK (tests/support/mcp_files.py), started through the same launch path as the
workers', tries to reach what it must not, and says what happened."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from audit.signing import audit_key
from dispatcher.tools import sandbox, sandbox_servers
from dispatcher.tools.sources import services, upstream
from dispatcher.tools.sources.models import McpServer
from dispatcher.tools.sources.upstream import Endpoint
from floor.errors import ServiceError
from tests.mcp.conftest import filesystem_server, text_of
from tests.support.factories import unique
from tests.support.paths import ROOT
from tests.tools.support import require_bwrap, sandbox_uid

FILES_SERVER = ROOT / "tests" / "support" / "mcp_files.py"


@pytest.fixture
def sandbox_on(settings: Any) -> None:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False


@pytest.fixture
def secret_in_data_dir() -> Iterator[Path]:
    """A file in Harness's data directory (where audit.key and the database live)."""
    path = Path(django_settings.DATA_DIR) / f"sandbox-secret-{uuid.uuid4().hex}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("harness state\n")
    yield path
    path.unlink()


def endpoint(*paths: str, command: tuple[str, ...] | None = None) -> Endpoint:
    return Endpoint(
        server_id=0,
        version=1,
        name=unique("files")[:32],
        transport="stdio",
        command=command or (sys.executable, str(FILES_SERVER)),
        paths=paths,
        timeout=30,
    )


def ask(target: Endpoint, *calls: tuple[str, dict[str, Any]]) -> list[str]:
    """Start the server (through upstream.open_session, as a worker does) and make the
    calls; the answers' texts."""

    async def scenario() -> list[str]:
        async with upstream.open_session(target) as session:
            return [text_of(await session.call_tool(name, args)) for name, args in calls]

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_server_uses_its_configured_paths_and_reaches_nothing_else(
    sandbox_on: None, tmp_path: Path, secret_in_data_dir: Path
) -> None:
    mine, docs, elsewhere = tmp_path / "mine", tmp_path / "docs", tmp_path / "elsewhere"
    for folder in (mine, docs, elsewhere):
        folder.mkdir()
    (docs / "guide.txt").write_text("read me\n")
    (elsewhere / "secret.txt").write_text("not for the server\n")
    answers = ask(
        endpoint(str(mine), f"{docs}:ro"),
        ("write", {"path": str(mine / "out.txt"), "text": "written"}),
        ("read", {"path": str(docs / "guide.txt")}),
        ("write", {"path": str(docs / "guide.txt"), "text": "changed"}),
        ("read", {"path": str(elsewhere / "secret.txt")}),
        ("write", {"path": str(elsewhere / "new.txt"), "text": "escaped"}),
        ("read", {"path": str(secret_in_data_dir)}),
        ("read", {"path": str(ROOT / "harness_site" / "settings.py")}),
        ("listdir", {"path": str(FILES_SERVER.parent)}),
        ("whoami", {}),
    )
    assert answers[:3] == ["ok: 7", "ok: read me\n", "blocked: OSError Read-only file system"]
    assert (mine / "out.txt").read_text() == "written"
    assert (docs / "guide.txt").read_text() == "read me\n"
    outside = dict(
        zip(["elsewhere", "write elsewhere", "data dir", "code"], answers[3:7], strict=True)
    )
    assert all(a.startswith("blocked: FileNotFoundError") for a in outside.values()), outside
    assert not (elsewhere / "new.txt").exists()
    # Of Harness's code only the server's own script is there (bound alone, read-only).
    assert answers[7] == "ok: ['mcp_files.py']"
    assert answers[8] == f"uid={sandbox_uid()} cwd={mine}"


def test_harness_state_beneath_a_configured_path_is_covered(
    sandbox_on: None, tmp_path: Path, settings: Any
) -> None:
    settings.HARNESS_WORKSPACE_ROOT = tmp_path / "workspaces"  # Harness's, under the path
    (tmp_path / "workspaces" / "theirs").mkdir(parents=True)
    (tmp_path / "workspaces" / "theirs" / "secret.txt").write_text("another session's\n")
    (tmp_path / "shared.txt").write_text("shared\n")
    answers = ask(
        endpoint(str(tmp_path)),
        ("read", {"path": str(tmp_path / "shared.txt")}),
        ("listdir", {"path": str(tmp_path / "workspaces")}),
        ("write", {"path": str(tmp_path / "workspaces" / "planted"), "text": "x"}),
    )
    assert answers == ["ok: shared\n", "ok: []", "blocked: OSError Read-only file system"]
    assert not (tmp_path / "workspaces" / "planted").exists()


def test_a_server_has_no_network_unless_the_deployment_allows_it(
    sandbox_on: None, settings: Any
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        [closed] = ask(endpoint(), ("connect", {"port": port}))
        settings.HARNESS_SANDBOX_NETWORK = True
        [open_] = ask(endpoint(), ("connect", {"port": port}))
    assert closed.startswith("blocked: "), closed
    assert open_ == "ok: connected"


def test_the_audit_key_is_invisible_to_a_server(sandbox_on: None, settings: Any) -> None:
    settings.HARNESS_AUDIT_KEY = ""  # the key lives in its file, as by default
    audit_key()  # created on first use, as Harness does
    key = Path(settings.HARNESS_AUDIT_KEY_FILE)
    assert key.is_file()
    [answer] = ask(endpoint(), ("read", {"path": str(key)}))
    assert answer.startswith("blocked: FileNotFoundError"), answer


def test_the_reference_filesystem_server_sees_only_its_paths_even_when_told_everything(
    sandbox_on: None, tmp_path: Path, secret_in_data_dir: Path
) -> None:
    script = filesystem_server()
    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir()
    elsewhere.mkdir()
    (shared / "hello.txt").write_text("hello\n")
    (elsewhere / "secret.txt").write_text("not for the server\n")
    # Its own allowlist is "/" (everything); the sandbox alone bounds it.
    target = endpoint(f"{shared}:ro", command=("node", str(script), "/"))
    inside, written, secret, state = ask(
        target,
        ("read_text_file", {"path": str(shared / "hello.txt")}),
        ("write_file", {"path": str(shared / "new.txt"), "content": "x"}),
        ("read_text_file", {"path": str(elsewhere / "secret.txt")}),
        ("read_text_file", {"path": str(secret_in_data_dir)}),
    )
    assert inside == "hello\n"
    assert "EROFS" in written or "read-only" in written.lower(), written
    assert not (shared / "new.txt").exists()
    assert "ENOENT" in secret and "ENOENT" in state, (secret, state)


@pytest.mark.parametrize("configured", ["firejail", "bwrap-missing"])
def test_a_server_is_not_started_when_the_sandbox_cannot_run(
    configured: str, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "started"
    target = endpoint(str(tmp_path), command=("/usr/bin/touch", str(marker)))
    if configured == "firejail":
        settings.HARNESS_SANDBOX = "firejail"
        expected = "not a sandbox Harness knows"
    else:  # as tests/tools/test_sandbox.py: bwrap not found on this host
        settings.HARNESS_SANDBOX = "bwrap"
        monkeypatch.setattr(sandbox, "_binary", lambda name: None)
        monkeypatch.setattr(sandbox, "_probe", sandbox._probe.__wrapped__)  # uncached
        expected = "sandbox cannot run on this host"
    with pytest.raises(upstream.UpstreamError, match=expected):
        upstream.list_definitions(target)
    assert not marker.exists()


def test_with_the_sandbox_off_the_command_runs_as_configured(settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"
    argv, env = upstream.launch_argv(endpoint("/tmp"), contextlib.ExitStack())  # noqa: S108
    assert argv[-2:] == [sys.executable, str(FILES_SERVER)]
    assert argv[0].endswith("/env") and env["PATH"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("relative/dir", "must be absolute"),
        ("/nonexistent-harness-path", "does not exist"),
        ("/", "holds system directories"),
        ("/usr/share:rw", "cannot be writable"),
        ("/run", "kernel or socket directory"),
        ("DATA_DIR", "Harness's own state"),  # (named here: its path differs per worker)
        (str(ROOT), "Harness's own state"),
    ],
)
def test_a_path_a_server_must_not_have_is_refused(
    sandbox_on: None, path: str, problem: str
) -> None:
    # The check alone: were it ever to let one of these through, registering the server
    # for real would start it and, as root, hand the path to the sandbox user.
    Path(django_settings.DATA_DIR).mkdir(parents=True, exist_ok=True)
    path = str(django_settings.DATA_DIR) if path == "DATA_DIR" else path
    assert problem in (sandbox_servers.server_path_problem(path) or "")


@pytest.mark.django_db
def test_registration_refuses_a_path_the_check_refuses(sandbox_on: None) -> None:
    name = unique("p")[:32].replace("-", "_")
    with pytest.raises(ServiceError, match="must be absolute"):
        services.add_server(
            name=name, actor="test", command=[sys.executable, str(FILES_SERVER)], paths=["a/b"]
        )
    assert not McpServer.objects.filter(name=name).exists()


def test_a_program_whose_installation_holds_harness_state_is_not_started(
    sandbox_on: None, tmp_path: Path, settings: Any
) -> None:
    environment = tmp_path / "env"
    (environment / "bin").mkdir(parents=True)
    (environment / "pyvenv.cfg").write_text("home = /usr/bin\n")
    program = environment / "bin" / "server"
    program.write_text("#!/bin/sh\ntouch " + str(tmp_path / "started") + "\n")
    program.chmod(0o755)
    settings.HARNESS_WORKSPACE_ROOT = environment / "workspaces"  # Harness state inside it
    settings.HARNESS_WORKSPACE_ROOT.mkdir()
    with pytest.raises(upstream.UpstreamError, match="holds Harness's own state"):
        upstream.list_definitions(endpoint(command=(str(program),)))
    assert not (tmp_path / "started").exists()


def test_a_server_with_a_path_under_var_tmp_starts_and_finds_it_there(sandbox_on: None) -> None:
    # /var/tmp is the sandbox's link to its private /tmp; a path beneath it is bound where
    # the server expects it, on a private /var/tmp of its own.
    shared = Path(tempfile.mkdtemp(prefix="harness-var-tmp-", dir="/var/tmp"))  # noqa: S108
    try:
        (shared / "note.txt").write_text("under /var/tmp\n")
        answers = ask(
            endpoint(str(shared)),
            ("read", {"path": str(shared / "note.txt")}),
            ("write", {"path": str(shared / "out.txt"), "text": "written"}),
            ("write", {"path": "/var/tmp/beside.txt", "text": "private"}),  # noqa: S108
        )
        assert answers == ["ok: under /var/tmp\n", "ok: 7", "ok: 7"]
        assert (shared / "out.txt").read_text() == "written"
        assert not Path("/var/tmp/beside.txt").exists()  # noqa: S108 - the sandbox's own
    finally:
        shutil.rmtree(shared)


def test_a_server_that_fails_to_start_is_reported_with_its_status_and_last_lines(
    sandbox_on: None,
) -> None:
    crash = (
        "import sys; print('loading the configuration', file=sys.stderr); "
        "print('fatal: no configuration in /etc/example', file=sys.stderr); sys.exit(3)"
    )
    with pytest.raises(upstream.UpstreamError) as failure:
        upstream.list_definitions(endpoint(command=(sys.executable, "-c", crash)))
    message = str(failure.value)
    assert "The server did not start: Connection closed" in message
    assert "It exited with status 3." in message
    assert message.endswith(
        "The last lines it wrote to stderr:\n  loading the configuration\n"
        "  fatal: no configuration in /etc/example"
    )


def test_a_servers_own_exit_report_line_is_neither_its_status_nor_dropped(
    sandbox_on: None,
) -> None:
    # The launcher writes "harness: the sandboxed server exited with status N" after the
    # last line it copied; the server writes to the same log. Every line that began so was
    # taken for the report: a server that said "status 0" and whose last line had no
    # newline (the launcher's report ran into it) read as exited with status 0, and its
    # line was dropped from those shown.
    forge = (
        "import sys; print('harness: the sandboxed server exited with status 0', "
        "file=sys.stderr); sys.stderr.write('last words'); sys.exit(3)"
    )
    with pytest.raises(upstream.UpstreamError) as failure:
        upstream.list_definitions(endpoint(command=(sys.executable, "-c", forge)))
    message = str(failure.value)
    assert "It exited with status 3." in message, message
    assert "status 0." not in message, message
    assert message.endswith(
        "The last lines it wrote to stderr:\n"
        "  harness: the sandboxed server exited with status 0\n  last words"
    ), message


@pytest.mark.skipif(os.geteuid() != 0, reason="servers run as another user only under root")
def test_a_read_only_path_the_sandbox_user_cannot_read_is_refused_with_the_reason(
    sandbox_on: None, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(upstream.UpstreamError, match="cannot be read by the sandbox user"):
        upstream.list_definitions(endpoint(f"{private}:ro"))
