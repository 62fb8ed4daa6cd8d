"""A red-team sweep of the sandbox as Harness runs it here (root), and of the command
reader's knowledge of what a program it reads as harmless really runs.

Every test runs a real program in a real bwrap sandbox (run_command's own environment),
so what is asserted is what the sandboxed program could do. The defects found are fixed
or marked xfail(strict=True) with the reason; the rest locks in what held."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.policy.reading import read_command
from dispatcher.tools import sandbox
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.run_command import program_path


@pytest.fixture
def workspace(sandboxed_workspace: Path) -> Path:
    return sandboxed_workspace


def exchanging(a: Path, b: Path) -> tuple[threading.Event, threading.Thread, list[int]]:
    """Another sandboxed program, whose writable directory holds `a` and `b`: it
    exchanges them over and over (renameat2 RENAME_EXCHANGE) until the event is set.
    (The event, its thread, and how many exchanges it made so far.)"""
    stop = threading.Event()
    swaps = [0]

    def swap() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        while not stop.is_set():
            libc.renameat2(-100, bytes(a), -100, bytes(b), 2)
            swaps[0] += 1

    thread = threading.Thread(target=swap)
    thread.start()
    return stop, thread, swaps


def run_command(workspace: Path, argv: list[str], cwd: str = ".", git_guard: str = "all") -> str:
    """run_command as the worker runs it: its environment, its sandbox (`git_guard`: as the
    worker decides it, execution.git_guard)."""
    ctx = ExecutionContext(
        workspace=workspace, call_id="rtd", timeout=30, output_limit=20_000, git_guard=git_guard
    )
    return str(RUN_COMMAND.execute(ctx, {"argv": argv, "cwd": cwd}))


def python(workspace: Path, code: str) -> str:
    return run_command(workspace, ["python3", "-c", code])


# --- the seccomp filter ----------------------------------------------------------------------


def test_a_vsock_socket_is_refused(workspace: Path) -> None:
    # vsock is not network-namespaced: --unshare-net left it open, and in a virtual machine
    # (Firecracker, cloud hypervisors) CID 2 is the hypervisor's services, CID 1 the host's
    # own vsock listeners. socket(AF_VSOCK) used to succeed in the sandbox.
    out = python(
        workspace,
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "    print('vsock open', s.fileno())\n"
        "except OSError as e:\n"
        "    print('vsock refused', e.errno)\n"
        "try:\n"
        "    socket.socket(0x100000000 | socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "    print('wide vsock open')\n"
        "except (OSError, OverflowError) as e:\n"
        "    print('wide vsock refused')\n",
    )
    assert "vsock refused 1" in out, out
    assert "open" not in out, out


# Machine code run from an executable page, each returning to Python if the kernel lets
# it: the 32-bit ABI (int 0x80, getpid) and the x32 ABI (syscall with bit 30 set) must
# kill the process (SIGSYS), never reach a second, unfiltered system-call table.
FOREIGN_ABI = r"""
import ctypes, mmap, sys
code = {
    "int80": bytes.fromhex("b814000000" "cd80" "c3"),          # mov eax,20; int 0x80; ret
    "x32": bytes.fromhex("b827000040" "0f05" "c3"),            # mov eax,0x40000027; syscall
    "x32_unshare": bytes.fromhex("b810010040" "bf00000010" "0f05" "c3"),  # unshare(NEWUSER)
}[sys.argv[1]]
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
print("returned", ctypes.CFUNCTYPE(ctypes.c_long)(address)(), flush=True)
"""


@pytest.mark.parametrize("abi", ["int80", "x32", "x32_unshare"])
def test_a_foreign_system_call_abi_kills_the_program(workspace: Path, abi: str) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the 32-bit and x32 ABIs are x86_64's")
    (workspace / "abi.py").write_text(FOREIGN_ABI)
    out = run_command(workspace, ["python3", "abi.py", abi])
    assert "returned" not in out, out
    assert "SIGSYS" in out.splitlines()[0], out


# --- the program's environment: HOME is the run's own, not the workspace ----------------------------------------


def test_git_status_runs_no_program_named_by_a_gitconfig_in_home(workspace: Path) -> None:
    # HOME is the workspace. The reader guards `.git/config` (core.fsmonitor runs with git
    # status), but `~/.gitconfig` is the same file under another name: written by
    # write_file, `cp`, `git apply` or a checkout, it made an allowed `git status` run any
    # program. git now reads no per-user configuration (GIT_CONFIG_GLOBAL).
    assert read_command(("git", "status")).unreadable is None  # an allow rule may match it
    run_command(workspace, ["git", "init", "-q"])
    marker = workspace / "ran"
    hook = f"echo fsmonitor > {marker}; false"
    (workspace / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "{hook}"\n')
    (workspace / ".config" / "git").mkdir(parents=True)
    (workspace / ".config" / "git" / "config").write_text(
        f'[diff]\n\texternal = "sh -c \\"echo diff > {marker}\\""\n'
    )
    (workspace / "f").write_text("a\n")
    run_command(workspace, ["git", "add", "f"])
    (workspace / "f").write_text("b\n")
    out = run_command(workspace, ["git", "status", "--short"])
    out += run_command(workspace, ["git", "diff"])
    assert not marker.exists(), out
    # a repository's own configuration still works
    assert run_command(
        workspace, ["git", "config", "user.email", "a@b.c"], git_guard="all-but-config"
    ).startswith("exit code 0")


def test_home_is_an_empty_directory_of_each_run_not_the_workspace(workspace: Path) -> None:
    # HOME was the workspace, where the agent writes: every program's per-user files (a
    # `.hgrc`'s hooks, a `.curlrc`, a `.npmrc`'s script shell, IPython's startup files,
    # Python's user site-packages) were the agent's to plant under an allowed command.
    # HOME is empty and read-only (a per-user file copied there within the run would be
    # read as well: tests/redteam/test_home_and_server_bind_attacks.py).
    out = run_command(workspace, ["sh", "-c", 'echo "home=$HOME"; ls -A "$HOME"; touch "$HOME/x"'])
    assert out.startswith("exit code 1\nhome=/run/home\ntouch: "), out  # nothing listed
    assert "Read-only file system" in out, out
    assert not (workspace / "x").exists()


def test_python_reads_no_user_site_packages_the_agent_planted(workspace: Path) -> None:
    # A `.pth` line under HOME's user site-packages runs at every Python start: with HOME
    # the workspace, a planted one ran inside any allowed Python program.
    version = run_command(workspace, ["python3", "-c", "import sys; print(*sys.version_info[:2])"])
    major, minor = version.splitlines()[1].split()
    site = workspace / ".local" / "lib" / f"python{major}.{minor}" / "site-packages"
    site.mkdir(parents=True)
    (site / "planted.pth").write_text("import os; open('ran-pth', 'w').close()\n")
    (workspace / "hello.py").write_text("print('hello')\n")
    out = run_command(workspace, ["python3", "hello.py"])
    assert out == "exit code 0\nhello\n", out
    assert not (workspace / "ran-pth").exists()


def test_the_sandbox_off_gives_each_run_a_new_empty_home(workspace: Path, settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"
    (workspace / ".hgrc").write_text("[hooks]\n")
    out = run_command(workspace, ["sh", "-c", 'echo "$HOME"; ls -A "$HOME"; touch "$HOME/x"'])
    home = Path(out.splitlines()[1])
    assert home != workspace.resolve() and out.count("\n") == 2, out
    assert not home.exists()  # removed after the run


def test_vim_is_never_read_as_harmless(workspace: Path) -> None:
    # `vim f` runs HOME's .vimrc (and .vim/plugin/*), which the agent writes: it was read
    # as harmless, so an allow rule for vim let a planted .vimrc run anything.
    (workspace / ".vimrc").write_text(":call writefile(['x'], 'ran-vim')\n:qa!\n")
    assert read_command(("vim", "f")).unreadable is not None
    assert read_command(("view", "f")).unreadable is not None


def test_python_m_names_the_workspaces_module_first_and_P_the_installed_one(
    workspace: Path,
) -> None:
    """`python3 -m NAME` runs the working directory's NAME when it holds one, as Python
    looks there first: a rule for it allows the workspace's code (docs/rules.md, "Limits",
    as a rule for `python3 script.py` does). `-P` (or `-I`) names the installed module,
    and reads as readable for a rule to allow."""
    (workspace / "json").mkdir()
    (workspace / "json" / "__init__.py").write_text("")
    (workspace / "json" / "tool.py").write_text("print('workspace code')\n")
    (workspace / "x.json").write_text('{"a": 1}')
    plain = ["python3", "-m", "json.tool", "x.json"]
    assert "workspace code" in run_command(workspace, plain)  # (the documented limit)
    for flag in ("-P", "-I"):
        argv = ["python3", flag, "-m", "json.tool", "x.json"]
        assert read_command(tuple(argv)).unreadable is None
        out = run_command(workspace, argv)
        assert "workspace code" not in out and '"a": 1' in out, out


# --- the program's PATH ----------------------------------------------------------------------


def test_path_never_leads_to_the_workspace(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's PATH with an empty entry (`PATH=$PATH:$EXTRA`, EXTRA unset) or `.` or
    # a relative one means "the working directory": an allowed `tool` that is not
    # installed then ran the workspace's file called `tool`, and the reader, which reads
    # `./tool` as unreadable, read it as the program `tool`.
    name = "harness-rtd-not-installed"
    program = workspace / name
    program.write_text("#!/bin/sh\necho workspace program ran\n")
    program.chmod(0o755)
    (workspace / "bin").mkdir()
    for path in ("/usr/bin:/bin:", ".:/usr/bin", "bin:/usr/bin", f"{workspace}:/usr/bin"):
        monkeypatch.setenv("PATH", path)
        try:
            out = run_command(workspace, [name])
        except ToolError as error:
            out = str(error)
        assert "workspace program ran" not in out, (path, out)
    assert program_path(f"/usr/bin::.:bin:{workspace}/bin:/bin", workspace.resolve()) == (
        "/usr/bin:/bin"
    )


# --- what held, locked in ----------------------------------------------------------------------


def test_a_daemon_that_double_forks_and_setsids_dies_with_the_timeout(workspace: Path) -> None:
    script = (
        'setsid -f sh -c "trap \\"\\" HUP TERM; sleep 3; echo late > late1"; '
        '(sh -c "sleep 3; echo late > late2" &); '
        'nohup sh -c "sleep 3; echo late > late3" >/dev/null 2>&1 & sleep 30'
    )
    limits = sandbox.Limits(timeout=1.5, output_chars=2000)
    with pytest.raises(TimeoutError):
        sandbox.run(
            ["sh", "-c", script],
            workspace=workspace,
            cwd=workspace,
            env={"PATH": "/usr/bin:/bin"},
            limits=limits,
        )
    time.sleep(4)
    assert not list(workspace.glob("late*"))


def test_no_capability_no_namespace_no_host_service(workspace: Path) -> None:
    out = python(
        workspace,
        "import ctypes, os, socket\n"
        "print('fds', sorted(os.listdir('/proc/self/fd')))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "status = open('/proc/self/status').read()\n"
        "print([l for l in status.splitlines() if l.startswith(('CapEff', 'CapBnd', 'CapAmb'))])\n"
        "print('uid', os.getuid())\n"
        "for flag in (0x10000000, 0x20000, 0x40000000):\n"
        "    print('unshare', hex(flag), libc.unshare(flag), ctypes.get_errno())\n"
        "for port in (6379, 5432):\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    print('tcp', port, s.connect_ex(('127.0.0.1', port)))\n"
        "print('pids', sorted(p for p in os.listdir('/proc') if p.isdigit()))\n",
    )
    assert "CapEff:\\t0000000000000000" in out and "CapBnd:\\t0000000000000000" in out, out
    assert "uid 0" not in out, out
    assert out.count(" -1 1") == 3, out  # every unshare: EPERM
    assert "tcp 6379 0" not in out and "tcp 5432 0" not in out, out
    assert "fds ['0', '1', '2', '3']" in out, out  # 3: listdir's own


# --- a workspace nested in another agent's ---------------------------------------------------


def run_in(workspace: Path, script: str) -> sandbox.Completed:
    return sandbox.run(
        ["sh", "-c", script],
        workspace=workspace,
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin"},
        limits=sandbox.Limits(timeout=30, output_chars=20_000),
    )


def swapped_nested(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Agent A's workspace a holding agent B's, a/b, which A's own program has replaced
    with a symlink to a host directory (victim, holding f) neither may touch."""
    a = tmp_path / "projects" / "a"
    b = a / "b"
    b.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f").write_text("original\n")
    (victim / "f").chmod(0o644)
    done = run_in(a, f"mv b b.old && ln -s {victim} b && echo swapped")
    assert "swapped" in done.output, done.output
    return a, b, victim


