"""dispatcher.W040: a host core_pattern socket (`@`, `@@`: Linux 6.16 and later) takes a
crashing sandboxed program's memory out of the sandbox whatever its core dump limit (the
limit of 1 stops a core file and a pipe helper only), so the start-up checks name it.

The pattern is read from a file given to the check: the real one is the host's, and a
test must not change it."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.checks import Warning, run_checks
from django.test import override_settings

from dispatcher import checks

# Settings only: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent


def pattern(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "core_pattern"
    path.write_text(text + "\n")  # (the kernel's file ends with a newline)
    return path


@pytest.mark.parametrize("socket", ["@/run/systemd/coredump", "@@/run/coredump.socket"])
def test_a_socket_core_pattern_is_named_with_what_to_do(tmp_path: Path, socket: str) -> None:
    with override_settings(HARNESS_SANDBOX="bwrap"):
        found = checks.check_core_dumps(core_pattern=pattern(tmp_path, socket))
    assert [(type(w), w.id) for w in found] == [(Warning, "dispatcher.W040")]
    assert f"core_pattern is '{socket}', a socket" in found[0].msg
    assert "sandboxed program that crashes is dumped" in found[0].msg
    assert "kernel.core_pattern" in str(found[0].hint)
    assert "|/bin/false" in str(found[0].hint)


@pytest.mark.parametrize(
    "text",
    [
        "core",  # a file: the limit of 1 is below the smallest core file
        "/var/crash/core.%e.%p",
        "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E",  # a pipe: 1 stops it
        "|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h",
    ],
)
def test_a_file_or_pipe_core_pattern_is_not_named(tmp_path: Path, text: str) -> None:
    with override_settings(HARNESS_SANDBOX="bwrap"):
        assert checks.check_core_dumps(core_pattern=pattern(tmp_path, text)) == []


def test_without_the_sandbox_or_a_readable_pattern_nothing_is_named(tmp_path: Path) -> None:
    socket = pattern(tmp_path, "@/run/systemd/coredump")
    with override_settings(HARNESS_SANDBOX="off"):  # (harness.W011 names that already)
        assert checks.check_core_dumps(core_pattern=socket) == []
    with override_settings(HARNESS_SANDBOX="bwrap"):
        assert checks.check_core_dumps(core_pattern=tmp_path / "absent") == []


def test_the_registered_check_reads_the_hosts_pattern() -> None:
    """`manage.py check` runs it on /proc/sys/kernel/core_pattern: named exactly when that
    is a socket."""
    assert Path("/proc/sys/kernel/core_pattern") == checks.CORE_PATTERN
    host = checks.CORE_PATTERN.read_text().strip()
    with override_settings(HARNESS_SANDBOX="bwrap"):
        ids = [m.id for m in run_checks()]
    assert ("dispatcher.W040" in ids) == host.startswith("@"), (host, ids)
