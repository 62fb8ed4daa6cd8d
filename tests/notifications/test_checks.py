"""Start-up checks of the link and channel settings."""

from __future__ import annotations

import pytest
from django.test import override_settings

from approvals.checks import check_links_and_channels

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent


def ids() -> list[str]:
    return [message.id for message in check_links_and_channels()]  # type: ignore[misc]


def test_defaults_pass() -> None:
    assert ids() == []


@override_settings(HARNESS_PUBLIC_URL="harness.example.com")
def test_public_url_must_be_http() -> None:
    assert "approvals.E003" in ids()


@override_settings(HARNESS_WEBHOOK_URL="https://hooks.example.test", HARNESS_WEBHOOK_SECRET="")
def test_a_webhook_needs_a_secret() -> None:
    assert "approvals.E004" in ids()


@override_settings(HARNESS_LINKS_REQUIRE_LOGIN=False)
def test_links_without_login_over_http_warn() -> None:
    assert ids() == ["approvals.W001"]
    with override_settings(HARNESS_PUBLIC_URL="https://harness.example.com"):
        assert ids() == []
