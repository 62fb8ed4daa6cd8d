"""The event loop daphne runs Harness on (`HARNESS_EVENT_LOOP`: `uvloop`, the default, or
`asyncio`).

daphne installs Twisted's asyncio reactor on a stock asyncio loop when `daphne.server` is
imported, before it imports the application, and starts that loop only after. So the
choice is made here, at the application's import (harness_site.asgi, first thing): while
the reactor is installed and not yet running, it is moved onto a uvloop loop (libuv's),
the readers it had registered (its waker) and the default executor daphne gave the loop
(`ASGI_THREADS`) moved with it. Nothing else has run on the old loop; it is closed.

Any other process (a test's server in-process, `manage.py`, the Celery worker) keeps the
loop it has: the choice is daphne's. docs/benchmarks.md measures what it changes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

CHOICES = ("uvloop", "asyncio")


def configured() -> str:
    """`HARNESS_EVENT_LOOP`, checked: an unknown value stops the server with its name."""
    choice = os.environ.get("HARNESS_EVENT_LOOP", "uvloop").strip().lower() or "uvloop"
    if choice not in CHOICES:
        raise RuntimeError(f"HARNESS_EVENT_LOOP={choice!r}: expected one of {', '.join(CHOICES)}.")
    return choice


def install() -> str:
    """Move daphne's reactor onto the configured loop if it is daphne's and not running;
    the name of the loop the reactor runs on after (`none` outside daphne)."""
    choice = configured()
    reactor: Any = sys.modules.get("twisted.internet.reactor")
    if reactor is None or "daphne.server" not in sys.modules:
        return "none"
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    if not isinstance(reactor, AsyncioSelectorReactor):
        return "none"
    old: asyncio.AbstractEventLoop = reactor._asyncioEventloop
    if choice == "asyncio" or reactor.running or old.is_running():
        return loop_name(old)
    if reactor._timerHandle is not None or reactor._continuousPolling._readers:
        return loop_name(old)  # something already scheduled on it: left as it is
    if loop_name(old) == "uvloop":
        return "uvloop"
    import uvloop

    new = uvloop.new_event_loop()
    executor = getattr(old, "_default_executor", None)
    if executor is not None:
        new.set_default_executor(executor)
    readers, writers = list(reactor._readers), list(reactor._writers)
    for reader in readers:
        reactor.removeReader(reader)
    for writer in writers:
        reactor.removeWriter(writer)
    reactor._asyncioEventloop = new
    for reader in readers:
        reactor.addReader(reader)
    for writer in writers:
        reactor.addWriter(writer)
    asyncio.set_event_loop(new)
    old.close()
    return "uvloop"


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
