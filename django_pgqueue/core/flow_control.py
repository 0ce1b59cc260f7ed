"""Flow control in the claim: tenant fairness, concurrency limits and rate limits.

Opt-in per queue through ``PGQUEUE["QUEUES"][<queue>]`` (see
``docs/how-to/fairness-and-limits.md``). A queue with none of the keys below set is claimed
by the plain single-statement claim in ``manager.py``, untouched.

- Fairness is weighted fair queuing by virtual time: every message of a fair queue gets its
  place in the queue's fair order (``Message.fair_order``) when it enters it — at enqueue,
  or, for a message that was scheduled, retried, redelivered or released, in the first claim
  after it falls due. A claim reads the head of that order: an index range, whatever the
  number of tenants or the backlog.
- Concurrency limits count the queue's messages in flight — leased, lease not expired —
  from the leases themselves (a flow claim marks them, a partial index holds them), so a
  finished, failed, released or expired lease frees its slot by itself and a crashed worker
  never leaks one. Optimistic claims of a full batch, or with many in flight, read instead a
  count of the leases that claims and acks keep, which may err high but never low
  (:data:`KEPT_COUNT_BATCH`).
- Rate limits are token buckets refilled from ``clock_timestamp()`` (a queue's bucket in
  shards, one per optimistic claim).

Race freedom: a claim of a queue with a limit or a rate takes the queue's advisory lock first,
in a statement of its own — exclusive (serialized: each sees what the previous one committed,
READ COMMITTED taking a new snapshot per statement), or shared with a ticket (optimistic: a
few side by side, each with room to spare for the others; see ``sql.py``). Lock and claim
reach the server in one round trip and run as one transaction (one query string, or on a
worker's claim session one pipeline of two Bind/Executes), so the lock is never held across a
round trip to a worker. Fairness alone needs no lock: claims take the head of the
fair order with SKIP LOCKED, side by side. Everything is decided in the database, with
database time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from django.db import connections, transaction

from ..conf import get_settings
from . import sql
from .execution import NO_SEQSCAN, async_commit, is_claim_session, set_local
from .prepared import (
    DriverStatement,
    can_pipeline,
    can_prepare,
    driver_path,
    execute_all,
    run_on_driver,
    run_prepared,
)

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

#: Messages of the fair order a claim reads beyond twice its batch (and two per tenant short of
#: it) when some tenant may be unable to take a whole batch: room to pass over messages of
#: tenants at their key limit or out of tokens (see ``sql.KEYED_CHOICE_CTES``).
WINDOW_SLACK = 8

#: Messages due again (scheduled, retried, redelivered) one claim places in the fair order
#: at most, beyond its batch size.
PLACE_SLACK = 32

#: Optimistic claims of a queue with limits or rates (see ``sql.py``, "Flow control"): at most
#: this many at once, each of at most this many messages; a claim goes ahead optimistically
#: only with their product to spare under every limit, else it runs serialized. Claims of a
#: single message too: side by side they beat one at a time, even with the extra lock
#: statement.
OPTIMISTIC_CLAIMS = 4
OPTIMISTIC_BATCH = 100

#: The first key of the queues' advisory locks (the second is the queue name's hash); the
#: ticket locks use the next ``OPTIMISTIC_CLAIMS`` values.
LOCK_CLASS = 0x70677100

#: How often a fair queue's claims place messages in its order when none were found waiting
#: (see :class:`PlacingSchedule`), seconds.
PLACING_INTERVAL = 1.0

#: An optimistic claim trusts a queue's lease count (the rate shards' ``held``, which claims
#: and acks keep) only if a serialized claim counted the leases within this many seconds,
#: database time; else it runs serialized, which counts. What the kept count misses (an
#: operator's moves, acks inside a caller's transaction, a re-claimed expired lease) only
#: makes it err high; this bounds how long it does, and covers a queue whose settings
#: changed (claims without limits keep no count).
RECOUNT_INTERVAL = 1.0

#: Rows written without a place (``fair_order`` NULL: raw SQL, or from before fairness was
#: switched on) are looked for among this many oldest ready messages of the queue.
UNPLACED_WINDOW = 32

#: Claim credits (:class:`CreditBook`, ``sql.py`` "Claim credits"): an optimistic claim that
#: took its whole batch far from every limit grants its session an allowance of up to
#: ``CREDIT_CLAIMS`` times its batch, which the session leases with claims of fairness alone
#: for ``CREDIT_WINDOW`` seconds (database time). 0 switches credits off. A rate may be
#: exceeded by the allowances of the credits live at once (their tokens are spent when
#: granted, and leased within the window): at most the rate times the window.
CREDIT_CLAIMS = 32
CREDIT_WINDOW = 0.2


ClaimShape = Literal["limits", "fair_limits", "keyed", "fair"]


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
        """Claims follow the fair order over tenants instead of the global claim order."""
        return bool(self.fairness or self.tenant_weights or self.key_limited)

    @property
    def key_limited(self) -> bool:
        """Some tenant's claims are bounded: a key concurrency limit or a key rate."""
        return bool(
            self.key_concurrency_limit or self.key_concurrency_limits or self.key_rate_limit
        )

    @property
    def serialized(self) -> bool:
        """A limit or a rate: the queue's claims take its lock, one after the other."""
        return bool(
            self.concurrency_limit
            or self.key_concurrency_limit
            or self.key_concurrency_limits
            or self.rate_limit
            or self.key_rate_limit
        )

    @property
    def counted(self) -> bool:
        """Claims need the queue's leases in flight: a queue limit or a key limit (kept in the
        rate shards' ``held`` for optimistic claims, acks taking theirs away)."""
        return self.concurrency_limit is not None or self.least_key_limit is not None

    @property
    def least_key_limit(self) -> int | None:
        """The smallest limit any key has: the default key limit and every per-key limit."""
        limits = list(self.key_concurrency_limits.values())
        if self.key_concurrency_limit is not None:
            limits.append(self.key_concurrency_limit)
        return min(limits, default=None)

    @property
    def shape(self) -> ClaimShape:
        """Which claim statement serves the queue (see :func:`claim_statement`)."""
        if not self.keyed:
            return "limits"
        if not self.serialized:
            return "fair"
        return "keyed" if self.key_limited else "fair_limits"

    @property
    def optimistic_shape(self) -> ClaimShape:
        """The claim statement of an optimistic claim (see ``sql.BUDGET_OPTIMISTIC_CTES``).

        With key limits and no key rate, the statement without the per-tenant counts (~25 plan
        nodes fewer to set up on every claim, and no count of every tenant's leases): it goes
        ahead only while the queue's whole in flight leaves the smallest key limit (the
        default or a per-key one, :attr:`least_key_limit`) ``margin`` away, so no tenant can
        reach its limit and the keyed choice is the fair one. Closer to it the claim answers
        ``contended`` (it cannot tell each tenant's room) and runs serialized, which counts
        key by key. A key rate needs its buckets: the keyed statement.
        """
        if self.shape == "keyed" and not self.key_rate_limit:
            return "fair_limits"
        return self.shape

    def fair_step(self, tenant: str | None) -> float:
        """How far a tenant's next message goes behind its previous one in the fair order."""
        return 1.0 / int(self.tenant_weights.get(tenant, 1)) if tenant is not None else 1.0

    @property
    def rate_burst(self) -> float | None:
        """Bucket size: one second's worth of messages, at least one."""
        return None if self.rate_limit is None else max(1.0, float(self.rate_limit))

    @property
    def key_rate_burst(self) -> float | None:
        return None if self.key_rate_limit is None else max(1.0, float(self.key_rate_limit))

    @functools.cached_property
    def settings_params(self) -> dict[str, Any]:
        """The claim parameters that come from these settings alone (see
        :func:`claim_params`): worked out once, not on every claim."""
        return {
            "queue_limit": self.concurrency_limit,
            "rate": self.rate_limit,
            "burst": self.rate_burst,
            "weights": json.dumps(dict(self.tenant_weights)),
            "key_limits": json.dumps(dict(self.key_concurrency_limits)),
            "key_limit": self.key_concurrency_limit,
            "least_key_limit": self.least_key_limit,
            "key_rate": self.key_rate_limit,
            "key_burst": self.key_rate_burst,
            "window": WINDOW_SLACK,
            "lock_class": LOCK_CLASS,
            "tickets": OPTIMISTIC_CLAIMS,
            "margin": OPTIMISTIC_CLAIMS * OPTIMISTIC_BATCH,
            "unplaced_window": UNPLACED_WINDOW,
            "recount": RECOUNT_INTERVAL,
            "counted": self.counted,
            "credit_window": CREDIT_WINDOW,
        }

    @functools.cached_property
    def settings_literals(self) -> SettingsLiterals:
        """What :func:`claim_statement` writes into this queue's claims as literals."""
        return _literals(self.settings_params)

    @functools.cached_property
    def optimistic_settings_literals(self) -> SettingsLiterals:
        """The same for its optimistic claims: where those run the statement without the
        per-tenant counts (:attr:`optimistic_shape`), one key limit, the smallest."""
        if self.optimistic_shape == self.shape:
            return self.settings_literals
        return _literals(
            {**self.settings_params, "key_limit": self.least_key_limit, "key_limits": "{}"}
        )

    def literals(self, optimistic: bool) -> SettingsLiterals:
        """The settings literals of an optimistic or a serialized claim."""
        return self.optimistic_settings_literals if optimistic else self.settings_literals


