"""Moves of leased messages: complete, fail (retry or bury), extend, release.

All take batches of leases, ``(id, lease_token)`` pairs or leased ``Message`` objects, and
run one statement. A lease whose token no longer matches (it expired and another worker took
the message, or an operator moved it) changes nothing and is reported in ``stale``.
"""

from __future__ import annotations

import json
import random
import traceback as traceback_module
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db import connections

from ..conf import get_settings
from ..models import DeadReason
from . import _send, _sql
from ._execution import ACK_PLAN, ack_settings, beyond_session, execute

__all__ = [
    "FailedAttempt",
    "Outcome",
    "backoff_delay",
    "complete",
    "error_entry",
    "extend",
    "fail",
    "release",
    "snooze",
    "start_alone",
]


class LeaseLike(Protocol):
    id: int
    lease_token: uuid.UUID | None


LeaseRef = LeaseLike | tuple[int, uuid.UUID]


@dataclass
class Outcome:
    """What a batch transition did: ``done`` ids moved or changed, ``stale`` ids fenced off."""

    done: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    buried: list[int] = field(default_factory=list)
    # extend(): the leases among ``done`` whose message cancel() flagged meanwhile.
    cancel_requested: list[int] = field(default_factory=list)
    # fail(): the reason each of ``buried`` was buried with (cancel() overrides the caller's).
    dead_reasons: dict[int, str] = field(default_factory=dict)
    # snooze(): the leases not snoozed, still held, and why: ``"limit"`` (snoozed
    # ``max_snoozes`` times already) or ``"cancelled"`` (cancel() flagged the message).
    not_snoozed: dict[int, str] = field(default_factory=dict)


def _pairs(leases: Iterable[LeaseRef]) -> tuple[list[int], list[uuid.UUID | None]]:
    """The leases' ids and tokens."""
    ids: list[int] = []
    tokens: list[uuid.UUID | None] = []
    for lease in leases:
        if isinstance(lease, tuple):
            ids.append(lease[0])
            tokens.append(lease[1])
        else:
            ids.append(lease.id)
            tokens.append(lease.lease_token)
    return ids, tokens


def _alias(using: str | None) -> str:
    return using or get_settings().DATABASE_ALIAS


def _array(values: Sequence[int | uuid.UUID | None]) -> str:
    """Ids or lease tokens as one array literal: quoting them one by one costs the client
    more than the statement costs the server."""
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


def _run(
    connection: Any, statement: str, params: list[Any], local_settings: dict[str, str]
) -> list[Any]:
    """Run a batch transition: in a transaction of its own, prepared, with a nested-loop
    generic plan (``_send.py``, ``_execution.ACK_PLAN``: sent with it unless the session runs
    under it already); else through Django's cursor."""
    if _send.direct(connection):
        plan = beyond_session(connection, {**ACK_PLAN, **local_settings})
        rows = _send.run(connection, statement, params, plan=plan)
        if rows is not None:
            return rows
    with connection.cursor() as cursor:
        execute(cursor, statement, params, local_settings)
        return list(cursor.fetchall())


def _stale(ids: Sequence[int], done: Iterable[int]) -> list[int]:
    finished = set(done)
    return [i for i in ids if i not in finished]


def complete(
    leases: Iterable[LeaseRef],
    results: Sequence[Any] | None = None,
    *,
    using: str | None = None,
) -> Outcome:
    """Archive finished messages with their JSON results (``None`` when not given)."""
    ids, tokens = _pairs(leases)
    if not ids:
        return Outcome()
    encoded: list[str | None] | None = None
    if results is not None:
        if len(results) != len(ids):
            raise ValueError("complete(): one result per lease")
        encoded = [None if r is None else json.dumps(r, allow_nan=False) for r in results]
    return complete_encoded(ids, tokens, encoded, using=using)


def complete_encoded(
    ids: list[int],
    tokens: list[uuid.UUID | None],
    results_json: Sequence[str | None] | None,
    *,
    using: str | None = None,
) -> Outcome:
    """:func:`complete` for results already encoded as JSON text (the worker's completer)."""
    if not ids:
        return Outcome()
    if results_json is not None and all(r is None for r in results_json):
        results_json = None  # NULL: unnest() pads the results with NULLs
    connection = connections[_alias(using)]
    params = [_array(ids), _array(tokens), results_json]
    rows = _run(connection, _sql.COMPLETE, params, ack_settings(connection))
    done = [row[0] for row in rows]
    return Outcome(done=done, stale=_stale(ids, done))