def test_a_preview_in_a_nested_workspace_replaced_by_a_symlink_follows_nothing(
    workspace: Path, tmp_path: Path
) -> None:
    # The same swap, then B's next command asks and is previewed: the preview resolved
    # the path too, gave the victim's tree to the sandbox user and read it as its lower
    # layer (its output, the reviewer's page and, once applied, the agent's result).
    from dispatcher.tools import preview, workspace_lock
    from dispatcher.tools.run_command import scrubbed_environment

    a, b, victim = swapped_nested(tmp_path)
    owner = victim.stat().st_uid
    with workspace_lock.held(a), pytest.raises(ToolError, match="symlink"):
        preview.run_preview(["cat", "f"], cwd=b, workspace=b, env=scrubbed_environment(b))
    assert victim.stat().st_uid == owner and (victim / "f").stat().st_uid == owner


def test_a_nested_workspace_replaced_by_a_symlink_is_not_followed(
    workspace: Path, tmp_path: Path
) -> None:
    # Agent A's fixed workspace holds agent B's (a monorepo and one of its packages; the
    # docs accept that A sees B's files). A's program replaces B's directory with a
    # symlink to a host directory neither may touch (a person's home, an app in /opt, a
    # virtualenv the worker imports from). B's next run resolved it, gave the whole tree
    # to the sandbox user (as root: chown of every file) and bound it writable.
    _, b, victim = swapped_nested(tmp_path)
    owner = victim.stat().st_uid
    with pytest.raises(ToolError, match="symlink"):
        run_in(b, "echo written > f")
    assert (victim / "f").read_text() == "original\n"
    assert victim.stat().st_uid == owner and (victim / "f").stat().st_uid == owner


