"""``Message.objects``: leasing with ``select_for_update(skip_locked=True)`` under a visibility timeout."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models import Exists, F
from django.db.models.base import ModelState
from django.db.models.functions import Now

from ..conf import get_settings
from ..exceptions import LeaseError
from . import _flow_control, _sql
from ._claim_bound import ClaimBounds, Level
from ._execution import CLAIM_PLAN, ORDERED_PLAN, async_commit, execute, is_claim_session, set_local
from ._flow_control import flow_config
from ._prepared import can_prepare, driver_path, execute_prepared, run_on_driver
from ._registry import notify_dead
from ._timestamps import TimestampLoader
from ._validation import printable, storable_text, validate_queue_name

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue")

_STATEMENT_CACHE_SIZE = 1024


class MessageManager(models.Manager["Message"]):
    def __init__(self) -> None:
        super().__init__()
        # Compiled claim statements by (alias, queue, batch size): compiling the ORM query
        # costs more than running it.
        self._statements: dict[tuple[str, str, int], tuple[str, tuple[Any, ...]]] = {}

    def claimable(self, queue: str) -> models.QuerySet[Message]:
        """Messages of ``queue`` a worker may take now, in claim order (served by an index)."""
        # Looked up through the app registry: the models module imports this one.
        queue_state = self.model._meta.apps.get_model("django_pgqueue", "QueueState")
        paused = queue_state.objects.filter(name=queue, paused=True)
        return (
            self.filter(queue=queue, available_at__lte=Now(), attempts__lt=F("max_attempts"))
            .exclude(Exists(paused))
            .order_by("-priority", "available_at", "id")
        )

    def lease(
        self,
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
        """Lease up to ``batch_size`` ready messages for ``worker_id``.

        Each message comes back with ``attempts`` already counted, a fresh ``lease_token`` and
        ``available_at`` pushed to database ``now()`` + ``visibility_timeout`` seconds: if the
        worker dies, the message becomes claimable again by itself. Queues are tried in the
        given order until the batch is full; within a queue, higher priority first, then the
        oldest available, then the lowest id.

        ``hold=False`` (default): each queue's claim is one short transaction of its own,
        committed before this returns; calling it inside ``atomic()`` raises
        :class:`LeaseError`, since the lease would otherwise stay uncommitted and invisible to
        other workers' fencing.

        ``hold=True`` (hold-the-lock): runs inside the caller's transaction, which must be
        open; the rows stay locked until it ends and a rollback returns the whole batch
        untouched (attempts included).

        ``decode_payloads=False`` leaves each ``payload`` as its JSON text, for a caller that
        decodes it elsewhere (the worker does, in the handler's thread).

        ``bounds``: the caller's :class:`~django_pgqueue.core._claim_bound.ClaimBounds`, kept
        across its calls (a worker passes its own): plain claims (``hold=False``) then walk
        the claim index from where the last one left nothing behind, not from its head,
        which stays cheap while a long transaction keeps vacuum from removing dead entries.
        """
        queue_list = [queues] if isinstance(queues, str) else list(queues)
        for queue in queue_list:
            validate_queue_name(queue)
        storable_text(worker_id, "worker_id")  # written into each leased row
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        alias = using or get_settings().DATABASE_ALIAS
        vt = self._visibility_timeout(queue_list, visibility_timeout)
        connection = connections[alias]
        if hold:
            if not connection.in_atomic_block:
                raise LeaseError("lease(hold=True) must run inside transaction.atomic().")
            return self._lease_queues(
                queue_list,
                worker_id,
                batch_size,
                vt,
                alias,
                None,
                hold=True,
                decode=decode_payloads,
            )
        if connection.in_atomic_block:
            raise LeaseError(
                "lease() commits its own short transaction; inside transaction.atomic() use "
                "lease(hold=True) so the caller's transaction owns the lease."
            )
        # Each queue's claim is one short transaction of its own.
        return self._lease_queues(
            queue_list,
            worker_id,
            batch_size,
            vt,
            alias,
            bounds,
            hold=False,
            decode=decode_payloads,
        )

    @staticmethod
    def _visibility_timeout(queues: list[str], requested: float | None) -> float:
        if requested is not None:
            if requested <= 0:
                raise ValueError("visibility_timeout must be > 0 seconds")
            return float(requested)
        conf = get_settings()
        return float(max(conf.for_queue(q, "VISIBILITY_TIMEOUT") for q in queues))

    def _lease_queues(
        self,
        queues: list[str],
        worker_id: str,
        batch_size: int,
        vt: float,
        alias: str,
        bounds: ClaimBounds | None,
        hold: bool,
        decode: bool,
    ) -> list[Message]:
        leased: list[Message] = []
        for queue in queues:
            wanted = batch_size - len(leased)
            if wanted <= 0:
                break
            rows = self._claim_one_queue(queue, worker_id, wanted, vt, alias, bounds, hold)
            leased.extend(self._messages_from_rows(rows, alias, decode))
        return leased

    def look_from_head(
        self, queue: str, bounds: ClaimBounds, *, using: str | None = None, rows: int = 100
    ) -> float:
        """Read the first ``rows`` messages a claim of ``queue`` from the head of the claim
        index (of a fair queue: of its fair order) would take, without claiming them, and
        tell ``bounds`` what was seen and how long it took
        (:meth:`ClaimBounds.seen_from_head`): the claims that walk from the bounds then take
        what fell due below them. For a ``ClaimBounds`` made with
        ``head_walks_in_claims=False``, from a connection of its own. Returns the seconds
        the look took."""
        validate_queue_name(queue)
        alias = using or get_settings().DATABASE_ALIAS
        flow = flow_config(queue)
        fair = flow is not None and flow.walks_from_bounds
        began = time.monotonic()
        with connections[alias].cursor() as cursor:
            cursor.execute(_sql.FAIR_HEAD_OF_QUEUE if fair else _sql.HEAD_OF_QUEUE, [queue, rows])
            due = [(priority, position, message_id) for priority, position, message_id in cursor]
        seconds = time.monotonic() - began
        bounds.walked_from_head(queue, seconds)
        bounds.seen_from_head(queue, due)
        return seconds

    def _claim_one_queue(
        self,
        queue: str,
        worker_id: str,
        limit: int,
        vt: float,
        alias: str,
        bounds: ClaimBounds | None,
        hold: bool,
    ) -> list[Any]:
        flow = flow_config(queue)
        if flow is not None and not flow.walks_from_bounds:
            bounds = None  # its claims follow no fair order, or pass over messages in it
        began = time.monotonic()
        levels = None if bounds is None else bounds.start(queue, fair=flow is not None)
        if flow is not None:
            # Opt-in per queue: the candidates come from the flow-control function
            # (_flow_control.py); inside a transaction every limit is counted exactly.
            exact = hold or connections[alias].in_atomic_block
            statement = _flow_control.CLAIM
            params = _flow_control.claim_params(
                flow, queue, worker_id, limit, vt, exact, _levels_params(levels or [])
            )
        elif levels is not None:
            statement = self._bounded_lease_statement(limit)
            priorities, floors, _ = _levels_params(levels)
            params = [queue, priorities, floors, queue, queue, worker_id, vt]
        else:
            statement, candidate_params = self._lease_statement(alias, queue, limit)
            params = [queue, *candidate_params, worker_id, vt]
        walk_began = time.monotonic()
        rows = self._run_claim(alias, statement, params, hold)
        if bounds is not None and levels is None:
            bounds.walked_from_head(queue, time.monotonic() - walk_began)
        if bounds is not None:
            claimed = [row for row in rows if row[0] == "claimed"]
            taken = [(row[_PRIORITY_AT], row[-1], row[_ID_AT]) for row in claimed]
            claim_time = claimed[0][_CLAIM_TIME_AT] / 1e6 if claimed else 0.0
            bounds.claimed(queue, taken, claim_time, full=len(claimed) == limit, began=began)
        return rows

    def _run_claim(self, alias: str, statement: str, params: list[Any], hold: bool) -> list[Any]:
        connection = connections[alias]
        # driver_path first: its health check may replace the connection with a fresh one.
        if not hold and driver_path(connection) and is_claim_session(connection):
            # A worker's connection that runs under the claim's settings already.
            rows = run_on_driver(
                connection,
                kind="claim",
                statement=statement,
                types=tuple(_sql_type(p) for p in params),
                params=params,
                typed_rows=True,
            )
            if rows is not None:
                return rows
        with connection.cursor() as cursor:
            rows = None
            if can_prepare(connection, cursor):
                rows = _run_prepared_claim(cursor, connection, statement, params)
            if rows is None:
                with transaction.atomic(using=alias):
                    rows = _execute_claim(cursor, statement, params, restore=hold)
        return rows

    def _messages_from_rows(
        self, rows: Sequence[Sequence[Any]], alias: str, decode: bool
    ) -> list[Message]:
        """Messages from a claim's rows (``claimed`` / ``buried``), logging the warnings."""
        attempts_at = _sql.LEASED_COLUMNS.index("attempts")
        worker_at = _sql.LEASED_COLUMNS.index("leased_by")
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
                    values[attempts_at],
                    values[worker_at],
                )
                continue
            *columns, redelivered, _position, _walk_position = values
            message = self._from_row(columns, alias, load_time, decode)
            message.redelivered = redelivered
            if redelivered:
                logger.warning(
                    "Message %s (%s on %s) redelivered: its previous lease expired "
                    "(attempt %s of %s).",
                    message.id,
                    printable(message.task),
                    message.queue,
                    message.attempts,
                    message.max_attempts,
                )
            leased.append(message)
        return leased

    def _bounded_lease_statement(self, limit: int) -> str:
        """The claim walked from a bound (``_sql.CANDIDATES_FROM``), one text per batch size."""
        key = ("bounded", "", limit)
        cached = self._statements.get(key)
        if cached is None:
            statement = _plain_claim(_sql.CANDIDATES_FROM.format(limit=limit))
            if len(self._statements) >= _STATEMENT_CACHE_SIZE:
                self._statements.clear()
            cached = self._statements[key] = (statement, ())
        return cached[0]

    def _lease_statement(self, alias: str, queue: str, limit: int) -> tuple[str, tuple[Any, ...]]:
        """The claim statement around the ORM's SKIP LOCKED select, compiled once per shape."""
        key = (alias, queue, limit)
        cached = self._statements.get(key)
        if cached is None:
            candidates = (
                self.claimable(queue)
                .using(alias)
                .select_for_update(skip_locked=True)
                .values("id", "lease_token", "available_at")[:limit]
            )
            # select_for_update() compiles only inside a transaction (of the alias it is
            # compiled for: sql_with_params() would take the default's); nothing is sent here.
            with transaction.atomic(using=alias):
                candidates_sql, candidates_params = candidates.query.get_compiler(alias).as_sql()
            statement = _plain_claim(candidates_sql)
            if len(self._statements) >= _STATEMENT_CACHE_SIZE:
                self._statements.clear()
            cached = self._statements[key] = (statement, tuple(candidates_params))
        return cached

    def _from_row(
        self, values: Sequence[Any], alias: str, load_time: TimestampLoader, decode: bool
    ) -> Message:
        # Model.__init__ is costly per row; a leased batch is plain column data, so fill the
        # instance the way Model.from_db would, without per-field descriptors.
        columns = list(values)
        payload = columns[_PAYLOAD_AT]
        if decode and isinstance(payload, str):
            columns[_PAYLOAD_AT] = json.loads(payload)
        for position in _TIMESTAMPS_AT:
            columns[position] = load_time(columns[position])
        message = self.model.__new__(self.model)
        message.__dict__.update(zip(_sql.LEASED_COLUMNS, columns, strict=True))
        state = message._state = ModelState()
        state.adding = False
        state.db = alias
        return message


