"""run_command: run one program (argv, no shell) inside the workspace."""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from pathlib import Path
from typing import Any

from dispatcher.tools import sandbox
from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError, storable_text


def run_command(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Run `argv` in `cwd` (default: the workspace) and return "exit code N\\n<output>".

    The program runs in the sandbox (dispatcher.tools.sandbox, settings.HARNESS_SANDBOX).
    stdin is empty; stdout and stderr are combined, read while produced and capped to
    ctx.output_limit. The environment holds only PATH (no entry in the workspace), HOME
    (an empty directory of the run's own, not the workspace), LANG, TERM and git's own
    settings (see scrubbed_environment). A
    non-zero exit is a normal result. Raises ToolError when the program cannot be started,
    TimeoutError after ctx.timeout seconds (everything it started is killed first).
    """
    argv = list(args["argv"])
    relative_cwd = args.get("cwd", ".")
    cwd = resolve_in_workspace(ctx.workspace, relative_cwd)
    if not cwd.is_dir():
        raise ToolError(f"cwd '{relative_cwd}' is not a directory in the workspace.")
    limits = sandbox.Limits(timeout=ctx.timeout, output_chars=ctx.output_limit)
    try:
        done = sandbox.run(
            argv,
            workspace=ctx.workspace,
            cwd=cwd,
            env=scrubbed_environment(ctx.workspace),
            limits=limits,
            git=ctx.git_guard,
        )
    except TimeoutError:
        raise TimeoutError(
            f"Command {shlex.join(argv)!r} did not finish within {ctx.timeout:g} s and "
            "was killed with its child processes."
        ) from None
    exit_text = sandbox.describe_exit(done.returncode, sandboxed=done.sandboxed)
    return f"exit code {exit_text}\n{storable_text(done.output)}"


def scrubbed_environment(workspace: Path) -> dict[str, str]:
    """The whole environment a command gets: nothing inherited except PATH.

    HOME is an empty read-only directory of the sandbox's own (sandbox.HOME; caches go to
    the private /tmp), never the workspace: programs read per-user files from
    HOME (a `.hgrc`'s hooks, a `.curlrc`'s options, a `.npmrc`'s script shell, IPython's
    startup files, Python's user site-packages and their `.pth` lines, `.ssh/config`), and
    in the workspace the agent writes them, so any program an allow rule read as harmless
    would run what they name. git is told besides to read no per-user configuration
    (GIT_CONFIG_GLOBAL) wherever HOME is. Repository configuration (`.git/config`) is the
    command reader's to guard, and the system's (`/etc/gitconfig`) is the operator's. `git
    config --global` fails; an agent sets a repository's own configuration instead (`git
    config user.email ...`). And git uses a bare repository only when one is named
    (safe.bareRepository=explicit): `git -C x status` never takes the `config` of a bare
    layout an allowed `git apply` wrote in x/.
    """
    root = workspace.resolve()
    return {
        "PATH": program_path(os.environ.get("PATH", os.defpath), root),
        "HOME": sandbox.HOME,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "GIT_CONFIG_GLOBAL": os.devnull,
        # HOME is read-only (sandbox.HOME): caches go to the private /tmp instead
        "XDG_CACHE_HOME": "/tmp/.cache",  # noqa: S108
        "npm_config_cache": "/tmp/.npm",  # noqa: S108
        # a directory holding HEAD, config, objects/ and refs/ (which `git apply` or a
        # checkout may write) is a git directory only when named (`--git-dir`, unreadable)
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.bareRepository",
        "GIT_CONFIG_VALUE_0": "explicit",
    }


def program_path(value: str, workspace: Path) -> str:
    """`value` (the worker's PATH) without the entries that would make a bare program name
    run a file of the workspace: empty entries and `.` (the working directory), relative
    entries, and directories inside the workspace. The command reader reads `ls` as ls,
    and only a directory the program cannot write may answer to that name."""
    kept: list[str] = []
    for entry in value.split(os.pathsep):
        path = Path(entry)
        if not entry or not path.is_absolute():
            continue
        resolved = Path(os.path.normpath(entry))
        with contextlib.suppress(OSError, RuntimeError):
            resolved = path.resolve()
        if resolved == workspace or resolved.is_relative_to(workspace):
            continue
        if entry not in kept:
            kept.append(entry)
    return os.pathsep.join(kept) or os.defpath


def present_command(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """What a reviewer sees: the argv, the absolute cwd it runs in, and a shell-quoted line.

    The cwd is resolved as the run resolves it, and the directory found there is bound by
    its identity (`cwd_identity`, device and inode): a link on the way (`sub -> dirA`)
    that another call turns to `dirB` before the run would otherwise have the approved
    command run where the reviewer never looked (`changed_since`)."""
    argv = [str(word) for word in arguments.get("argv") or []]
    cwd = str(arguments.get("cwd", "."))
    resolved, identity = _bound_cwd(workspace, cwd)
    if resolved is None:
        try:
            shown = str((workspace.resolve() / cwd).resolve(strict=False))
        except (OSError, RuntimeError, ValueError):
            shown = str(workspace.resolve())
    else:
        shown = resolved
    return {
        "kind": "command",
        "argv": argv,
        "cwd": shown,
        "text": shlex.join(argv),
        "cwd_identity": identity,
    }


def _bound_cwd(workspace: Path, cwd: str) -> tuple[str | None, list[int] | None]:
    """The directory `cwd` names in `workspace`, resolved as `run_command` resolves it, and
    its (device, inode); (path, None) when it is no directory, (None, None) when it does
    not resolve inside the workspace."""
    try:
        resolved = resolve_in_workspace(workspace, cwd)
    except (ToolError, OSError, RuntimeError, ValueError):
        return None, None
    return str(resolved), directory_identity(resolved)


def directory_identity(path: Path) -> list[int] | None:
    """The (device, inode) of the directory at `path`, None when there is none: what an
    ask binds as `cwd_identity` (the preview records it too, under its lock)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return [info.st_dev, info.st_ino] if stat.S_ISDIR(info.st_mode) else None


def changed_since(
    arguments: dict[str, Any], workspace: Path, presentation: dict[str, Any]
) -> str | None:
    """Why the directory the command would start in is no longer the one the reviewer
    was shown (another path, or another directory at that path), or None. Asked under the
    workspace lock before an approved call runs, so nothing of the workspace changes it
    in between; an ask recorded before the cwd was bound has nothing to compare."""
    if "cwd_identity" not in presentation:
        return None
    cwd = str(arguments.get("cwd", "."))
    resolved, identity = _bound_cwd(workspace, cwd)
    if resolved != presentation.get("cwd") or identity != presentation["cwd_identity"]:
        now = "no directory in the workspace" if identity is None else resolved
        return (
            f"its working directory {cwd!r} now names {now}, not the directory the "
            f"reviewer was shown ({presentation.get('cwd')})"
        )
    return None


TOOL = Tool(
    name="run_command",
    description=(
        "Run a program in the workspace without a shell: `argv` is the program and its "
        "arguments, e.g. ['pytest', '-q']. `cwd` is a directory relative to the "
        "workspace. Returns the exit code and the combined stdout/stderr (truncated when "
        "long). Standard input is empty and the environment is minimal."
    ),
    parameters={
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "Program and arguments, e.g. ['git', 'status'].",
            },
            "cwd": {"type": "string", "description": "Directory relative to the workspace."},
        },
        "required": ["argv"],
        "additionalProperties": False,
    },
    execute=run_command,
    present_call=present_command,
    changed_since=changed_since,
    timeout=60.0,
    open_world=True,
    path_arguments=("cwd",),
    command_argument="argv",
    previewable=True,
)
