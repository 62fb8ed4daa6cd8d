"""Fixtures of the red-team files that drive the real ASGI application in-process."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import limits
from tests.tools.support import require_bwrap


@pytest.fixture
def rng() -> random.Random:
    """A random generator whose seed is printed (a failing test's output shows it) and
    taken from HARNESS_MASK_SEED when set: a random token's failure is run again."""
    seed = int(os.environ.get("HARNESS_MASK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"HARNESS_MASK_SEED={seed}")
    return random.Random(seed)


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


@pytest.fixture
def sandboxed_workspace(settings: Any, tmp_path: Path) -> Path:
    """An agent's workspace under HARNESS_WORKSPACE_ROOT, its commands run in the real
    bubblewrap sandbox with no network (skipped, saying how, where bwrap is missing)."""
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_WORKSPACE_ROOT = tmp_path / "workspaces"
    path = tmp_path / "workspaces" / "agent"
    path.mkdir(parents=True)
    return path
