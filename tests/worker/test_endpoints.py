"""The worker's HTTP endpoints under clients that misbehave, and where they listen.

Real worker processes (``--health-port``): hundreds of clients that send half a request and
wait cost neither threads nor unbounded descriptors, and ``/healthz`` still answers at once;
a half-sent request is dropped after ``REQUEST_TIMEOUT``; clients that go away early are a
DEBUG line, never a traceback; by default only this host can connect. The HTTP each server
speaks is checked on an :class:`EndpointServer` of its own.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from django_pgqueue.worker.endpoints import (
    MAX_CONNECTIONS,
    MAX_REQUEST_HEAD,
    REQUEST_TIMEOUT,
    EndpointServer,
    Response,
)
from tests.acceptance.conftest import WorkerProcess, spawn_worker  # noqa: F401 (fixture)

from .conftest import wait_for
from .http_probe import endpoint_port, probe

Spawn = Callable[..., WorkerProcess]

HALF_A_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: worker\r\n"  # no blank line: never done


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slow_client(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    client.sendall(HALF_A_REQUEST)
    return client


def closed_by_server(client: socket.socket) -> bool:
    """Whether the server has closed ``client``, asked without waiting: a socket with a timeout
    would wait that long for an answer, which would decide the check by the clock."""
    client.setblocking(False)
    try:
        return client.recv(1) == b""
    except BlockingIOError:
        return False  # still open, nothing sent
    except ConnectionResetError:
        return True


@pytest.fixture
def health_worker(spawn_worker: Spawn) -> Iterator[tuple[WorkerProcess, int]]:  # noqa: F811
    worker = spawn_worker("--health-port", "0", "--poll-interval", "0.5", "-v", "2").ready()
    port = endpoint_port(worker, "/healthz")
    wait_for(lambda: probe(port, "/readyz")[0] == 200)
    yield worker, port
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_slow_clients_cost_no_threads_and_never_keep_healthz_from_answering(
    health_worker: tuple[WorkerProcess, int],
) -> None:
    worker, port = health_worker
    pid = worker.proc.pid
    threads_before, descriptors_before = threads(pid), descriptors(pid)
    clients = [slow_client(port) for _ in range(300)]
    try:
        started = time.monotonic()
        status, body = probe(port, "/healthz")
        answered_in = time.monotonic() - started
        assert status == 200 and body["status"] == "ok", body
        assert answered_in < 2.0
        assert threads(pid) <= threads_before + 2
        # Over the bound the oldest connections were closed: few descriptors, few clients left.
        wait_for(lambda: descriptors(pid) <= descriptors_before + MAX_CONNECTIONS + 5)
        still_open = [c for c in clients if not closed_by_server(c)]
        assert len(still_open) <= MAX_CONNECTIONS
    finally:
        for client in clients:
            client.close()
    assert "Traceback" not in worker.output


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_half_sent_request_is_dropped_after_the_timeout(
    health_worker: tuple[WorkerProcess, int],
) -> None:
    worker, port = health_worker
    with slow_client(port) as client:
        client.settimeout(REQUEST_TIMEOUT + 5)
        started = time.monotonic()
        assert client.recv(100) == b""  # closed by the worker, no answer
        waited = time.monotonic() - started
    assert REQUEST_TIMEOUT - 0.5 < waited < REQUEST_TIMEOUT + 2
    worker.wait_for_line(r"closed: no whole request and answer within")
    assert probe(port, "/healthz")[0] == 200


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_clients_that_go_away_early_are_a_debug_line_not_a_traceback(
    health_worker: tuple[WorkerProcess, int],
) -> None:
    worker, port = health_worker
    for _ in range(20):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n")
        # Closed with a reset before the answer is read: the worker's write fails.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # connects and says nothing
    assert probe(port, "/healthz")[0] == 200
    worker.wait_for_line(r"DEBUG django_pgqueue.worker: 127\.0\.0\.1:\d+ went away")
    assert "Traceback" not in worker.output
    assert "Exception occurred during processing" not in worker.output


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "shown", "from_another_address"),
    [((), "127.0.0.1", False), (("--http-host", "0.0.0.0"), "0.0.0.0", True)],
    ids=["default", "every-interface"],
)
def test_by_default_only_this_host_can_connect(
    spawn_worker: Spawn,  # noqa: F811
    args: tuple[str, ...],
    shown: str,
    from_another_address: bool,
) -> None:
    worker = spawn_worker("--health-port", "0", *args).ready()
    line = worker.wait_for_line(r"serves /healthz, /readyz on http://")
    assert f"on http://{shown}:" in line
    port = endpoint_port(worker, "/healthz")
    assert probe(port, "/healthz")[0] == 200
    # 127.0.0.2 is this machine too (Linux routes all of 127/8 to the loopback interface),
    # but not the address 127.0.0.1: it stands for a connection from elsewhere.
    try:
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
        reachable = True
    except ConnectionRefusedError:
        reachable = False
    assert reachable is from_another_address
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


# -- the HTTP one server speaks (no worker) ---------------------------------------------------


@pytest.fixture
def server() -> Iterator[EndpointServer]:
    def broken() -> Response:
        raise RuntimeError("a bug")

    routes = {"/hello": lambda: (200, "text/plain", b"hello\n"), "/broken": broken}
    server = EndpointServer("127.0.0.1", 0, routes)
    server.start()
    yield server
    server.stop()


def exchange(server: EndpointServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def test_get_and_head(server: EndpointServer) -> None:
    answer = exchange(server, b"GET /hello?x=1 HTTP/1.1\r\nHost: w\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nContent-Length: 6\r\n" in answer and b"\r\nConnection: close\r\n" in answer
    assert answer.endswith(b"\r\n\r\nhello\n")
    head = exchange(server, b"HEAD /hello HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("request_bytes", "status_line"),
    [
        (b"GET /nowhere HTTP/1.1\r\n\r\n", b"HTTP/1.1 404 Not Found"),
        (b"POST /hello HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.1 405 Method Not Allowed"),
        (b"nonsense\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
        (
            b"GET /hello HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_HEAD + b"\r\n\r\n",
            b"HTTP/1.1 431 Request Header Fields Too Large",
        ),
    ],
    ids=["unknown-path", "post", "garbage", "huge-head"],
)
def test_requests_it_does_not_serve(
    server: EndpointServer, request_bytes: bytes, status_line: bytes
) -> None:
    assert exchange(server, request_bytes).startswith(status_line + b"\r\n")


def test_a_failing_route_is_a_500_and_logged(
    server: EndpointServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, "django_pgqueue.worker"):
        answer = exchange(server, b"GET /broken HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert answer.endswith(b"\r\n\r\nRuntimeError\n")
    assert "The /broken endpoint failed." in caplog.text


def test_stop_closes_the_port_and_open_connections(server: EndpointServer) -> None:
    client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    client.sendall(HALF_A_REQUEST)
    wait_for(lambda: len(server._open) == 1)
    port = server.port
    server.stop()
    assert client.recv(10) == b""
    client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
