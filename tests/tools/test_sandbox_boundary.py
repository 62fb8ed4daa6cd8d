"""No host privilege behind the sandbox (DESIGN principle 13), proved from inside a real
sandbox and from the host: whoever runs Harness, the program is no host root, the
kernel's writable interfaces are read-only, the seccomp filter refuses what no tool needs,
and a memory hog is stopped. Run as Harness runs here (root, as in CI and `make demo`),
and again with Harness as an unprivileged user (uid 65534, started from this test).

No test writes a sysctl: /proc files are only opened for writing, never written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyseccomp
import pytest

from dispatcher.checks import check_sandbox
from dispatcher.tools import sandbox, sandbox_servers, seccomp
from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.write_file import TOOL as WRITE_FILE
from tests.support.paths import ROOT
from tests.tools import support
from tests.tools.support import require_bwrap

# Run inside the sandbox by the system's python3 as `python3 boundary.py '<json>'`: tries
# each refused system call (numbers resolved on the host by libseccomp), the terminal
# and socket interfaces, and the kernel's files; prints one JSON object.
BOUNDARY_SCRIPT = r"""
import ctypes, errno, fcntl, json, os, socket, sys, termios

spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = {"syscalls": {}, "proc": {}}

def outcome(result):
    if result != -1:
        return "returned %d" % result
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

for name, (number, *args) in spec["syscalls"].items():
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    if result == 0 and name == "clone":
        os._exit(0)  # the child of a clone that went through: never let it run on
    found["syscalls"][name] = outcome(result)

def refused(action):
    try:
        action()
        return "allowed"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))

found["socket AF_UNIX"] = refused(lambda: socket.socket(socket.AF_UNIX).close())
found["socketpair"] = refused(lambda: [s.close() for s in socket.socketpair()])
_, tty = os.openpty()
found["TIOCSTI"] = refused(lambda: fcntl.ioctl(tty, termios.TIOCSTI, b"x"))
found["TIOCLINUX"] = refused(lambda: fcntl.ioctl(tty, 0x541C, b"\x00"))

def open_for_writing(path):
    fd = os.open(path, os.O_WRONLY)  # opened only: never written
    os.close(fd)

for path in spec["proc"]:
    found["proc"][path] = refused(lambda: open_for_writing(path))
found["sys"] = os.path.exists("/sys")
with open("/proc/self/mounts") as mounts:
    found["proc sys mount"] = [l.split()[3].split(",")[0] for l in mounts if l.split()[1] == "/proc/sys"]
found["uid"] = os.getuid()
with open("/proc/self/status") as status:
    found["seccomp"] = [l.split()[1] for l in status if l.startswith("Seccomp:")][0]
