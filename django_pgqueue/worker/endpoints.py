"""The worker's small HTTP server: ``/metrics`` and the health probes on one or two ports.

Each port is served by one thread running an asyncio event loop, standard library only. A
connection costs a socket and a few kilobytes, never a thread, and is held in check three
ways, so that clients that connect and wait can never keep a probe from its answer:

- it has :data:`REQUEST_TIMEOUT` seconds to send its request and take the answer, then it is
  closed (a half-sent request holds nothing for long);
- at most :data:`MAX_CONNECTIONS` are open: one more closes the oldest, which a client that
  sends its request at once (a probe, a scrape) never is, since it is answered at once;
- one request per connection (``Connection: close``), its head at most
  :data:`MAX_REQUEST_HEAD` bytes.

A client that goes away early, or is closed by these rules, is a DEBUG log line. Each path
is a function returning ``(status, content type, body)``, called on the loop's thread (the
routes read what the worker already recorded, without a query); a port serves every path
whose flag named it (``--metrics-port`` and ``--health-port`` may be the same).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from ..core._validation import printable
from . import health

if TYPE_CHECKING:
    from .runner import Worker

logger = logging.getLogger("django_pgqueue.worker")

#: What a path answers: HTTP status, content type, body.
Response = tuple[int, str, bytes]
Route = Callable[[], Response]

#: The address the endpoints listen on unless told otherwise (``--http-host``): this host
#: only, so a port is reachable from elsewhere only when asked for.
DEFAULT_HOST = "127.0.0.1"
#: Seconds a connection has to send its request and read the whole answer.
REQUEST_TIMEOUT = 5.0
#: Connections open at once on one port; one more closes the oldest.
MAX_CONNECTIONS = 64
#: Bytes of a request line and headers; a longer head is answered 431.
MAX_REQUEST_HEAD = 8192

_TEXT = "text/plain; charset=utf-8"


class EndpointServer:
    """Bound on creation (a port in use fails the worker's start, not its first probe);
    serves once :meth:`start` is called, until :meth:`stop`."""

    def __init__(self, host: str, port: int, routes: dict[str, Route]) -> None:
        self.routes = routes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._socket = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        # Insertion order is age: the first one is the oldest.
        self._open: dict[asyncio.WriteTransport, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._serving = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        self._serving.wait(5)

    def stop(self) -> None:
        """Closes the port and every open connection; may be called more than once."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(stopping.set)
            thread.join(5)
        self._socket.close()

    # -- the loop's thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            logger.exception("The HTTP endpoints stopped on an internal error.")
        finally:
            self._serving.set()  # start() waits no longer

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self._socket, limit=MAX_REQUEST_HEAD
        )
        self._serving.set()
        async with server:
            await self._stopping.wait()
            server.close()
            for transport in list(self._open):
                transport.abort()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        if self._stopping is not None and self._stopping.is_set():
            transport.abort()
            return
        peer = _peer(writer)
        self._admit(transport)
        # drain() returns once the answer is with the kernel, so that closing never waits
        # on a client that reads nothing.
        transport.set_write_buffer_limits(high=0)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    line, response = "", _plain(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
                else:
                    line = head.split(b"\r\n", 1)[0].decode("latin-1")
                    response = self._answer(line)
                status, content_type, body = response
                writer.write(
                    _encode(status, content_type, body, head_only=line.startswith("HEAD "))
                )
                await writer.drain()
            logger.debug('%s "%s" %d', peer, printable(line), status)
        except TimeoutError:
            logger.debug(
                "%s closed: no whole request and answer within %ss.", peer, REQUEST_TIMEOUT
            )
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            logger.debug("%s went away (%s).", peer, type(exc).__name__)
        finally:
            self._open.pop(transport, None)
            transport.close()

    def _admit(self, transport: asyncio.WriteTransport) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.abort()
            logger.debug(
                "Closed the oldest of %d open connections to make room for a new one.",
                MAX_CONNECTIONS,
            )
        self._open[transport] = None

    def _answer(self, request_line: str) -> Response:
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _plain(HTTPStatus.BAD_REQUEST)
        method, target, _version = parts
        if method not in ("GET", "HEAD"):
            return _plain(HTTPStatus.METHOD_NOT_ALLOWED)
        path = target.split("?", 1)[0]
        route = self.routes.get(path)
        if route is None:
            return _plain(HTTPStatus.NOT_FOUND)
        try:
            return route()
        except Exception as exc:
            logger.exception("The %s endpoint failed.", printable(path))
            return 500, _TEXT, f"{type(exc).__name__}\n".encode()


def _plain(status: HTTPStatus) -> Response:
    return status.value, _TEXT, f"{status.phrase.lower()}\n".encode()


def _encode(status: int, content_type: str, body: bytes, *, head_only: bool) -> bytes:
    phrase = HTTPStatus(status).phrase
    headers = (
        f"HTTP/1.1 {status} {phrase}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode("latin-1")
    return headers if head_only else headers + body


def _peer(writer: asyncio.StreamWriter) -> str:
    address = writer.get_extra_info("peername")
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def bind(host: str, ports: dict[str, int], routes: dict[str, Route]) -> list[EndpointServer]:
    """One server per distinct port; ``ports`` maps each path to its port, ``routes`` each
    path to its function."""
    by_port: dict[int, dict[str, Route]] = {}
    for path, port in ports.items():
        by_port.setdefault(port, {})[path] = routes[path]
    servers: list[EndpointServer] = []
    try:
        for port, served in by_port.items():
            servers.append(EndpointServer(host, port, served))
    except ValueError:
        for server in servers:
            server.stop()
        raise
    return servers


def serve(servers: list[EndpointServer], who: str, host: str) -> None:
    """Start serving, saying what and where in one log line per port."""
    for server in servers:
        server.start()
        logger.info(
            "%s serves %s on http://%s:%d", who, ", ".join(sorted(server.routes)), host, server.port
        )


def bind_for_worker(worker: Worker) -> list[EndpointServer]:
    """The servers of ``worker``'s ``--metrics-port`` and ``--health-port``, bound."""
    options = worker.options
    ports: dict[str, int] = {}
    routes: dict[str, Route] = {}
    for port in (options.metrics_port, options.health_port):
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(f"a port must be a whole number in [0, 65535], not {port}")
    if options.metrics_port is not None:
        ports["/metrics"] = options.metrics_port
        routes["/metrics"] = _metrics_route(worker)
    if options.health_port is not None:
        timeout = worker.health_db_timeout
        ports[health.LIVENESS_PATH] = ports[health.READINESS_PATH] = options.health_port
        routes[health.LIVENESS_PATH] = lambda: health.respond(
            worker, health.liveness_problems(worker, timeout)
        )
        routes[health.READINESS_PATH] = lambda: health.respond(
            worker, health.readiness_problems(worker, timeout)
        )
    return bind(options.http_host, ports, routes)


def _metrics_route(worker: Worker) -> Route:
    try:
        # prometheus_client is an optional dependency: imported only when asked for.
        from ..metrics.exposition import WorkerCollector, render
    except ImproperlyConfigured as exc:
        raise ValueError(f"--metrics-port: {exc}") from exc
    collector = WorkerCollector(worker)

    def route() -> Response:
        content_type, body = render(collector)
        return 200, content_type, body

    return route
