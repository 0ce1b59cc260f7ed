"""Flow control in the claim: tenant fairness, concurrency limits and rate limits.

Opt-in per queue through ``PGQUEUE["QUEUES"][<queue>]`` (see
``docs/how-to/fairness-and-limits.md``). A queue with none of the keys below set is claimed
by the plain single-statement claim in ``manager.py``, untouched.

How a flow-controlled claim stays race-free with any number of workers: it locks the queue's
``pgqueue_flow_state`` row first, in a statement of its own, so claims of that queue run one
after the other and each sees what the previous one committed (READ COMMITTED takes a new
snapshot per statement). Lock and claim reach the server as one query string, run as one
implicit transaction, so the lock is never held across a round trip to a worker.
Everything is decided in the database, with database time:

- in-flight counts come from ``pgqueue_flow_slot`` rows checked against the live message
  (same id and lease token, lease not expired), so a finished, failed, released or expired
  lease frees its slot by itself and a crashed worker never leaks one;
- rate limits are token buckets refilled from ``clock_timestamp()``;
- fairness is a weighted round robin over tenants: a walk of the tenant index, one probe per
  tenant, never a scan of the backlog.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from django.db import ProgrammingError, connections, transaction

from ..conf import get_settings
from . import sql

if TYPE_CHECKING:
    from ..models import Message
    from .manager import MessageManager

logger = logging.getLogger("django_pgqueue")

#: Per-queue settings keys that switch a queue to the flow-controlled claim.
FLOW_KEYS = frozenset(
    {
        "FAIRNESS",
        "TENANT_WEIGHTS",
        "CONCURRENCY_LIMIT",
        "KEY_CONCURRENCY_LIMIT",
        "KEY_CONCURRENCY_LIMITS",
        "RATE_LIMIT",
        "KEY_RATE_LIMIT",
    }
)

#: Tenants one claim walks beyond the batch size (tenants at their limit or with nothing ready
#: cost a probe each); the cursor moves on, so the next claim continues where this one stopped.
WALK_SLACK = 32
WALK_MAX = 1000

#: Exhausted leases one claim buries at most (as the plain claim).
REAP_LIMIT = 100

#: Messages without a tenant in a keyed queue are found among this many oldest ready messages.
UNTENANTED_WINDOW = 32


@dataclass(frozen=True)
class FlowConfig:
    """The flow-control settings of one queue."""

    fairness: bool = False
    tenant_weights: Mapping[str, int] = field(default_factory=dict)
    concurrency_limit: int | None = None
    key_concurrency_limit: int | None = None
    key_concurrency_limits: Mapping[str, int] = field(default_factory=dict)
    rate_limit: float | None = None
    key_rate_limit: float | None = None

    @property
    def keyed(self) -> bool:
        """Claims walk the tenants (round robin) instead of taking the global claim order."""
        return bool(
            self.fairness
            or self.tenant_weights
            or self.key_concurrency_limit
            or self.key_concurrency_limits
            or self.key_rate_limit
        )

    @property
    def tracks_slots(self) -> bool:
        return bool(
            self.concurrency_limit or self.key_concurrency_limit or self.key_concurrency_limits
        )

    @property
    def rate_burst(self) -> float | None:
        """Bucket size: one second's worth of messages, at least one."""
        return None if self.rate_limit is None else max(1.0, float(self.rate_limit))

    @property
    def key_rate_burst(self) -> float | None:
        return None if self.key_rate_limit is None else max(1.0, float(self.key_rate_limit))


def flow_config(queue: str) -> FlowConfig | None:
    """The queue's flow-control settings, or ``None`` when it uses none (the plain claim)."""
    overrides = get_settings().QUEUES.get(queue)
    if not overrides or not FLOW_KEYS.intersection(overrides):
        return None
    config = FlowConfig(
        fairness=bool(overrides.get("FAIRNESS", False)),
        tenant_weights=dict(overrides.get("TENANT_WEIGHTS") or {}),
        concurrency_limit=overrides.get("CONCURRENCY_LIMIT"),
        key_concurrency_limit=overrides.get("KEY_CONCURRENCY_LIMIT"),
        key_concurrency_limits=dict(overrides.get("KEY_CONCURRENCY_LIMITS") or {}),
        rate_limit=overrides.get("RATE_LIMIT"),
        key_rate_limit=overrides.get("KEY_RATE_LIMIT"),
    )
    if not (config.keyed or config.tracks_slots or config.rate_limit):
        return None  # e.g. FAIRNESS=False and limits set to None
    return config


_LEASE_ANCHOR = "WITH exhausted AS ("
_RESULT_ANCHOR = "\nSELECT 'claimed' AS outcome"


