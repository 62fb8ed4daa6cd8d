"""The seccomp filter's BPF file (dispatcher.tools.seccomp.bpf_file): one file per filter
in Harness's data directory, shared by its processes. It was a temporary directory per
process removed by an exit handler, which a Celery pool process (it ends with os._exit)
or a killed one never ran: every such process left a `harness-seccomp-*` directory in
/tmp for good."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import seccomp

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux (libseccomp)")

# What a pool process does: builds the filter, then ends without running exit handlers.
CHILD = """
import os, sys
import django
django.setup()
from dispatcher.tools import seccomp
print(seccomp.bpf_file(), flush=True)
os._exit(0)
"""


def leftovers() -> set[str]:
    return {
        name for name in os.listdir(tempfile.gettempdir()) if name.startswith("harness-seccomp-")
    }


def test_processes_that_end_without_exit_handlers_leave_nothing_behind(
    tmp_path: Path,
) -> None:
    before = leftovers()
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"},  # (no gwN/)
        "HARNESS_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
    }
    paths = [
        subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(3)
    ]
    assert leftovers() <= before, "a process left its filter's directory in the temp dir"
    # One file, shared: in the data directory's private folder, read-only, the filter.
    assert len(set(paths)) == 1
    path = Path(paths[0])
    assert path.parent == tmp_path / "seccomp"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    with tempfile.TemporaryFile() as out:
        seccomp.build().export_bpf(out)
        out.seek(0)
        assert path.read_bytes() == out.read()


def test_a_damaged_file_is_written_again(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path
    seccomp._bpf_file.cache_clear()
    try:
        path = seccomp.bpf_file()
        good = path.read_bytes()
        path.chmod(0o600)
        path.write_bytes(b"not a filter")
        seccomp._bpf_file.cache_clear()
        assert seccomp.bpf_file() == path and path.read_bytes() == good
    finally:
        seccomp._bpf_file.cache_clear()
