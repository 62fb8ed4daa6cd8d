"""Pages too long to hold in memory (a long session's replay or transcript): made as
pieces, answered whole while they are short and streamed once they are not.

A piece is made in the request's sync thread (`sync_to_async(thread_sensitive=True)`, as
export.async_chunks reads its cursor), so a page's queries keep one database connection;
under ASGI a StreamingHttpResponse must be given an async iterator, or Django reads the
whole of a sync one into a list before sending any of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator

from asgiref.sync import sync_to_async
from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

# A page up to this many bytes is answered whole (with its Content-Length); a longer one
# is streamed, holding no more than this and one piece.
BUFFERED_BYTES = 1024 * 1024
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


def respond(pieces: Generator[str], content_type: str) -> HttpResponseBase:
    """`pieces` as one response: whole while they come to at most BUFFERED_BYTES, else
    streamed (the pieces made so far first, then the rest as the client reads)."""
    held: list[bytes] = []
    size = 0
    for piece in pieces:
        data = piece.encode()
        held.append(data)
        size += len(data)
        if size > BUFFERED_BYTES:
            return StreamingHttpResponse(
                async_pieces(_then(held, pieces)), content_type=content_type
            )
    return HttpResponse(b"".join(held), content_type=content_type)


def _then(held: list[bytes], pieces: Generator[str]) -> Generator[bytes]:
    try:
        while held:
            yield held.pop(0)
        for piece in pieces:
            yield piece.encode()
    finally:
        pieces.close()