def test_a_workspace_swapped_for_a_symlink_after_the_check_is_not_bound(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race behind the test above: the path is resolved and checked, then another
    # agent's program swaps the directory for a symlink before bwrap mounts it, and bwrap
    # (as root) followed the symlink. The workspace is now bound by the descriptor that
    # was opened, without following symlinks, after the check.
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o777)
    build = sandbox.bwrap_command

    def build_then_swap(*args: Any, **kwargs: Any) -> list[str]:
        command = build(*args, **kwargs)  # everything checked and resolved by now
        workspace.rename(workspace.with_name("moved"))
        workspace.symlink_to(victim)
        return command

    monkeypatch.setattr(sandbox, "bwrap_command", build_then_swap)
    run_in(workspace, "echo written > f")
    assert not (victim / "f").exists()
    assert (workspace.with_name("moved") / "f").read_text() == "written\n"


# --- one program, two names --------------------------------------------------------------------


def test_perl_under_its_arch_qualified_name_is_read_as_perl(workspace: Path) -> None:
    # Debian's perl is also /usr/bin/perl5.36-x86_64-linux-gnu: under that name `-e CODE`
    # was read as a plain program's arguments (and a deny rule on perl missed it).
    names = sorted(p.name for p in Path("/usr/bin").glob("perl5*-linux-gnu*"))
    name = names[0] if names else "perl5.36-x86_64-linux-gnu"
    argv = (name, "-e", "system('id')")
    assert read_command(argv).unreadable is not None
    if names:  # what it would have run, in the real sandbox
        assert "uid=" in run_command(workspace, list(argv))


