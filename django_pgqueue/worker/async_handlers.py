"""The executor's async half: one asyncio event loop, in a thread of its own
(``async-handlers``), runs at most ``concurrency`` async handlers at once.

Jobs go through the executor's gate and outcomes (``Executor.start_job``,
``handler_returned``, ``handler_raised``) like sync ones; only what must not block the loop
(waiting at the gate, recording a start alone, a lease extension) runs on helper threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from django.db import connections

from .. import tracing
from .failures import HandlerTimeout

if TYPE_CHECKING:
    from .executor import Executor, Job


class AsyncHandlers:
    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._helper: ThreadPoolExecutor | None = None

    def submit(self, job: Job) -> None:
        if self._loop is None:
            self._start_loop()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_task_supervised, job)

    def stop(self, deadline: float) -> None:
        """Stop the loop, waiting for its thread until ``deadline`` (monotonic)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self.thread is not None:
                self.thread.join(max(0.0, deadline - time.monotonic()))
        if self._helper is not None:
            # Its thread's connection would outlive the worker in a host process.
            self._helper.submit(connections.close_all)
            self._helper.shutdown(wait=False)

    def _start_task_supervised(self, job: Job) -> None:
        # The event loop would only log an error of its callback, and the job would be lost.
        try:
            self._start_task(job)
        except BaseException as exc:
            self.executor.on_crash("async-handlers", exc)

    def _start_task(self, job: Job) -> None:
        # The loop keeps only weak references to tasks: hold them until they finish.
        assert self._loop is not None
        loop = self._loop
        task = loop.create_task(self._run(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if job.alone:
            # Waiting for its outcome to be written happens off the loop.
            end_alone = self.executor.end_alone
            task.add_done_callback(lambda _: loop.run_in_executor(None, end_alone, job))

    def _start_loop(self) -> None:
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._slots = asyncio.Semaphore(self.executor.concurrency)
            ready.set()
            try:
                loop.run_forever()
            except BaseException as exc:
                self.executor.on_crash("async-handlers", exc)
            finally:
                loop.close()

        self.thread = threading.Thread(target=main, name="async-handlers", daemon=True)
        self.thread.start()
        ready.wait()

    async def _run(self, job: Job) -> None:
        try:
            await self._run_job(job)
        except BaseException as exc:
            self.executor.on_crash("async-handlers", exc)

    async def _run_job(self, job: Job) -> None:
        ex = self.executor
        assert self._slots is not None
        async with self._slots:
            # Waiting at the gate, and recording a start alone (a query), happen off the loop.
            started = None if job.alone else ex.start_job(job, block=False)
            if started is None:
                started = await asyncio.to_thread(ex.start_job, job)
            if not started:
                return
            handler = job.handler
            try:
                with tracing.processing(job.message):
                    async with asyncio.timeout(job.timeout) as scope:
                        if handler.takes_context:
                            context = ex.context_for(job, self._extend(job))
                            result = await handler.func(context, job.payload())
                        else:
                            result = await handler.func(job.payload())
            except BaseException as exc:
                if isinstance(exc, TimeoutError) and scope.expired():
                    exc = HandlerTimeout(f"handler exceeded its timeout of {job.timeout}s")
                ex.handler_raised(job, exc)
                return
            ex.handler_returned(job, result)

    def _extend(self, job: Job) -> Callable[[float], bool]:
        # Django refuses database calls on a thread running an event loop: run the extension
        # on a helper thread and wait for it (a short, rare call).
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="lease-extender")
        helper = self._helper
        extend_now = self.executor.extend_now

        def extend(seconds: float) -> bool:
            return helper.submit(extend_now, job, seconds).result()

        return extend
