"""The HTTP endpoints of a group of worker processes (``pgq_worker --processes N``), which its
supervisor serves on one ``--metrics-port`` and one ``--health-port``:

- ``/metrics``: every running child's exposition scraped and summed (``metrics/merge.py``;
  what a child that exited had counted still counts), plus the supervisor's own counts of
  its children;
- the health probes: the supervisor's own view of its children (``Supervisor.problems``),
  plus each running child's answer to the same probe.

A child serves its endpoints on a private port that it reports in a file
(``child.report_endpoints``); the supervisor asks it there, with a short timeout.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from . import child, health
from .endpoints import EndpointServer, Response, Route, bind, serve

if TYPE_CHECKING:
    from .supervisor import Slot, Supervisor

#: Seconds the supervisor waits for a child's answer when it scrapes or probes it.
CHILD_HTTP_TIMEOUT = 2.0


class GroupEndpoints:
    """Bound on creation (a port in use fails the supervisor's start); served from
    :meth:`start` until :meth:`stop`."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.metrics: Any = None  # a metrics.merge.GroupMetrics with --metrics-port
        self.servers = self._bind()

    def start(self) -> None:
        serve(
            self.servers,
            f"pgq_worker supervisor {self.supervisor.worker_id}",
            self.supervisor.options.http_host,
        )

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def retire(self, worker_id: str) -> None:
        """``worker_id`` exited: what it counted is kept, its scrapes end."""
        if self.metrics is not None:
            self.metrics.retire(worker_id)

    def _bind(self) -> list[EndpointServer]:
        options = self.supervisor.options
        ports: dict[str, int] = {}
        routes: dict[str, Route] = {}
        if options.metrics_port is not None:
            from django.core.exceptions import ImproperlyConfigured

            try:
                # The children's exposition needs prometheus_client: refuse now, not in each.
                from ..metrics import exposition  # noqa: F401
            except ImproperlyConfigured as exc:
                raise ValueError(f"--metrics-port: {exc}") from exc
            from ..metrics.merge import GroupMetrics

            self.metrics = GroupMetrics()
            ports["/metrics"] = options.metrics_port
            routes["/metrics"] = self._metrics
        if options.health_port is not None:
            ports[health.LIVENESS_PATH] = ports[health.READINESS_PATH] = options.health_port
            routes[health.LIVENESS_PATH] = lambda: self._probe(health.LIVENESS_PATH)
            routes[health.READINESS_PATH] = lambda: self._probe(health.READINESS_PATH)
        return bind(options.http_host, ports, routes)

    def _child_port(self, slot: Slot) -> int | None:
        if slot.port is None and slot.endpoints_file is not None:
            slot.port = child.read_endpoints(slot.endpoints_file)
        return slot.port

    def _get(self, port: int, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=CHILD_HTTP_TIMEOUT) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())

    def _metrics(self) -> Response:
        from ..metrics.merge import Family

        live = []
        with self.supervisor.lock:
            running = [
                (s.worker_id, self._child_port(s)) for s in self.supervisor.slots if s.running
            ]
        for worker_id, port in running:
            if port is None:
                continue
            try:
                status, body = self._get(port, "/metrics")
            except OSError:
                continue  # exiting or not serving yet: its retired counters still count
            if status == 200:
                live.append(self.metrics.scraped(worker_id, body.decode()))
        with self.supervisor.lock:
            states = {"running": 0, "waiting": 0}
            for slot in self.supervisor.slots:
                if slot.running:
                    states["running"] += 1
                elif not slot.done:
                    states["waiting"] += 1
            restarts = sum(s.restarts for s in self.supervisor.slots)
            recycles = sum(s.recycles for s in self.supervisor.slots)
        own = {
            "pgqueue_supervisor_children": Family(
                "pgqueue_supervisor_children",
                "gauge",
                "Worker processes of this supervisor: running, or waiting to be started.",
                {f'pgqueue_supervisor_children{{state="{k}"}}': v for k, v in states.items()},
            ),
            "pgqueue_supervisor_child_restarts_total": Family(
                "pgqueue_supervisor_child_restarts_total",
                "counter",
                "Children started again after they crashed.",
                {"pgqueue_supervisor_child_restarts_total": restarts},
            ),
            "pgqueue_supervisor_child_recycles_total": Family(
                "pgqueue_supervisor_child_recycles_total",
                "counter",
                "Children replaced after they reached a recycling bound.",
                {"pgqueue_supervisor_child_recycles_total": recycles},
            ),
        }
        return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.exposition(live, own)

    def _probe(self, path: str) -> Response:
        readiness = path == health.READINESS_PATH
        problems = self.supervisor.problems(readiness=readiness)
        children = []
        with self.supervisor.lock:
            running = [
                (s, s.worker_id, s.proc.pid) for s in self.supervisor.slots if s.proc is not None
            ]
        for slot, worker_id, pid in running:
            port = self._child_port(slot)
            entry: dict[str, Any] = {"worker_id": worker_id, "pid": pid}
            if port is None:
                if readiness:
                    problems.append(f"child {worker_id} is starting")
                entry["status"] = "starting"
            else:
                try:
                    status, body = self._get(port, path)
                    answer = json.loads(body)
                except (OSError, ValueError) as exc:
                    status, answer = 503, {"problems": [f"no answer ({type(exc).__name__})"]}
                entry["status"] = "ok" if status == 200 else "fail"
                if status != 200:
                    problems.extend(f"child {worker_id}: {p}" for p in answer.get("problems", []))
            children.append(entry)
        answer = {
            "status": "fail" if problems else "ok",
            "worker_id": self.supervisor.worker_id,
            "problems": problems,
            "children": children,
        }
        return 503 if problems else 200, "application/json", json.dumps(answer).encode() + b"\n"