# A patch `git apply` (read as harmless) turns into a git directory that is not named .git:
# HEAD, objects/, refs/ and a config whose core.fsmonitor runs with the next `git status`.
BARE_LAYOUT_PATCH = """\
diff --git a/x/HEAD b/x/HEAD
new file mode 100644
--- /dev/null
+++ b/x/HEAD
@@ -0,0 +1 @@
+ref: refs/heads/main
diff --git a/x/config b/x/config
new file mode 100644
--- /dev/null
+++ b/x/config
@@ -0,0 +1,3 @@
+[core]
+\tworktree = ..
+\tfsmonitor = "echo ran > {marker}; false"
diff --git a/x/objects/info/k b/x/objects/info/k
new file mode 100644
--- /dev/null
+++ b/x/objects/info/k
@@ -0,0 +1 @@
+k
diff --git a/x/refs/heads/k b/x/refs/heads/k
new file mode 100644
--- /dev/null
+++ b/x/refs/heads/k
@@ -0,0 +1 @@
+k
"""


def test_a_git_directory_written_by_git_apply_runs_nothing(workspace: Path) -> None:
    marker = workspace / "ran"
    (workspace / "evil.patch").write_text(BARE_LAYOUT_PATCH.format(marker=marker))
    assert read_command(("git", "apply", "evil.patch")).unreadable is None
    run_command(workspace, ["git", "init", "-q"])
    applied = run_command(workspace, ["git", "apply", "evil.patch"])
    assert applied.startswith("exit code 0"), applied
    # the git guard takes a bare repository a run made out of git's reach (its HEAD removed)
    assert not (workspace / "x" / "HEAD").exists(), applied
    # named: never read as harmless (as `--git-dir=.git` was not either)
    assert read_command(("git", "--git-dir=x", "status")).unreadable is not None
    assert read_command(("git", "--git-dir", "x", "--work-tree=.", "status")).unreadable
    # found: git -C x takes x for a bare repository only when one is named
    argv = ["git", "-C", "x", "status"]
    assert read_command(tuple(argv)).unreadable is None
    out = run_command(workspace, argv)
    assert not marker.exists(), out