open("made-by-sandbox", "w").close()
print(json.dumps(found))
"""

# system call -> its arguments after the number; each must fail with EPERM (clone3: ENOSYS)
SYSCALLS: dict[str, tuple[int, ...]] = {
    "ptrace": (0, 0, 0, 0),  # PTRACE_TRACEME
    "process_vm_readv": (1, 0, 0, 0, 0, 0),
    "kcmp": (1, 1, 0, 0, 0),
    "keyctl": (0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (0, 0, 0, 0, -3),
    "request_key": (0, 0, 0, -3),
    "bpf": (0, 0, 0),
    "perf_event_open": (0, 0, -1, -1, 0),
    "userfaultfd": (0,),
    "io_uring_setup": (1, 0),
    "mount": (0, 0, 0, 0, 0),
    "umount2": (0, 0),
    "pivot_root": (0, 0),
    "open_tree": (-100, 0, 0),
    "fsopen": (0, 0),
    "fspick": (-100, 0, 0),
    "mount_setattr": (-100, 0, 0, 0, 0),
    "unshare": (0x10000000,),  # CLONE_NEWUSER
    "setns": (0, 0),
    "clone": (0x10000000 | signal.SIGCHLD, 0, 0, 0, 0),  # CLONE_NEWUSER
    "clone3": (0, 0),
    "kexec_load": (0, 0, 0, 0),
    "init_module": (0, 0, 0),
    "finit_module": (0, 0, 0),
    "delete_module": (0, 0),
    "acct": (0,),
    "swapoff": (0,),
    "reboot": (0, 0, 0, 0),
    "settimeofday": (0, 0),
    "clock_settime": (0, 0),
    "adjtimex": (0,),
    "personality": (0x0040000,),  # ADDR_NO_RANDOMIZE
    "open_by_handle_at": (-100, 0, 0),
}
PROC_FILES = [
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/vm/drop_caches",
    "/proc/sysrq-trigger",
]
HOG = "data = b'x' * (1 << 30); print('allocated', len(data))"


def boundary_spec() -> str:
    arch = pyseccomp.system_arch()
    numbers = {
        name: (pyseccomp.resolve_syscall(arch, name), *args) for name, args in SYSCALLS.items()
    }
    return json.dumps({"syscalls": numbers, "proc": PROC_FILES})


def check_boundary(found: dict[str, Any], owner: int, user_uid: int) -> None:
    """What a program in the sandbox found, and the host owner of a file it made."""
    expected = {name: "EPERM" for name in SYSCALLS} | {"clone3": "ENOSYS"}
    assert found["syscalls"] == expected
    assert found["socket AF_UNIX"] == "EPERM" and found["socketpair"] == "allowed"
    assert found["TIOCSTI"] == "EPERM" and found["TIOCLINUX"] == "EPERM"
    # refused (read-only, or not the program's), or absent on this kernel
    assert all(c in ("EROFS", "EACCES", "ENOENT") for c in found["proc"].values()), found["proc"]
    assert found["proc"]["/proc/sys/kernel/core_pattern"] != "ENOENT"
    assert found["proc sys mount"] == ["ro"]
    assert found["sys"] is False
    assert found["seccomp"] == "2"
    assert owner == user_uid and owner != 0  # seen from the host


def run_in_sandbox(workspace: Path, argv: list[str], **limits: Any) -> sandbox.Completed:
    return sandbox.run(
        argv,
        workspace=workspace,
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin"},
        limits=sandbox.Limits(timeout=30, output_chars=20_000, **limits),
    )


@pytest.fixture
def sandbox_on(settings: Any) -> None:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False


@pytest.fixture
def workspace(settings: Any, tmp_path: Path) -> Path:
    settings.HARNESS_WORKSPACE_ROOT = tmp_path / "workspaces"
    path = tmp_path / "workspaces" / "mine"
    path.mkdir(parents=True)
    return path


# --- Harness as it runs here ----------------------------------------------------------------


def test_the_program_is_no_host_root_and_the_kernel_refuses_it(
    sandbox_on: None, workspace: Path
) -> None:
    (workspace / "boundary.py").write_text(BOUNDARY_SCRIPT)
    done = run_in_sandbox(workspace, ["python3", "boundary.py", boundary_spec()])
    assert done.returncode == 0, done.output
    found = json.loads(done.output)
    owner = (workspace / "made-by-sandbox").stat().st_uid
    check_boundary(found, owner, support.sandbox_uid() if os.geteuid() == 0 else os.getuid())
    assert found["uid"] == support.sandbox_uid()


def host_uids(pid: int) -> list[int]:
    """The real, effective, saved and filesystem uids of `pid`, as the host sees them."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(uid) for uid in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def wait_for(condition: Any, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError("the condition never held")


def test_seen_from_the_host_a_server_program_holds_no_root_uid(
    sandbox_on: None, tmp_path: Path
) -> None:
    marker = f"60.{os.getpid()}"
    argv = sandbox_servers.sandboxed_argv(["sleep", marker], [], contextlib.ExitStack())
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:

        def program() -> int | None:
            for pid in descendants(process.pid):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{marker}\0".encode():
                        return pid
            return None

        pid = wait_for(program)
        uids = host_uids(pid)
        assert 0 not in uids
        if os.geteuid() == 0:
            assert uids == [support.sandbox_uid()] * 4
        # The uid map, read by the host: the program's uids all land on that host uid.
        first = Path(f"/proc/{pid}/uid_map").read_text().split()
        assert first[:3] == ["0", "0", "4294967295"] or first[1] != "0", first
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_memory_hog_is_stopped_with_a_clear_message(sandbox_on: None, workspace: Path) -> None:
    done = run_in_sandbox(workspace, ["python3", "-c", HOG], memory_bytes=256 << 20)
    assert "allocated" not in done.output
    assert done.returncode != 0
    if sandbox.sandbox_cgroups.root_for("memory") is not None:
        assert done.stopped_for_memory
        assert f"used more than {256 << 20} bytes of memory" in done.output
    else:  # RLIMIT_AS: the allocation fails inside the program
        assert "MemoryError" in done.output


