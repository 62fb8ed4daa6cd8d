"""Red team (rt7sand) of the sandbox's lookup shell (sandbox.EXEC_SCRIPT) as Harness runs
it here (root): a program whose path begins with a dash.

The lookup shell becomes the program with dash's `exec "$@"`, and dash's `exec` reads a
first word beginning with '-' as its own option (it takes no '--'): `-/build` (the
workspace's directory named '-', its program `build`), found by the lookup and executable,
never ran; the model was told the program's result was exit code 2, "Illegal option -/",
where the same command ran when Harness is not root (bwrap executes it directly). It is
now executed by the path the lookup found it at ("./-/build")."""

from __future__ import annotations

from pathlib import Path

from tests.redteam.test_rt6sand_exec_report import run_command, workspace

__all__ = ["workspace"]  # the fixture, used by name


def test_a_program_whose_path_begins_with_a_dash_runs_with_its_own_argv0(workspace: Path) -> None:
    (workspace / "-").mkdir()
    for name in ("-/build", "--/build"):
        program = workspace / name
        program.parent.mkdir(exist_ok=True)
        program.write_text('#!/bin/sh\nprintf "ran %s" "$0"; printf "|%s" "$@"; echo "|"\n')
        program.chmod(0o755)
        out = run_command(workspace, [name, "-x", "--"])
        assert out.startswith("exit code 0\n"), out
        # (dash's exec sets no argv[0] of its own: the program's is the path it was found at)
        assert f"ran ./{name}|-x|--|" in out, out
