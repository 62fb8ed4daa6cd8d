"""The sandbox, proved from inside: commands run through the real run_command tool (or
sandbox.run with tighter limits) try to reach what they must not, and fail."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.test import Client

from dispatcher.tools import sandbox
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.search_files import TOOL as SEARCH_FILES
from tests.tools import support
from tests.tools.support import PROBE_SCRIPT, probe_results, require_bwrap


@pytest.fixture
def sandbox_on(settings: Any) -> None:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False


@pytest.fixture
def workspaces(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """A workspace root (Harness hides it) with this session's workspace 'mine' in it."""
    root = tmp_path / "workspaces"
    (root / "mine").mkdir(parents=True)
    settings.HARNESS_WORKSPACE_ROOT = root
    yield root


def run(workspace: Path, argv: list[str], *, timeout: float = 20, limit: int = 10_000) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=timeout, output_limit=limit)
    result = RUN_COMMAND.execute(ctx, {"argv": argv})
    assert isinstance(result, str)
    return result


def sh(workspace: Path, script: str, *args: str, **kwargs: Any) -> str:
    """`script` run by sh -c; `args` become $0, $1, ..."""
    return run(workspace, ["sh", "-c", script, *args], **kwargs)


def probe(workspace: Path, targets: dict[str, Any]) -> dict[str, Any]:
    (workspace / "probe.py").write_text(PROBE_SCRIPT)
    return probe_results(run(workspace, ["python3", "probe.py", json.dumps(targets)]))


def listening_socket() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def host_can_connect(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- Harness's own state is invisible ----------------------------------------------------


@pytest.mark.django_db
def test_the_database_and_the_redis_socket_cannot_be_reached(
    sandbox_on: None, workspaces: Path
) -> None:
    database = django_settings.DATABASES["default"]
    targets: dict[str, Any] = {"read": {}, "unix": {}, "tcp": {}}
    if database["ENGINE"].endswith("sqlite3"):
        path = Path(database["NAME"])
        assert path.read_bytes().startswith(b"SQLite format 3")  # the host can read it
        targets["read"]["database"] = str(path)
    else:
        port = int(database.get("PORT") or 5432)
        assert host_can_connect(port)
        targets["tcp"]["database"] = port
    redis_url = django_settings.REDIS_URL
    if redis_url.startswith("unix://"):
        sock = redis_url.removeprefix("unix://")
        assert Path(sock).is_socket()
        targets["unix"]["redis"] = sock
    else:
        targets["tcp"]["redis"] = 6379
    found = probe(workspaces / "mine", targets)
    escaped = {name: value for name, value in found.items() if str(value).startswith("open")}
    assert escaped == {}, found
    assert found["uid"] == support.sandbox_uid()


def test_the_settings_and_data_directories_do_not_exist(sandbox_on: None, workspaces: Path) -> None:
    settings_file = Path(django_settings.BASE_DIR) / "harness_site" / "settings.py"
    data_dir = Path(django_settings.DATA_DIR)
    assert settings_file.exists() and data_dir.is_dir()
    for path in (settings_file, data_dir):
        result = run(workspaces / "mine", ["ls", "-d", str(path)])
        assert f"cannot access '{path}': No such file or directory" in result
    top = set(run(workspaces / "mine", ["ls", "/"]).splitlines()[1:])
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "usr"}
    assert top <= system | {"tmp", "var", "run"}  # (run: HOME's tmpfs alone)
    assert run(workspaces / "mine", ["ls", "-A", "/run"]).splitlines()[1:] == ["home"]


def test_secrets_in_etc_are_not_there(sandbox_on: None, workspaces: Path) -> None:
    assert Path("/etc/shadow").exists()
    result = sh(workspaces / "mine", "cat /etc/shadow; cat /etc/passwd | head -1")
    assert "/etc/shadow: No such file or directory" in result
    assert "root:x:0:0" in result  # what programs need is there


def test_another_sessions_workspace_cannot_be_read(sandbox_on: None, workspaces: Path) -> None:
    other = workspaces / "theirs"
    other.mkdir()
    (other / "secret.txt").write_text("their secret\n")
    result = sh(workspaces / "mine", 'cat ../theirs/secret.txt "$0"; ls ..', str(other))
    assert "their secret" not in result
    assert "../theirs/secret.txt: No such file or directory" in result
    assert result.rstrip().endswith("mine")  # the parent holds only this workspace


