"""A live test goes out last: tests/conftest.py refuses, at collection, a test that uses the
live stack but that pytest-django would run before the unmarked tests (marked django_db,
on its module, its class or itself, or using db, transactional_db or live_server). Its
Celery worker, once started, runs every queued call in the test database: among the
transactional tests it ran the calls the tests after it meant to stay queued (CI,
2026-12-07). Collected by a real pytest, under a conftest that is tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.backend_independent, pytest.mark.heavy]

MARKED_MODULE = """
import pytest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.live
def test_in_a_transactional_module(live_db):
    pass
"""

UNMARKED_MODULE = """
import pytest


@pytest.mark.django_db(transaction=True)
@pytest.mark.live
class TestTransactional:
    def test_in_a_transactional_class(self, live_stack):
        pass


@pytest.mark.django_db
@pytest.mark.live
def test_marked_django_db(live_agent):
    pass


@pytest.mark.live
def test_using_db(db, live_db):
    pass


@pytest.mark.live
def test_unmarked(live_stack, live_db):
    pass


@pytest.mark.django_db(transaction=True)
def test_transactional_not_live():
    pass
"""


def collect(*paths: Path) -> subprocess.CompletedProcess[str]:
    """A pytest's collection of `paths` (files in one directory) under tests/conftest.py."""
    (Path(paths[0]).parent / "conftest.py").write_text("from tests.conftest import *  # noqa\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", "pyproject.toml"]
        + ["--collect-only", "-q", *map(str, paths)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_live_test_pytest_django_runs_early_fails_collection_naming_it(tmp_path: Path) -> None:
    (tmp_path / "test_marked_module.py").write_text(MARKED_MODULE)
    (tmp_path / "test_unmarked_module.py").write_text(UNMARKED_MODULE)
    result = collect(tmp_path / "test_marked_module.py", tmp_path / "test_unmarked_module.py")
    out = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, out
    named = {
        line.strip().split("::", 1)[1]
        for line in out.splitlines()
        if line.startswith("  ") and "::" in line
    }
    assert named == {
        "test_in_a_transactional_module: marked django_db(transaction=True)",
        "TestTransactional::test_in_a_transactional_class: marked django_db(transaction=True)",
        "test_marked_django_db: marked django_db",
        "test_using_db: uses db",
    }, out
    # (test_unmarked, and test_transactional_not_live, not named: they go out in their turn)
    assert "Move each to its own unmarked module" in out, out
