"""Pages too long to hold in memory (a long session's replay or transcript): made as
pieces, answered whole while they are short and streamed once they are not.

A piece is made in the request's sync thread (`sync_to_async(thread_sensitive=True)`, as
export.async_chunks reads its cursor), so a page's queries keep one database connection;
under ASGI a StreamingHttpResponse must be given an async iterator, or Django reads the
whole of a sync one into a list before sending any of it.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

# A page up to this many bytes is answered whole (with its Content-Length); a longer one
# is streamed, holding no more than this and one piece.
BUFFERED_BYTES = 1024 * 1024
# The fewest bytes one audit event of a session makes of its replay page, and one call
# (its call.received event) of its transcript (the call's messages, page or download;
# measured: about 440 and 140-240 for a call with short arguments; a call's other events,
# and the session's, add nothing to a transcript): a session with more of them than
# BUFFERED_BYTES over these is surely streamed, so a request for it that no export slot is
# free for is refused before its page is rendered (audit.views._refused_early).
REPLAY_EVENT_BYTES = 400
TRANSCRIPT_EVENT_BYTES = 128
# Items (steps, states, messages) a piece renders at once.
PIECE_ITEMS = 200


def mark(name: str) -> SafeString:
    """Where a page's streamed section `name` goes: the page template renders it, and
    `sections` puts the section's pieces there."""
    return mark_safe(f"<!--harness-stream:{name}-->")  # noqa: S308 (a constant of ours)


def sections(page: str, names: list[str], filled: dict[str, Iterator[str]]) -> Generator[str]:
    """`page` (rendered with `mark(name)` for each of `names`, in that order) with each
    mark replaced by the pieces of `filled[name]`, read only when reached."""
    rest = page
    for name in names:
        before, rest = rest.split(mark(name), 1)
        yield before
        yield from filled[name]
    yield rest


def rendered(template: str, name: str, items: Iterator[object]) -> Generator[str]:
    """`items` rendered PIECE_ITEMS at a time by the partial `template`#`name`, which
    iterates the context variable `name`."""
    batch: list[object] = []
    for item in items:
        batch.append(item)
        if len(batch) >= PIECE_ITEMS:
            yield render_to_string(f"{template}#{name}", {name: batch})
            batch = []
    if batch:
        yield render_to_string(f"{template}#{name}", {name: batch})


async def async_pieces(source: Generator[bytes]) -> AsyncIterator[bytes]:
    """`source`'s pieces, each made in the request's sync thread; `source` is closed when
    the response is (streamed whole, or its client gone)."""

    def read() -> bytes | None:
        return next(source, None)

    try:
        while (data := await sync_to_async(read, thread_sensitive=True)()) is not None:
            yield data
    finally:
        await sync_to_async(source.close, thread_sensitive=True)()


class Held(StreamingHttpResponse):
    """A streamed response holding one of a few slots (audit.export.SLOTS), given back
    when it is closed (streamed whole, or its client gone), whether or not streaming ever
    started, or at the latest when the response is gone (a caller that never closes it:
    the test client, when the body is not read; a response whose streaming raised, which
    Django's handler does not close)."""

    def __init__(
        self, content: AsyncIterator[bytes], *args: Any, release: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(_closed_on_error(content, weakref.ref(self)), *args, **kwargs)
        self._release = release
        weakref.finalize(self, release)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()


async def _closed_on_error(
    content: AsyncIterator[bytes], response: weakref.ref[Held]
) -> AsyncIterator[bytes]:
    """`content`, and the response closed (in the request's sync thread) when it raises.

    Django's ASGI handler closes a response (its request_finished: the request's database
    connection closed, given back to the pool) only when it was streamed whole or its
    client left; one whose streaming raised (its database connection ended mid-page) was
    never closed: its connection stayed out of the pool for good, and a few such pages left
    every later request of the process waiting HARNESS_DB_POOL_MAX's 10 s for none (500),
    and its slot held until a garbage collection. (A weak reference: the response is
    still freed, and its slot given back, when it is dropped unread.)"""
    try:
        async for data in content:
            yield data
    except Exception:
        if (held := response()) is not None:
            await sync_to_async(held.close, thread_sensitive=True)()
        raise


Slot = Callable[[], "Callable[[], None] | HttpResponseBase"]


def respond(pieces: Generator[str], content_type: str, slot: Slot) -> HttpResponseBase:
    """`pieces` as one response: whole while they come to at most BUFFERED_BYTES, else
    streamed (the pieces made so far first, then the rest as the client reads) holding
    one of the export slots `slot` takes (its release, or the answer that it is refused).

    A streamed page holds its request's database connection for as long as its client
    takes to read it, as an export does: without a slot, a few slow readers of long
    replays held every connection of the process (HARNESS_DB_POOL_MAX), and every other
    page waited for one."""
    held: list[bytes] = []
    size = 0
    for piece in pieces:
        data = piece.encode()
        held.append(data)
        size += len(data)
        if size > BUFFERED_BYTES:
            taken = slot()
            if isinstance(taken, HttpResponseBase):
                pieces.close()
                return taken
            return Held(async_pieces(_then(held, pieces)), content_type=content_type, release=taken)
    return HttpResponse(b"".join(held), content_type=content_type)


def _then(held: list[bytes], pieces: Generator[str]) -> Generator[bytes]:
    try:
        while held:
            yield held.pop(0)
        for piece in pieces:
            yield piece.encode()
    finally:
        pieces.close()