def test_a_hidden_directory_inside_the_workspace_is_empty_and_read_only(
    sandbox_on: None, workspaces: Path, settings: Any
) -> None:
    workspace = workspaces / "mine"
    state = workspace / "var"
    state.mkdir()
    (state / "harness.sqlite3").write_text("rows")
    settings.DATA_DIR = state
    result = sh(workspace, "ls -A var; echo x > var/new; echo x > kept.txt; echo done")
    assert "harness.sqlite3" not in result
    assert "var/new: Read-only file system" in result and "done" in result
    assert (workspace / "kept.txt").read_text() == "x\n"
    assert not (state / "new").exists()


def test_a_workspace_that_is_harness_state_or_the_system_is_refused(
    sandbox_on: None, settings: Any
) -> None:
    with pytest.raises(ToolError, match="one of Harness's own directories"):
        run(Path(settings.DATA_DIR), ["true"])
    for system in ("/", "/usr", "/home", "/root"):  # as root, /home would be given away
        with pytest.raises(ToolError, match="holds system or home directories"):
            run(Path(system), ["true"])


INSIDE_SYSTEM = {
    "/etc/profile.d": "/etc",
    "/usr/local/bin": "/usr",
    "/bin/x": "/bin",
    "/sbin/x": "/sbin",
    "/lib/x": "/lib",
    "/lib64/x": "/lib64",
    "/boot/grub": "/boot",
    "/proc/sys/kernel": "/proc",
    "/sys/kernel": "/sys",
    "/dev/shm": "/dev",  # noqa: S108  (a path refused, not used)
    "/root/.ssh": "/root",
    "/run/user": "/run",
    "/var/lib/postgresql": "/var/lib",
    "/var/spool/cron": "/var/spool",
    "/var/log/x": "/var/log",
}


def test_a_workspace_inside_a_system_directory_is_refused(settings: Any, tmp_path: Path) -> None:
    """As root, a workspace inside /etc (profile.d runs for every login), /usr or /root
    would be given to the sandbox user and written by it: refused, whatever resolves it."""
    for workspace, tree in INSIDE_SYSTEM.items():
        reason = sandbox.exposed_state(Path(workspace))
        # /bin, /lib... may be links into /usr: refused under either name.
        assert reason is not None and "lies inside the system directory /" in reason, workspace
        assert tree in reason or "/usr" in reason, (workspace, reason)
    # A person's own project in /home stays a workspace, and so does Harness's own
    # workspace root when the checkout lies in /root.
    assert sandbox.exposed_state(Path("/home/dev/project")) is None
    settings.HARNESS_WORKSPACE_ROOT = Path("/root/harness/var/workspaces")
    assert sandbox.exposed_state(Path("/root/harness/var/workspaces/s-1")) is None
    assert sandbox.exposed_state(Path("/root/harness-other")) is not None
    settings.HARNESS_WORKSPACE_ROOT = Path("/var/lib/harness/workspaces")
    assert sandbox.exposed_state(Path("/var/lib/harness/workspaces/s-1")) is None
    assert sandbox.exposed_state(Path("/var/lib/harness/audit")) is not None


def test_a_program_never_runs_in_a_workspace_inside_etc(sandbox_on: None) -> None:
    before = os.stat("/etc/profile.d")
    with pytest.raises(ToolError, match="lies inside the system directory /etc"):
        run(Path("/etc/profile.d"), ["sh", "-c", "echo owned > /etc/profile.d/x.sh"])
    after = os.stat("/etc/profile.d")
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)  # not given away
    assert not Path("/etc/profile.d/x.sh").exists()


# --- Nothing outside the workspace can be written ----------------------------------------


def test_only_the_workspace_is_writable(sandbox_on: None, workspaces: Path) -> None:
    workspace = workspaces / "mine"
    outside = {
        "parent": str(workspaces / "escape.txt"),
        "etc": "/etc/escape.txt",
        "usr": "/usr/escape.txt",
        "root": "/escape.txt",
        "data": str(Path(django_settings.DATA_DIR) / "escape.txt"),
    }
    found = probe(workspace, {"write": {**outside, "workspace": str(workspace / "ok.txt")}})
    assert found.pop("write workspace") == f"open: {workspace / 'ok.txt'}"
    assert found.pop("uid") == support.sandbox_uid()
    if workspace.is_relative_to(tempfile.gettempdir()):
        found.pop("write parent")  # lands in the sandbox's private /tmp (checked below)
    assert all(value.startswith("blocked") for value in found.values()), found
    assert (workspace / "ok.txt").read_text() == "escaped"
    assert not any(Path(path).exists() for path in outside.values())