def test_files_the_worker_writes_and_files_programs_write_stay_editable_by_both(
    sandbox_on: None, workspace: Path
) -> None:
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=20, output_limit=2000)
    WRITE_FILE.execute(ctx, {"path": "deep/by-worker.txt", "content": "worker\n"})
    done = run_in_sandbox(
        workspace,
        ["sh", "-c", "echo program >> deep/by-worker.txt && mkdir deep/more && echo p > mine.txt"],
    )
    assert done.returncode == 0, done.output
    assert (workspace / "deep" / "by-worker.txt").read_text() == "worker\nprogram\n"
    WRITE_FILE.execute(ctx, {"path": "mine.txt", "content": "edited by the worker\n"})
    WRITE_FILE.execute(ctx, {"path": "deep/more/new.txt", "content": "new\n"})
    WRITE_FILE.execute(ctx, {"path": "later/by-worker.txt", "content": "worker\n"})
    script = (
        "echo again >> mine.txt && rm deep/more/new.txt && "
        "echo program >> later/by-worker.txt && touch later/by-program.txt"
    )
    done = run_in_sandbox(workspace, ["sh", "-c", script])
    assert done.returncode == 0, done.output
    assert (workspace / "mine.txt").read_text() == "edited by the worker\nagain\n"
    assert not (workspace / "deep" / "more" / "new.txt").exists()
    assert (workspace / "later" / "by-worker.txt").read_text() == "worker\nprogram\n"


def test_node_and_git_run_under_the_default_memory_limit(sandbox_on: None, workspace: Path) -> None:
    script = (
        "git init -q repo && cd repo && git -c user.name=a -c user.email=a@example.com "
        "commit -q --allow-empty -m first && git log --format=%s && "
        'node -e "WebAssembly.instantiate(new Uint8Array([0,97,115,109,1,0,0,0]))'
        ".then(() => console.log('node ok'))\""
    )
    done = run_in_sandbox(workspace, ["sh", "-c", script])
    assert (done.returncode, done.output.split()) == (0, ["first", "node", "ok"]), done.output


# --- The start-up probe refuses what it cannot enforce ---------------------------------------


@pytest.fixture
def uncached_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "_probe", sandbox._probe.__wrapped__)


def sandbox_errors() -> list[str]:
    """The sandbox's start-up check alone (run_checks would also run Django's model checks,
    which need the database)."""
    return [f"{e.id}: {e.msg}" for e in check_sandbox() if e.id.startswith("dispatcher.E04")]


