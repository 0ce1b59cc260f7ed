"""django-tasks-db adapter (runs in bench/.venvs/tasksdb): Django 6.1 ``django.tasks`` with
``django_tasks_db.DatabaseBackend``, persistent connections, its ``db_worker`` loop in-process."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

from bench.config import payload
from bench.peers.protocol import serve_sync, trickle_sync

params = conninfo_to_dict(sys.argv[1])
settings.configure(
    INSTALLED_APPS=["django_tasks_db"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": params.get("dbname"),
            "USER": params.get("user", "postgres"),
            "PASSWORD": params.get("password", ""),
            "HOST": params.get("host", ""),
            "PORT": str(params.get("port", "")),
            "CONN_MAX_AGE": 600,
        }
    },
    TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []}},
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django_tasks_db.management.commands.db_worker import Worker  # noqa: E402
from django_tasks_db.models import DBTaskResult  # noqa: E402

from bench.peers import tasksdb_tasks  # noqa: E402

state: dict[str, Any] = {}


def setup() -> None:
    call_command("migrate", verbosity=0)


def reset() -> None:
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {DBTaskResult._meta.db_table}")


def enqueue(n: str, start: str) -> dict[str, float]:
    t0 = time.perf_counter()
    for i in range(int(start), int(start) + int(n)):
        tasksdb_tasks.noop.enqueue(payload(i))
    return {"seconds": time.perf_counter() - t0}


def load(n: str, start: str) -> dict[str, float]:
    t0 = time.perf_counter()
    with transaction.atomic():
        for i in range(int(start), int(start) + int(n)):
            tasksdb_tasks.noop.enqueue(payload(i))
    return {"seconds": time.perf_counter() - t0}


def _worker(queue: str, batch: bool, interval: float) -> Worker:
    return Worker(
        queue_names=[queue],
        interval=interval,
        batch=batch,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id=f"bench-{queue}",
        excluded_queue_names=[],
    )


def drain(n: str, _procs: str) -> dict[str, float]:
    tasksdb_tasks.done["n"] = 0
    t0 = time.perf_counter()
    _worker("bench", True, 0.0).run()
    return {"seconds": time.perf_counter() - t0, "n": tasksdb_tasks.done["n"]}


def serve_latency() -> dict[str, bool]:
    worker = _worker("bench_latency", False, 0.1)
    state["worker"] = worker
    state["thread"] = threading.Thread(target=worker.run, daemon=True)
    state["thread"].start()
    time.sleep(1.0)
    return {"ok": True}


def stop_latency() -> dict[str, bool]:
    state["worker"].running = False
    state["thread"].join(30)
    return {"ok": True}


def do_trickle(n: str, rate: str) -> dict[str, bool]:
    trickle_sync(int(n), float(rate), tasksdb_tasks.latency.enqueue)
    return {"ok": True}


serve_sync(
    {
        "reset": reset,
        "enqueue": enqueue,
        "load": load,
        "drain": drain,
        "serve_latency": serve_latency,
        "stop_latency": stop_latency,
        "trickle": do_trickle,
    },
    setup,
)