def test_python_tools_under_their_own_names_are_read_as_python(workspace: Path) -> None:
    # `python3 -m pdb -c CMD` is unreadable; Debian's pdb3 is the same program, and
    # `pydoc3 NAME` imports NAME from the working directory (a workspace NAME.py).
    (workspace / "mod.py").write_text("print('workspace code')\n")
    for argv in (("pdb3", "-c", "!print(1)", "x.py"), ("pydoc3", "mod"), ("pdb3.11", "x.py")):
        assert read_command(argv).unreadable is not None, argv
    if Path("/usr/bin/pydoc3").exists():
        assert "workspace code" in run_command(workspace, ["pydoc3", "mod"])


@pytest.mark.skipif(os.geteuid() != 0, reason="root only")
def test_the_walk_gives_no_file_swapped_in_for_an_entry_it_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # give_to_sandbox looked an entry up by name, judged it, then gave it by name again: a
    # program exchanging two names meanwhile (renameat2 RENAME_EXCHANGE) had it give a file
    # hard-linked from outside the workspace (`git clone --local`, `cp -al`), the case a
    # file with another name keeps its owner for. The entry is now held by descriptor.
    user = (65534, 65534)
    monkeypatch.setattr(sandbox, "_owner", lambda: user)
    monkeypatch.setattr(sandbox, "hidden_paths", lambda: [])
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_text("root's\n")
    os.chown(secret, 0, 0)
    ws = tmp_path / "ws"
    d = ws / "d"
    d.mkdir(parents=True)
    for i in range(200):  # (many names: the walk spends its time near `x`)
        (d / f"f{i:03}").write_text("")
    (d / "x").write_text("the program's own\n")
    os.link(secret, d / "hl")  # the second name lies in the workspace
    # a sandboxed program: exchanges two names it may rename
    stop, thread, _ = exchanging(d / "x", d / "hl")
    try:
        for _ in range(1000):
            os.chown(ws, 0, 0)  # not yet given: walked again
            fd = os.open(ws, os.O_PATH | os.O_DIRECTORY)
            try:
                sandbox.give_to_sandbox(ws, root_fd=fd)
            finally:
                os.close(fd)
            if secret.stat().st_uid != 0:
                break
    finally:
        stop.set()
        thread.join()
    assert secret.stat().st_uid == 0, "the file outside the workspace was given away"


