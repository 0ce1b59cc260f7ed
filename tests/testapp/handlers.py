"""Handlers the worker tests (and bench/) run; the worker imports this module at start."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from django.db import connection

import django_pgqueue
from django_pgqueue.worker.context import MessageContext


@django_pgqueue.handler("bench.noop")
def noop(payload: Any) -> None:
    """Does nothing: what bench/ drains to measure the worker's own overhead."""


@django_pgqueue.handler("tests.echo")
def echo(payload: Any) -> Any:
    return payload


@django_pgqueue.handler("tests.async-echo-any")
async def async_echo_any(payload: Any) -> Any:
    return payload


@django_pgqueue.handler("tests.effect")
def effect(context: MessageContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Records one row per message id: a UNIQUE violation proves a double run."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (message_id, worker_pid, attempt) VALUES (%s, %s, %s)",
            [context.message_id, os.getpid(), context.attempt],
        )
    return {"pid": os.getpid()}


@django_pgqueue.handler("tests.sleep")
def sleep(context: MessageContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps ``payload['seconds']`` (only on attempts listed in ``only_attempts``; only on
    its first run with ``first_run_only``, which needs a ``started_file``), or less once the
    file ``payload['release_file']`` exists; first creates the file ``payload['started_file']``,
    if given, so a test knows it started."""
    first_run = True
    if payload.get("started_file"):
        started = Path(payload["started_file"])
        first_run = not started.exists()
        started.touch()
    only = payload.get("only_attempts")
    if (only is None or context.attempt in only) and (
        first_run or not payload.get("first_run_only")
    ):
        deadline = time.monotonic() + payload.get("seconds", 0)
        release = Path(payload["release_file"]) if payload.get("release_file") else None
        while (left := deadline - time.monotonic()) > 0 and not (release and release.exists()):
            time.sleep(min(left, 0.05) if release else left)
    if payload.get("effect"):
        effect(context, payload)
    return {"attempt": context.attempt, "pid": os.getpid()}


@django_pgqueue.handler("tests.chain-step")
def chain_step(context: MessageContext, payload: Any) -> int:
    """The previous step's result + 1 (1 for a first step): a chain counts its own steps."""
    try:
        previous = django_pgqueue.previous_result(context)
    except LookupError:
        previous = 0
    return int(previous) + 1


@django_pgqueue.handler("tests.fail")
def always_fail(payload: Any) -> None:
    raise ValueError(f"always fails: {payload!r}")


@django_pgqueue.handler("tests.not-json")
def not_json(payload: Any) -> object:
    return object()


@django_pgqueue.handler("tests.async-echo")
async def async_echo(context: MessageContext, payload: Any) -> Any:
    await asyncio.sleep(payload.get("seconds", 0) if isinstance(payload, dict) else 0)
    return {"payload": payload, "attempt": context.attempt}


@django_pgqueue.handler("tests.timeout", timeout=0.3)
def too_slow(payload: Any) -> None:
    time.sleep(payload.get("seconds", 2))


@django_pgqueue.handler("tests.async-timeout", timeout=0.3)
async def async_too_slow(payload: Any) -> None:
    await asyncio.sleep(payload.get("seconds", 2))


@django_pgqueue.handler("tests.extend")
def extends_lease(context: MessageContext, payload: Any) -> bool:
    return context.extend_lease(120)


@django_pgqueue.handler("tests.async-extend")
async def async_extends_lease(context: MessageContext, payload: Any) -> bool:
    return context.extend_lease(120)


@django_pgqueue.handler("tests.crash")
def crash(payload: Any) -> None:
    """Kills its own worker process at once, as a segfault or the OOM killer would."""
    os._exit(1)


# (message id, start, end) of each run of tests.timed / tests.async-timed, in-process workers.
TIMELINE: list[tuple[int, float, float]] = []


@django_pgqueue.handler("tests.timed")
def timed(context: MessageContext, payload: dict[str, Any]) -> None:
    start = time.monotonic()
    time.sleep(payload.get("seconds", 0.1))
    TIMELINE.append((context.message_id, start, time.monotonic()))


@django_pgqueue.handler("tests.async-timed")
async def async_timed(context: MessageContext, payload: dict[str, Any]) -> None:
    start = time.monotonic()
    await asyncio.sleep(payload.get("seconds", 0.1))
    TIMELINE.append((context.message_id, start, time.monotonic()))


_soak_log: int | None = None


@django_pgqueue.handler("tests.soak")
def soak(context: MessageContext, payload: dict[str, Any]) -> None:
    """The soak test's handler (tests/acceptance/test_soak.py): writes ``id pid attempt`` to
    this process's run log in ``PGQUEUE_SOAK_RUNS`` before anything else (a write the
    kernel keeps through a SIGKILL); a ``poison`` message then raises, a ``crash`` one kills
    the process."""
    global _soak_log
    if _soak_log is None:
        path = Path(os.environ["PGQUEUE_SOAK_RUNS"]) / f"runs-{os.getpid()}.log"
        _soak_log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_soak_log, f"{context.message_id} {os.getpid()} {context.attempt}\n".encode())
    if payload.get("poison"):
        raise ValueError("poison message")
    if payload.get("crash"):
        os._exit(1)


