"""Leasing: one claim statement per queue (``_claim_sql.py``), its rows made into messages.

A claim picks its text by the kind of queue (plain from the head, plain from the claimer's
bounds, flow-controlled), sends it as a prepared statement (:func:`_run_claim`) and tells the
claimer's bounds what it took. ``Message.objects.lease()`` is the public door; the worker
calls :func:`lease` with its own bounds and leaves the payloads to its handler threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import connections, transaction
from django.db.models.base import ModelState

from ..conf import get_settings
from ..exceptions import LeaseError
from . import _claim_sql, _json, _send
from ._claim_bound import ClaimBounds, Level
from ._execution import CLAIM_PLAN, ORDERED_PLAN, async_commit, beyond_session, execute
from ._flow_control import flow_config
from ._log_fields import message_fields
from ._registry import notify_dead
from ._timestamps import TimestampLoader
from ._validation import printable, storable_text, validate_queue_name

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue")

#: The columns a claim returns, in this order (the claimed messages are built from them).
#: Not ``errors`` and ``last_error``: they can hold long tracebacks that a handler does not
#: need; reading them on a leased message loads them lazily.
LEASED_COLUMNS = (
    "id",
    "queue",
    "task",
    "payload",
    "priority",
    "tenant",
    "dedup_key",
    "enqueued_at",
    "available_at",
    "attempts",
    "max_attempts",
    "lease_token",
    "leased_by",
    "leased_at",
    "headers",
)
#: Leased timestamps travel as integer microseconds since the epoch.
LEASED_TIMESTAMPS = ("enqueued_at", "available_at", "leased_at")

_PAYLOAD_AT = LEASED_COLUMNS.index("payload")
_ATTEMPTS_AT = LEASED_COLUMNS.index("attempts")
_WORKER_AT = LEASED_COLUMNS.index("leased_by")
_HEADERS_AT = LEASED_COLUMNS.index("headers")
_TIMESTAMPS_AT = tuple(LEASED_COLUMNS.index(name) for name in LEASED_TIMESTAMPS)
# In a claim's row (its outcome first): when the lease was taken, the claim's now(), in
# microseconds since the epoch; the message's priority and id.
_CLAIM_TIME_AT = 1 + LEASED_COLUMNS.index("leased_at")
_PRIORITY_AT = 1 + LEASED_COLUMNS.index("priority")
_ID_AT = 1 + LEASED_COLUMNS.index("id")


def lease(
    queues: str | Sequence[str],
    *,
    worker_id: str,
    batch_size: int = 1,
    visibility_timeout: float | None = None,
    hold: bool = False,
    using: str | None = None,
    decode_payloads: bool = True,
    bounds: ClaimBounds | None = None,
) -> list[Message]:
    """``Message.objects.lease()`` (see there), and for the worker: ``decode_payloads=False``
    leaves each ``payload`` as its JSON text (its handler threads decode it); ``bounds``: the
    claimer's :class:`ClaimBounds`, kept across its calls, so that plain claims outside a
    transaction walk the claim index from where the last one left nothing behind."""
    queue_list = [queues] if isinstance(queues, str) else list(queues)
    for queue in queue_list:
        validate_queue_name(queue)
    storable_text(worker_id, "worker_id")  # written into each leased row
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    alias = using or get_settings().DATABASE_ALIAS
    vt = _visibility_timeout(queue_list, visibility_timeout)
    in_atomic_block = connections[alias].in_atomic_block
    if hold and not in_atomic_block:
        raise LeaseError("lease(hold=True) must run inside transaction.atomic().")
    if not hold and in_atomic_block:
        raise LeaseError(
            "lease() commits its own short transaction; inside transaction.atomic() use "
            "lease(hold=True) so the caller's transaction owns the lease."
        )
    leased: list[Message] = []
    for queue in queue_list:
        wanted = batch_size - len(leased)
        if wanted <= 0:
            break
        rows = _claim_queue(queue, worker_id, wanted, vt, alias, None if hold else bounds, hold)
        leased.extend(_messages(rows, alias, decode_payloads))
    return leased


def _visibility_timeout(queues: list[str], requested: float | None) -> float:
    if requested is not None:
        if requested <= 0:
            raise ValueError("visibility_timeout must be > 0 seconds")
        return float(requested)
    conf = get_settings()
    return float(max(conf.for_queue(q, "VISIBILITY_TIMEOUT") for q in queues))


def _claim_queue(
    queue: str,
    worker_id: str,
    batch: int,
    vt: float,
    alias: str,
    bounds: ClaimBounds | None,
    hold: bool,
) -> list[Any]:
    """One queue's claim: its rows, ``claimed`` or ``buried``, in claim order."""
    flow = flow_config(queue)
    if flow is not None and not flow.walks_from_bounds:
        bounds = None  # its claims follow no fair order, or pass over messages in it
    began = time.monotonic()
    levels = None if bounds is None else bounds.start(queue, fair=flow is not None)
    params: dict[str, Any] = {
        "queue": queue,
        "batch": batch,
        "worker": worker_id,
        "visibility_timeout": vt,
    }
    if flow is not None:
        statement = _claim_sql.FLOW_CLAIM
        params["levels"], params["bounds"], params["after"] = levels_params(levels or [])
        params["settings"] = flow.settings_json
        # Inside a transaction every limit is counted exactly.
        params["exact"] = hold or connections[alias].in_atomic_block
    elif levels is not None:
        statement = _claim_sql.BOUNDED_CLAIM
        params["levels"], params["bounds"], _ = levels_params(levels)
    else:
        statement = _claim_sql.PLAIN_CLAIM
    walk_began = time.monotonic()
    rows = _run_claim(alias, statement, params, hold)
    if bounds is not None and levels is None:
        bounds.walked_from_head(queue, time.monotonic() - walk_began)
    if bounds is not None:
        claimed = [row for row in rows if row[0] == "claimed"]
        taken = [(row[_PRIORITY_AT], row[-1], row[_ID_AT]) for row in claimed]
        claim_time = claimed[0][_CLAIM_TIME_AT] / 1e6 if claimed else 0.0
        bounds.claimed(queue, taken, claim_time, full=len(claimed) == batch, began=began)
    return rows