def backoff_delay(
    attempt: int,
    *,
    base: float | None = None,
    maximum: float | None = None,
    jitter: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retrying after failed attempt number ``attempt`` (1-based).

    ``base * 2 ** (attempt - 1)``, capped at ``maximum``, then spread by +/- ``jitter`` (a
    fraction) so that a burst of failures does not retry in lockstep.
    """
    conf = get_settings()
    base = conf.BACKOFF_BASE if base is None else base
    maximum = conf.BACKOFF_MAX if maximum is None else maximum
    jitter = conf.BACKOFF_JITTER if jitter is None else jitter
    delay = min(maximum, base * 2 ** max(attempt - 1, 0))
    if jitter:
        delay *= 1 + (rng or random).uniform(-jitter, jitter)
    return max(0.0, delay)


def error_entry(
    exc: BaseException | None = None,
    *,
    attempt: int,
    worker_id: str | None = None,
    type_name: str | None = None,
    message: str | None = None,
    traceback: str | None = None,
) -> dict[str, Any]:
    """One attempt's failure as stored in ``errors`` / ``details``."""
    if exc is not None:
        type_name = type_name or f"{type(exc).__module__}.{type(exc).__qualname__}"
        message = message if message is not None else str(exc)
        if traceback is None:
            traceback = "".join(traceback_module.format_exception(exc))
    return {
        "attempt": attempt,
        "worker": worker_id,
        "type": type_name or "Error",
        "message": message or "",
        "traceback": traceback or "",
    }


@dataclass
class FailedAttempt:
    """A failed lease: the error entry, and how to treat it.

    ``retry_in`` seconds before the next attempt, or ``None`` to bury it now whatever the
    attempts left (a rejected message); ``final_reason`` is the dead reason used when it is
    buried (its attempts are used up, or ``retry_in`` is ``None``).
    """

    lease: LeaseRef
    error: dict[str, Any]
    retry_in: float | None
    final_reason: str = DeadReason.ERROR


def fail(attempts: Sequence[FailedAttempt], *, using: str | None = None) -> Outcome:
    """Retry failed messages after their delay, or move them to dead with their reason."""
    if not attempts:
        return Outcome()
    ids, tokens = _pairs(a.lease for a in attempts)
    for a in attempts:
        if a.final_reason not in DeadReason.values:
            raise ValueError(f"Unknown dead reason {a.final_reason!r}")
    errors = [json.dumps(a.error, default=str) for a in attempts]
    reasons = [str(a.final_reason) for a in attempts]
    delays = [None if a.retry_in is None else float(a.retry_in) for a in attempts]
    connection = connections[_alias(using)]
    params = [_array(ids), _array(tokens), errors, reasons, delays]
    rows = _run(connection, _sql.FAIL, params, ack_settings(connection))
    retried = [r[0] for r in rows if r[1] == "retried"]
    dead_reasons = {r[0]: r[2] for r in rows if r[1] == "buried"}
    buried = list(dead_reasons)
    return Outcome(
        done=retried + buried,
        stale=_stale(ids, retried + buried),
        retried=retried,
        buried=buried,
        dead_reasons=dead_reasons,
    )


def snooze(
    leases: Sequence[LeaseRef],
    seconds: Sequence[float],
    *,
    max_snoozes: Sequence[int] | int,
    using: str | None = None,
) -> Outcome:
    """Make leased messages wait ``seconds`` (one per lease) and run again without spending
    an attempt: each gives back the attempt its claim counted and counts a snooze.

    ``done``: snoozed. ``not_snoozed``: still leased, with why (``"limit"``: it had already
    snoozed ``max_snoozes`` times; ``"cancelled"``): the caller decides what becomes of them
    (the worker buries them with :func:`fail`). ``stale``: the lease was lost.
    """
    ids, tokens = _pairs(leases)
    if len(seconds) != len(ids):
        raise ValueError("snooze(): one delay per lease")
    if not ids:
        return Outcome()
    limits = [max_snoozes] * len(ids) if isinstance(max_snoozes, int) else list(max_snoozes)
    if len(limits) != len(ids):
        raise ValueError("snooze(): one max_snoozes per lease")
    if any(s < 0 for s in seconds) or any(n < 0 for n in limits):
        raise ValueError("snooze(): delays and max_snoozes must be >= 0")
    connection = connections[_alias(using)]
    params = [_array(ids), _array(tokens), [float(s) for s in seconds], limits]
    rows = _run(connection, _sql.SNOOZE, params, ack_settings(connection))
    done = [row[0] for row in rows if row[1] is None]
    refused = {row[0]: row[1] for row in rows if row[1] is not None}
    return Outcome(done=done, stale=_stale(ids, [*done, *refused]), not_snoozed=refused)


def extend(
    leases: Iterable[LeaseRef], visibility_timeout: float, *, using: str | None = None
) -> Outcome:
    """Set the leases to expire ``visibility_timeout`` seconds from database now (``set_vt``)."""
    if visibility_timeout <= 0:
        raise ValueError("visibility_timeout must be > 0 seconds")
    ids, tokens = _pairs(leases)
    if not ids:
        return Outcome()
    connection = connections[_alias(using)]
    params = [float(visibility_timeout), _array(ids), _array(tokens)]
    rows = _run(connection, _sql.EXTEND, params, ack_settings(connection))
    done = [row[0] for row in rows]
    flagged = [row[0] for row in rows if row[1]]
    return Outcome(done=done, stale=_stale(ids, done), cancel_requested=flagged)


def release(
    leases: Iterable[LeaseRef], *, reset_attempt: bool = True, using: str | None = None
) -> Outcome:
    """Give leases back: the messages are available again at once.

    ``reset_attempt=True`` (default) takes back the attempt counted when it was leased: the
    message did not fail, its worker stopped (graceful shutdown past the grace period).
    """
    ids, tokens = _pairs(leases)
    if not ids:
        return Outcome()
    params = [reset_attempt, _array(ids), _array(tokens)]
    rows = _run(connections[_alias(using)], _sql.RELEASE, params, {})
    done = [row[0] for row in rows]
    return Outcome(done=done, stale=_stale(ids, done))


def start_alone(lease: LeaseRef, *, using: str | None = None) -> bool:
    """Record that ``lease``'s handler starts now, with no other handler running beside it in
    its worker: committed when this returns, so if the worker dies from now on, the lease
    spends its attempt when it expires (see "The attempt rule" in ``_sql.py``). False when the
    lease is no longer held (it expired and another worker took it)."""
    ids, tokens = _pairs([lease])
    connection = connections[_alias(using)]
    with connection.cursor() as cursor:
        # Its own transaction, asynchronous commit allowed: it survives a crash of the worker
        # process (what it is for); a crash of the database may forget it, which gives one
        # attempt back.
        execute(cursor, _sql.START_ALONE, [ids[0], tokens[0]], ack_settings(connection))
        return cursor.fetchone() is not None
