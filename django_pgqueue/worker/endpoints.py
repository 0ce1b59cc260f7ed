"""The worker's small HTTP server: ``/metrics`` and the health probes on one or two ports.

Standard library only (``http.server``), one thread per request so a slow scrape never holds
up a probe. Each path is a function returning ``(status, content type, body)``; a port serves
every path whose flag named it (``--metrics-port`` and ``--health-port`` may be the same).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from . import health

if TYPE_CHECKING:
    from .runner import Worker

logger = logging.getLogger("django_pgqueue.worker")

#: What a path answers: HTTP status, content type, body.
Response = tuple[int, str, bytes]
Route = Callable[[], Response]


class _Handler(BaseHTTPRequestHandler):
    server: EndpointServer

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, content_type, body = 404, "text/plain; charset=utf-8", b"not found\n"
        else:
            try:
                status, content_type, body = route()
            except Exception as exc:
                logger.exception("The %s endpoint failed.", self.path)
                status, content_type = 500, "text/plain; charset=utf-8"
                body = f"{type(exc).__name__}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # Probes arrive every few seconds: an access log line each would drown the worker's.
        logger.debug("%s %s", self.address_string(), format % args)


class EndpointServer(ThreadingHTTPServer):
    """Bound on creation (a port in use fails the worker's start, not its first probe);
    serves once :meth:`start` is called."""

    daemon_threads = True

    def __init__(self, host: str, port: int, routes: dict[str, Route]) -> None:
        self.routes = routes
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
        self.server_close()


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
            server.server_close()
        raise
    return servers


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
