"""docs/architecture.md's "to change X, open Y" table names only what exists: every file
and folder it names, and every `module.py::name` defined at the top of its module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def table_rows(text: str) -> list[tuple[str, str]]:
    """(what to change, where) for each row of the "To change X, open Y" table."""
    section = text.split("## To change X, open Y", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("to change", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def named_paths(cell: str) -> list[tuple[str, str]]:
    """(path, name or "") for each file or folder a cell names. A bare file name
    (`codex.py`) is in the folder of the path named before it in the same cell;
    placeholders (`<tool>.py`) are skipped."""
    found: list[tuple[str, str]] = []
    folder = ""
    for ref in re.findall(r"`([^`]+)`", cell):
        path, _, name = ref.partition("::")
        if "<" in path or not re.fullmatch(r"[\w./-]+(\.py|\.html|/)", path):
            continue
        if "/" not in path.rstrip("/"):
            path = folder + path
        folder = path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
        found.append((path, name))
    return found


def problems(text: str, root: Path) -> list[str]:
    """What the table names that does not exist under `root`."""
    out = []
    for change, where in table_rows(text):
        for path, name in named_paths(where):
            target = root / path
            if not target.exists():
                out.append(f"'{change}': {path} does not exist")
            elif name and name not in top_level_names(target):
                out.append(f"'{change}': {path} defines no {name}")
    return out


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_every_module_the_table_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(table_rows(text)) > 30  # the table was found and read
    assert problems(text, ROOT) == []


def test_a_drifted_row_is_named() -> None:
    text = (
        "## To change X, open Y\n\n| to change | open |\n|---|---|\n"
        "| hooks | `dispatcher/gateways/hooks.py`, `gone.py`, `dispatcher/admission.py::_nope` |\n"
        "| a tool | `dispatcher/tools/<tool>.py` |\n"
    )
    assert problems(text, ROOT) == [
        "'hooks': dispatcher/gateways/gone.py does not exist",
        "'hooks': dispatcher/admission.py defines no _nope",
    ]
