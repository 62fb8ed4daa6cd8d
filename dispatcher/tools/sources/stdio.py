"""The stdio transport to an upstream MCP server, with each message it sends bounded.

The `mcp` SDK's `stdio_client` (mcp.client.stdio) reads the server's standard output as
text and keeps a line until its newline arrives, however long it grows, adding each piece
read to all it holds (a copy of the whole line per 64 KiB read): one huge line from a
server held the worker's memory and, for minutes, the event loop every upstream call of
the process runs on. This is that client with two changes: the output is read as bytes,
and a line past `limit` bytes ends the session at once (`too_large` is called first, so
the caller can say why its request failed); the rest of the output is drained; and an
environment given is the process's whole environment (the SDK adds the worker's HOME,
USER, ... to it). Launch,
shutdown and parsing are the SDK's own (its helpers, pinned with the SDK's version).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import anyio.lowlevel
from mcp.client import stdio as sdk
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage


@asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters, errlog: TextIO, limit: int, too_large: Callable[[], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """`mcp.client.stdio.stdio_client(server, errlog)` whose server may send no line
    longer than `limit` bytes (see the module docstring)."""
    command = await sdk._get_executable_command(server.command)
    process = await sdk._create_platform_compatible_process(
        command=command,
        args=server.args,
        # The environment given is the whole of it: the SDK's would add the worker's HOME,
        # USER, ... to that of the sandbox's launcher (sandbox_servers.LAUNCHER_ENVIRONMENT).
        env=server.env if server.env is not None else sdk.get_default_environment(),
        errlog=errlog,
        cwd=server.cwd,
    )
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](
        0
    )
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def deliver(line: bytes) -> None:
        text = line.decode(server.encoding, errors=server.encoding_error_handler)
        await read_stream_writer.send(sdk._parse_line(text))

    async def stdout_reader() -> None:
        assert process.stdout, "Opened process is missing stdout"
        try:
            async with read_stream_writer:  # (closed first: the session ends, then drains)
                held = bytearray()
                async for chunk in process.stdout:
                    *complete, rest = chunk.split(b"\n")
                    for piece in complete:
                        held += piece
                        line, held = bytes(held), bytearray()
                        await deliver(line)
                    held += rest
                    if len(held) > limit:
                        too_large()
                        return  # (the session ends: its requests fail, closed)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # the session or its stream closed under the read: it ends either way
        finally:
            await sdk._drain_stdout(process)

    async def stdin_writer() -> None:
        assert process.stdin, "Opened process is missing stdin"
        try:
            async with write_stream_reader:
                async for message in write_stream_reader:
                    json = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(
                        (json + "\n").encode(server.encoding, errors=server.encoding_error_handler)
                    )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(sdk._WRITER_FLUSH_TIMEOUT) as flush_scope:
            await writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await sdk._stop_server_process(process)
        await sdk._aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