# Every claim and enqueue asks for its queue's FlowConfig: built once per queue named in the
# settings and per settings object (a change of settings builds a new one: conf.get_settings).
_configs: tuple[object, dict[str, FlowConfig | None]] = (None, {})


def flow_config(queue: str) -> FlowConfig | None:
    """The queue's flow-control settings, or ``None`` when it uses none (the plain claim)."""
    global _configs
    settings = get_settings()
    overrides = settings.QUEUES.get(queue)
    if not overrides:
        return None
    built_for, configs = _configs
    if built_for is not settings:
        configs = {}
        _configs = (settings, configs)
    if queue not in configs:
        configs[queue] = _flow_config(overrides)
    return configs[queue]


def _flow_config(overrides: Mapping[str, Any]) -> FlowConfig | None:
    if not FLOW_KEYS.intersection(overrides):
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
    if not (config.keyed or config.serialized):
        return None  # e.g. FAIRNESS=False and limits set to None
    return config


#: A queue with a concurrency limit keeps a count of its leases (``sql.py``, "shards"): an
#: optimistic claim reads it instead of counting what is in flight when it takes at least
#: ``KEPT_COUNT_BATCH`` messages, or when the last claim of the queue in this process saw at
#: least ``KEPT_COUNT_HELD`` leases in flight; the acks that follow a claim that read it keep
#: it (they take away the leases they end). A count reads a row for every lease in flight and
#: every lease finished since the last WAL flush, so it grows with what is in flight; with
#: few in flight, counting and acks that keep nothing are cheaper (see bench/notes/).
#: What claims that count and their acks leave counted makes the kept count err high until a
#: serialized claim counts again.
KEPT_COUNT_BATCH = 100
KEPT_COUNT_HELD = 256


