"""``manage.py pgq_worker``: run a worker (a thin shell over :mod:`django_pgqueue.worker`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import MAX_BATCH_SIZE, MAX_CONCURRENCY, get_settings
from ...worker import child
from ...worker.endpoints import DEFAULT_HOST
from ...worker.options import STARTUP_TIMEOUT, check_sizes, default_worker_id, served_queues
from ...worker.runner import Worker, WorkerOptions
from ...worker.supervisor import Supervisor, SupervisorOptions


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

        processes = parser.add_argument_group(
            "worker processes (one supervisor, N workers; see docs/how-to/run-workers.md)"
        )
        processes.add_argument(
            "--processes",
            type=_positive_int,
            default=1,
            metavar="N",
            help="Run N worker processes under one supervisor that replaces those that die. "
            "Default 1: this process is the worker.",
        )
        processes.add_argument(
            "--max-tasks-per-child",
            type=_positive_int,
            metavar="N",
            help="Replace a worker process after it handled N messages (runs a supervisor).",
        )
        processes.add_argument(
            "--max-memory-per-child",
            type=_positive_int,
            metavar="MIB",
            help="Replace a worker process once its resident memory passes MIB mebibytes, "
            "between messages (runs a supervisor; Linux).",
        )
        # Internal: set by the supervisor on the command lines of its children.
        parser.add_argument("--child-of", type=_positive_int, help=argparse.SUPPRESS)
        parser.add_argument("--child-endpoints", help=argparse.SUPPRESS)

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
        if options["child_of"] is None and (
            options["processes"] > 1
            or options["max_tasks_per_child"]
            or options["max_memory_per_child"]
        ):
            sys.exit(self._supervise(worker_options, options))
        if options["child_of"] is not None:
            child.die_with_parent(options["child_of"])
            worker_options.max_messages = options["max_tasks_per_child"]
        try:
            worker = Worker(worker_options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["child_endpoints"] and worker.servers:
            child.report_endpoints(options["child_endpoints"], worker.servers[0].port)
        memory = None
        if options["max_memory_per_child"] and options["child_of"] is not None:
            memory = child.MemoryBound(
                options["max_memory_per_child"],
                stop=lambda: None if worker.stopping.is_set() else worker.request_stop(),
            )
            memory.start()
        code = worker.run()
        if memory is not None:
            memory.close()
        if options["child_of"] is not None and code == 0:
            limit = options["max_tasks_per_child"]
            if memory is not None and memory.reached_mib is not None:
                sys.exit(child.RECYCLED)
            if limit is not None and worker.taken >= limit:
                logging.getLogger("django_pgqueue.worker").info(
                    "pgq_worker %s handled %d messages (--max-tasks-per-child): recycling.",
                    worker.worker_id,
                    worker.taken,
                )
                sys.exit(child.RECYCLED)
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

    def _supervise(self, worker_options: WorkerOptions, options: dict[str, Any]) -> int:
        """Run N worker processes (this same command, ``--child-of`` this process)."""
        if options["max_messages"] is not None:
            raise CommandError(
                "--max-messages stops one worker; with --processes or recycling use "
                "--max-tasks-per-child"
            )
        if options["healthcheck_file"]:
            raise CommandError(
                "--healthcheck-file is one worker's file; with --processes or recycling use "
                "--health-port"
            )
        conf = get_settings()
        try:
            check_sizes(
                worker_options.concurrency or conf.CONCURRENCY,
                worker_options.batch_size or conf.BATCH_SIZE,
                None,
            )
            served_queues(worker_options)
            if options["max_memory_per_child"]:
                child.check_memory_bound_supported()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        grace = conf.GRACE_PERIOD if options["grace_period"] is None else options["grace_period"]
        recycling = []
        if options["max_tasks_per_child"]:
            recycling.append(f"--max-tasks-per-child {options['max_tasks_per_child']}")
        if options["max_memory_per_child"]:
            recycling.append(f"--max-memory-per-child {options['max_memory_per_child']}")
        try:
            supervisor = Supervisor(
                SupervisorOptions(
                    processes=options["processes"],
                    worker_id=options["worker_id"] or default_worker_id(),
                    child_args=_child_args(options),
                    grace_period=grace,
                    burst=options["burst"],
                    metrics_port=options["metrics_port"],
                    health_port=options["health_port"],
                    http_host=options["http_host"],
                    recycling=", ".join(recycling),
                )
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        return supervisor.run()

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


def _child_args(options: dict[str, Any]) -> list[str]:
    """The flags each worker process of a supervisor gets: the supervisor's own, but for its
    endpoints (a child serves them on a private port of 127.0.0.1) and its id."""
    args = ["-v", str(options["verbosity"])]
    for queue in options["queues"]:
        args += ["--queue", queue]
    for queue in options["exclude_queues"]:
        args += ["--exclude-queue", queue]
    valued = {
        "concurrency": "--concurrency",
        "batch_size": "--batch-size",
        "visibility_timeout": "--visibility-timeout",
        "poll_interval": "--poll-interval",
        "grace_period": "--grace-period",
        "startup_timeout": "--startup-timeout",
        "health_db_timeout": "--health-db-timeout",
        "max_tasks_per_child": "--max-tasks-per-child",
        "max_memory_per_child": "--max-memory-per-child",
    }
    for dest, flag in valued.items():
        if options.get(dest) is not None:
            args += [flag, str(options[dest])]
    if not options["listen"]:
        args.append("--no-listen")
    if options["burst"]:
        args.append("--burst")
    if options["metrics_port"] is not None:
        args += ["--metrics-port", "0"]
    if options["health_port"] is not None:
        args += ["--health-port", "0"]
    return args
