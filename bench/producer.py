"""A producer process, reused across rounds. It connects (Django and raw psycopg), prints
"ready", then for every stdin line ``run <system> <n> <start> [rate] [latency|-] [batch]`` enqueues
and prints its start and end times as JSON; ``exit`` ends it. ``system`` is ``raw``,
``raw-notify``, ``pgq`` (NOTIFY on) or ``pgq-nonotify``; ``rate`` 0 = flat out. A seventh
word, ``batch``, sends that many per ``enqueue_many()`` call (pgq systems only).

    python -m bench.producer <dsn>
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main() -> None:
    dsn = sys.argv[1]
    from psycopg.types.json import Jsonb

    from bench import core_cases, raw
    from bench.config import LATENCY_TASK, QUEUE, TASK, payload

    core_cases.setup_django(dsn, migrate=False)
    core_cases.warm_up()
    from django.conf import settings
    from django.db import connection as django_connection
    from django.test.utils import override_settings

    from django_pgqueue import enqueue, enqueue_many

    conn = raw.connect(dsn)
    quiet = override_settings(PGQUEUE={**settings.PGQUEUE, "NOTIFY": False})

    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "exit":
            break
        if words[0] == "flush":  # publish this process's counters now (see measure.py)
            conn.execute("SELECT pg_stat_force_next_flush()")
            with django_connection.cursor() as cur:
                cur.execute("SELECT pg_stat_force_next_flush()")
            print(json.dumps({"ok": True}), flush=True)
            continue
        system, n, start = words[1], int(words[2]), int(words[3])
        rate = float(words[4]) if len(words) > 4 else 0.0
        latency = len(words) > 5 and words[5] == "latency"
        batch = int(words[6]) if len(words) > 6 else 1
        task = LATENCY_TASK if latency else TASK
        send: Any
        if system == "raw":

            def send(body: dict[str, Any]) -> None:
                conn.execute(raw.INSERT, [QUEUE, Jsonb(body)])
        elif system == "raw-notify":

            def send(body: dict[str, Any]) -> None:
                conn.execute(raw.INSERT_NOTIFY, [QUEUE, Jsonb(body), QUEUE])
        else:

            def send(body: dict[str, Any], task: str = task) -> None:
                enqueue(task, body, queue=QUEUE)

        if system == "pgq-nonotify":
            quiet.enable()
        started = time.time()
        t0 = time.perf_counter()
        for k in range(0, n, batch):
            if rate:
                delay = t0 + k / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            bodies = [payload(start + i) for i in range(k, min(n, k + batch))]
            if latency:
                stamp = time.time()
                for body in bodies:
                    body["t"] = stamp
            if batch == 1:
                send(bodies[0])
            else:
                enqueue_many(task, bodies, queue=QUEUE)
        ended = time.time()
        if system == "pgq-nonotify":
            quiet.disable()
        print(json.dumps({"start": started, "end": ended, "n": n, "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