@functools.cache
def claim_statement(keyed: bool) -> str:
    """The core's LEASE statement (reaper and all) wrapped in the flow-control CTEs.

    Built once per shape from ``sql.LEASE`` itself, so the claim proper (attempts, fencing
    token, burying exhausted leases, the row shape) stays the same as the plain claim's.
    """
    lease = sql.LEASE.format(
        candidates=sql.FLOW_CANDIDATES,
        reap_limit=REAP_LIMIT,
        shared=sql.SHARED_COLUMNS,
        leased_columns=", ".join(f"m.{c}" for c in sql.LEASED_COLUMNS),
    ).strip()
    # LEASE's positional parameters are, in order: queue (reaper), worker id, visibility.
    names = iter(("%(queue)s", "%(worker_id)s", "%(visibility_timeout)s"))
    lease, count = re.subn(r"(?<!%)%s", lambda _: next(names), lease)
    if count != 3 or not lease.startswith(_LEASE_ANCHOR) or lease.count(_RESULT_ANCHOR) != 1:
        raise RuntimeError("sql.LEASE changed shape; update core/flow_control.claim_statement")
    ctes = sql.FLOW_COMMON_CTES + ", " + (sql.FLOW_KEYED_CTES if keyed else sql.FLOW_QUEUE_CTES)
    lease = "WITH RECURSIVE " + ctes + ",\n" + lease.removeprefix("WITH ")
    return lease.replace(_RESULT_ANCHOR, "," + sql.FLOW_SAVE_CTES + _RESULT_ANCHOR)


def claim_params(
    config: FlowConfig, queue: str, worker_id: str, limit: int, vt: float
) -> dict[str, Any]:
    """The named parameters of :func:`claim_statement`."""
    return {
        "queue": queue,
        "n": limit,
        "queue_limit": config.concurrency_limit,
        "rate": config.rate_limit,
        "burst": config.rate_burst,
        "weights": json.dumps(dict(config.tenant_weights)),
        "key_limits": json.dumps(dict(config.key_concurrency_limits)),
        "key_limit": config.key_concurrency_limit,
        "key_rate": config.key_rate_limit,
        "key_burst": config.key_rate_burst,
        "max_tenants": min(limit + WALK_SLACK, WALK_MAX),
        "untenanted_window": UNTENANTED_WINDOW,
        "track_slots": config.tracks_slots,
        "worker_id": worker_id,
        "visibility_timeout": vt,
    }


# The claim's parameters as a prepared statement's, in order, with their types.
_PARAM_TYPES = (
    ("queue", "text"),
    ("n", "int"),
    ("queue_limit", "int"),
    ("rate", "float8"),
    ("burst", "float8"),
    ("weights", "jsonb"),
    ("key_limits", "jsonb"),
    ("key_limit", "int"),
    ("key_rate", "float8"),
    ("key_burst", "float8"),
    ("max_tenants", "int"),
    ("untenanted_window", "int"),
    ("track_slots", "bool"),
    ("worker_id", "text"),
    ("visibility_timeout", "float8"),
)


@functools.cache
def prepared_claim(keyed: bool) -> tuple[str, str]:
    """``(name, PREPARE statement)`` of :func:`claim_statement` with ``$n`` parameters."""
    index = {name: n for n, (name, _) in enumerate(_PARAM_TYPES, 1)}
    body = re.sub(r"%\((\w+)\)s", lambda m: f"${index[m.group(1)]}", claim_statement(keyed))
    body = body.replace("%%", "%")
    digest = hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:12]
    name = f"pgq_flow_{'keyed' if keyed else 'queue'}_{digest}"
    types = ", ".join(sql_type for _, sql_type in _PARAM_TYPES)
    return name, f"PREPARE {name} ({types}) AS {body}"


# Prepared statement names per database connection (a new connection prepares again), and
# the connections that cannot keep prepared statements.
_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_unpreparable: weakref.WeakSet[Any] = weakref.WeakSet()


def lease_queues_with_flow_control(
    manager: MessageManager,
    queues: list[str],
    worker_id: str,
    batch_size: int,
    vt: float,
    alias: str,
) -> list[Message]:
    """``lease(hold=False)`` over queues of which some are flow-controlled.

    Each queue is claimed in a transaction of its own: a flow-controlled one in a single
    implicit transaction (see :func:`lease_with_flow_control`), a plain one as usual.
    """
    leased: list[Message] = []
    for queue in queues:
        wanted = batch_size - len(leased)
        if wanted <= 0:
            break
        config = flow_config(queue)
        if config is None:
            with transaction.atomic(using=alias):
                leased.extend(manager._lease_one_queue(queue, worker_id, wanted, vt, alias, False))
        else:
            leased.extend(
                lease_with_flow_control(manager, config, queue, worker_id, wanted, vt, alias)
            )
    return leased


