"""The notification tests' receivers listen on loopback, which the outbound door refuses
unless listed: these tests list 127.0.0.1 (tests/notifications/test_outbound.py and
tests/dispatcher/test_outbound.py test the refusal itself)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]