class LeasesSeen:
    """What the last claim of each queue in this process saw (its ``held`` marker row) and
    whether it read the kept count: which claims and acks read and keep that count."""

    def __init__(self) -> None:
        # (alias, queue) -> (leases in flight the last claim saw, it read the kept count)
        self._last: dict[tuple[str, str], tuple[int, bool]] = {}

    def reads_kept_count(self, alias: str, queue: str, messages: int) -> bool:
        """Whether a claim of ``messages`` reads the kept count (:data:`KEPT_COUNT_BATCH`)."""
        if messages >= KEPT_COUNT_BATCH:
            return True
        return self._last.get((alias, queue), (0, False))[0] >= KEPT_COUNT_HELD

    def keeps_count(self, alias: str, queue: str) -> bool:
        """Whether an ack of ``queue``'s leases keeps the kept count: the last claim read it."""
        return self._last.get((alias, queue), (0, False))[1]

    def noted(self, alias: str, queue: str, rows: list[Any], kept_count: bool) -> list[Any]:
        """``rows`` without the ``held`` marker row, whose count (last column) is noted with
        whether the claim read the kept count."""
        kept = []
        for row in rows:
            if row[0] == HELD:
                self._last[(alias, queue)] = (int(row[-1]), kept_count)
            else:
                kept.append(row)
        return kept

    def reset(self) -> None:
        self._last.clear()


LEASES_SEEN = LeasesSeen()


@dataclass
class Credit:
    """A claim credit of one session and queue: what it may still lease, and until when."""

    left: int
    until: float  # seconds since the epoch, database time: the database checks it
    stale_at: float  # host monotonic clock: past it, not worth trying (a hint only)


class CreditBook:
    """The claim credits of this process: one holder per connection (a claiming session,
    one thread) and at most one credit per holder and queue, with what is left of it.

    The database decides whether a credit is live (``sql.CREDIT_COMMON_CTES``); the host
    clock only spares a claim that would find it ended. The count of what is left is the
    holder's own: nobody else claims under its credit."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._books: weakref.WeakKeyDictionary[Any, tuple[str, dict[str, Credit]]] = (
            weakref.WeakKeyDictionary()
        )

    def _book(self, connection: Any) -> tuple[str, dict[str, Credit]]:
        book = self._books.get(connection)
        if book is None:
            holder = f"{os.getpid()}-{uuid.uuid4().hex[:16]}"
            book = self._books[connection] = (holder, {})
        return book

    def holder(self, connection: Any) -> str:
        return self._book(connection)[0]

    def usable(self, connection: Any, queue: str, messages: int) -> Credit | None:
        """The holder's credit of ``queue`` if it has ``messages`` left and may be live."""
        credit = self._book(connection)[1].get(queue)
        if credit is None or credit.left < messages or self.clock() >= credit.stale_at:
            return None
        return credit

    def spent(self, connection: Any, queue: str, messages: int) -> None:
        credit = self._book(connection)[1].get(queue)
        if credit is not None:
            credit.left -= messages

    def drop(self, connection: Any, queue: str) -> None:
        self._book(connection)[1].pop(queue, None)

    def noted(self, connection: Any, queue: str, rows: list[Any]) -> list[Any]:
        """``rows`` without a grant's marker rows, whose credit is noted (a new grant
        replaces the holder's credit, in the database as here)."""
        allowance = until = None
        kept = []
        for row in rows:
            if row[0] == CREDIT:
                allowance = int(row[-1])
            elif row[0] == CREDIT_UNTIL:
                until = int(row[-1]) / 1e6
            else:
                kept.append(row)
        if allowance is not None and until is not None:
            stale_at = self.clock() + CREDIT_WINDOW
            self._book(connection)[1][queue] = Credit(allowance, until, stale_at)
        return kept

    def reset(self) -> None:
        self._books = weakref.WeakKeyDictionary()


CREDITS = CreditBook()


def credit_size(config: FlowConfig, messages: int) -> int:
    """The largest credit an optimistic claim of ``messages`` may grant: none for a key rate
    (its buckets are per key) or with credits switched off (:data:`CREDIT_CLAIMS`)."""
    if not config.serialized or config.key_rate_limit is not None:
        return 0
    return messages * CREDIT_CLAIMS


