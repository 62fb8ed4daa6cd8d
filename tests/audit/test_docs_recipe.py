"""The dependency-free verification recipe in docs/audit.md works on a real export."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.audit.chains import write_chain

pytestmark = pytest.mark.django_db

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def recipe(tmp_path: Path) -> Path:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert code, "docs/audit.md has no python recipe"
    script = tmp_path / "verify.py"
    script.write_text(code.group(1))
    return script


def test_the_documented_recipe_passes_an_export_and_catches_an_edit(tmp_path: Path) -> None:
    events = write_chain(5)
    export = tmp_path / "audit.jsonl"
    call_command(
        "export_audit", "--session", events[0].chain, "--output", str(export), "--no-progress"
    )
    script = recipe(tmp_path)
    good = subprocess.run(
        [sys.executable, "-I", str(script), str(export)], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stderr
    assert f"{events[0].chain}: 5 events, head {events[-1].hash}" in good.stdout
    lines = export.read_text().splitlines()
    edited = json.loads(lines[2])
    edited["actor"] = "user:mallory"
    lines[2] = json.dumps(edited)
    export.write_text("\n".join(lines) + "\n")
    bad = subprocess.run(
        [sys.executable, "-I", str(script), str(export)], capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert f"seq 3 (event id {events[2].pk}): hash mismatch" in bad.stderr