def test_a_writable_server_path_swapped_after_its_check_gives_nothing_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server's writable path was checked by path, then resolved again and given by path:
    # another server's program, whose writable path holds this one, exchanging it with a
    # symlink in between had root give the symlink's target away. It is now given by the
    # descriptor of the directory judged, and refused when that is not the one checked.
    from dispatcher.tools import sandbox_servers
    from dispatcher.tools.base import ToolError

    user = (65534, 65534)
    monkeypatch.setattr(sandbox, "_owner", lambda: user)
    outside = tmp_path / "victim"  # a person's or an application's directory
    outside.mkdir()
    (outside / "f").write_text("theirs\n")
    shared = tmp_path / "shared"  # server 1's writable path, given already
    (shared / "sub").mkdir(parents=True)
    os.symlink(outside, shared / "alt")
    for p in (shared, shared / "sub"):
        os.chown(p, *user)
    os.lchown(shared / "alt", *user)
    # server 1's program: sub <-> a symlink, over and over
    stop, thread, _ = exchanging(shared / "sub", shared / "alt")
    entry = f"{shared / 'sub'}:rw"  # server 2's writable path
    try:
        for _ in range(3000):
            path, _ = sandbox_servers.parse_server_path(entry)
            with contextlib.suppress(ToolError, OSError):  # (a path mid-exchange: refused)
                if sandbox_servers.server_path_problem(entry) is None:
                    os.close(sandbox_servers._give_checked(path, path.resolve()))
            assert (outside / "f").stat().st_uid == 0, "the symlink's target was given away"
    finally:
        stop.set()
        thread.join()


def test_a_writable_server_path_swapped_before_the_bind_binds_nothing_else(
    workspace: Path, tmp_path: Path
) -> None:
    # The server's writable path was given by descriptor, but bwrap bound the path the
    # command named: a program exchanging it with a symlink at that moment had another
    # directory bound writable in the server's sandbox. It is bound by the descriptor of
    # the directory judged now (held here, opened again by the launcher from /proc).
    import subprocess

    from dispatcher.tools import sandbox_servers
    from dispatcher.tools.base import ToolError

    outside = tmp_path / "victim"  # a person's directory, readable by all
    outside.mkdir()
    (outside / "f").write_text("theirs\n")
    shared = tmp_path / "shared"  # another server's writable path, holding this one
    (shared / "sub").mkdir(parents=True)
    os.symlink(outside, shared / "alt")
    # that server's program: sub <-> a symlink, over and over
    stop, thread, swaps = exchanging(shared / "sub", shared / "alt")
    target = shared / "sub"
    started = 0
    try:
        for _ in range(120):
            with contextlib.ExitStack() as held:
                try:
                    argv = sandbox_servers.sandboxed_argv(
                        ["/bin/sh", "-c", 'cat "$0/f"', str(target)], [f"{target}:rw"], held
                    )
                except ToolError:  # (judged mid-exchange: refused, nothing started)
                    continue
                done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
            assert b"theirs" not in done.stdout, "another directory was bound for the server"
            started += b"No such file" in done.stderr  # the judged directory, bound
    finally:
        stop.set()
        thread.join()
    assert swaps[0] > 1000 and started > 5, (swaps, started)