def counted_queue(queue: str | None, connection: Any) -> str | None:
    """``queue`` if an ack of its leases on ``connection`` keeps its kept count
    (``sql.LEASES_ENDED_CTE``): its claims count leases, the last one here read the kept count
    (:class:`LeasesSeen`), and the ack is a transaction of its own (inside a caller's, the
    shard's row lock would hold the queue's claims until that ends)."""
    if queue is None or connection.in_atomic_block:
        return None
    if not LEASES_SEEN.keeps_count(connection.alias, queue):
        return None
    config = flow_config(queue)
    return queue if config is not None and config.counted else None


_LEASE_ANCHOR = "WITH exhausted AS ("
_RESULT_ANCHOR = "\nSELECT 'claimed' AS outcome"
_ORDER_ANCHOR = "\nORDER BY position"

#: The outcome of the marker row of an optimistic claim that had no room to spare.
CONTENDED = "contended"
#: The outcome of the marker row of a head-only claim that found messages to place.
PLACING = "placing"
#: The outcome of the marker row of a claim of a queue with a concurrency limit that tells
#: the leases in flight it saw (counted, or the kept count): see :class:`LeasesSeen`.
HELD = "held"
#: The outcomes of the marker rows of an optimistic claim that granted a claim credit: its
#: allowance, its end (microseconds since the epoch, database time). See :class:`CreditBook`.
CREDIT = "credit"
CREDIT_UNTIL = "credit_until"
MARKERS = frozenset({CONTENDED, PLACING, HELD, CREDIT, CREDIT_UNTIL})


