"""Fixtures of the red-team files that drive the real ASGI application in-process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher import limits


@pytest.fixture
def asgi() -> Any:
    """harness_site.asgi, imported when a test needs it (it starts the request threads)."""
    from harness_site import asgi

    return asgi


@pytest.fixture
def forgetting() -> Iterator[None]:
    """The refusal memory starts and ends empty (it is this process's)."""
    limits._refused_until.clear()
    yield
    limits._refused_until.clear()