def test_tmp_is_private_and_vanishes(sandbox_on: None, workspaces: Path) -> None:
    marker = f"harness-sandbox-{uuid.uuid4().hex}"
    first = sh(workspaces / "mine", f"echo hi > /tmp/{marker} && cat /tmp/{marker}")
    assert first == "exit code 0\nhi\n"
    assert not (Path(tempfile.gettempdir()) / marker).exists()  # not the host's /tmp
    second = sh(workspaces / "mine", f"cat /tmp/{marker}")
    assert "No such file or directory" in second


def test_tmp_is_size_limited(sandbox_on: None, workspaces: Path) -> None:
    result = sh(workspaces / "mine", "head -c 300000000 /dev/zero > /tmp/big; echo rc=$?")
    assert "No space left on device" in result and "rc=1" in result


# --- Network ----------------------------------------------------------------------------


def test_loopback_services_cannot_be_reached_without_network(
    sandbox_on: None, workspaces: Path
) -> None:
    with listening_socket() as server:
        port = server.getsockname()[1]
        ports = {"listener": port}
        if host_can_connect(6379):
            ports["redis"] = 6379
        found = probe(workspaces / "mine", {"tcp": ports})
    assert found["tcp listener"].startswith("blocked"), found
    if "redis" in ports:
        assert found["tcp redis"].startswith("blocked"), found


def test_network_allowed_reaches_loopback(
    sandbox_on: None, workspaces: Path, settings: Any
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = True
    with listening_socket() as server:
        ports = {"listener": server.getsockname()[1]}
        if host_can_connect(6379):
            ports["redis"] = 6379
        found = probe(workspaces / "mine", {"tcp": ports})
    assert all(found[f"tcp {name}"] == "open: connected" for name in ports), found


# --- No privilege gain --------------------------------------------------------------------


def test_no_privilege_can_be_gained(sandbox_on: None, workspaces: Path) -> None:
    script = (
        "id -u; grep -E '^(NoNewPrivs|CapEff)' /proc/self/status; "
        "su root -c 'id -u' </dev/null; echo su=$?; "
        "sudo -n true; echo sudo=$?; "
        "unshare -U true; echo userns=$?"
    )
    result = sh(workspaces / "mine", script)
    lines = result.splitlines()
    assert lines[1] == str(support.sandbox_uid())
    assert "NoNewPrivs:\t1" in result and "CapEff:\t0000000000000000" in result
    assert "su=0" not in result and "sudo=0" not in result and "userns=0" not in result
    assert "\n0\n" not in result  # su never printed uid 0


# --- Processes, time, output -----------------------------------------------------------------


def test_setsid_children_do_not_outlive_the_call(sandbox_on: None, workspaces: Path) -> None:
    token = f"{97 + uuid.uuid4().int % 1000 / 1000:.3f}"
    result = sh(workspaces / "mine", f"setsid -f sleep {token}; echo started")
    assert result == "exit code 0\nstarted\n"
    time.sleep(0.5)
    assert not any(f"sleep {token}" in line for line in host_command_lines()), "sleep survived"


def test_the_timeout_kills_the_whole_sandbox(sandbox_on: None, workspaces: Path) -> None:
    token = f"{98 + uuid.uuid4().int % 1000 / 1000:.3f}"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        sh(workspaces / "mine", f"setsid -f sleep {token}; sleep 30", timeout=1)
    assert time.monotonic() - started < 15  # at the timeout, not the sleep's 30 s (3 s once)
    time.sleep(0.5)
    assert not any(f"sleep {token}" in line for line in host_command_lines())


def test_yes_is_stopped_and_nothing_grows(sandbox_on: None, workspaces: Path) -> None:
    free_before = shutil.disk_usage(tempfile.gettempdir()).free
    started = time.monotonic()
    result = run(workspaces / "mine", ["yes"], timeout=30, limit=1000)
    # stopped at the output ceiling, well under the 30 s timeout (not 5 s: a loaded host's
    # sandboxed start alone outlasts a few seconds)
    assert time.monotonic() - started < 15
    assert result.startswith("exit code -9 (killed by SIGKILL)\ny\ny\n")
    assert "[truncated: about" in result and "[stopped: the command wrote more than" in result
    assert len(result) < 1500
    assert free_before - shutil.disk_usage(tempfile.gettempdir()).free < 200 << 20


def test_file_size_is_limited(sandbox_on: None, workspaces: Path) -> None:
    limits = sandbox.Limits(timeout=20, output_chars=2000, file_bytes=1 << 20)
    done = sandbox_run(workspaces / "mine", ["sh", "-c", "yes > big; echo rc=$?"], limits)
    assert "rc=153" in done.output  # 128 + SIGXFSZ
    assert (workspaces / "mine" / "big").stat().st_size == 1 << 20


def test_a_fork_bomb_is_bounded(sandbox_on: None, workspaces: Path) -> None:
    # A bounded bomb (400 children at most), so that a broken limit cannot hurt the machine.
    script = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(400):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as error:\n"
        "        print('refused after', n, error.strerror); break\n"
        "    if pid == 0:\n"
        "        time.sleep(3); os._exit(0)\n"
        "    n += 1\n"
        "print('started', n)\n"
    )
    limits = sandbox.Limits(timeout=20, output_chars=2000, processes=40)
    done = sandbox_run(workspaces / "mine", ["python3", "-c", script], limits)
    started = int(done.output.split("started ")[1].split()[0])
    assert "refused after" in done.output and "Resource temporarily unavailable" in done.output
    assert started <= 44  # 40, and the cgroup's room for the sandbox's own processes
    default = run(workspaces / "mine", ["python3", "-c", script])
    assert "refused after" in default and int(default.split("started ")[1].split()[0]) <= 260