@functools.cache
def claim_statement(
    shape: ClaimShape,
    optimistic: bool = False,
    queue_shards: bool = True,
    key_rate: bool = True,
    placing: bool = True,
    settings: SettingsLiterals = (),
    kept_count: bool = False,
    credit: bool = False,
) -> str:
    """The core's LEASE statement (reaper and all) wrapped in the flow-control CTEs.

    Built once per shape from ``sql.LEASE`` itself, so the claim proper (attempts, fencing
    token, burying exhausted leases, the row shape) stays the same as the plain claim's.
    Shapes: ``limits`` (queue-wide limits or rate: the plain claim order), ``fair_limits``
    (the fair order, queue-wide limits or rate), ``keyed`` (the fair order, key limits or
    rates too), ``fair`` (the fair order alone: no lock, no limits). ``optimistic`` (limits
    and rates): the variant run under the shared lock, which takes nothing and answers
    ``contended`` unless it has room to spare (see ``sql.py``). ``queue_shards`` /
    ``key_rate``: whether the claim saves the queue's shards (rate, lease count) / the
    keys' rate buckets (a statement
    without what a queue does not use runs with fewer plan nodes to set up). ``placing=False``
    (the fair order's shapes): the head-only claim, which places nothing and answers
    ``placing`` instead when messages wait to be placed (see ``sql.HEAD_CANDIDATE_CTES``).
    ``settings``: the queue's settings written in as literals (FlowConfig.settings_literals;
    claims always do); without them the statement takes them as parameters too.
    ``kept_count`` (optimistic): the queue's leases in flight read from the count its claims
    and acks keep instead of counted (see ``sql.py``, and :data:`KEPT_COUNT_BATCH`); it may
    grant a claim credit (``sql.SAVE_CREDIT_CTES``). ``credit`` (shape ``fair``, or
    ``limits`` for the plain claim order): a claim under a credit (``sql.CREDIT_COMMON_CTES``),
    after the shared lock, without counting anything.
    """
    if credit and (optimistic or shape not in ("fair", "limits")):
        raise ValueError("a claim under a credit takes the fair or the plain order as is")
    # Side by side (fairness alone, optimistic claims, claims under a credit), heads are
    # taken with SKIP LOCKED.
    head_lock = "FOR UPDATE SKIP LOCKED" if optimistic or credit or shape == "fair" else ""
    head_only = not placing and shape != "limits"
    # A head-only claim whose head is locked chose only locked rows: none to lock by id; and
    # unless some tenant may refuse a message (keyed), it chose the head as read. So does a
    # claim of the plain order under a credit (FLOW_QUEUE_CTES: the head, locked, numbered).
    all_locked = (head_only or (credit and shape == "limits")) and bool(head_lock)
    head_as_read = head_only and all_locked and shape != "keyed"
    if head_as_read:
        candidates = sql.LOCKED_HEAD_CANDIDATES
    else:
        candidates = sql.LOCKED_CANDIDATES if all_locked else sql.FLOW_CANDIDATES
    lease = sql.LEASE.format(
        candidates=candidates,
        reap_limit=sql.REAP_LIMIT,
        shared=sql.SHARED_COLUMNS,
        leased_columns=sql.leased_returning(),
        leased_order=sql.LEASED_OUT_OF_ORDER,
    ).strip()
    # LEASE's positional parameters are, in order: queue (reaper), worker id, visibility.
    names = iter(("%(queue)s", "%(worker_id)s", "%(visibility_timeout)s"))
    lease, count = re.subn(r"(?<!%)%s", lambda _: next(names), lease)
    if (
        count != 3
        or not lease.startswith(_LEASE_ANCHOR)
        or lease.count(_RESULT_ANCHOR) != 1
        or not lease.endswith(_ORDER_ANCHOR)
    ):
        raise RuntimeError("sql.LEASE changed shape; update core/flow_control.claim_statement")
    budget = sql.BUDGET_OPTIMISTIC_CTES if optimistic else sql.BUDGET_SERIALIZED_CTES
    if not optimistic:
        common = sql.FLOW_COMMON_CTES
    elif kept_count:
        common = sql.OPTIMISTIC_COMMON_CTES
    else:
        common = sql.OPTIMISTIC_COUNTING_COMMON_CTES
    head_locked = "true" if head_lock else "false"
    fair_candidates = (sql.HEAD_CANDIDATE_CTES if head_only else sql.FAIR_CANDIDATE_CTES).format(
        head_lock=head_lock, head_locked=head_locked
    )
    fair_choice = sql.HEAD_CHOICE_CTES if head_only else sql.FAIR_CHOICE_CTES
    save_state = sql.SAVE_STATE_OPTIMISTIC_CTES if optimistic else sql.SAVE_STATE_SERIALIZED_CTES
    save = [save_state] if queue_shards and shape != "fair" and not credit else []
    # An optimistic claim may grant a credit; its shard spends it (save_state reads it). Not
    # the keyed one: only a key rate claims optimistically with it, and gets no credits.
    grants = optimistic and shape in ("limits", "fair_limits")
    if grants:
        save.insert(0, sql.SAVE_CREDIT_CTES)
    elif optimistic:
        save.insert(0, sql.NO_GRANT_CTES)
    elif shape != "fair" and not credit:
        save.append(sql.END_OWN_CREDIT_CTES)
    if key_rate and shape == "keyed":
        save.append(sql.SAVE_KEY_BUCKETS_CTES)
    if shape == "limits":
        ctes = [sql.CREDIT_COMMON_CTES] if credit else [common, sql.NO_KEY_ROOM_CTES, budget]
        ctes.append(sql.FLOW_QUEUE_CTES.format(head_lock=head_lock, head_locked=head_locked))
    elif shape == "fair_limits":
        ctes = [common, sql.NO_KEY_ROOM_CTES, budget, sql.NO_REACH_CTES, fair_candidates]
    elif shape == "keyed":
        ctes = [common, sql.KEY_ROOM_CTES, budget, sql.REACH_CTES]
        ctes += [fair_candidates, sql.KEYED_CHOICE_CTES]
    else:
        budget = sql.CREDIT_COMMON_CTES if credit else sql.FAIR_ONLY_COMMON_CTES
        ctes = [sql.NO_REACH_CTES, budget, fair_candidates]
    if shape in ("fair_limits", "fair") and not head_as_read:
        ctes.append(fair_choice)
    if shape != "limits" and not head_only:
        save.append(sql.FAIR_SAVE_CTES)
    if not all_locked:
        ctes.append(sql.RELOCKED_CTES)
    lease = "WITH " + ",".join(ctes) + ",\n" + lease.removeprefix("WITH ")
    if save:
        lease = lease.replace(_RESULT_ANCHOR, "," + ",".join(save) + _RESULT_ANCHOR)
    # The answer of a claim that went no further (optimistic, no room): one marker row.
    marker = ", ".join(["NULL"] * (len(sql.LEASED_COLUMNS) + 1))
    markers = f"\nUNION ALL\nSELECT '{CONTENDED}', {marker}, 0 FROM budget WHERE contended"
    if head_only:
        markers += "\nUNION ALL" + sql.HEAD_ONLY_MARKERS.format(outcome=PLACING, nulls=marker)
    if shape != "fair" and not credit:
        markers += "\nUNION ALL" + sql.HELD_MARKER.format(outcome=HELD, nulls=marker)
    if grants:
        markers += "\nUNION ALL" + sql.CREDIT_MARKERS.format(
            outcome=CREDIT, until=CREDIT_UNTIL, nulls=marker
        )
    statement = lease.removesuffix(_ORDER_ANCHOR) + markers + _ORDER_ANCHOR
    return _substituted(statement, dict(settings))


def claim_params(
    config: FlowConfig,
    queue: str,
    worker_id: str,
    limit: int,
    vt: float,
    holder: str | None = None,
    credit_size: int = 0,
    credit_until: float | None = None,
) -> dict[str, Any]:
    """The named parameters of :func:`claim_statement`: an optimistic claim may grant
    ``holder`` a credit of up to ``credit_size`` messages; a claim under a credit goes ahead
    until ``credit_until`` (seconds since the epoch, database time)."""
    return {
        **config.settings_params,
        "queue": queue,
        "n": limit,
        "place_limit": limit + PLACE_SLACK,
        "worker_id": worker_id,
        "visibility_timeout": vt,
        "holder": holder,
        "credit_size": credit_size,
        "credit_until": credit_until,
    }


# The claim's parameters as a prepared statement's, in order, with their types: what changes
# from one claim to the next. What comes from the queue's settings is written into the
# statement as literals instead (``_SETTINGS_TYPES``, FlowConfig.settings_literals): the
# planner folds what they decide once (no rate: no bucket to read; no limit: nothing to
# count), and there is less to send, parse and bind on every claim.
_PARAM_TYPES = (
    ("queue", "text"),
    ("n", "int"),
    ("place_limit", "int"),
    ("worker_id", "text"),
    ("visibility_timeout", "float8"),
    ("holder", "text"),
    ("credit_size", "int"),
    ("credit_until", "float8"),
)

