"""`verify_audit --file` reads a file someone hands over (review of ec53131, the
verifier's diagnosis): a line that is not an event is named, never a traceback. A line of
deeply nested JSON (`[[[[...]]]]`, 100,000 levels: 200 KB) raised RecursionError out of
json.loads, which the command does not catch (it catches ValueError and OSError): the
person verifying saw a traceback, not the line that is wrong.

audit.verify.file_events takes a RecursionError of json.loads as the line not being JSON:
the line is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.audit.test_verify import run_verify

pytestmark = pytest.mark.django_db


def test_a_deeply_nested_export_line_is_named_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    ok, output = run_verify("--file", str(path))
    assert not ok
    assert f"{path}:1" in output, output
