"""factory-boy factories for every model; rows go in through the ORM, no worker needed."""

from __future__ import annotations

import datetime as dt
import uuid

import factory
from django.utils import timezone

from django_pgqueue.models import (
    ArchivedMessage,
    Batch,
    DeadMessage,
    DeadReason,
    Message,
    MessageProgress,
    QueueState,
    WorkerHeartbeat,
)


class _MessageRowFactory(factory.django.DjangoModelFactory):
    """What a live, archived and dead row of a message share."""

    class Meta:
        abstract = True

    queue = "default"
    task = "tests.noop"
    payload = factory.Sequence(lambda n: {"n": n})
    max_attempts = 3
    errors = factory.LazyFunction(list)


class MessageFactory(_MessageRowFactory):
    class Meta:
        model = Message

    priority = 0
    attempts = 0

    class Params:
        # A message leased by a worker whose lease is still running.
        leased = factory.Trait(
            attempts=1,
            lease_token=factory.LazyFunction(uuid.uuid4),
            leased_by="worker-1",
            leased_at=factory.LazyFunction(timezone.now),
            available_at=factory.LazyFunction(lambda: timezone.now() + dt.timedelta(minutes=5)),
        )
        # A lease that ran out: the worker crashed.
        expired = factory.Trait(
            attempts=1,
            lease_token=factory.LazyFunction(uuid.uuid4),
            leased_by="worker-dead",
            leased_at=factory.LazyFunction(lambda: timezone.now() - dt.timedelta(minutes=10)),
            available_at=factory.LazyFunction(lambda: timezone.now() - dt.timedelta(minutes=5)),
        )


class ArchivedMessageFactory(_MessageRowFactory):
    class Meta:
        model = ArchivedMessage

    message_id = factory.Sequence(lambda n: 1_000_000 + n)
    attempts = 1
    started_at = factory.LazyFunction(lambda: timezone.now() - dt.timedelta(seconds=2))
    worker_id = "worker-1"
    result = None


class DeadMessageFactory(_MessageRowFactory):
    class Meta:
        model = DeadMessage

    message_id = factory.Sequence(lambda n: 2_000_000 + n)
    attempts = 3
    reason = DeadReason.ERROR
    details = factory.LazyFunction(
        lambda: {"type": "ValueError", "message": "boom", "traceback": "Traceback ..."}
    )
    worker_id = "worker-1"


class QueueStateFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = QueueState
        django_get_or_create = ("name",)

    name = "default"
    paused = False


class WorkerHeartbeatFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WorkerHeartbeat

    worker_id = factory.Sequence(lambda n: f"host:{1000 + n}")
    hostname = "host"
    pid = factory.Sequence(lambda n: 1000 + n)
    queues = factory.LazyFunction(lambda: ["default"])
    concurrency = 4


class BatchFactory(factory.django.DjangoModelFactory):
    """A batch row alone, no members: for what reads only the row (its counts)."""

    class Meta:
        model = Batch

    label = factory.Sequence(lambda n: f"batch {n}")
    total = 10
    succeeded = 0
    failed = 0


class MessageProgressFactory(factory.django.DjangoModelFactory):
    """A handler's progress report, as the worker's completer writes it."""

    class Meta:
        model = MessageProgress

    message_id = factory.Sequence(lambda n: 2_000_000 + n)
    done = 3
    total = 10
    note = "copying rows"
