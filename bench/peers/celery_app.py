"""The Celery app of the benchmark: Redis broker, results ignored, no-op tasks."""

import os

import redis
from celery import Celery

from bench.peers.protocol import report_latency

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
QUEUE = "pgq_bench"
DONE_KEY = "pgq_bench:done"

app = Celery("pgq_bench", broker=BROKER)
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
counter = redis.Redis.from_url(BROKER)


@app.task(name="bench.noop")
def noop(body: dict) -> None:
    # The pool's processes are separate: the adapter sees completions through Redis.
    counter.incr(DONE_KEY)


@app.task(name="bench.latency")
def latency(body: dict) -> None:
    report_latency("celery", body)