# The settings' parameters of :func:`claim_statement`, with the types of their literals.
_SETTINGS_TYPES = (
    ("queue_limit", "int"),
    ("rate", "float8"),
    ("burst", "float8"),
    ("weights", "jsonb"),
    ("key_limits", "jsonb"),
    ("key_limit", "int"),
    ("least_key_limit", "int"),
    ("key_rate", "float8"),
    ("key_burst", "float8"),
    ("window", "int"),
    ("tickets", "int"),
    ("margin", "int"),
    ("unplaced_window", "int"),
    ("recount", "float8"),
    ("counted", "boolean"),
    ("credit_window", "float8"),
)

#: ``(name, SQL literal)`` pairs written into a claim statement (``%`` doubled, as the
#: statement's own).
SettingsLiterals = tuple[tuple[str, str], ...]


def _literals(params: Mapping[str, Any]) -> SettingsLiterals:
    return tuple((name, _literal(params[name], t)) for name, t in _SETTINGS_TYPES)


def _literal(value: Any, sql_type: str) -> str:
    """A setting as a typed SQL literal for a ``%``-style statement."""
    if value is None:
        text = "NULL"
    elif sql_type == "int":
        text = str(int(value))
    elif sql_type == "boolean":
        text = "true" if value else "false"
    else:  # float8 and jsonb (already JSON text), quoted
        value = repr(float(value)) if sql_type == "float8" else str(value)
        text = "'" + value.replace("'", "''") + "'"
    return f"({text}::{sql_type})".replace("%", "%%")


# The same types as the driver path names them; the arguments of an ``EXECUTE``.
_DRIVER_TYPES = tuple(sql_type for _, sql_type in _PARAM_TYPES)
_ARGUMENTS = ", ".join(f"%({name})s" for name, _ in _PARAM_TYPES)


@functools.cache
def numbered_claim(
    shape: ClaimShape, optimistic: bool = False, *saves: bool, **variant: Any
) -> str:
    """:func:`claim_statement` (``variant``: its keyword arguments) with ``$n`` parameters in
    ``_PARAM_TYPES`` order (``%%`` kept)."""
    return _numbered(claim_statement(shape, optimistic, *saves, **variant), _PARAM_TYPES)


def _numbered(statement: str, param_types: tuple[tuple[str, str], ...]) -> str:
    """``statement``'s ``%(name)s`` parameters as ``$n``, in ``param_types`` order."""
    index = {name: f"${n}" for n, (name, _) in enumerate(param_types, 1)}
    return _substituted(statement, index)


# A ``%``-style statement's placeholders; ``%%`` (a literal ``%``) is matched first so that
# nothing inside it is taken for one.
_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s")


