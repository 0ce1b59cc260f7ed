"""django-pgqueue in the harness process: enqueue paths, and lease + complete batches."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .config import QUEUE, TASK, payload
from .raw import noop

if TYPE_CHECKING:
    from django_pgqueue.core._claim_bound import ClaimBounds


def setup_django(dsn: str, migrate: bool = True) -> None:
    """Django on the bench database (``bench.settings``); a helper process finds it migrated."""
    os.environ["BENCH_DSN"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django
    from django.core.management import call_command

    django.setup()
    if migrate:
        call_command("migrate", verbosity=0)


def reset() -> None:
    execute("TRUNCATE pgqueue_message, pgqueue_archive, pgqueue_dead RESTART IDENTITY")


def execute(statement: str) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(statement)


def warm_up() -> None:
    """Open the persistent connection (and its first-query set-up) before timing."""
    execute("SELECT 1")


def enqueue_single(n: int, start: int = 0) -> int:
    from django_pgqueue import enqueue

    for i in range(start, start + n):
        enqueue(TASK, payload(i), queue=QUEUE)
    return n


def enqueue_single_without_notify(n: int, start: int = 0) -> int:
    from django.test.utils import override_settings

    with override_settings(PGQUEUE={**_pgqueue_settings(), "NOTIFY": False}):
        return enqueue_single(n, start)


def _pgqueue_settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.PGQUEUE)


def enqueue_on_commit_in_atomic(n: int, start: int = 0) -> int:
    """As a view under ATOMIC_REQUESTS: one transaction per message, written at commit."""
    from django.db import transaction

    from django_pgqueue import enqueue_on_commit

    for i in range(start, start + n):
        with transaction.atomic():
            enqueue_on_commit(TASK, payload(i), queue=QUEUE)
    return n


def enqueue_many(
    n: int,
    start: int = 0,
    chunk: int | None = None,
    queue: str = QUEUE,
    *,
    dedup: bool = False,
    tenant: str | None = None,
) -> int:
    """``n`` messages in calls of ``chunk``; ``dedup``: each with a key of its own."""
    from django_pgqueue import enqueue_many as many

    chunk = chunk or n
    for offset in range(start, start + n, chunk):
        stop = min(offset + chunk, start + n)
        keys = [f"key-{i}" for i in range(offset, stop)] if dedup else None
        many(
            TASK,
            (payload(i) for i in range(offset, stop)),
            queue=queue,
            dedup_keys=keys,
            tenant=tenant,
        )
    return n


def lease_complete_drain(
    batch: int,
    limit: int | None = None,
    queue: str = QUEUE,
    synchronous_acks: bool = False,
    bounds: ClaimBounds | None = None,
) -> int:
    """The worker's database work without the worker: lease a batch, run the no-op, complete.
    The claims keep a claimer's bounds as a worker's do (``bounds``, or new ones), one of them
    walking from the head every ``HEAD_WALK_EVERY`` seconds in the head watcher's stead."""
    from django_pgqueue.core._claim_bound import ClaimBounds

    bounds = bounds if bounds is not None else ClaimBounds()
    if synchronous_acks:
        from django.test.utils import override_settings

        with override_settings(PGQUEUE={**_pgqueue_settings(), "SYNCHRONOUS_ACKS": True}):
            return _lease_complete_drain(batch, limit, queue, bounds)
    return _lease_complete_drain(batch, limit, queue, bounds)


def _lease_complete_drain(batch: int, limit: int | None, queue: str, bounds: ClaimBounds) -> int:
    from django_pgqueue.core._claim import lease
    from django_pgqueue.core.transitions import complete

    worker_id = f"bench-{uuid.uuid4().hex[:8]}"
    done = 0
    while limit is None or done < limit:
        want = batch if limit is None else min(batch, limit - done)
        leased = lease(queue, worker_id=worker_id, batch_size=want, bounds=bounds)
        if not leased:
            return done
        for message in leased:
            noop(message.payload)
        complete(leased)
        done += len(leased)
    return done


@contextlib.contextmanager
def standard_json() -> Iterator[bool]:
    """The standard library's JSON in place of orjson (``core/_json.py``), when this version
    has the codec and orjson is installed; yields whether it could."""
    try:
        from django_pgqueue.core import _json
    except ImportError:
        yield False
        return
    fast = _json.orjson
    _json.orjson = None
    try:
        yield fast is not None
    finally:
        _json.orjson = fast


def close_connections() -> None:
    from django.db import connections

    connections.close_all()
