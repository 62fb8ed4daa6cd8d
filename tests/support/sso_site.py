"""A daphne of its own whose environment configures single sign-on (the shared live
stack's does not), on this run's database and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.live import daphne, free_port, live_env


@contextmanager
def daphne_with(env_extra: dict[str, str], tmp: Path) -> Iterator[str]:
    """Its base URL while it runs."""
    port = free_port()
    with daphne(live_env(tmp) | env_extra, port, tmp / f"daphne-sso-{port}.log") as url:
        yield url