_PAYLOAD_AT = _sql.LEASED_COLUMNS.index("payload")
# In a claim's row (its outcome first): when the lease was taken, the claim's now(), in
# microseconds since the epoch.
_CLAIM_TIME_AT = 1 + _sql.LEASED_COLUMNS.index("leased_at")
_PRIORITY_AT = 1 + _sql.LEASED_COLUMNS.index("priority")
_ID_AT = 1 + _sql.LEASED_COLUMNS.index("id")

_TIMESTAMPS_AT = tuple(_sql.LEASED_COLUMNS.index(name) for name in _sql.LEASED_TIMESTAMPS)


def _plain_claim(candidates: str) -> str:
    """``_sql.LEASE`` for a queue without flow control, around its ``candidates`` search."""
    return _sql.LEASE.format(
        candidates=candidates,
        reap_limit=_sql.REAP_LIMIT,
        shared=_sql.SHARED_COLUMNS,
        leased_columns=_sql.leased_returning(),
        leased_order=_sql.LEASED_ORDER,
        walk_position=_sql.WALKED_AT,
    )


def _execute_claim(cursor: Any, statement: str, params: list[Any], *, restore: bool) -> list[Any]:
    """Run the claim with an ordered plan (see ``_execution.ORDERED_PLAN``).

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


def _sql_type(value: Any) -> str:
    """The parameter type of a claim argument (Django may pass ``psycopg`` int wrappers)."""
    for python_type, sql_type in ((bool, "boolean"), (int, "bigint"), (float, "float8")):
        if isinstance(value, python_type):
            return sql_type
    if isinstance(value, str):
        return "text"
    raise TypeError(f"unexpected claim parameter {value!r}")


def _levels_params(levels: list[Level]) -> tuple[str, str, str]:
    """The levels, their bounds and the bounds' ids, as array literals (text parameters) of
    ``_sql.CANDIDATES_FROM`` (the first two) and of the flow-control claim."""
    priorities = ",".join(str(priority) for priority, _, _ in levels)
    floors = ",".join(repr(bound) for _, bound, _ in levels)
    ids = ",".join(str(message_id) for _, _, message_id in levels)
    return "{" + priorities + "}", "{" + floors + "}", "{" + ids + "}"


def _run_prepared_claim(
    cursor: Any, connection: Any, statement: str, params: list[Any]
) -> list[Any] | None:
    """The claim as a session-level prepared statement, outside any transaction block: the
    settings and the ``EXECUTE`` go as one query string, one implicit transaction (see
    ``_prepared.py``). ``None`` when this session cannot keep prepared statements."""
    plan = {**CLAIM_PLAN, **async_commit()}
    return execute_prepared(
        cursor,
        connection,
        kind="claim",
        statement=statement,
        types=tuple(_sql_type(p) for p in params),
        params=params,
        prefix=set_local(plan),
        # A worker sends the same claim (queue, batch size, worker id) again and again.
        reuse_text=True,
    )
