"""The one door every request Harness makes goes through (docs/security.md, "Outbound
requests"): webhooks, Slack, Web Push, the audit checkpoint URL, OpenTelemetry export and
HTTP upstream MCP servers.

What the door does, whoever calls it:
- an address policy: loopback, private, link-local, shared (CGNAT), multicast, reserved,
  unspecified and cloud metadata addresses are refused unless `HARNESS_OUTBOUND_ALLOW`
  names the destination (a host name, `host:port`, an address or a network, `addr:port`).
  The policy is applied where the connection is made: the name is resolved once, every
  address it resolves to is checked, and the socket connects to a checked address (TLS
  still names the host), so a name that answers differently the second time (DNS
  rebinding) reaches nothing it was not allowed to;
- no redirects (a 3xx is an answer like any other), no proxies from the environment;
- timeouts on every phase and a deadline on the whole exchange;
- a cap on the answer's size, read in chunks: a larger answer is cut, never held whole;
- failures as `OutboundRefused` with a short, fixed-size reason that never carries what
  the remote end sent.

Web Push endpoints must also belong to a known push service unless listed in
`HARNESS_OUTBOUND_ALLOW`. It sits on the floor of the layering (floor/, beside `floor.errors`),
so audit, tools and approvals all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import math
import re
import socket
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore
import httpcore2
import httpx
import httpx2
import requests
import requests.adapters
from django.conf import settings
from httpx2._transports.default import AsyncResponseStream, map_httpcore_exceptions
from requests.structures import CaseInsensitiveDict

from floor.threads import ProcessThreads

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Push services of the browsers Harness's dashboard supports (RFC 8030 endpoints).
PUSH_SERVICES = ("fcm.googleapis.com", "updates.push.services.mozilla.com")
PUSH_SERVICE_SUFFIXES = (".push.apple.com", ".notify.windows.com")
# Named even though the classification below already refuses them: the reason says so.
METADATA = tuple(
    ipaddress.ip_network(n)
    for n in ("169.254.169.254/32", "fd00:ec2::254/128", "100.100.100.200/32")
)
_HOST = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")


class OutboundRefused(Exception):
    """The request was not made or did not complete. `str()` is a short fixed-size reason
    ("refused: a loopback address", "timed out", "HTTP 500", ...), never remote content."""


@dataclass(frozen=True)
class Allowance:
    """The destinations an admin allowed (HARNESS_OUTBOUND_ALLOW), parsed."""

    hosts: frozenset[str] = frozenset()
    host_ports: frozenset[tuple[str, int]] = frozenset()
    networks: tuple[Network, ...] = ()
    network_ports: tuple[tuple[Network, int], ...] = field(default=())

    def names(self, host: str, port: int) -> bool:
        """Whether the host name itself (any address it resolves to) is allowed."""
        host = host.lower().rstrip(".")
        return host in self.hosts or (host, port) in self.host_ports

    def covers(self, address: Address, port: int) -> bool:
        return any(address in n for n in self.networks) or any(
            address in n and port == p for n, p in self.network_ports
        )


def parse_allow(entries: Iterable[str]) -> Allowance:
    """Parse `host`, `host:port`, `address`, `network` (CIDR), `address:port` and
    `[v6-address]:port` entries. Raises ValueError naming the first entry it cannot read."""
    hosts: set[str] = set()
    host_ports: set[tuple[str, int]] = set()
    networks: list[Network] = []
    network_ports: list[tuple[Network, int]] = []
    for raw in entries:
        entry = raw.strip().lower().rstrip(".")
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        host, port = _split_port(entry, raw)
        try:
            network = ipaddress.ip_network(host.strip("[]"))
        except ValueError:
            if not _HOST.match(host):
                raise ValueError(f"'{raw}' is not a host, host:port, address or network") from None
            (hosts.add(host) if port is None else host_ports.add((host, port)))
            continue
        if port is None:
            raise ValueError(f"'{raw}' is not a host, host:port, address or network")
        network_ports.append((network, port))
    return Allowance(frozenset(hosts), frozenset(host_ports), tuple(networks), tuple(network_ports))


def _split_port(entry: str, raw: str) -> tuple[str, int | None]:
    host, colon, port = entry.rpartition(":")
    if not colon or (host.count(":") and not host.endswith("]")):
        return entry, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"'{raw}' has a port that is not a number from 1 to 65535")
    return host, int(port)


@functools.lru_cache(maxsize=8)
def _allowance(entries: tuple[str, ...]) -> Allowance:
    return parse_allow(entries)


def allowance() -> Allowance:
    """This deployment's allowance (checked at start-up: harness.E001)."""
    return _allowance(tuple(settings.HARNESS_OUTBOUND_ALLOW))


