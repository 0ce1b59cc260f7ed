"""Flow control in the claim: tenant fairness, concurrency limits and rate limits.

Opt-in per queue through ``PGQUEUE["QUEUES"][<queue>]`` (see
``docs/how-to/fairness-and-limits.md``). A queue with none of the keys below set is claimed
by the plain single-statement claim in ``manager.py``, untouched.

How a flow-controlled claim stays race-free with any number of workers: it locks the queue's
``pgqueue_flow_state`` row first, in a statement of its own, so claims of that queue run one
after the other and each sees what the previous one committed (READ COMMITTED takes a new
snapshot per statement). Everything is decided in the database, with database time:

- in-flight counts come from ``pgqueue_flow_slot`` rows checked against the live message
  (same id and lease token, lease not expired), so a finished, failed, released or expired
  lease frees its slot by itself and a crashed worker never leaks one;
- rate limits are token buckets refilled from ``clock_timestamp()``;
- fairness is a weighted round robin over tenants: a walk of the tenant index, one probe per
  tenant, never a scan of the backlog.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections

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

#: Messages without a tenant in a keyed queue are found among this many oldest ready messages.
UNTENANTED_WINDOW = 256


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

    def weight(self, tenant: str | None) -> int:
        return 1 if tenant is None else int(self.tenant_weights.get(tenant, 1))


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


@dataclass
class _Pick:
    ids: list[int]
    tenants: dict[int, str | None]
    cursor: str | None
    used: int


def lease_with_flow_control(
    manager: MessageManager,
    config: FlowConfig,
    queue: str,
    worker_id: str,
    limit: int,
    vt: float,
    alias: str,
) -> list[Message]:
    """Lease up to ``limit`` messages of ``queue`` within its fairness and limits.

    Runs inside the transaction ``Message.objects.lease`` opened (or the caller's, with
    ``hold=True``: the queue then stays locked for other claimers until it ends).
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.FLOW_LOCK, [queue])
        if cursor.fetchone() is None:
            cursor.execute(sql.FLOW_CREATE, [queue])
            cursor.execute(sql.FLOW_LOCK, [queue])
        cursor.execute(
            sql.FLOW_STATE, {"queue": queue, "rate": config.rate_limit, "burst": config.rate_burst}
        )
        rr_cursor, rr_used, tokens, clock, paused, in_flight, in_flight_by_key = cursor.fetchone()
        if paused:
            return []
        wanted = limit
        if config.concurrency_limit is not None:
            wanted = min(wanted, config.concurrency_limit - in_flight)
        if tokens is not None:
            wanted = min(wanted, math.floor(tokens + 1e-9))
        if wanted <= 0:
            return []
        candidates_params: tuple[Any, ...]
        if config.keyed:
            pick = _pick(cursor, config, queue, wanted, rr_cursor, rr_used, in_flight_by_key)
            if not pick.ids:
                _save(cursor, config, queue, pick.cursor, pick.used, tokens, clock, [], {})
                return []
            candidates_sql, candidates_params = sql.FLOW_CANDIDATES, (pick.ids, queue)
        else:
            pick = None
            candidates_sql, candidates_params = sql.FLOW_QUEUE_CANDIDATES, (queue, wanted)
        leased = _run_lease(
            manager, cursor, queue, candidates_sql, candidates_params, worker_id, vt, alias
        )
        if pick is not None:
            order = {message_id: n for n, message_id in enumerate(pick.ids)}
            leased.sort(key=lambda m: order.get(m.id, len(order)))
        _save(
            cursor,
            config,
            queue,
            pick.cursor if pick else None,
            pick.used if pick else 0,
            None if tokens is None else tokens - len(leased),
            clock,
            leased,
            Counter(m.tenant for m in leased if m.tenant is not None),
        )
    return leased


def _pick(
    cursor: Any,
    config: FlowConfig,
    queue: str,
    wanted: int,
    rr_cursor: str | None,
    rr_used: int,
    in_flight_by_key: Mapping[str, int] | str,
) -> _Pick:
    """Run FLOW_PICK and work out where the round robin stands afterwards."""
    in_flight = (
        json.loads(in_flight_by_key) if isinstance(in_flight_by_key, str) else in_flight_by_key
    )
    resume = rr_cursor is not None and rr_used < config.weight(rr_cursor)
    cursor.execute(
        sql.FLOW_PICK,
        {
            "queue": queue,
            "cursor": rr_cursor or "",
            "resume": resume,
            "used": rr_used,
            "max_tenants": min(wanted + WALK_SLACK, WALK_MAX),
            "n": wanted,
            "weights": json.dumps(dict(config.tenant_weights)),
            "key_limits": json.dumps(dict(config.key_concurrency_limits)),
            "key_limit": config.key_concurrency_limit,
            "in_flight": json.dumps(dict(in_flight)),
            "key_rate": config.key_rate_limit,
            "key_burst": config.key_rate_burst,
            "untenanted_window": UNTENANTED_WINDOW,
        },
    )
    rows = cursor.fetchall()
    picked = [row for row in rows if row[0] is not None]
    last_walked = next((row[1] for row in rows if row[0] is None), None)
    ids = [row[0] for row in picked]
    tenants = {row[0]: row[1] for row in picked}
    if len(picked) < wanted:
        # Everything the walk reached had its turn: continue after the last tenant walked.
        return _Pick(ids, tenants, last_walked, config.weight(last_walked))
    _, last_tenant, _, used = picked[-1]
    if last_tenant is None:  # the untenanted group: its turn sits where the rotation wraps
        return _Pick(ids, tenants, None, 0)
    return _Pick(ids, tenants, last_tenant, used)


def _run_lease(
    manager: MessageManager,
    cursor: Any,
    queue: str,
    candidates_sql: str,
    candidates_params: tuple[Any, ...],
    worker_id: str,
    vt: float,
    alias: str,
) -> list[Message]:
    """The core's LEASE statement (reaper included) over the flow-controlled candidates."""
    statement = sql.LEASE.format(
        candidates=candidates_sql,
        reap_limit=100,
        shared=sql.SHARED_COLUMNS,
        leased_columns=", ".join(f"m.{c}" for c in sql.LEASED_COLUMNS),
    )
    cursor.execute(statement, [queue, *candidates_params, worker_id, vt])
    attempts_at = sql.LEASED_COLUMNS.index("attempts")
    worker_at = sql.LEASED_COLUMNS.index("leased_by")
    leased: list[Message] = []
    for outcome, *values in cursor.fetchall():
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


def _save(
    cursor: Any,
    config: FlowConfig,
    queue: str,
    rr_cursor: str | None,
    rr_used: int,
    tokens: float | None,
    clock: Any,
    leased: list[Message],
    per_key: Mapping[str, int],
) -> None:
    """Persist the round-robin position, the buckets and the new slots."""
    slots = leased if config.tracks_slots else []
    buckets = per_key if config.key_rate_limit else {}
    key_burst = config.key_rate_burst
    cursor.execute(
        sql.FLOW_SAVE,
        {
            "queue": queue,
            "cursor": rr_cursor,
            "used": rr_used,
            "tokens": tokens,
            "refilled_at": clock if tokens is not None else None,
            "slot_tokens": [str(m.lease_token) for m in slots],
            "slot_ids": [m.id for m in slots],
            "slot_keys": [m.tenant for m in slots],
            "bucket_keys": list(buckets),
            "bucket_counts": list(buckets.values()),
            "key_rate": config.key_rate_limit,
            "key_burst": key_burst,
            "key_idle": None
            if key_burst is None or not config.key_rate_limit
            else (key_burst / config.key_rate_limit),
        },
    )
