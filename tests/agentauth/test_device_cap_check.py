"""Start-up check: one network's share of a client's pending device codes stays well under
the half of the cap kept for networks that hold few
(harness_site.checks.check_device_network_cap)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]

# Django's own model checks ask the database whether it supports JSON fields.
pytestmark = pytest.mark.django_db


def _device_messages() -> list[str]:
    return [
        f"{message.id}: {message.msg} {message.hint}"
        for message in run_checks()
        if message.id in ("harness.E004", "harness.W016")
    ]


def test_default_limits_pass() -> None:
    assert _device_messages() == []


@override_settings(HARNESS_DEVICE_PENDING_SHARE=500, HARNESS_DEVICE_PENDING_MAX=1000)
def test_a_share_of_half_the_cap_is_an_error() -> None:
    [message] = _device_messages()
    assert message.startswith("harness.E004: HARNESS_DEVICE_PENDING_SHARE (500)")
    assert "not below half of HARNESS_DEVICE_PENDING_MAX (1000)" in message
    assert "at most 10" in message


@override_settings(HARNESS_DEVICE_PENDING_SHARE=11, HARNESS_DEVICE_PENDING_MAX=1000)
def test_a_share_above_a_fiftieth_of_half_the_cap_is_a_warning() -> None:
    [message] = _device_messages()
    assert message.startswith("harness.W016: HARNESS_DEVICE_PENDING_SHARE (11)")
    assert "more than a fiftieth of half of HARNESS_DEVICE_PENDING_MAX (1000)" in message


@override_settings(HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK=5000, HARNESS_DEVICE_PENDING_MAX=100)
def test_the_network_rate_may_pass_the_cap() -> None:
    """One network may fill the first half: the second is kept for the networks with few."""
    with override_settings(HARNESS_DEVICE_PENDING_SHARE=1):
        assert _device_messages() == []


@override_settings(HARNESS_DEVICE_PENDING_SHARE=5000, HARNESS_DEVICE_PENDING_MAX=0)
def test_no_cap_nothing_to_fill() -> None:
    assert _device_messages() == []


@pytest.mark.heavy
def test_manage_py_check_names_both_settings() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "harness_site.settings",
        "HARNESS_DEVICE_PENDING_SHARE": "15000",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "harness.E004" in result.stderr
    assert "HARNESS_DEVICE_PENDING_SHARE (15000)" in result.stderr
    assert "HARNESS_DEVICE_PENDING_MAX (20000)" in result.stderr


@override_settings(HARNESS_DEVICE_PENDING_AGGREGATE_SHARE=500, HARNESS_DEVICE_PENDING_MAX=1000)
def test_a_blocks_share_of_half_the_cap_is_an_error() -> None:
    [message] = [
        f"{message.id}: {message.msg} {message.hint}"
        for message in run_checks()
        if message.id == "harness.E005"
    ]
    assert message.startswith("harness.E005: HARNESS_DEVICE_PENDING_AGGREGATE_SHARE (500)")
    assert "not below half of HARNESS_DEVICE_PENDING_MAX (1000)" in message
    assert "at most 50" in message


def test_the_default_blocks_share_passes() -> None:
    assert not [message for message in run_checks() if message.id == "harness.E005"]