@django_pgqueue.handler("tests.cancellable")
def cancellable(context: MessageContext, payload: dict[str, Any]) -> str:
    """Works in small steps until cancel() is seen (then raises), ``seconds`` pass, or the
    ``release_file`` the test writes exists."""
    if payload.get("started_file"):
        Path(payload["started_file"]).touch()
    deadline = time.monotonic() + payload.get("seconds", 10)
    release = Path(payload["release_file"]) if payload.get("release_file") else None
    while time.monotonic() < deadline and not (release and release.exists()):
        if context.cancel_requested:
            raise RuntimeError("stopped: cancel requested")
        time.sleep(0.05)
    return "finished"


# -- job control (tests/worker/test_job_control.py) ---------------------------------------------

#: Runs of each message by id, for the snooze tests.
snooze_runs: dict[int, int] = {}
#: Set by a test to let the progress handlers finish.
progress_release = threading.Event()


@django_pgqueue.handler("tests.snooze")
def snooze_n_times(context: MessageContext, payload: dict[str, Any]) -> int:
    """Snoozes ``payload["times"]`` times for ``payload["seconds"]``, then returns its runs."""
    runs = snooze_runs[context.message_id] = snooze_runs.get(context.message_id, 0) + 1
    if runs <= payload["times"]:
        raise django_pgqueue.Snooze(payload.get("seconds", 0))
    return runs


@django_pgqueue.handler("tests.async-snooze")
async def async_snooze_n_times(context: MessageContext, payload: dict[str, Any]) -> int:
    runs = snooze_runs[context.message_id] = snooze_runs.get(context.message_id, 0) + 1
    if runs <= payload["times"]:
        raise django_pgqueue.Snooze(payload.get("seconds", 0))
    return runs


@django_pgqueue.handler("tests.snooze-twice-at-most", max_snoozes=2)
def snooze_forever(payload: Any) -> None:
    raise django_pgqueue.Snooze(0)


@django_pgqueue.handler("tests.progress")
def report_then_wait(context: MessageContext, payload: dict[str, Any]) -> str:
    """Reports 3 of 10 done, then waits until the test lets it finish."""
    context.report_progress(1, 10, note="warming up")
    context.report_progress(3, 10, note="copying rows")
    if not progress_release.wait(30):
        raise TimeoutError("the test never released the handler")
    return "done"


@django_pgqueue.handler("tests.async-progress")
async def async_report_then_wait(context: MessageContext, payload: dict[str, Any]) -> str:
    context.report_progress(7, None, note="async")
    deadline = time.monotonic() + 30
    while not progress_release.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the handler")
        await asyncio.sleep(0.01)
    return "done"


@django_pgqueue.handler("tests.headers")
def headers(context: MessageContext, payload: Any) -> dict[str, str]:
    """Returns the headers it was given (``context.headers``)."""
    return dict(context.headers)


@django_pgqueue.handler("tests.async-headers")
async def async_headers(context: MessageContext, payload: Any) -> dict[str, str]:
    return dict(context.headers)