def kind_of(address: Address) -> str:
    """What kind of non-public address this is ("a loopback address"), "" when public."""
    if isinstance(address, ipaddress.IPv6Address):
        # (an IPv4 address inside: mapped, or 6to4's 2002:a.b.c.d::/48, which a host with a
        # 6to4 interface or relay sends to a.b.c.d: 2002:7f00:1:: is loopback's)
        address = address.ipv4_mapped or address.sixtofour or address
    if any(address in n for n in METADATA):
        return "a cloud metadata address"
    for kind, test in (
        ("an unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("a private address", address.is_private),
        ("a reserved address", address.is_reserved),
    ):
        if test:
            return kind
    return "" if address.is_global else "a shared or reserved address"


def refusal(host: str, address: str, port: int, allowed: Allowance) -> str:
    """Why connecting to `address` (which `host` resolved to) is refused, "" if it is not."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if allowed.names(host, port) or allowed.covers(ip, port):
        return ""
    kind = kind_of(ip)
    return f"refused: {kind} ({ip})" if kind else ""


def _checked(host: str, port: int, infos: Iterable[tuple[Any, ...]]) -> list[str]:
    """The addresses to connect to, in order; OutboundRefused when any one is refused (a
    name that also resolves inward is not trusted with its outward addresses either)."""
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise OutboundRefused("refused: the name resolves to no address")
    allowed = allowance()
    for address in addresses:
        if reason := refusal(host, address, port, allowed):
            raise OutboundRefused(reason)
    return addresses


def checked_addresses(host: str, port: int) -> list[str]:
    """Resolve `host` once and check every address (raises OutboundRefused)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise OutboundRefused("the name does not resolve") from None
    return _checked(host, port, infos)


def _left(deadline: float | None, timeout: float | None) -> float | None:
    """`timeout` cut to what is left before `deadline`; ReadTimeout once it has passed."""
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("past the deadline")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A stream whose every read and write ends by the exchange's deadline: a server that
    sends its status line and headers a byte at a time (each read within the per-phase
    timeout) is cut off there, not after 16 KiB of header bytes."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: float | None) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(self._deadline, timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(self._deadline, timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        tls = self._stream.start_tls(ssl_context, server_hostname, _left(self._deadline, timeout))
        return _DeadlineStream(tls, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _GuardedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, connecting only to checked addresses, every stream
    bounded by `deadline` (time.monotonic) when one is given."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        error: Exception = OutboundRefused("connection failed")
        for address in checked_addresses(host, port):
            try:
                stream = super().connect_tcp(
                    address, port, _left(self.deadline, timeout), local_address, socket_options
                )
            except httpcore.ConnectError as failed:
                error = failed
            else:
                return _DeadlineStream(stream, self.deadline)
        raise error


# The async door's name resolutions run on threads of their own, never on the running
# loop's default executor: an upstream MCP server's request may be made on a web
# request's loop (daphne's: upstream.Pool.loop_for), whose default executor every
# request's short sync work shares, and a busy one must not hold up the connection.
RESOLVER_THREADS = 4
_resolver_threads = ProcessThreads(RESOLVER_THREADS, "outbound-resolve")


async def _resolve(host: str, port: int) -> list[Any]:
    """`host` resolved as the sync door resolves it (`checked_addresses`), on one of
    `_resolver_threads`."""
    lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    return await asyncio.get_running_loop().run_in_executor(_resolver_threads(), lookup)


class _AsyncGuardedBackend(httpcore2.AnyIOBackend):
    """The same for asyncio (HTTP upstream MCP servers), on httpcore2: the MCP SDK's
    client takes httpx2's clients only."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            infos = await _resolve(host, port)
        except OSError:
            raise OutboundRefused("the name does not resolve") from None
        error: Exception = OutboundRefused("connection failed")
        for address in _checked(host, port, infos):
            try:
                return await super().connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore2.ConnectError as failed:
                error = failed
        raise error


def ssl_context() -> ssl.SSLContext:
    """The public certificate authorities (certifi), and those of HARNESS_OUTBOUND_CA_FILE
    when it names a PEM file (a private CA); never the environment's."""
    context = httpx.create_ssl_context(trust_env=False)
    if settings.HARNESS_OUTBOUND_CA_FILE:
        context.load_verify_locations(cafile=settings.HARNESS_OUTBOUND_CA_FILE)
    return context


def transport(deadline: float | None = None) -> httpx.HTTPTransport:
    """An httpx transport whose connections pass the address policy (and end by
    `deadline`, a time.monotonic value, when one is given)."""
    guarded = httpx.HTTPTransport(trust_env=False)
    # httpx builds its pool without a way to pass a network backend; the pool is rebuilt
    # with the same SSL context and the guarded backend (TLS still names the host).
    guarded._pool = httpcore.ConnectionPool(
        ssl_context=ssl_context(),
        network_backend=_GuardedBackend(deadline),
    )
    return guarded


# Closing an answer whose end was not read (an MCP server's SSE answer, which the SDK stops
# reading at the message it waited for; a 202 with no body): the rest is read first, for up
# to DRAIN_SECONDS and DRAIN_BYTES (still within the answer's cap), so that its connection
# goes back to the pool for the next request (a new connection per call cost a connect,
# and the upstream an accept, every call: docs/benchmarks.md, S14); an end that does not
# come by then closes the connection, as before.
DRAIN_SECONDS = 0.25
DRAIN_BYTES = 64 << 10
# How long an idle connection is kept for the next request: under the idle timeouts of
# common servers (uvicorn's 5 s), so a kept connection is not one the server is closing.
KEEPALIVE_SECONDS = 2.0
# The connections one async client opens at once (httpx's own default; httpcore's pool
# alone would allow 10): an MCP session's calls in flight, each its own POST, are capped
# below it (upstream.HTTP_IN_FLIGHT).
ASYNC_CONNECTIONS = 100


class _CappedBody(httpx2.AsyncByteStream):
    """An answer's body that fails with OutboundRefused past `limit` bytes, as it arrives;
    closed before its end, the rest is read (`DRAIN_SECONDS`) so the connection is kept."""

    def __init__(self, stream: httpx2.AsyncByteStream, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._size = 0
        self._chunks: AsyncIterator[bytes] | None = None
        self._ended = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            self._chunks = self._read()
        return self._chunks

    async def _read(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._size += len(chunk)
            if self._size > self._limit:
                raise OutboundRefused(f"answer larger than {self._limit} bytes")
            yield chunk
        self._ended = True

    async def aclose(self) -> None:
        try:
            if not self._ended and anyio.current_effective_deadline() != -math.inf:
                await self._drain()
        finally:
            await self._stream.aclose()

    async def _drain(self) -> None:
        """The rest of the answer read and dropped, if it ends soon (else nothing: the
        connection is closed)."""
        cap = self._size + DRAIN_BYTES
        with contextlib.suppress(Exception), anyio.move_on_after(DRAIN_SECONDS):
            async for _ in self.__aiter__():
                if self._size > cap:
                    return


class _KeptConnection(httpcore2.AsyncHTTPConnection):
    """A connection that is not reused when bytes came after its last answer's end (a
    second answer no request asked for, or a body longer than its Content-Length): the
    next request would read them as its own answer (HTTP response queue poisoning).
    They are either read already (h11's buffer) or, over TLS, in a record not yet
    decrypted; bytes that come later, while it waits in the pool, make its socket
    readable, which httpcore2's own `has_expired` checks."""

    # (the stream's TLS object, read once: the pool asks every kept connection on every
    # request, and anyio builds all of a stream's attributes, a getpeername() among them,
    # for each look)
    _tls: ssl.SSLObject | None = None
    _tls_read = False

    def has_expired(self) -> bool:
        http11 = self._connection
        if not isinstance(http11, httpcore2.AsyncHTTP11Connection) or not http11.is_idle():
            return super().has_expired()
        if not self._tls_read:
            self._tls = http11._network_stream.get_extra_info("ssl_object")
            self._tls_read = True
        left_over = http11._h11_state.trailing_data[0] or _tls_pending(self._tls)
        return bool(left_over) or super().has_expired()


def _tls_pending(tls: ssl.SSLObject | None) -> bool:
    """Whether a TLS stream (its `ssl_object`; None: not TLS) holds a record it could
    decrypt now (read, and lost: the caller closes the connection) or one that ends it."""
    if tls is None:
        return False
    try:
        return bool(tls.read(1))
    except ssl.SSLWantReadError:
        return False
    except ssl.SSLError:
        return True


class _AsyncPool(httpcore2.AsyncConnectionPool):
    """The pool of `async_transport`: HTTP/1.1 connections through the guarded backend,
    kept idle for KEEPALIVE_SECONDS, none reused after bytes left behind an answer."""

    def __init__(self) -> None:
        super().__init__(
            ssl_context=ssl_context(),
            network_backend=_AsyncGuardedBackend(),
            keepalive_expiry=KEEPALIVE_SECONDS,
            max_connections=ASYNC_CONNECTIONS,
        )

    def create_connection(self, origin: httpcore2.Origin) -> httpcore2.AsyncConnectionInterface:
        return _KeptConnection(
            origin=origin,
            ssl_context=self._ssl_context,
            keepalive_expiry=self._keepalive_expiry,
            network_backend=self._network_backend,
        )


def _refused_answer(headers: Mapping[str, str], limit: int) -> str:
    """Why an answer with these headers is refused before its body is read ("" if it is
    not): a compressed one (a small gzip body would decode past any cap), or one that
    declares a length past `limit`."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    declared = headers.get("content-length", "")
    if encoding not in ("", "identity"):
        return "refused: a compressed answer"
    if declared.isdigit() and int(declared) > limit:
        return f"answer larger than {limit} bytes"
    return ""


class _CappedAsyncTransport(httpx2.AsyncHTTPTransport):
    """Each answer capped at `limit` bytes and never decompressed (`_refused_answer`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(trust_env=False)
        self.limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await super().handle_async_request(request)
        if problem := _refused_answer(response.headers, self.limit):
            await response.aclose()
            raise OutboundRefused(problem)
        assert isinstance(response.stream, httpx2.AsyncByteStream)  # noqa: S101 - httpx2's own
        response.stream = _CappedBody(response.stream, self.limit)
        return response


@dataclass(frozen=True)
class Opened:
    """An answer `exchange` received: its status, its headers (names in lower case, each
    value decoded and a repeated header's values joined with ", ", as httpx2's `Headers`
    gives them; `raw` as they came) and its body, capped, still to be read."""

    status: int
    headers: Mapping[str, str]
    raw: list[tuple[bytes, bytes]]
    body: _CappedBody

    async def read(self) -> bytes:
        """The whole body (OutboundRefused past the cap)."""
        return b"".join([chunk async for chunk in self.body])


def _decoded(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers as httpx2's `Headers.get` reads them: ASCII, else UTF-8, else Latin-1, the
    same for all (the first that decodes every name and value)."""
    for encoding in ("ascii", "utf-8", "iso-8859-1"):
        try:
            pairs = [(name.decode(encoding).lower(), value.decode(encoding)) for name, value in raw]
        except UnicodeDecodeError:
            continue
        headers: dict[str, str] = {}
        for name, value in pairs:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return headers
    raise AssertionError("unreachable: Latin-1 decodes every byte")


@contextlib.asynccontextmanager
async def exchange(
    client: httpx2.AsyncClient,
    method: str,
    url: httpx2.URL,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
) -> AsyncIterator[Opened]:
    """One request sent on the pool of `client` (one of `async_client`'s) by httpcore2
    itself, without httpx2's client, request and response objects around it (the cost of
    an upstream MCP call: docs/mcp.md, "The upstream call"), and its answer. The same door
    as the client's: the same kept connections, each made through the guarded backend
    (every resolved address checked) with the same TLS context; the client's timeouts;
    `Accept-Encoding: identity` sent, and a compressed answer or one declaring a length
    past the client's cap refused (`_refused_answer`); the body capped as it is read, and
    on leaving drained or closed as `_CappedBody` does. Never a redirect followed (the
    caller decides). `headers` are sent as given (the caller's Host and Content-Length
    among them) but for Accept-Encoding; failures are httpx2's exceptions, as through
    the client."""
    transport = client._transport
    if not isinstance(transport, _CappedAsyncTransport):
        raise TypeError("exchange needs a client of outbound.async_client")
    if client.is_closed:  # (its pool would open a connection no one closes: httpx2's test)
        raise RuntimeError("Cannot send a request, as the client has been closed.")
    sent = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"]
    sent.append((b"Accept-Encoding", b"identity"))
    request = httpcore2.Request(
        method,
        httpcore2.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
        headers=sent,
        content=content,
        extensions={"timeout": client.timeout.as_dict()},
    )
    with map_httpcore_exceptions():
        answer = await transport._pool.handle_async_request(request)
    raw = list(answer.headers)
    decoded = _decoded(raw)
    assert isinstance(answer.stream, AsyncIterable)  # noqa: S101 - httpcore2's async pool
    stream = AsyncResponseStream(answer.stream)
    if problem := _refused_answer(decoded, transport.limit):
        await stream.aclose()
        raise OutboundRefused(problem)
    body = _CappedBody(stream, transport.limit)
    try:
        yield Opened(answer.status, decoded, raw, body)
    finally:
        await body.aclose()


def async_transport(limit: int | None = None) -> httpx2.AsyncHTTPTransport:
    """The async transport: the address policy, and each answer capped at `limit` bytes
    (HARNESS_OUTBOUND_MAX_BYTES by default)."""
    guarded = _CappedAsyncTransport(settings.HARNESS_OUTBOUND_MAX_BYTES if limit is None else limit)
    guarded._pool = _AsyncPool()
    return guarded


def async_client(*, limit: int | None = None, **kwargs: Any) -> httpx2.AsyncClient:
    """An httpx2.AsyncClient through the door (no redirects, no proxies from the
    environment, each answer capped at `limit` bytes and never decompressed); for streams
    whose answers the caller reads incrementally (MCP, whose SDK takes httpx2's clients;
    the certificate authorities are still `ssl_context`'s, not the system's)."""
    return httpx2.AsyncClient(
        transport=async_transport(limit), follow_redirects=False, trust_env=False, **kwargs
    )


def is_push_service(host: str) -> bool:
    host = host.lower().rstrip(".")
    return host in PUSH_SERVICES or host.endswith(PUSH_SERVICE_SUFFIXES)


def check_url(url: str, *, push: bool = False) -> tuple[str, int]:
    """The (host, port) of an http(s) URL the door may try; raises OutboundRefused.
    With `push`, the host must be a known push service (https) or listed in the
    allowance by name, address or network."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        raise OutboundRefused("refused: not a valid URL") from None
    if parts.scheme not in ("http", "https") or not host:
        raise OutboundRefused("refused: not an http(s) URL")
    port = port or (443 if parts.scheme == "https" else 80)
    if push and not (parts.scheme == "https" and is_push_service(host)) and not _listed(host, port):
        raise OutboundRefused("refused: not a known push service")
    return host, port


def _listed(host: str, port: int) -> bool:
    allowed = allowance()
    if allowed.names(host, port):
        return True
    try:
        return allowed.covers(ipaddress.ip_address(host.strip("[]")), port)
    except ValueError:
        return False


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


def send(
    method: str,
    url: str,
    *,
    content: bytes = b"",
    headers: Mapping[str, str] | None = None,
    push: bool = False,
    timeout: float | None = None,
    limit: int | None = None,
) -> Answer:
    """Make one request through the door and return its answer (any status: the caller
    decides what a 4xx means). Raises OutboundRefused for a refused destination, a
    timeout (each phase, and the whole exchange past `timeout` seconds), an answer
    larger than `limit` bytes, or a failed connection."""
    timeout = settings.HARNESS_OUTBOUND_TIMEOUT if timeout is None else timeout
    limit = settings.HARNESS_OUTBOUND_MAX_BYTES if limit is None else limit
    check_url(url, push=push)
    deadline = time.monotonic() + timeout
    client = httpx.Client(
        transport=transport(deadline), follow_redirects=False, trust_env=False, timeout=timeout
    )
    try:
        with client, client.stream(method, url, content=content, headers=headers) as response:
            body = _read_capped(response, limit, deadline)
            return Answer(response.status_code, dict(response.headers), body)
    except httpx.TimeoutException:
        raise OutboundRefused("timed out") from None
    except httpx.InvalidURL:  # what urlsplit took and httpx does not (`0177.0.0.1`)
        raise OutboundRefused("refused: not a valid URL") from None
    except httpx.HTTPError:
        raise OutboundRefused("connection failed") from None


def _read_capped(response: httpx.Response, limit: int, deadline: float) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise OutboundRefused(f"answer larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_raw():  # as it arrives: the deadline is checked per piece
        size += len(chunk)
        if size > limit:
            raise OutboundRefused(f"answer larger than {limit} bytes")
        if time.monotonic() > deadline:
            raise OutboundRefused("timed out")
        chunks.append(chunk)
    return b"".join(chunks)


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class _DoorAdapter(requests.adapters.BaseAdapter):
    """A requests adapter that sends through the door (for libraries that take a
    requests.Session: pywebpush, the OTLP/HTTP exporter)."""

    def __init__(self, push: bool) -> None:
        super().__init__()
        self.push = push

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        body = request.body or b""
        if not isinstance(body, (str, bytes)):
            raise OutboundRefused("refused: a streamed request body")  # none of ours streams
        answer = send(
            request.method or "GET",
            request.url or "",
            content=body.encode() if isinstance(body, str) else body,
            headers={str(k): _text(v) for k, v in request.headers.items()},
            push=self.push,
        )
        response = requests.Response()
        response.status_code = answer.status
        # Without Location, requests never follows a redirect either.
        response.headers = CaseInsensitiveDict(
            {k: v for k, v in answer.headers.items() if k.lower() != "location"}
        )
        response._content = answer.body
        response.url = request.url or ""
        response.request = request
        response.reason = ""
        return response

    def close(self) -> None:
        pass


def requests_session(*, push: bool = False) -> requests.Session:
    """A requests.Session whose every request goes through the door."""
    session = requests.Session()
    session.trust_env = False
    adapter = _DoorAdapter(push)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
