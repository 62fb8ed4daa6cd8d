"""run_command: run one program (argv, no shell) inside the workspace."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError


def run_command(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Run `argv` in `cwd` (default: the workspace) and return "exit code N\\n<output>".

    stdin is empty; stdout and stderr are combined and capped to ctx.output_limit. The
    environment holds only PATH, HOME (the workspace), LANG and TERM. A non-zero exit is
    a normal result. Raises ToolError when the program cannot be started, TimeoutError
    after ctx.timeout seconds (the whole process group is killed first).
    """
    argv = list(args["argv"])
    relative_cwd = args.get("cwd", ".")
    cwd = resolve_in_workspace(ctx.workspace, relative_cwd)
    if not cwd.is_dir():
        raise ToolError(f"cwd '{relative_cwd}' is not a directory in the workspace.")
    with tempfile.TemporaryFile() as output:
        process = _start(argv, cwd, scrubbed_environment(ctx.workspace), output)
        try:
            returncode = process.wait(timeout=ctx.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise TimeoutError(
                f"Command {shlex.join(argv)!r} did not finish within {ctx.timeout:g} s and "
                "was killed with its child processes."
            ) from None
        _kill_group(process)  # background children must not outlive the call
        text = _read_capped(output, ctx.output_limit)
    return f"exit code {_describe_exit(returncode)}\n{text}"


def scrubbed_environment(workspace: Path) -> dict[str, str]:
    """The whole environment a command gets: nothing inherited except PATH."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(workspace.resolve()),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }


def _start(
    argv: list[str], cwd: Path, env: dict[str, str], output: IO[bytes]
) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout kills everything
        )
    except FileNotFoundError as error:
        raise ToolError(
            f"Command '{argv[0]}' was not found on PATH. Check the name, or run "
            "['sh', '-c', 'command -v NAME'] to see what is installed."
        ) from error
    except PermissionError as error:
        raise ToolError(f"Command '{argv[0]}' is not executable: {error.strerror}.") from error
    except OSError as error:
        raise ToolError(f"Command '{argv[0]}' could not be started: {error}.") from error


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _read_capped(output: IO[bytes], limit: int) -> str:
    """The captured output as text, at most `limit` characters plus a truncation note."""
    size = output.seek(0, os.SEEK_END)
    output.seek(0)
    head = output.read(limit * 4).decode("utf-8", errors="replace")
    if len(head) <= limit and size <= limit * 4:
        return head
    shown = head[:limit]
    hidden = size - len(shown.encode("utf-8", errors="replace"))
    return f"{shown}\n[truncated: about {hidden} more bytes of output]"


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return str(returncode)
    try:
        return f"{returncode} (killed by {signal.Signals(-returncode).name})"
    except ValueError:
        return str(returncode)


def present_command(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """What a reviewer sees: the argv, the absolute cwd it runs in, and a shell-quoted line."""
    argv = [str(word) for word in arguments.get("argv") or []]
    cwd = arguments.get("cwd", ".")
    try:
        resolved = (workspace.resolve() / str(cwd)).resolve(strict=False)
    except (OSError, RuntimeError, ValueError):
        resolved = workspace.resolve()
    return {"kind": "command", "argv": argv, "cwd": str(resolved), "text": shlex.join(argv)}


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
    timeout=60.0,
    open_world=True,
    path_arguments=("cwd",),
    command_argument="argv",
)
