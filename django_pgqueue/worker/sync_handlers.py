"""The executor's sync half: a pool of ``handler-N`` threads, each running one sync handler
at a time and using its own Django connection.

A thread whose handler ran past its timeout keeps running until the handler returns (a
Python thread cannot be killed); the executor has given its slot to a fresh thread by then
(:meth:`SyncHandlers.spawn`), and the stuck one exits once it is free.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from .. import tracing
from ..core._log_fields import message_fields

if TYPE_CHECKING:
    from .executor import Executor, Job

logger = logging.getLogger("django_pgqueue.worker")


class SyncHandlers:
    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._work: queue_module.SimpleQueue[Job | None] = queue_module.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self._seq = 0

    def start(self, count: int) -> None:
        for _ in range(count):
            self.spawn()

    def spawn(self) -> None:
        """One more handler thread."""
        self._seq += 1
        thread = threading.Thread(target=self._main, name=f"handler-{self._seq}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def submit(self, job: Job) -> None:
        self._work.put(job)

    def stop(self, deadline: float) -> None:
        """Let idle threads exit and close their connections (busy ones are daemons)."""
        for _ in self.threads:
            self._work.put(None)
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _main(self) -> None:
        me = threading.current_thread()
        try:
            self._serve()
        except BaseException as exc:
            self.executor.on_crash(me.name, exc)
        finally:
            connections.close_all()
            if me in self.threads:
                self.threads.remove(me)

    def _serve(self) -> None:
        ex = self.executor
        while True:
            job = self._work.get()
            if job is None:
                return
            if not ex.start_job(job):
                continue
            try:
                self._run(job)
            except Exception:
                # A bug here must not kill the thread and strand the job: fail it.
                logger.exception(
                    "Internal error while handling message %s",
                    job.message.id,
                    extra=message_fields(job.message),
                )
                ex.handler_raised(job, RuntimeError("internal worker error"))
            if job.alone:
                ex.end_alone(job)
            if job.abandoned:
                # Timed out: a replacement thread owns this slot now.
                with ex.lock:
                    ex.stuck -= 1
                return

    def _run(self, job: Job) -> None:
        ex = self.executor
        handler = job.handler
        try:
            with tracing.processing(job.message):
                if handler.takes_context:
                    ctx = ex.context_for(job, lambda s: ex.extend_now(job, s))
                    result = handler.func(ctx, job.payload())
                else:
                    result = handler.func(job.payload())
        except BaseException as exc:
            # A handler's failed query may leave this thread's connection unusable.
            connections[ex.alias].close_if_unusable_or_obsolete()
            ex.handler_raised(job, exc)
            return
        ex.handler_returned(job, result)