def _run_claim(alias: str, statement: str, params: dict[str, Any], hold: bool) -> list[Any]:
    """Run a claim under the claim's plan settings (``_execution.CLAIM_PLAN``), prepared
    once per session (``_send.py``), with a generic plan:

    - on a worker's claim connection (``_execution.dedicate_to_claims``), whose session runs
      under those settings already: the claim alone;
    - otherwise in autocommit: the settings, local to the claim, and the claim in one
      pipeline (one round trip, one implicit transaction);
    - in the caller's transaction (``hold``), while something observes Django's cursors, or
      on a session that cannot keep prepared statements: through Django's cursor, planned
      each time.
    """
    connection = connections[alias]
    if not hold and _send.direct(connection):
        plan = beyond_session(connection, {**CLAIM_PLAN, **async_commit()})
        rows = _send.run(connection, statement, params, plan=plan)
        if rows is not None:
            return rows
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        return _execute(cursor, statement, params, restore=hold)


def _execute(cursor: Any, statement: str, params: dict[str, Any], *, restore: bool) -> list[Any]:
    """Run the claim with an ordered plan (``_execution.ORDERED_PLAN``).

    In our own short transaction the ``SET LOCAL`` ends with it, and the commit may be
    asynchronous (``_execution.async_commit``). In the caller's transaction (hold mode) the
    previous plan settings are put back afterwards and the commit is theirs.
    """
    names = list(ORDERED_PLAN)
    previous = None
    if restore:
        cursor.execute("SELECT " + ", ".join(f"current_setting('{n}')" for n in names))
        previous = cursor.fetchone()
        local_settings = dict(ORDERED_PLAN)
    else:
        local_settings = {**ORDERED_PLAN, **async_commit()}
    execute(cursor, statement, params, local_settings)
    rows: list[Any] = cursor.fetchall()
    if previous is not None:
        cursor.execute(
            "SELECT " + ", ".join(f"set_config('{n}', %s, true)" for n in names), list(previous)
        )
    return rows