def test_cpu_time_limit_kills_a_busy_loop(sandbox_on: None, workspaces: Path) -> None:
    limits = sandbox.Limits(timeout=30, output_chars=2000, cpu_seconds=1)
    started = time.monotonic()
    done = sandbox_run(workspaces / "mine", ["python3", "-c", "while True: pass"], limits)
    # a CPU second, not the 30 s timeout: on a loaded host a second of CPU takes several of
    # the wall clock (a sixth of a core at load 12), so the bound is the timeout's side
    assert time.monotonic() - started < 20
    assert done.returncode == 128 + 24  # SIGXCPU
    shown = sandbox.describe_exit(done.returncode, sandboxed=True)
    assert shown == "152 (128+24: killed by SIGXCPU: the CPU time limit)"


# --- Configuration ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_unknown_sandbox_runs_nothing(settings: Any, workspaces: Path) -> None:
    settings.HARNESS_SANDBOX = "firejail"
    with pytest.raises(ToolError, match="not a sandbox Harness knows"):
        sh(workspaces / "mine", "touch ran")
    assert not (workspaces / "mine" / "ran").exists()
    assert "dispatcher.E040" in {error.id for error in run_checks()}


@pytest.mark.django_db
def test_a_missing_bwrap_fails_the_checks_and_runs_nothing(
    settings: Any, workspaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.HARNESS_SANDBOX = "bwrap"
    monkeypatch.setattr(sandbox, "_binary", lambda name: None)
    monkeypatch.setattr(sandbox, "_probe", sandbox._probe.__wrapped__)  # uncached
    errors = [error for error in run_checks() if error.id == "dispatcher.E041"]
    assert errors and "`bwrap` is not installed" in errors[0].msg
    assert "HARNESS_SANDBOX=off" in str(errors[0].hint)
    with pytest.raises(ToolError, match="sandbox cannot run on this host"):
        sh(workspaces / "mine", "touch ran")
    assert not (workspaces / "mine" / "ran").exists()


@pytest.mark.django_db
def test_other_configuration_errors_fail_the_checks(settings: Any) -> None:
    settings.HARNESS_SANDBOX_READ_ONLY = ["opt/tools"]
    settings.CELERY_TASK_TIME_LIMIT = 45
    found = {error.id: error for error in run_checks()}
    assert "'opt/tools' is not an absolute path" in found["dispatcher.E043"].msg
    assert "tool 'run_command'" in found["dispatcher.E042"].msg
    assert "at least 90" in str(found["dispatcher.E042"].hint)


def test_extra_read_only_paths_are_visible_but_not_writable(
    sandbox_on: None, workspaces: Path, settings: Any, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        # (unprivileged, Harness may write whatever directory the test makes, so an entry
        # there is refused: tests/redteam/test_rtsandnr_unprivileged_entries.py)
        pytest.skip("an entry must lie where only others write; as root the test makes one")
    tools = tmp_path / "toolchain"
    tools.mkdir()
    (tools / "tool.txt").write_text("a tool\n")
    (tools / "var").mkdir()
    (tools / "var" / "harness.sqlite3").write_text("rows")
    settings.HARNESS_SANDBOX_READ_ONLY = [str(tools)]
    settings.DATA_DIR = tools / "var"  # Harness's state beneath an extra path stays hidden
    result = sh(
        workspaces / "mine", 'cat "$0/tool.txt"; touch "$0/new"; ls -A "$0/var"', str(tools)
    )
    assert "a tool" in result and "Read-only file system" in result
    assert "harness.sqlite3" not in result


def test_with_the_sandbox_off_output_is_still_capped_and_children_killed(
    settings: Any, workspaces: Path
) -> None:
    settings.HARNESS_SANDBOX = "off"
    started = time.monotonic()
    result = run(workspaces / "mine", ["yes"], timeout=30, limit=100)
    # (well under the 30 s timeout: stopped at the ceiling, however loaded the host)
    assert time.monotonic() - started < 15 and "[stopped:" in result
    assert sh(workspaces / "mine", "(sleep 1; touch survived) & echo bg") == "exit code 0\nbg\n"
    time.sleep(1.5)
    assert not (workspaces / "mine" / "survived").exists()


@pytest.mark.django_db
def test_the_dashboard_shows_when_the_sandbox_is_off(
    settings: Any, client: Client, reviewer: User
) -> None:
    client.force_login(reviewer)
    settings.HARNESS_SANDBOX = "bwrap"
    assert "The sandbox is off" not in client.get("/approvals/").content.decode()
    settings.HARNESS_SANDBOX = "off"
    page = client.get("/approvals/").content.decode()
    assert '<p class="notice bad" role="alert">The sandbox is off (HARNESS_SANDBOX=off)' in page
    client.logout()
    assert "The sandbox is off" not in client.get("/accounts/login/").content.decode()


def test_confines_only_with_bwrap_and_no_network(sandbox_on: None, settings: Any) -> None:
    assert sandbox.confines()
    settings.HARNESS_SANDBOX_NETWORK = True
    assert not sandbox.confines()
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_SANDBOX = "off"
    assert not sandbox.confines()


def test_a_missing_bwrap_skips_here_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("HARNESS_SANDBOX", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install bubblewrap"):
        support.require_bwrap()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and Sandbox tests need"):
        support.require_bwrap()
    monkeypatch.setenv("HARNESS_SANDBOX", "off")  # turned off for the run: skipped, even in CI
    with pytest.raises(pytest.skip.Exception, match="make test-fast"):
        support.require_bwrap()


# --- search_files: linear time ---------------------------------------------------------------


def test_a_catastrophic_pattern_answers_at_once(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("a" * 100_000 + "\n")
    ctx = ExecutionContext(workspace=tmp_path, call_id="t", timeout=30, output_limit=1000)
    # (the CPU time of this thread, which the search runs in: a backtracking engine burns
    # minutes of it; the wall clock of a loaded host counts other processes' time too)
    started = time.thread_time()
    result = SEARCH_FILES.execute(ctx, {"pattern": "(.+)+\\x01"})
    assert time.thread_time() - started < 1
    assert result == "No matches for '(.+)+\\\\x01' in '.'."
    assert SEARCH_FILES.execute(ctx, {"pattern": "(a+)+$"}).startswith("long.txt:1: aaaa")


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)", r"(?<!a)b"])
def test_unsupported_syntax_is_a_clear_error(tmp_path: Path, pattern: str) -> None:
    ctx = ExecutionContext(workspace=tmp_path, call_id="t", timeout=30, output_limit=1000)
    with pytest.raises(ToolError, match="RE2 syntax.*without backreferences"):
        SEARCH_FILES.execute(ctx, {"pattern": pattern})


# --- helpers -----------------------------------------------------------------------------------


def sandbox_run(workspace: Path, argv: list[str], limits: sandbox.Limits) -> sandbox.Completed:
    return sandbox.run(
        argv, workspace=workspace, cwd=workspace, env={"PATH": os.defpath}, limits=limits
    )


def host_command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return lines
