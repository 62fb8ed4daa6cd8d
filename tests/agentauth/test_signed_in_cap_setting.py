"""HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON below 0 is refused at start-up, as the other
caps of agent sign-in are (HARNESS_DEVICE_PENDING_MAX): a negative value read as "no
cap", as 0 does, though no one asked for none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _check(value: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "harness_site.settings",
        "HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON": value,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.heavy
def test_a_negative_cap_is_refused_at_start_up_and_zero_is_no_cap() -> None:
    refused = _check("-1")
    assert refused.returncode != 0
    assert "HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON is -1" in refused.stderr, refused.stderr[-2000:]
    assert "(0: no cap)" in refused.stderr
    started = _check("0")
    assert started.returncode == 0, started.stderr[-2000:]
