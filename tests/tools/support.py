"""What the sandbox tests share: the bwrap requirement, a probe script, a GIL-holding tool."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import Any

import pytest

from dispatcher.tools import sandbox
from dispatcher.tools.base import ExecutionContext, Tool

NEEDS_BWRAP = (
    "Sandbox tests need Debian's bubblewrap with user namespaces: `apt-get install "
    "bubblewrap` (make test installs it)."
)


def sandbox_uid() -> int:
    """The uid a sandboxed program has: the sandbox user's host uid when Harness is root
    (no user namespace), else 65534 in the program's own user namespace."""
    user = sandbox.sandbox_user()
    return user[0] if user else sandbox.SANDBOX_UID


def require_bwrap() -> None:
    """Skip (saying how to enable) unless bwrap works here; under CI=true, fail instead.
    A run that turns the sandbox off in its environment (`make test-fast`) skips them."""
    if os.environ.get("HARNESS_SANDBOX") == "off":
        pytest.skip("HARNESS_SANDBOX=off for this run (make test-fast); make test runs them.")
    problem = "bwrap is not installed" if shutil.which("bwrap") is None else sandbox.probe()
    if problem is None:
        return
    message = f"{NEEDS_BWRAP} Here: {problem}."
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and " + message)
    pytest.skip(message)


def previews_as_root(settings: Any, timeout: int = 10) -> None:
    """Previews on, in the bwrap sandbox with no network, for a test of a previewed
    command's effect; skipped (require_bwrap) where bwrap cannot run, and unless Harness
    runs as root (the sandbox user rewrites the workspace's files)."""
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("needs root: the bwrap sandbox runs as the sandbox user")
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW = True
    settings.HARNESS_PREVIEW_TIMEOUT = timeout


# Run inside the sandbox as `python3 probe.py '<json of targets>'`: tries every way out and
# prints one JSON object, each value "blocked: <why>" or what got through.
PROBE_SCRIPT = r"""
import json, os, socket, sys

targets = json.loads(sys.argv[1])
found = {}

def attempt(name, action):
    try:
        found[name] = "open: " + str(action())[:200]
    except OSError as error:
        found[name] = "blocked: " + type(error).__name__ + " " + str(error.strerror)

def read(path):
    with open(path, "rb") as f:
        return f.read(64)

def write(path):
    with open(path, "w") as f:
        f.write("escaped")
    return path

def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
        return "connected"

def tcp(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return "connected"

for name, path in targets.get("read", {}).items():
    attempt("read " + name, lambda: read(path))
for name, path in targets.get("write", {}).items():
    attempt("write " + name, lambda: write(path))
for name, path in targets.get("unix", {}).items():
    attempt("unix " + name, lambda: unix(path))
for name, port in targets.get("tcp", {}).items():
    attempt("tcp " + name, lambda: tcp(port))
found["uid"] = os.getuid()
print(json.dumps(found))
"""


def probe_results(output: str) -> dict[str, Any]:
    """The probe's JSON from a run_command result ("exit code 0\\n{...}")."""
    first, _, rest = output.partition("\n")
    assert first == "exit code 0", output
    result: dict[str, Any] = json.loads(rest)
    return result


def _hog(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Hold the GIL for ~15 s in one C call (Python's re backtracking), after a mark."""
    with (ctx.workspace / "hog-runs.txt").open("a") as marks:
        marks.write(f"{time.time()}\n")
    re.match(r"(.+)+\x01", "a" * 28)
    return "finished"


GIL_HOG = Tool(
    name="gil_hog",
    description="Hold the GIL in one C call (tests only).",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
    execute=_hog,
    timeout=1.0,
    read_only=True,
)
