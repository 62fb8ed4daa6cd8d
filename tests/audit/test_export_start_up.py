"""`manage.py export_audit` starts without the MCP SDK or the shell parser: the apps
import them where first used (dispatcher.preload), so an export, which uses neither, does
not pay their start-up (S8: a third of a second or more of every export, on the host's
measure). The serving processes load them at start, as before."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support import processes

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["mcp", "mcp_types", "bashlex", "dispatcher.tools.sources.upstream"]


def loaded_after(code: str) -> dict[str, bool]:
    """Which of HEAVY a fresh process of the real settings has loaded after `code`."""
    script = (
        "import json, sys, django\n"
        "django.setup()\n"
        f"{code}\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "harness_site.settings"}
    done = processes.run([sys.executable, "-c", script], timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    loaded: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_the_export_command_loads_neither_the_mcp_sdk_nor_the_shell_parser() -> None:
    loaded = loaded_after(
        "from django.core.management import load_command_class\n"
        "load_command_class('audit', 'export_audit').create_parser('manage.py', 'export_audit')\n"
        # (what the command runs before its export: the system checks)
        "from django.core.checks import run_checks\nrun_checks()"
    )
    assert loaded == dict.fromkeys(HEAVY, False)


def test_a_serving_process_loads_them_at_start() -> None:
    """What the web process (harness_site.asgi) and a worker (worker_init) call."""
    loaded = loaded_after("from dispatcher import preload\npreload.load()")
    assert loaded == dict.fromkeys(HEAVY, True)
