"""Issue 30's reader forms run by the real bash, dash, git, make, awk and python3 in a
scratch repository: each really runs code or writes the file, and the reader says so
(unreadable for allow rules; deny rules see the command it carries)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispatcher.policy.parts import command_parts
from dispatcher.policy.reading import read_command

from .real_forms import FORMS, Form, run, scratch_repo

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize("form", FORMS, ids=[form.name for form in FORMS])
def test_the_real_programs_do_what_the_reader_predicts(form: Form, tmp_path: Path) -> None:
    if form.needs and shutil.which(form.needs) is None:
        pytest.skip(f"{form.needs} is not installed")
    repo = scratch_repo(tmp_path)
    for line in (form.setup, form.line, form.after):
        if line:
            run(line, repo)
    assert (repo / form.effect).exists(), f"{form.line!r} had no effect: the test proves nothing"

    argv = ("bash", "-c", form.line)
    reading = read_command(argv)
    assert reading.unreadable is not None, reading.commands
    if form.seen:
        parts = {part.argv for part in command_parts(argv).parts}
        assert tuple(form.seen.split()) in parts, parts


def test_the_same_commands_without_the_forms_are_read(tmp_path: Path) -> None:
    """The neighbours an allow rule keeps reading: the safe key, stdout, a script file."""
    repo = scratch_repo(tmp_path)
    for line in (
        "git config user.name 'A B'",
        "git log -1 --format=%s",
        "git format-patch -1 --stdout",
        "git commit -q --allow-empty -m m",
        "awk 'BEGIN{print \"x\" \\\n}'",
        "echo 'touch x' > /dev/null",
    ):
        assert run(line, repo).returncode == 0, line
        assert read_command(("bash", "-c", line)).unreadable is None, line
    assert not (repo / "pwned").exists()