def _messages(rows: Sequence[Sequence[Any]], alias: str, decode: bool) -> list[Message]:
    """Messages from a claim's rows (``claimed`` / ``buried``), logging the warnings."""
    # Through the app registry: the models module imports the manager, which imports this.
    message_model: type[Message] = apps.get_model("django_pgqueue", "Message")
    leased: list[Message] = []
    load_time = TimestampLoader(alias)
    for outcome, *values in rows:
        if outcome == "buried":
            notify_dead(values[2], values[0], "lease_expired")
            logger.warning(
                "Message %s (%s on %s) dead-lettered: lease_expired after %s attempts "
                "(last worker %s).",
                values[0],
                printable(values[2]),
                values[1],
                values[_ATTEMPTS_AT],
                values[_WORKER_AT],
                extra={
                    "message_id": values[0],
                    "task": values[2],
                    "queue": values[1],
                    "attempt": values[_ATTEMPTS_AT],
                },
            )
            continue
        *columns, _position, redelivered, _walk_position = values
        payload = columns[_PAYLOAD_AT]
        if decode and isinstance(payload, str):
            columns[_PAYLOAD_AT] = _json.loads(payload)
        headers = columns[_HEADERS_AT]
        if isinstance(headers, str):  # a claim session reads jsonb as text
            columns[_HEADERS_AT] = _json.loads(headers)
        for position in _TIMESTAMPS_AT:
            columns[position] = load_time(columns[position])
        # Model.__init__ is costly per row; a leased batch is plain column data, so fill the
        # instance the way Model.from_db would, without per-field descriptors.
        message = message_model.__new__(message_model)
        message.__dict__.update(zip(LEASED_COLUMNS, columns, strict=True))
        state = message._state = ModelState()
        state.adding = False
        state.db = alias
        message.redelivered = redelivered
        if redelivered:
            logger.warning(
                "Message %s (%s on %s) redelivered: its previous lease expired (attempt %s of %s).",
                message.id,
                printable(message.task),
                message.queue,
                message.attempts,
                message.max_attempts,
                extra=message_fields(message),
            )
        leased.append(message)
    return leased


def look_from_head(queue: str, bounds: ClaimBounds, *, alias: str, rows: int = 100) -> float:
    """Read the first ``rows`` messages a claim of ``queue`` from the head of the claim index
    (of a fair queue: of its fair order) would take, without claiming them, and tell
    ``bounds`` what was seen and how long it took (:meth:`ClaimBounds.seen_from_head`): the
    claims that walk from the bounds then take what fell due below them. The worker's head
    watcher runs it on a connection of its own. Returns the seconds the look took."""
    flow = flow_config(queue)
    fair = flow is not None and flow.walks_from_bounds
    statement = _claim_sql.FAIR_HEAD_OF_QUEUE if fair else _claim_sql.HEAD_OF_QUEUE
    began = time.monotonic()
    with connections[alias].cursor() as cursor:
        cursor.execute(statement, {"queue": queue, "rows": rows})
        due = [(priority, position, message_id) for priority, position, message_id in cursor]
    seconds = time.monotonic() - began
    bounds.walked_from_head(queue, seconds)
    bounds.seen_from_head(queue, due)
    return seconds


def levels_params(levels: list[Level]) -> tuple[str, str, str]:
    """The levels, their bounds and the bounds' ids, as array literals (text parameters of
    the claims from bounds)."""
    priorities = ",".join(str(priority) for priority, _, _ in levels)
    floors = ",".join(repr(bound) for _, bound, _ in levels)
    ids = ",".join(str(message_id) for _, _, message_id in levels)
    return "{" + priorities + "}", "{" + floors + "}", "{" + ids + "}"
