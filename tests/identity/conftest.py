"""allauth counts sign-in attempts per address in the cache (127.0.0.1 for every test):
each test starts with none, so one test's attempts never refuse another's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _no_attempts_counted_yet() -> Iterator[None]:
    cache.clear()
    yield
