"""Start-up checks: broken tools and bad configuration stop `manage.py check`."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from django.core.checks import run_checks

from dispatcher.tools.base import Tool

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

# Django's own model checks ask SQLite whether it supports JSON fields.
pytestmark = pytest.mark.django_db

BROKEN = Tool(
    name="broken",
    description="x",
    parameters={"type": "object", "properties": {"a": {"type": "nope"}}},
)
NOT_OBJECT = Tool(name="listy", description="x", parameters={"type": "array"})
DUPLICATE = Tool(name="read_file", description="another read_file", parameters={"type": "object"})


def ids(errors: list[Any]) -> set[str]:
    return {e.id for e in errors}


def test_default_configuration_passes() -> None:
    assert [e for e in run_checks() if e.id and e.id.startswith("dispatcher.")] == []


@pytest.mark.parametrize(
    "extra, expected_id, text",
    [
        (
            "tests.dispatcher.test_startup_checks.BROKEN",
            "dispatcher.E004",
            "invalid parameters schema",
        ),
        ("tests.dispatcher.test_startup_checks.NOT_OBJECT", "dispatcher.E005", "type 'object'"),
        (
            "tests.dispatcher.test_startup_checks.DUPLICATE",
            "dispatcher.E003",
            "Duplicate tool name 'read_file'",
        ),
        ("tests.nowhere.TOOL", "dispatcher.E001", "Cannot import tool"),
    ],
)
def test_broken_tools_fail_the_checks(
    settings: Any, extra: str, expected_id: str, text: str
) -> None:
    settings.HARNESS_TOOLS = [*settings.HARNESS_TOOLS, extra]
    errors = [e for e in run_checks() if e.id == expected_id]
    assert errors and text in errors[0].msg


@pytest.mark.parametrize(
    "thresholds, expected_id",
    [
        ([], "dispatcher.E020"),
        ([1, 3], "dispatcher.E021"),
        ([3, 3, 5], "dispatcher.E022"),
        ([5, 3], "dispatcher.E023"),
    ],
)
def test_bad_repeat_thresholds_fail_the_checks(
    settings: Any, thresholds: list[int], expected_id: str
) -> None:
    settings.HARNESS_REPEAT_THRESHOLDS = thresholds
    assert expected_id in ids(run_checks())


def test_unknown_default_mode_fails_the_checks(settings: Any) -> None:
    settings.HARNESS_DEFAULT_MODE = "yolo"
    assert "dispatcher.E012" in ids(run_checks())


@pytest.mark.heavy
def test_manage_py_check_stops_with_a_clear_message() -> None:
    env = {
        **__import__("os").environ,
        "HARNESS_REPEAT_THRESHOLDS": "1,1",
        "DJANGO_SETTINGS_MODULE": "harness_site.settings",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "dispatcher.E021" in result.stderr and "HARNESS_REPEAT_THRESHOLDS" in result.stderr


@pytest.mark.parametrize(
    "recorder, text",
    [
        ("approvals.services.no_such_recorder", "approvals.services.no_such_recorder"),
        ("approvals.services.REVIEWER", "not callable"),
    ],
)
def test_an_ask_recorder_that_does_not_resolve_fails_the_checks(
    settings: Any, recorder: str, text: str
) -> None:
    settings.HARNESS_ASK_RECORDER = recorder
    errors = [e for e in run_checks() if e.id == "dispatcher.E013"]
    assert errors and text in errors[0].msg


def test_a_task_sent_by_a_name_no_task_registers_fails_the_checks(settings: Any) -> None:
    settings.CELERY_BEAT_SCHEDULE = {
        **settings.CELERY_BEAT_SCHEDULE,
        "typo": {"task": "approvals.tasks.expire_aprovals", "schedule": 15.0},
    }
    errors = [e for e in run_checks() if e.id == "dispatcher.E014"]
    assert [e.msg for e in errors] == [
        "CELERY_BEAT_SCHEDULE['typo'] sends the task 'approvals.tasks.expire_aprovals', "
        "which no Celery task registers."
    ]


def test_the_fast_paths_verified_lines_match_what_is_installed() -> None:
    assert [e.msg for e in run_checks() if e.id == "dispatcher.W015"] == []


def test_a_fast_path_verified_against_another_line_is_named(monkeypatch: Any) -> None:
    from floor import compiled

    monkeypatch.setitem(compiled.VERIFIED_WITH, "psycopg", "3.2")
    warnings = [e.msg for e in run_checks() if e.id == "dispatcher.W015"]
    assert len(warnings) == 1
    assert warnings[0].startswith("floor.compiled was verified against psycopg 3.2.x; psycopg 3.3")
