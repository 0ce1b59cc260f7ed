"""``manage.py pgq_worker``: run a worker (a thin shell over :mod:`django_pgqueue.worker`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import MAX_BATCH_SIZE, MAX_CONCURRENCY
from ...worker.endpoints import DEFAULT_HOST
from ...worker.options import STARTUP_TIMEOUT
from ...worker.runner import Worker, WorkerOptions


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _bounded_int(maximum: int) -> Callable[[str], int]:
    """A whole number in [1, maximum], the bounds of the matching ``PGQUEUE`` setting."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if not 1 <= number <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be a whole number in [1, {maximum}], not {value!r}"
            )
        return number

    return parse


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a port number in [0, 65535] (0: any free port), not {value!r}"
        )
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError(value)
    return number


def _non_negative_float(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Run a django-pgqueue worker: lease messages, run their registered handlers, archive "
        "the results. SIGTERM/SIGINT drain in-flight messages and exit 0; a second signal "
        "releases them and exits 1."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=[],
            metavar="NAME",
            help="Serve this queue (repeatable; in the given order). Default: every queue.",
        )
        parser.add_argument(
            "--exclude-queue",
            action="append",
            dest="exclude_queues",
            default=[],
            metavar="NAME",
            help="Never serve this queue (repeatable).",
        )
        parser.add_argument(
            "--concurrency",
            type=_bounded_int(MAX_CONCURRENCY),
            help="Handlers run at once "
            "(threads for sync handlers; async ones share one event loop). "
            "Default PGQUEUE['CONCURRENCY'].",
        )
        parser.add_argument(
            "--batch-size",
            type=_bounded_int(MAX_BATCH_SIZE),
            help="Messages leased per "
            "round trip and completions archived per statement; the worker "
            "holds at most max(concurrency, batch size). Default "
            "PGQUEUE['BATCH_SIZE'].",
        )
        parser.add_argument(
            "--visibility-timeout",
            type=_positive_float,
            help="Seconds a "
            "lease lasts before another worker may take the message "
            "(heartbeats extend it). Default: per queue / "
            "PGQUEUE['VISIBILITY_TIMEOUT'].",
        )
        parser.add_argument(
            "--poll-interval",
            type=_positive_float,
            help="Seconds between polls when no NOTIFY arrives. Default PGQUEUE['POLL_INTERVAL'].",
        )
        parser.add_argument(
            "--no-listen",
            action="store_false",
            dest="listen",
            help="Poll only, no LISTEN connection (PgBouncer transaction pooling).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Drain what is ready, then exit 0."
        )
        parser.add_argument(
            "--max-messages", type=_positive_int, help="Exit 0 after handling this many messages."
        )
        parser.add_argument(
            "--worker-id",
            help="Name in logs, leases and the heartbeat row. Default host:pid:random.",
        )
        parser.add_argument(
            "--healthcheck-file",
            help="File rewritten on every heartbeat; "
            "a liveness probe checks its age. Removed on exit.",
        )
        parser.add_argument(
            "--startup-timeout",
            type=_non_negative_float,
            default=STARTUP_TIMEOUT,
            metavar="SECONDS",
            help="Seconds a starting worker tries to reach its database before it exits 1 "
            f"with one line saying why. Default {STARTUP_TIMEOUT:g}.",
        )
        parser.add_argument(
            "--grace-period",
            type=_non_negative_float,
            help="Seconds "
            "in-flight handlers get to finish after SIGTERM. Default "
            "PGQUEUE['GRACE_PERIOD'].",
        )

        endpoints = parser.add_argument_group(
            "metrics and health endpoints (HTTP, served by the worker; see docs/how-to/metrics.md)"
        )
        endpoints.add_argument(
            "--metrics-port",
            type=_port,
            help="Serve Prometheus metrics at /metrics on this port (0: any free port, "
            "logged). Needs the [metrics] extra (prometheus_client).",
        )
        endpoints.add_argument(
            "--health-port",
            type=_port,
            help="Serve the liveness (/healthz) and readiness (/readyz) probes on this port "
            "(may be the metrics port).",
        )
        endpoints.add_argument(
            "--http-host",
            default=DEFAULT_HOST,
            metavar="ADDRESS",
            help=f"The address the metrics and health endpoints listen on. Default {DEFAULT_HOST} "
            "(this host only); 0.0.0.0 for every IPv4 interface, e.g. for Kubernetes probes "
            "and a Prometheus scrape from another pod.",
        )
        endpoints.add_argument(
            "--health-db-timeout",
            type=_positive_float,
            metavar="SECONDS",
            help="Both probes fail when no database round trip succeeded for this long; "
            "longer than the poll and heartbeat intervals. Default 60 (or 3 polls).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._ensure_logging(options["verbosity"])
        worker_options = WorkerOptions(
            queues=options["queues"],
            exclude_queues=options["exclude_queues"],
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            visibility_timeout=options["visibility_timeout"],
            poll_interval=options["poll_interval"],
            listen=options["listen"],
            burst=options["burst"],
            max_messages=options["max_messages"],
            worker_id=options["worker_id"],
            healthcheck_file=options["healthcheck_file"],
            grace_period=options["grace_period"],
            metrics_port=options["metrics_port"],
            health_port=options["health_port"],
            http_host=options["http_host"],
            health_db_timeout=options["health_db_timeout"],
            startup_timeout=options["startup_timeout"],
        )
        if options["health_port"] is None and options["health_db_timeout"] is not None:
            raise CommandError("--health-db-timeout needs --health-port")
        try:
            worker = Worker(worker_options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        code = worker.run()
        if worker.unreachable:
            sys.exit(code)  # the worker logged why, in one line
        if code and worker.crashed:
            raise CommandError(
                f"stopped after an internal error in the {worker.crashed} thread (logged above "
                "with its traceback); what it held was released",
                returncode=code,
            )
        if code:
            raise CommandError(
                "stopped before every in-flight message finished; their leases were released",
                returncode=code,
            )

    @staticmethod
    def _ensure_logging(verbosity: int) -> None:
        """Print the worker's log lines when the project configured no handler for them."""
        package = logging.getLogger("django_pgqueue")
        if package.handlers or logging.getLogger().handlers:
            return
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        package.addHandler(stream)
        package.setLevel(
            logging.DEBUG if verbosity > 1 else logging.WARNING if verbosity == 0 else logging.INFO
        )