def _substituted(statement: str, values: Mapping[str, str]) -> str:
    """``statement`` with its ``%(name)s`` placeholders for the names in ``values`` replaced,
    in one pass: what a replacement brings in is never read as a placeholder."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1) or "", m.group()), statement)


@functools.cache
def prepared_claim(
    shape: ClaimShape, optimistic: bool = False, *saves: bool, **variant: Any
) -> tuple[str, str]:
    """``(name, PREPARE statement)`` of :func:`claim_statement` (``variant``: its keyword
    arguments) with ``$n`` parameters."""
    body = numbered_claim(shape, optimistic, *saves, **variant).replace("%%", "%")
    digest = hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:12]
    kind = ("_optimistic" if optimistic else "") + ("_kept" if variant.get("kept_count") else "")
    kind += "_credit" if variant.get("credit") else ""
    kind += "" if variant.get("placing", True) else "_head"
    name = f"pgq_flow_{shape}{kind}_{digest}"
    types = ", ".join(sql_type for _, sql_type in _PARAM_TYPES)
    return name, f"PREPARE {name} ({types}) AS {body}"


# The lock statements' parameters, in order, with their types.
_LOCK_PARAM_TYPES = (("queue", "text"), ("lock_class", "int"), ("tickets", "int"))


_LOCK_DRIVER_TYPES = tuple(sql_type for _, sql_type in _LOCK_PARAM_TYPES)


@functools.cache
def _lock_body(lock: str) -> str:
    """A lock statement with ``$n`` parameters in ``_LOCK_PARAM_TYPES`` order."""
    return _numbered(lock.strip().rstrip(";"), _LOCK_PARAM_TYPES)


@functools.cache
def prepared_lock(lock: str) -> tuple[str, str, str]:
    """``(name, PREPARE statement, EXECUTE text)`` of a lock statement (``sql.FLOW_LOCK`` or
    ``sql.FLOW_LOCK_SHARED``): planned once per session, as the claim."""
    body = _lock_body(lock)
    digest = hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:12]
    name = f"pgq_flow_lock_{digest}"
    types = ", ".join(sql_type for _, sql_type in _LOCK_PARAM_TYPES)
    arguments = ", ".join(f"%({p})s" for p, _ in _LOCK_PARAM_TYPES)
    return name, f"PREPARE {name} ({types}) AS {body}", f"EXECUTE {name}({arguments});\n"


class PlacingSchedule:
    """Which claims of a fair queue place messages in its fair order, in this process.

    Placing (due again, written without a place: ``sql.FAIR_CANDIDATE_CTES``) costs a third
    of a fair claim's time whether or not anything waits, so the other claims read the head
    of the order alone (``sql.HEAD_CANDIDATE_CTES``), whose probes find what is due again in
    the database and ask for a placing claim at once. What they do not look for, rows written
    without a place while the order has a head to serve, waits for the first claim of each
    ``interval``, which places. After a claim found messages waiting, every claim places for
    an ``interval`` (a stream of retries would otherwise cost two claims each). The clock only
    paces this choice; what is due is decided by database time.
    """

    def __init__(
        self, interval: float = PLACING_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        # (alias, queue) -> (every claim places until, the next placing claim at)
        self._times: dict[tuple[str, str], tuple[float, float]] = {}

    def placing_now(self, alias: str, queue: str) -> bool:
        now = self.clock()
        every_claim_until, next_at = self._times.get((alias, queue), (0.0, 0.0))
        if now < every_claim_until:
            return True
        if now >= next_at:
            self._times[(alias, queue)] = (every_claim_until, now + self.interval)
            return True
        return False

    def found_waiting(self, alias: str, queue: str) -> None:
        now = self.clock()
        self._times[(alias, queue)] = (now + self.interval, now + 2 * self.interval)

    def reset(self) -> None:
        self._times.clear()


PLACING_SCHEDULE = PlacingSchedule()


def claim_with_flow_control(
    config: FlowConfig,
    queue: str,
    worker_id: str,
    limit: int,
    vt: float,
    alias: str,
    hold: bool = False,
) -> list[Any]:
    """Lease up to ``limit`` messages of ``queue`` within its fairness and limits: the
    claim's rows, as the plain claim's (``MessageManager`` makes them messages).

    Outside a transaction (``lease()``'s default), the lock and the claim go to the server as
    one query string (on a worker's claim session, one pipeline of two Bind/Executes), which
    runs as one transaction: the queue's lock is held only while the server runs the claim,
    never across a round trip to this process. A queue with limits is first claimed
    optimistically (shared lock, see ``sql.py``); only when that finds no room to spare is it
    claimed serialized, in a second round trip. A fair queue's claim
    reads the head of the fair order alone unless messages wait to be placed in it
    (:class:`PlacingSchedule`); when they do, the placing claim follows in another round trip.
    The claim is a session-level prepared statement (planning it costs more than running
    it), whatever the connection's ``prepare_threshold``. Inside a transaction (``hold=True``)
    the claim is serialized, places, and holds the lock until that transaction ends; ``hold``
    itself is implied by the connection's transaction state.
    """
    in_transaction = connections[alias].in_atomic_block
    placing = not config.keyed or in_transaction or PLACING_SCHEDULE.placing_now(alias, queue)
    rows = _claim_within_limits(config, queue, worker_id, limit, vt, alias, placing)
    if placing or not any(row[0] == PLACING for row in rows):
        return rows
    # The head-only claim took nothing: messages wait to be placed. What its reaper buried
    # is reported all the same.
    PLACING_SCHEDULE.found_waiting(alias, queue)
    buried = [row for row in rows if row[0] not in MARKERS]
    return buried + _claim_within_limits(config, queue, worker_id, limit, vt, alias, True)


def _claim_within_limits(
    config: FlowConfig,
    queue: str,
    worker_id: str,
    limit: int,
    vt: float,
    alias: str,
    placing: bool,
) -> list[Any]:
    """One claim: optimistic then serialized if need be (limits), serialized, or without a
    lock (fairness alone); each on the driver on a worker's claim session (see ``_claim``)."""
    connection = connections[alias]
    optimistic = limit <= OPTIMISTIC_BATCH
    if config.serialized and optimistic and not connection.in_atomic_block:
        size = credit_size(config, limit)
        params = claim_params(config, queue, worker_id, limit, vt, CREDITS.holder(connection), size)
        buried: list[Any] = []
        credit = CREDITS.usable(connection, queue, limit) if size else None
        if credit is not None:
            rows = _claim_under_credit(connection, alias, config, params, credit, placing)
            if not any(row[0] == CONTENDED for row in rows):
                CREDITS.spent(connection, queue, sum(row[0] == "claimed" for row in rows))
                return rows
            # The credit ended (or no ticket was free): claim optimistically, which may
            # grant another one.
            buried = [row for row in rows if row[0] not in MARKERS]
        # This claim replaces or ends the session's credit in the database (whether or not
        # its answer arrives): the session never claims under the old one again.
        CREDITS.drop(connection, queue)
        shape = config.optimistic_shape
        rows = _claim(connection, alias, config, shape, True, sql.FLOW_LOCK_SHARED, params, placing)
        rows = CREDITS.noted(connection, queue, rows)
        if not any(row[0] == CONTENDED for row in rows):
            return buried + rows
        # No room to spare: count exactly, one claim at a time (what the reaper buried in
        # the optimistic attempt is reported all the same).
        buried += [row for row in rows if row[0] not in MARKERS]
        return buried + _claim(
            connection, alias, config, config.shape, False, sql.FLOW_LOCK, params, placing
        )
    params = claim_params(config, queue, worker_id, limit, vt)
    lock = sql.FLOW_LOCK if config.serialized else ""
    return _claim(connection, alias, config, config.shape, False, lock, params, placing)


def _claim_under_credit(
    connection: Any,
    alias: str,
    config: FlowConfig,
    params: dict[str, Any],
    credit: Credit,
    placing: bool,
) -> list[Any]:
    """A claim under the session's credit, after the queue's shared lock and a ticket
    (``sql.CREDIT_COMMON_CTES``): the head of the fair order (or of the plain claim order,
    for a queue without fairness or key limits) as is, without counting anything;
    ``contended`` when the credit ended."""
    params = {**params, "credit_until": credit.until}
    variant = {"placing": placing, "settings": config.settings_literals, "credit": True}
    shape: ClaimShape = "fair" if config.keyed else "limits"
    saves = (False, False)
    return _send_claim(
        connection, alias, shape, False, saves, variant, sql.FLOW_LOCK_SHARED, params
    )


def _claim(
    connection: Any,
    alias: str,
    config: FlowConfig,
    shape: ClaimShape,
    optimistic: bool,
    lock: str,
    params: dict[str, Any],
    placing: bool = True,
) -> list[Any]:
    """One claim statement after ``lock``, in one implicit transaction (or the caller's);
    a queue with a concurrency limit's ``held`` marker row noted (:class:`LeasesSeen`)."""
    # What the claim saves: the queue's shards (a rate, a lease count), the keys' buckets.
    saves = (config.rate_limit is not None or config.counted, config.key_rate_limit is not None)
    # An optimistic claim may read the kept count of leases instead of counting them.
    queue = params["queue"]
    kept = optimistic and config.counted and LEASES_SEEN.reads_kept_count(alias, queue, params["n"])
    variant = {"placing": placing, "settings": config.literals(optimistic), "kept_count": kept}
    rows = _send_claim(connection, alias, shape, optimistic, saves, variant, lock, params)
    return LEASES_SEEN.noted(alias, queue, rows, kept) if config.counted else rows


def _send_claim(
    connection: Any,
    alias: str,
    shape: ClaimShape,
    optimistic: bool,
    saves: tuple[bool, bool],
    variant: dict[str, Any],
    lock: str,
    params: dict[str, Any],
) -> list[Any]:
    """The claim statement of ``shape`` and ``variant`` after ``lock``: on the driver on a
    worker's claim session, else a session-prepared statement through Django's cursor."""
    name, prepare = prepared_claim(shape, optimistic, *saves, **variant)
    statement = claim_statement(shape, optimistic, *saves, **variant)
    arguments = _ARGUMENTS
    also: tuple[tuple[str, str], ...] = ()
    execute_lock = ""
    if lock:
        lock_name, lock_prepare, execute_lock = prepared_lock(lock)
        also = ((lock_name, lock_prepare),)
    # driver_path first: its health check may replace the connection with a fresh one.
    if driver_path(connection) and is_claim_session(connection) and (not lock or can_pipeline()):
        # A worker's claim session runs under the claim's settings already: the lock's and
        # the claim's Bind/Execute go straight to the driver, one pipeline, one round trip
        # (with a libpq too old for pipelines, through Django's cursor below).
        first: DriverStatement | None = None
        if lock:
            lock_params = [params[p] for p, _ in _LOCK_PARAM_TYPES]
            first = ("flow_lock", _lock_body(lock), _LOCK_DRIVER_TYPES, lock_params)
        rows = run_on_driver(
            connection,
            kind=f"flow_{shape}",
            statement=numbered_claim(shape, optimistic, *saves, **variant),
            types=_DRIVER_TYPES,
            params=[params[p] for p, _ in _PARAM_TYPES],
            typed_rows=True,
            first=first,
        )
        if rows is not None:
            return rows
    with connection.cursor() as cursor:
        if not can_prepare(connection, cursor):
            with transaction.atomic(using=alias, savepoint=False):
                _execute_each(cursor, (lock, statement), params)
                rows = cursor.fetchall()
            return rows
        # Like the plain claim: may commit without waiting for the WAL flush (a crash
        # forgets the lease, and with it the slot, together).
        plan = {"plan_cache_mode": "force_generic_plan", **NO_SEQSCAN, **async_commit()}
        prefix = set_local(plan)
        rows = run_prepared(
            cursor,
            connection,
            name=name,
            prepare=prepare,
            prefix=prefix + execute_lock,
            arguments=arguments,
            params=params,
            reuse_text=True,
            also=also,
        )
        if rows is None:
            execute_all(cursor, prefix + lock + statement, params)
            rows = cursor.fetchall()
    return rows


def _execute_each(cursor: Any, statements: Sequence[str], params: dict[str, Any]) -> None:
    """Run ``statements`` (each one whole statement, or empty), leaving the cursor on the last
    one's result: in one round trip with client-side binding, else one by one (server-side
    binding takes a single statement per query). They come as a list, never split from one
    text: their comments and literals may hold a ``;``."""
    parts = [part for part in statements if part.strip()]
    if isinstance(cursor.cursor, psycopg.ClientCursor):
        execute_all(cursor, "".join(parts), params)
        return
    for part in parts:
        cursor.execute(part, params)
