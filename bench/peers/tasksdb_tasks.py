"""Tasks for the django-tasks-db adapter (importable by module path, as Django requires)."""

from typing import Any

from django.tasks import task

from bench.peers.protocol import report_latency

done = {"n": 0}


@task(queue_name="bench")
def noop(body: Any) -> None:
    done["n"] += 1


@task(queue_name="bench_latency")
def latency(body: Any) -> None:
    report_latency("tasksdb", body)