def test_the_probe_refuses_a_filter_that_lets_calls_through(
    sandbox_on: None, uncached_probe: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    allow_all = tmp_path / "allow-all.bpf"
    with allow_all.open("wb") as out:
        pyseccomp.SyscallFilter(pyseccomp.ALLOW).export_bpf(out)
    monkeypatch.setattr(seccomp, "bpf_file", lambda: allow_all)
    [error] = sandbox_errors()
    assert error.startswith("dispatcher.E041") and "let personality() through" in error


def test_the_probe_refuses_a_writable_proc_sys(
    sandbox_on: None, uncached_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "PROC_READ_ONLY", ())
    [error] = sandbox_errors()
    assert error.startswith("dispatcher.E041") and "/proc/sys is not mounted read-only" in error


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user matters when Harness is root")
@pytest.mark.parametrize(
    ("user", "expected"),
    [("no-such-user-here", "is not a user on this host"), ("0:0", "root's uid or gid")],
)
def test_the_probe_refuses_a_sandbox_user_that_is_missing_or_root(
    sandbox_on: None, uncached_probe: None, settings: Any, user: str, expected: str
) -> None:
    settings.HARNESS_SANDBOX_USER = user
    [error] = sandbox_errors()
    assert error.startswith("dispatcher.E041") and expected in error


@pytest.mark.parametrize("memory", ["lots", "1M"])
def test_a_memory_setting_that_is_no_limit_fails_the_checks(
    sandbox_on: None, uncached_probe: None, settings: Any, memory: str
) -> None:
    settings.HARNESS_SANDBOX_MEMORY = memory
    errors = sandbox_errors()
    assert any(e.startswith("dispatcher.E044") and repr(memory) in e for e in errors), errors


def test_the_filter_names_every_refused_call() -> None:
    with tempfile.TemporaryFile() as text:
        seccomp.build().export_pfc(text)
        text.seek(0)
        pfc = text.read().decode()
    arch = pyseccomp.system_arch()
    numbers = {name: pyseccomp.resolve_syscall(arch, name) for name in seccomp.REFUSED}
    assert all(number >= 0 for number in numbers.values()), numbers  # known to libseccomp
    for name, number in numbers.items():
        assert f"if ($syscall == {number})" in pfc, name


# --- Harness as an unprivileged user ---------------------------------------------------------

# Run by Harness's interpreter as uid 65534: the sandbox module exactly as a worker of an
# unprivileged deployment uses it.
AS_USER = r"""
import json, os, sys, tempfile
from pathlib import Path
import django
django.setup()
from dispatcher.tools import sandbox

workspace = Path(tempfile.mkdtemp())
(workspace / "boundary.py").write_text(sys.argv[1])
env = {"PATH": "/usr/bin:/bin"}

def run(argv, **limits):
    limits = sandbox.Limits(timeout=30, output_chars=20000, **limits)
    return sandbox.run(argv, workspace=workspace, cwd=workspace, env=env, limits=limits)

found = {"euid": os.geteuid(), "probe": sandbox.probe(), "user": sandbox.sandbox_user()}
done = run(["python3", "boundary.py", sys.argv[2]])
found["boundary"] = done.output
found["owner"] = (workspace / "made-by-sandbox").stat().st_uid
hog = run(["python3", "-c", sys.argv[3]], memory_bytes=256 << 20)
found["hog"] = [hog.returncode, hog.output]
print(json.dumps(found))
"""
NOBODY = 65534


@pytest.fixture
def unprivileged_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="harness-as-user-"))
    os.chown(home, NOBODY, NOBODY)
    yield home
    subprocess.run(["rm", "-rf", str(home)], check=False)


def as_user_command(home: Path) -> list[str]:
    """A private mount namespace where Harness's interpreter (which may lie under /root,
    mode 0700) is reachable by uid 65534, then setpriv to that uid: Harness's code runs
    with no privilege at all, and starts the sandbox itself."""
    prefix = Path(sys.base_prefix)
    stage = home / "interpreter"
    shell = (
        f"mkdir -p {stage} && mount --bind {prefix} {stage} && "
        "mount -t tmpfs -o mode=0755 tmpfs /root && "
        f"mkdir -p {prefix} && mount --bind {stage} {prefix} && "
        f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- "$@"'
    )
    python = [sys.executable, "-c", AS_USER, BOUNDARY_SCRIPT, boundary_spec(), HOG]
    if not str(prefix).startswith("/root/"):
        shell = f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh", *python]


@pytest.mark.skipif(os.geteuid() != 0, reason="Harness runs as this user already: see above")
def test_with_harness_as_a_user_the_program_is_that_user_and_refused_alike(
    sandbox_on: None, unprivileged_home: Path
) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(unprivileged_home),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "harness_site.settings",
        "HARNESS_SECRET_KEY": "test-secret-key-not-for-production",
        "HARNESS_DATA_DIR": str(unprivileged_home / "data"),
        "HARNESS_SANDBOX": "bwrap",
    }
    done = subprocess.run(
        as_user_command(unprivileged_home),
        env=env,
        cwd=unprivileged_home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert (found["euid"], found["probe"], found["user"]) == (NOBODY, None, None)
    inside = json.loads(found["boundary"])
    check_boundary(inside, found["owner"], NOBODY)
    assert inside["uid"] == sandbox.SANDBOX_UID  # 65534 inside its own user namespace
    returncode, output = found["hog"]
    assert returncode != 0 and "allocated" not in output
    assert "MemoryError" in output or "used more than" in output