def lease_with_flow_control(
    manager: MessageManager,
    config: FlowConfig,
    queue: str,
    worker_id: str,
    limit: int,
    vt: float,
    alias: str,
    hold: bool = False,
) -> list[Message]:
    """Lease up to ``limit`` messages of ``queue`` within its fairness and limits.

    Outside a transaction (``lease()``'s default), the lock and the claim go to the server as
    one query string, which runs as one implicit transaction: the queue's lock is held only
    while the server runs the claim, never across a round trip to this process. The claim is
    a session-level prepared statement (planning it costs more than running it), whatever
    the connection's ``prepare_threshold``. Inside a transaction
    (``hold=True``) the lock is held until that transaction ends; ``hold`` itself is implied
    by the connection's transaction state.
    """
    params = claim_params(config, queue, worker_id, limit, vt)
    connection = connections[alias]
    with connection.cursor() as cursor:
        raw = connection.connection
        one_shot = not connection.in_atomic_block and isinstance(
            cursor.cursor, psycopg.ClientCursor
        )
        if not one_shot:
            with transaction.atomic(using=alias, savepoint=False):
                _execute_all(cursor, sql.FLOW_LOCK + claim_statement(config.keyed), params)
                rows = cursor.fetchall()
            return _messages(manager, rows, alias)
        prefix = "SET LOCAL plan_cache_mode = force_generic_plan;\n"
        if not get_settings().SYNCHRONOUS_ACKS:
            # Like the plain claim: may commit without waiting for the WAL flush (a crash
            # forgets the lease and its slot together).
            prefix += "SET LOCAL synchronous_commit = off;\n"
        prefix += sql.FLOW_LOCK
        rows = None
        if raw not in _unpreparable:
            rows = _run_prepared(cursor, raw, config.keyed, prefix, params)
        if rows is None:
            _execute_all(cursor, prefix + claim_statement(config.keyed), params)
            rows = cursor.fetchall()
    return _messages(manager, rows, alias)


def _run_prepared(
    cursor: Any, raw: Any, keyed: bool, prefix: str, params: dict[str, Any]
) -> list[Any] | None:
    """The claim through a session-level prepared statement; ``None`` when the session cannot
    keep one (PgBouncer transaction pooling, ``DISCARD ALL``): then this connection falls back
    to sending the statement itself, planned on every claim."""
    name, prepare = prepared_claim(keyed)
    done = _prepared.setdefault(raw, set())
    try:
        if name not in done:
            try:
                cursor.execute(prepare)
            except ProgrammingError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.DuplicatePreparedStatement):
                    raise
            done.add(name)
        arguments = ", ".join(f"%({p})s" for p, _ in _PARAM_TYPES)
        _execute_all(cursor, f"{prefix}EXECUTE {name}({arguments})", params)
        return list(cursor.fetchall())
    except ProgrammingError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.InvalidSqlStatementName):
            raise
        # The whole query string was one implicit transaction: nothing was claimed.
        _unpreparable.add(raw)
        logger.warning(
            "Flow-control claims on this connection re-plan every time: its prepared "
            "statement vanished (a pooler in transaction mode?)."
        )
        return None


def _execute_all(cursor: Any, statements: str, params: dict[str, Any]) -> None:
    """Run ``;``-separated statements, leaving the cursor on the last one's result."""
    if isinstance(cursor.cursor, psycopg.ClientCursor):
        cursor.execute(statements, params)  # one round trip
        for _ in range(statements.count(";")):
            cursor.nextset()
        return
    parts = [part for part in statements.split(";") if part.strip()]
    for part in parts:
        cursor.execute(part, params)


def _messages(manager: MessageManager, rows: list[Any], alias: str) -> list[Message]:
    """Messages from LEASE's rows (``claimed`` / ``buried``), logging as the plain claim does."""
    attempts_at = sql.LEASED_COLUMNS.index("attempts")
    worker_at = sql.LEASED_COLUMNS.index("leased_by")
    leased: list[Message] = []
    for outcome, *values in rows:
        if outcome == "buried":
            logger.warning(
                "Message %s (%s on %s) dead-lettered: lease_expired after %s attempts "
                "(last worker %s).",
                values[0],
                values[2],
                values[1],
                values[attempts_at],
                values[worker_at],
            )
            continue
        *columns, redelivered = values
        message = manager._from_row(columns, alias)
        message.redelivered = redelivered
        if redelivered:
            logger.warning(
                "Message %s (%s on %s) redelivered: its previous lease expired (attempt %s of %s).",
                message.id,
                message.task,
                message.queue,
                message.attempts,
                message.max_attempts,
            )
        leased.append(message)
    return leased
