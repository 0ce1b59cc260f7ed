"""Every hot-path SQL statement, named and kept readable in one place.

Rules these follow:
- database time only (``now()`` is the transaction's start; claims are short transactions);
- each move between the live, archive and dead tables is ONE statement
  (``WITH moved AS (DELETE ... RETURNING ...) INSERT ...``), so a crash cannot leave a
  message in two tables or in none;
- completions and failures are fenced by ``(id, lease_token)`` pairs: a worker whose lease
  expired and was taken over changes nothing;
- batch inputs travel as arrays through ``unnest``: one round trip for N messages.
"""

from __future__ import annotations

# Columns every table shares (see models.MessageFields).
SHARED_COLUMNS = (
    "queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors"
)

# Columns ``lease()`` returns, in this order (core/manager.py builds Message objects from them).
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
)
# Not returned by a claim: ``errors`` and ``last_error`` can hold long tracebacks that a
# handler does not need; reading them on a leased Message loads them lazily.

# Leased timestamps travel as integer microseconds since the epoch: parsing three timestamptz
# texts per row costs a worker more than the rest of the row (manager.py rebuilds them).
LEASED_TIMESTAMPS = ("enqueued_at", "available_at", "leased_at")


# Python's datetime range, a day inside: a value stored beyond it (written by SQL: 'infinity',
# year 275817) is read as the nearest bound rather than failing every claim of its queue.
_LOADABLE_TIME = "LEAST(GREATEST({}, '0001-01-02+00'::timestamptz), '9999-12-30+00'::timestamptz)"


def leased_returning(alias: str = "m") -> str:
    """The claim's ``RETURNING`` list of :data:`LEASED_COLUMNS`."""
    return ", ".join(
        f"(extract(epoch FROM {_LOADABLE_TIME.format(f'{alias}.{c}')}) * 1000000)::int8"
        if c in LEASED_TIMESTAMPS
        else f"{alias}.{c}"
        for c in LEASED_COLUMNS
    )


# Made available at the same instant as ``enqueued_at`` (its default): ``now()`` is the
# transaction's start, which comes before the statement's in an extended-protocol round trip.
_ENQUEUE_INSERT = """
INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at)
VALUES
    (%s, %s, %s::jsonb, %s, %s, %s, %s,
     COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s)))
"""
_ENQUEUE_RETURNING = "RETURNING id, enqueued_at, available_at"
_ON_DEDUP_KEY_CONFLICT = "ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"

# One insert. ON CONFLICT only when the message has a dedup key: with it Postgres inserts
# speculatively (an extra WAL record and a recheck per row), even for rows the partial unique
# index does not cover.
ENQUEUE = f"{_ENQUEUE_INSERT}{_ENQUEUE_RETURNING}\n"
ENQUEUE_DEDUP = f"{_ENQUEUE_INSERT}{_ON_DEDUP_KEY_CONFLICT}\n{_ENQUEUE_RETURNING}\n"


def enqueue_and_notify(insert: str) -> str:
    """``insert`` with the wake-up folded in: Postgres delivers it only on commit and merges
    identical notifications of one transaction, so N enqueues in one transaction send one."""
    return f"""
WITH inserted AS ({insert})
SELECT id, enqueued_at, available_at, pg_notify(%s, %s) FROM inserted
"""


ENQUEUE_AND_NOTIFY = enqueue_and_notify(ENQUEUE)
ENQUEUE_DEDUP_AND_NOTIFY = enqueue_and_notify(ENQUEUE_DEDUP)


# A message's place when it enters its queue's fair order (see FAIR_CANDIDATE_CTES): max(the
# head of the order, the tenant's newest place + its step). Three index probes; the third only
# for messages without a tenant (a one-time filter skips it otherwise).
FAIR_ORDER_ENTRY = """GREATEST(
    COALESCE((SELECT h.fair_order FROM pgqueue_message h
              WHERE h.queue = {queue} AND h.priority = {priority} AND h.fair_order >= 0
              ORDER BY h.fair_order LIMIT 1), 0),
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE t.queue = {queue} AND t.tenant = {tenant} AND t.priority = {priority}
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE {tenant} IS NULL AND t.queue = {queue} AND t.tenant IS NULL
       AND t.priority = {priority} AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1))"""


# Enqueue into a fair queue: the message takes its place in the fair order at once when it is
# ready, -1 (outside the order until it falls due) when scheduled. Parameters as ENQUEUE's,
# then the tenant's step (1 / weight).
_ENTRY_OF_V = FAIR_ORDER_ENTRY.format(
    queue="v.queue", priority="v.priority", tenant="v.tenant", step="v.step"
)


def enqueue_fair(insert_suffix: str) -> str:
    return f"""
INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at, fair_order)
SELECT v.queue, v.task, v.payload::jsonb, v.priority, v.tenant, v.dedup_key, v.max_attempts,
       v.available_at,
       CASE WHEN v.available_at <= statement_timestamp() THEN {_ENTRY_OF_V} ELSE -1 END
FROM (SELECT %s::text AS queue, %s::text AS task, %s::text AS payload,
             %s::smallint AS priority, %s::text AS tenant, %s::text AS dedup_key,
             %s::int AS max_attempts,
             COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s::float8))
                 AS available_at,
             %s::float8 AS step) v
{insert_suffix}"""


ENQUEUE_FAIR = enqueue_fair(_ENQUEUE_RETURNING)

ENQUEUE_FAIR_DEDUP = enqueue_fair(f"{_ON_DEDUP_KEY_CONFLICT}\n{_ENQUEUE_RETURNING}")
ENQUEUE_FAIR_AND_NOTIFY = enqueue_and_notify(ENQUEUE_FAIR)
ENQUEUE_FAIR_DEDUP_AND_NOTIFY = enqueue_and_notify(ENQUEUE_FAIR_DEDUP)

FIND_BY_DEDUP_KEY = """
SELECT id, enqueued_at, available_at FROM pgqueue_message WHERE queue = %s AND dedup_key = %s
"""

ENQUEUE_MANY_UNNEST = """
INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at, fair_order)
SELECT queue, task, payload::jsonb, priority, tenant, dedup_key, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), fair_order
FROM unnest(%s::text[], %s::text[], %s::text[], %s::smallint[], %s::text[], %s::text[],
            %s::int[], %s::timestamptz[], %s::float8[], %s::float8[])
     AS t(queue, task, payload, priority, tenant, dedup_key, max_attempts, run_at, delay,
          fair_order)
ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
"""

ENQUEUE_MANY_COPY = """
COPY pgqueue_message (queue, task, payload, priority, tenant, max_attempts, available_at)
FROM STDIN
"""
ENQUEUE_MANY_COPY_FAIR = """
COPY pgqueue_message
    (queue, task, payload, priority, tenant, max_attempts, available_at, fair_order)
FROM STDIN
"""

# When a bulk enqueue into a fair queue becomes available, and the first message's place in
# the fair order (-1 when scheduled); the others follow it a step apart.
FAIR_ORDER_OF_BULK = f"""
SELECT v.available_at,
       CASE WHEN v.available_at <= statement_timestamp() THEN {_ENTRY_OF_V} ELSE -1 END
FROM (SELECT %(queue)s::text AS queue, %(priority)s::smallint AS priority,
             %(tenant)s::text AS tenant, %(step)s::float8 AS step,
             COALESCE(%(run_at)s::timestamptz,
                      statement_timestamp() + make_interval(secs => %(delay)s::float8))
                 AS available_at) v
"""

NOTIFY_QUEUES = "SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS q(queue)"

#: Exhausted leases one claim (plain or flow-controlled) buries at most: keeps it short.
REAP_LIMIT = 100

# The claim. ``{candidates}`` is the ORM's ``select_for_update(skip_locked=True)`` query from
# ``MessageManager.lease`` (it selects ``id, lease_token``); ``{reap_limit}`` bounds the reaper;
# ``{leased_order}`` is a leased message's ``fair_order``: -1 (out of the fair order while
# leased) in a fair queue's claim, else LEASED_ORDER.
# One statement does both jobs:
#   1. the reaper, for leases that ran out on their last attempt: attempts count at claim, so
#      a message that kills its worker every time is buried here (reason ``lease_expired``),
#      not run in a loop; but a lease that gives its attempt back on expiry (below) gets it
#      back here instead, and runs again;
#   2. leases the batch: attempts + 1 (+ 0 after a lease that gives its attempt back), a
#      fresh fencing token, visible again after the timeout.
# Rows come back tagged ``claimed`` or ``buried`` so the caller can log both.
#
# The attempt rule. A worker's claim session sets ``pgqueue.refund_on_expiry``
# (execution.dedicate_to_claims): its leases are marked ``refund_on_expiry``, and a lease so
# marked that expires gives its attempt back. A worker runs a redelivered message (its
# previous lease expired) alone, and clears the mark in a committed statement just before
# its handler starts (transitions.start_alone). So when a worker dies, only a message whose
# handler was running alone has spent an attempt: the batch-mates it had leased, started or
# not, have not. Any other claim (``lease()`` called by your code) leaves the mark off: every
# claim counts, as it always did.
LEASE = """
WITH exhausted AS (
    SELECT id, refund_on_expiry AND lease_token IS NOT NULL AS refund FROM pgqueue_message
    WHERE queue = %s AND attempts >= max_attempts AND available_at <= now()
    ORDER BY available_at
    LIMIT {reap_limit}
    FOR UPDATE SKIP LOCKED
), refunded AS (
    -- Keeps its lease token: the next claim sees it redelivered (and the worker runs it
    -- alone), and counts that attempt again.
    UPDATE pgqueue_message m SET attempts = m.attempts - 1, refund_on_expiry = false
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE refund))
), reaped AS (
    DELETE FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE NOT refund))
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead (message_id, {shared}, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts,
           errors || jsonb_build_array(jsonb_build_object(
               'attempt', attempts, 'at', now(), 'started_at', leased_at, 'worker', leased_by,
               'type', 'LeaseExpired',
               'message', 'the lease expired before the worker finished (crash or timeout)')),
           'lease_expired',
           jsonb_build_object(
               'type', 'LeaseExpired',
               'message', format('lease taken by %%s at %%s expired on the last attempt (%%s of %%s)',
                                 leased_by, leased_at, attempts, max_attempts),
               'traceback', ''),
           leased_by, now()
    FROM reaped
    RETURNING message_id, queue, task, attempts, worker_id
), candidates AS (
    {candidates}
), numbered AS (
    -- The claim order, kept: an UPDATE ... FROM returns its rows in join order.
    SELECT id, lease_token, row_number() OVER () AS position FROM candidates
), claimed AS (
    UPDATE pgqueue_message m
    -- (SET reads the row as it was: ``m.lease_token`` is the expired lease's, if any.)
    SET attempts = m.attempts
                   + CASE WHEN m.refund_on_expiry AND m.lease_token IS NOT NULL THEN 0 ELSE 1 END,
        refund_on_expiry = COALESCE(current_setting('pgqueue.refund_on_expiry', true) = 'on',
                                    false),
        lease_token = gen_random_uuid(),
        leased_by = %s,
        leased_at = now(),
        available_at = now() + make_interval(secs => %s),
        fair_order = {leased_order}
    FROM numbered c
    -- The rows by primary key, an index condition whatever the plan: joined on ``m.id =
    -- c.id`` alone, a generic plan made while the table was small hash-joins the batch
    -- against a walk of the whole primary key, O(table) per claim once a backlog arrives.
    WHERE m.id = ANY(ARRAY(SELECT id FROM numbered)) AND m.id = c.id
    -- Re-checked on the row version this statement locked: a lease committed by another
    -- worker meanwhile is never taken over, whatever plan found the candidate. Written so
    -- that it does not imply the partial claim index's predicate: a plan made while the
    -- table was small would otherwise look each row up by walking that index.
      AND m.available_at <= statement_timestamp() AND m.attempts - m.max_attempts < 0
    RETURNING {leased_columns}, c.lease_token IS NOT NULL AS redelivered, c.position
)
SELECT 'claimed' AS outcome, claimed.* FROM claimed
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0
FROM buried
ORDER BY position
"""

# LEASE's ``{candidates}`` in a plain claim walked from a lower bound on ``available_at``
# (core/claim_bound.py): the claim order of ``MessageManager.claimable``, and the bound an
# index condition of the claim index, so that the entries below it are passed over without a
# visit to the heap. Parameters: the queue, the bound (seconds since the epoch), the queue.
CANDIDATES_FROM = """SELECT id, lease_token FROM pgqueue_message
    WHERE queue = %s AND attempts < max_attempts
      AND available_at >= to_timestamp(%s::float8) AND available_at <= statement_timestamp()
      AND NOT EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %s AND q.paused)
    ORDER BY priority DESC, available_at, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED"""

# A leased message's ``fair_order``: -1 in flow-controlled claims (out of any fair order, and
# counted in flight: see FLOW_COMMON_CTES); in plain claims -1 only for a row that had a place
# (its queue was fair), others stay NULL.
LEASED_ORDER = "CASE WHEN m.fair_order IS NULL THEN NULL ELSE -1 END"
LEASED_OUT_OF_ORDER = "-1"

# Acks of a queue whose claims count its leases (flow_control.FlowConfig.counted): the
# CTE that takes the flow leases they end (``fair_order`` < 0) away from the queue's count,
# in the shard of this backend (see "Flow control" below). ``{ended}``: the acked rows.
# Parameters: the queue, twice.
LEASES_ENDED_CTE = """, uncounted AS (
    UPDATE pgqueue_flow_rate_shard b SET held = b.held - e.n
    FROM (SELECT count(*)::int AS n FROM {ended} WHERE queue = %s AND fair_order < 0) e
    WHERE b.queue = %s AND b.shard = 1 + {tickets} + pg_backend_pid() %% {tickets} AND e.n > 0
)"""


def counting_ack(statement: str, anchor: str, ended: str, tickets: int) -> str:
    """``statement`` (an ack) with LEASES_ENDED_CTE after its CTE ending in ``anchor``."""
    cte = LEASES_ENDED_CTE.format(ended=ended, tickets=tickets)
    if statement.count(anchor) != 1:
        raise RuntimeError("an ack statement changed shape; update sql.counting_ack")
    return statement.replace(anchor, anchor + cte)


# Completed -> archive, fenced by lease token. Results travel as JSON text (NULL allowed).
COMPLETE = f"""
WITH done AS (
    DELETE FROM pgqueue_message m
    USING unnest(%s::bigint[], %s::uuid[], %s::text[]) AS d(id, token, result)
    WHERE m.id = d.id AND m.lease_token = d.token
    RETURNING m.*, d.result
)
INSERT INTO pgqueue_archive
    (message_id, {SHARED_COLUMNS}, started_at, finished_at, worker_id, result)
SELECT id, {SHARED_COLUMNS}, leased_at, now(), leased_by, result::jsonb
FROM done
RETURNING message_id
"""

# A failed attempt: back off while attempts remain (and the failure is retryable), else
# bury with its reason. Fenced by lease token; ``delay`` is seconds added to database time.
FAIL = f"""
WITH input AS (
    SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::text[], %s::text[], %s::float8[])
        AS i(id, token, error, final_reason, delay)
), target AS (
    -- Each error records when its attempt started and failed (database time), unless the
    -- caller set them: the Tasks backend reports a task's first start from this history.
    SELECT m.id, m.queue, m.fair_order,
           jsonb_build_object('started_at', m.leased_at, 'at', now()) || i.error::jsonb AS error,
           -- A message flagged by cancel() while it ran is never retried.
           CASE WHEN m.cancel_requested_at IS NULL THEN i.final_reason ELSE 'cancelled' END
               AS final_reason,
           i.delay,
           (i.delay IS NOT NULL AND m.attempts < m.max_attempts
            AND m.cancel_requested_at IS NULL) AS retry
    FROM pgqueue_message m JOIN input i ON m.id = i.id AND m.lease_token = i.token
    FOR UPDATE OF m
), retried AS (
    UPDATE pgqueue_message m
    SET available_at = now() + make_interval(secs => t.delay),
        lease_token = NULL, leased_by = NULL, leased_at = NULL,
        last_error = t.error,
        errors = m.errors || jsonb_build_array(t.error)
    FROM target t
    WHERE m.id = t.id AND t.retry
    RETURNING m.id
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = t.id AND NOT t.retry
    RETURNING m.*, t.error, t.final_reason
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts, errors || jsonb_build_array(error), final_reason, error, leased_by, now()
    FROM removed
    RETURNING message_id
)
SELECT id, 'retried' FROM retried
UNION ALL
SELECT message_id, 'buried' FROM buried
"""

# Lengthen (or shorten) a lease: PGMQ's set_vt, fenced by lease token. Also tells which of
# them cancel() flagged meanwhile (the worker's heartbeat passes that on to the handlers).
EXTEND = """
UPDATE pgqueue_message m
SET available_at = now() + make_interval(secs => %s)
FROM unnest(%s::bigint[], %s::uuid[]) AS l(id, token)
WHERE m.id = l.id AND m.lease_token = l.token
RETURNING m.id, m.cancel_requested_at IS NOT NULL
"""

# A worker starts the handler of a redelivered message alone (worker/executor.py): from this
# statement's commit on, the lease no longer gives its attempt back if it expires (see "The
# attempt rule" above). Fenced by lease token.
START_ALONE = """
UPDATE pgqueue_message SET refund_on_expiry = false
WHERE id = %s AND lease_token = %s
RETURNING id
"""

# Give leases back so the messages run again at once (graceful shutdown past its grace
# period). ``reset_attempt`` takes back the attempt counted at claim: it was not a failure.
RELEASE = """
WITH released AS (
    UPDATE pgqueue_message m
    SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL,
        attempts = CASE WHEN %s THEN GREATEST(m.attempts - 1, 0) ELSE m.attempts END
    FROM unnest(%s::bigint[], %s::uuid[]) AS l(id, token)
    WHERE m.id = l.id AND m.lease_token = l.token
    RETURNING m.id, m.queue, m.fair_order
)
SELECT id FROM released
"""

# Operator: release leases by id, whoever holds them (a stuck worker).
RELEASE_BY_ID = """
UPDATE pgqueue_message
SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL
WHERE id = ANY(%s) AND lease_token IS NOT NULL
RETURNING id, queue
"""

# Operator: a scheduled or backing-off (not leased) message becomes available now.
RETRY_NOW = """
UPDATE pgqueue_message SET available_at = now()
WHERE id = ANY(%s) AND lease_token IS NULL AND available_at > now()
RETURNING id, queue
"""

# Operator: dead -> live with attempts reset, keeping the message id. Concurrent retries of
# one message: the DELETE locks the row, so exactly one of them moves it. A dead message whose
# dedup key is taken by a live one stays dead (reported, never dropped).
RETRY_DEAD = f"""
WITH revived AS (
    DELETE FROM pgqueue_dead d
    WHERE d.message_id = ANY(%s)
      AND NOT EXISTS (
          SELECT 1 FROM pgqueue_message m
          WHERE m.queue = d.queue AND m.dedup_key = d.dedup_key)
    RETURNING d.*
)
INSERT INTO pgqueue_message (id, {SHARED_COLUMNS}, available_at)
SELECT message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, 0,
       max_attempts, errors, now()
FROM revived
RETURNING id, queue
"""

# Operator: live -> dead with reason ``discarded``.
DISCARD = f"""
WITH removed AS (
    DELETE FROM pgqueue_message WHERE id = ANY(%s) RETURNING *
)
INSERT INTO pgqueue_dead (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
SELECT id, {SHARED_COLUMNS}, 'discarded',
       jsonb_build_object('type', 'Discarded', 'message', %s, 'traceback', ''),
       leased_by, now()
FROM removed
RETURNING message_id
"""

# cancel(): a message no worker holds (never leased, backing off, or its lease expired) goes
# to dead with reason ``cancelled``; one a worker holds is flagged for its handler to see.
# One statement: the row lock taken by ``target`` orders it against a concurrent claim.
CANCEL = f"""
WITH target AS (
    SELECT id, (lease_token IS NOT NULL AND available_at > now()) AS held
    FROM pgqueue_message WHERE id = ANY(%s)
    FOR UPDATE
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = t.id AND NOT t.held
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
    SELECT id, {SHARED_COLUMNS}, 'cancelled',
           jsonb_build_object('type', 'Cancelled', 'message', %s, 'traceback', ''),
           leased_by, now()
    FROM removed
    RETURNING message_id
), flagged AS (
    UPDATE pgqueue_message m
    SET cancel_requested_at = COALESCE(m.cancel_requested_at, now())
    FROM target t
    WHERE m.id = t.id AND t.held
    RETURNING m.id
)
SELECT message_id, 'cancelled' FROM buried
UNION ALL
SELECT id, 'flagged' FROM flagged
"""

# Operator: a copy of an archived message as a new live message (new id, no dedup key).
REQUEUE_ARCHIVED = """
INSERT INTO pgqueue_message (queue, task, payload, priority, tenant, max_attempts)
SELECT queue, task, payload, priority, tenant, max_attempts
FROM pgqueue_archive WHERE id = ANY(%s)
ORDER BY id
RETURNING id, queue
"""

PURGE_QUEUE = "DELETE FROM pgqueue_message WHERE queue = %s"

# Distinct queues holding live messages, as a skip scan over the claim index:
# O(number of queues) index probes instead of a scan of the backlog.
LIVE_QUEUES = """
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM pgqueue_message WHERE attempts < max_attempts ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT m.queue FROM pgqueue_message m
            WHERE m.queue > q.queue AND m.attempts < m.max_attempts
            ORDER BY m.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
"""

# When the next message of one queue falls due, for the idle worker's sleep. A skip scan
# over the priorities of the claim index, then one probe per priority: O(priorities), not a
# scan of everything scheduled. Leased rows count too: their lease expiry is when they may
# be redelivered. The answer is seconds from now (a float, ``Infinity`` for 'infinity'), not
# a timestamp: a stored time past the year 9999 is no Python datetime, and must not stop the
# worker that reads it.
NEXT_DUE_AT = """
WITH RECURSIVE p(priority) AS (
    (SELECT priority FROM pgqueue_message
     WHERE queue = %(queue)s AND attempts < max_attempts
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT m.priority FROM pgqueue_message m
            WHERE m.queue = %(queue)s AND m.attempts < m.max_attempts AND m.priority < p.priority
            ORDER BY m.priority DESC LIMIT 1)
    FROM p WHERE p.priority IS NOT NULL
)
SELECT (extract(epoch FROM min((SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = %(queue)s AND m.attempts < m.max_attempts
              AND m.priority = p.priority AND m.available_at > now()
            ORDER BY m.priority DESC, m.available_at LIMIT 1)))
        - extract(epoch FROM now()))::float8
FROM p WHERE p.priority IS NOT NULL
"""

SET_PAUSED = """
INSERT INTO pgqueue_queue (name, paused, updated_at) VALUES (%s, %s, now())
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
"""

# --- Flow control (core/flow_control.py): fairness, concurrency and rate limits -------------
# Only queues that opt in run these. A flow-controlled claim is LEASE (above) with the FLOW_*
# common table expressions prepended and appended (flow_control.claim_statement builds it),
# in one round trip and one short transaction, after the queue's lock taken in a statement of
# its own: under READ COMMITTED each statement takes a new snapshot, so the claim then sees
# everything committed before the lock was granted.
#
# - Fairness alone needs no lock: claims take the head of the fair order with SKIP LOCKED,
#   side by side, as plain claims take the head of the queue.
# - Limits and rates: a claim is *optimistic* when it cannot matter who else is claiming:
#   it holds the queue's lock shared plus one of ``tickets`` ticket locks (at most that many
#   optimistic claims at once), takes at most ``optimistic_batch`` messages, and goes ahead
#   only if the queue and every key stay ``margin`` = tickets x optimistic_batch messages
#   (and tokens) away from their limits in what it sees; the claims it cannot see are the
#   other ticket holders', each under the same cap. Otherwise it takes nothing, answers
#   ``contended``, and the claim runs *serialized*: the lock exclusive, which waits for the
#   optimistic claims to end and lets none start, then everything counted exactly.

# The lock of one queue's claims: an advisory lock (two keys: a class, the queue's hash), so
# that optimistic claims can share it. The state row is created by the first serialized
# claim (BUDGET_SERIALIZED_CTES). flow_control runs these as session-prepared statements.
FLOW_LOCK = """
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(queue)s));
"""
FLOW_LOCK_SHARED = """
SELECT pg_advisory_xact_lock_shared(%(lock_class)s, hashtext(%(queue)s)),
       set_config('pgqueue.claim_ticket',
                  COALESCE((SELECT t::text FROM generate_series(1, %(tickets)s) t
                            WHERE pg_try_advisory_xact_lock(%(lock_class)s + t,
                                                            hashtext(%(queue)s))
                            LIMIT 1), ''),
                  true);
"""

# What a claim with limits computes first:
# - leases: the queue's leases, counted exactly, by a serialized claim of a queue with a
#   queue limit or key limits (``counted``: FlowConfig.counted; the others need no count). A
#   flow claim marks what it leases (``fair_order`` -1), so the partial index
#   pgq_message_leased holds exactly these queues' leases. ``held``: those in flight, lease
#   not expired: a finished, failed, released or expired lease stops counting by itself, and
#   a crashed worker never holds a slot past its lease. ``members``: all of them, expired or
#   not, what the kept count stands for (below). Keyed queues count per tenant in
#   KEY_ROOM_CTES, only when some tenant may reach its limit;
# - shards: ``2 x tickets`` rows per queue (so that claims and acks side by side write
#   different rows). Tokens, in the first ``tickets``: each has that share of the rate and
#   the burst, refilled to the database clock; an optimistic claim takes tokens from its
#   ticket's shard only, a serialized claim from all. The kept count of leases, ``held``
#   summed over all of them: an optimistic claim adds what it leases to its ticket's shard, an
#   ack takes away the flow leases it ends from one of the others (LEASES_ENDED_CTE, by its
#   backend), and a serialized claim sets the sum to its exact count (``members``) while
#   keeping, shard by shard, what acks committed since its snapshot (the shard as locked
#   now, less the shard as read). So the sum is never below the leases not given back, hence
#   never below those in flight, and an optimistic claim may read it instead of counting
#   (flow_control.KEPT_COUNT_BATCH: a count under a high claim rate reads a row for every
#   lease finished since the last WAL flush, acks committing asynchronously). What is not
#   taken away (an expired lease claimed again, acks after a claim that counted or inside a
#   caller's transaction, an operator's moves) only makes the sum err high; an optimistic
#   claim trusts it only while every shard was counted in the last ``recount`` seconds;
# - state: the whole bucket (shards not written yet are full), this claim's shard, whether
#   the queue has its state row, whether it is paused.
_COUNTED = "%(counted)s::boolean"
# A flow lease of the queue (pgq_message_leased), expired or not; in flight while
# ``available_at > now()``.
_QUEUE_LEASE = "queue = %(queue)s AND lease_token IS NOT NULL AND fair_order < 0"
# This claim's ticket (FLOW_LOCK_SHARED), and a shard's kept count recent enough to trust.
_TICKET = "NULLIF(current_setting('pgqueue.claim_ticket', true), '')::int"
_RECENTLY = "> now() - make_interval(secs => %(recount)s::float8)"
# A rate shard ``b``'s tokens now: its share of the rate since it was refilled, at most its
# share of the burst.
_SHARD_TOKENS = (
    "LEAST(%(burst)s::float8 / %(tickets)s, b.tokens + %(rate)s::float8 / %(tickets)s"
    " * extract(epoch FROM clock_timestamp() - b.refilled_at))"
)
# Claim credits (flow_control.CreditBook): the allowances of the queue's credits live now,
# counted as in flight by every claim of a queue whose claims count leases (see "Claim
# credits" below); but this session's own: it claims under it no more (what it leased under
# it is in flight, counted), and this claim replaces or ends it. A queue with a key rate gets
# no credits: nothing to read (processes with other settings for the queue, as in a rolling
# deploy, are not counted with, as for the kept count).
CREDITS_CTES = f"""
credits AS (
    SELECT COALESCE(sum(c.allowance), 0)::int AS n FROM pgqueue_flow_credit c
    WHERE c.queue = %(queue)s AND c.until > now() AND {_COUNTED}
      AND %(key_rate)s::float8 IS NULL AND c.holder IS DISTINCT FROM %(holder)s
)"""
LEASES_CTES = f"""
leases AS (
    SELECT count(*) FILTER (WHERE available_at > now())::int AS held,
           count(*)::int AS members
    FROM pgqueue_message
    WHERE {_QUEUE_LEASE} AND {_COUNTED}
)"""
FLOW_COMMON_CTES = (
    LEASES_CTES
    + ","
    + CREDITS_CTES
    + f""",
shards AS (
    SELECT b.shard,
           {_SHARD_TOKENS} AS tokens,
           b.held
    FROM pgqueue_flow_rate_shard b
    WHERE b.queue = %(queue)s AND (%(rate)s::float8 IS NOT NULL OR {_COUNTED})
), state AS (
    SELECT %(burst)s::float8
             * (%(tickets)s - (SELECT count(*) FROM shards WHERE shard <= %(tickets)s))
             / %(tickets)s
             + COALESCE((SELECT sum(tokens) FROM shards WHERE shard <= %(tickets)s), 0) AS tokens,
           (SELECT tokens FROM shards WHERE shard = {_TICKET}) AS own_tokens,
           f.queue IS NOT NULL AS known,
           EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused) AS paused,
           (SELECT held FROM leases) + (SELECT n FROM credits) AS held,
           (SELECT n FROM credits) AS credits
    FROM (SELECT 1) one LEFT JOIN pgqueue_flow_state f ON f.queue = %(queue)s
)"""
)

# The same for an optimistic claim that reads the kept count: ``held`` is the shards' sum, NULL
# (no room: the claim runs serialized, which counts) when a shard is missing or was not
# counted in the last ``recount`` seconds. A missing shard also reads as no tokens. Live
# credits are in that sum already (their grant added them).
OPTIMISTIC_COMMON_CTES = (
    CREDITS_CTES
    + f""",
shards AS (
    SELECT b.shard, b.tokens, b.refilled_at, b.held, b.counted_at
    FROM pgqueue_flow_rate_shard b
    WHERE b.queue = %(queue)s AND (%(rate)s::float8 IS NOT NULL OR {_COUNTED})
), state AS (
    SELECT (SELECT {_SHARD_TOKENS}
            FROM shards b
            WHERE %(rate)s::float8 IS NOT NULL AND b.shard = {_TICKET}) AS own_tokens,
           -- Shards to read imply the state row (the serialized claim that created the shards
           -- created it too): no probe.
           %(rate)s::float8 IS NOT NULL OR {_COUNTED}
             OR EXISTS (SELECT 1 FROM pgqueue_flow_state f WHERE f.queue = %(queue)s) AS known,
           EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused) AS paused,
           CASE WHEN NOT {_COUNTED} THEN 0
                WHEN (SELECT count(*) FROM shards WHERE counted_at {_RECENTLY}) = 2 * %(tickets)s
                THEN (SELECT sum(held) FROM shards)::bigint END AS held,
           (SELECT n FROM credits) AS credits
)"""
)

# An optimistic claim of fewer messages, with few in flight, counts instead
# (flow_control.KEPT_COUNT_BATCH: then the count reads few rows) and reads its ticket's shard
# alone, which must exist: it adds what it leases to the kept count all the same. Live
# credits count as in flight.
OPTIMISTIC_COUNTING_COMMON_CTES = (
    CREDITS_CTES
    + f""",
state AS (
    SELECT (SELECT {_SHARD_TOKENS}
            FROM pgqueue_flow_rate_shard b
            WHERE b.queue = %(queue)s AND %(rate)s::float8 IS NOT NULL
              AND b.shard = {_TICKET})
             AS own_tokens,
           -- With a rate, a missing shard reads as no tokens already; shards imply the state
           -- row (the serialized claim that created them created it too).
           CASE WHEN %(rate)s::float8 IS NOT NULL THEN true
                WHEN {_COUNTED}
                THEN EXISTS (SELECT 1 FROM pgqueue_flow_rate_shard b
                             WHERE b.queue = %(queue)s AND b.shard = {_TICKET})
                ELSE EXISTS (SELECT 1 FROM pgqueue_flow_state f WHERE f.queue = %(queue)s)
           END AS known,
           EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused) AS paused,
           CASE WHEN {_COUNTED}
                THEN (SELECT count(*)::int FROM pgqueue_message
                      WHERE {_QUEUE_LEASE} AND available_at > now())
                     + (SELECT n FROM credits)
                ELSE 0 END AS held,
           (SELECT n FROM credits) AS credits
)"""
)

# The marker row telling a claim of a queue with a concurrency limit's caller the leases in
# flight it saw (flow_control.LeasesSeen), in the ``position`` column: without the live
# credits' allowances (which are not leases to count).
HELD_MARKER = f"""
SELECT '{{outcome}}', {{nulls}}, held - credits
FROM state WHERE {_COUNTED} AND held IS NOT NULL"""

# Keyed queues: what each tenant has in flight, and the room left to the tenants that have
# less than unlimited room (in flight under a key limit, a limit override, a rate bucket).
# Tenants' leases are counted only when some tenant may be near its limit: not without key
# limits (a key rate alone), nor while the queue's whole in flight leaves the smallest key
# limit the margin and the batch away (no tenant has more in flight than the queue, and a
# tenant counted as having none may take at most the batch). An O(in flight) count saved.
KEY_ROOM_CTES = f"""
in_flight AS (
    SELECT tenant AS key, count(*)::int AS n FROM pgqueue_message
    WHERE {_QUEUE_LEASE} AND available_at > now() AND tenant IS NOT NULL
      AND %(least_key_limit)s::int IS NOT NULL
      AND NOT COALESCE(%(least_key_limit)s::int - (SELECT held FROM state)
                       >= GREATEST(%(margin)s::int, %(n)s::int), false)
    GROUP BY tenant
), key_room AS (
    SELECT i.key,
           COALESCE((%(key_limits)s::jsonb ->> i.key)::int, %(key_limit)s::int, 2147483647)
             - i.n - (SELECT credits FROM state) AS room
    FROM in_flight i
  UNION ALL
    SELECT o.key, o.value::int - (SELECT credits FROM state)
    FROM jsonb_each_text(%(key_limits)s::jsonb) o
  UNION ALL
    SELECT b.key, floor(LEAST(%(key_burst)s::float8,
                              b.tokens + %(key_rate)s::float8
                                         * extract(epoch FROM clock_timestamp() - b.refilled_at)))::int
    FROM pgqueue_flow_key_bucket b
    WHERE b.queue = %(queue)s AND %(key_rate)s::float8 IS NOT NULL
)"""
# Without the per-tenant counts: no room to tell, none when a key limit is set (an optimistic
# claim of a keyed queue run without them sees the smallest key limit as ``key_limit`` and
# goes ahead only while the queue's whole in flight leaves it ``margin`` away; see
# FlowConfig.optimistic_shape).
NO_KEY_ROOM_CTES = """
key_room AS (
    SELECT NULL::text AS key, 0 AS room WHERE %(key_limit)s::int IS NOT NULL
)"""

# How many messages this claim may take: the batch, the queue limit, whole tokens; 0 when
# the queue is paused. Serialized: exact; creates the queue's state row if missing.
BUDGET_SERIALIZED_CTES = """
new_state AS (
    INSERT INTO pgqueue_flow_state (queue)
    SELECT %(queue)s FROM state WHERE NOT known
    ON CONFLICT (queue) DO NOTHING
), budget AS (
    SELECT CASE WHEN s.paused THEN 0 ELSE GREATEST(0, LEAST(
               %(n)s::int,
               COALESCE(%(queue_limit)s::int - s.held, %(n)s::int),
               COALESCE(floor(s.tokens + 1e-9)::int, %(n)s::int))) END AS n,
           false AS contended
    FROM state s
)"""
# Optimistic: the same, and only with a ticket and ``margin`` of room everywhere.
BUDGET_OPTIMISTIC_CTES = """
room AS (
    SELECT COALESCE(current_setting('pgqueue.claim_ticket', true), '') <> ''
           AND s.known AND s.held IS NOT NULL
           AND COALESCE(%(queue_limit)s::int - s.held >= %(margin)s::int, true)
           AND (%(rate)s::float8 IS NULL OR COALESCE(s.own_tokens >= %(n)s::int, false))
           AND COALESCE(%(key_limit)s::int >= %(margin)s::int, true)
           AND COALESCE(%(key_burst)s::float8 >= %(margin)s::int, true)
           -- Room for every key: the queue's whole in flight leaves the default key limit
           -- ``margin`` away (no key has more), or else counted key by key.
           AND CASE WHEN %(key_limits)s::jsonb = '{}'::jsonb AND %(key_rate)s::float8 IS NULL
                         AND COALESCE(%(key_limit)s::int - s.held >= %(margin)s::int, true)
                    THEN true
                    ELSE NOT EXISTS (SELECT 1 FROM key_room WHERE room < %(margin)s::int) END
               AS ok
    FROM state s
), budget AS (
    SELECT CASE WHEN s.paused OR NOT r.ok THEN 0 ELSE GREATEST(0, LEAST(
               %(n)s::int,
               COALESCE(%(queue_limit)s::int - s.held, %(n)s::int),
               COALESCE(floor(s.own_tokens + 1e-9)::int, %(n)s::int))) END AS n,
           NOT s.paused AND NOT r.ok AS contended
    FROM state s CROSS JOIN room r
), credit AS (
    -- The claim credit this claim may grant its session (``credit_size`` > 0: see "Claim
    -- credits"): a ticket's share of what is left to spare under each limit once the margin
    -- and this batch are kept (the grants side by side, which do not see each other, fit
    -- together), and the tokens its shard has left; none with a key rate. Whole batches:
    -- what a session cannot lease in claims of its batch size is not taken from the others.
    SELECT GREATEST(0, LEAST(
               %(credit_size)s::int,
               (%(queue_limit)s::int - s.held - %(margin)s::int - b.n) / %(tickets)s,
               (%(least_key_limit)s::int - s.held - %(margin)s::int - b.n) / %(tickets)s,
               floor(s.own_tokens + 1e-9)::int - b.n)) / %(n)s::int * %(n)s::int AS allowance
    FROM state s CROSS JOIN budget b
    WHERE %(credit_size)s::int > 0 AND b.n = %(n)s::int AND %(key_rate)s::float8 IS NULL
)"""

# Keyed queues: how far past the batch the head of the fair order is read. When a tenant may
# be unable to take a whole batch (less room than the batch, or a default key limit under
# it), twice the batch plus two messages per such tenant plus ``window``: the fair order
# interleaves the tenants, so that covers what the ones at their limit hold there.
# Otherwise no tenant can refuse a message: the batch alone.
#
# uncapped: no tenant can reach a key limit in this claim (no key rate, and the queue's whole
# in flight plus the budget within the smallest key limit, default or per key: no tenant has
# more in flight than the queue). Then the keyed choice is the fair choice, and neither the
# per-tenant counts nor the reach past the batch are computed (see KEYED_CHOICE_CTES).
REACH_CTES = """
uncapped AS (
    SELECT %(key_rate)s::float8 IS NULL
           AND COALESCE(%(least_key_limit)s::int - (SELECT held FROM state)
                        >= (SELECT n FROM budget), true) AS ok
), short AS (
    SELECT count(DISTINCT key)::int AS n FROM key_room WHERE room < (SELECT n FROM budget)
), reach AS (
    SELECT CASE WHEN (SELECT ok FROM uncapped) THEN 0
                WHEN %(key_limit)s::int - (SELECT credits FROM state) < (SELECT n FROM budget)
                     OR (SELECT n FROM short) > 0
                THEN (SELECT n FROM budget) + 2 * (SELECT n FROM short) + %(window)s::int
                ELSE 0 END AS n
)"""

# No tenant can refuse a message (no key limits or rates): the batch alone.
NO_REACH_CTES = """
reach AS (
    SELECT 0 AS n
)"""

# A claim with fairness alone: only the pause.
FAIR_ONLY_COMMON_CTES = """
budget AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM pgqueue_queue q
                             WHERE q.name = %(queue)s AND q.paused)
                THEN 0 ELSE %(n)s::int END AS n,
           false AS contended
)"""

# Queue-wide limits only: the plain claim order, at most ``budget`` messages.
FLOW_QUEUE_CTES = """
chosen AS (
    SELECT id, lease_token, {head_locked} AS locked,
           row_number() OVER (ORDER BY priority DESC, available_at, id) AS k
    FROM (SELECT id, lease_token, priority, available_at FROM pgqueue_message
          WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
          ORDER BY priority DESC, available_at, id
          LIMIT (SELECT n FROM budget)
          {head_lock}) head
)"""

# Fair queues: weighted fair queuing by virtual time. Each message gets its place in the fair
# order (``fair_order``) when it enters the order: at enqueue when it is ready then (see
# FAIR_ORDER_ENTRY), else in the first claim after it falls due. A tenant with nothing waiting
# starts at the head of the order, a tenant with a backlog queues behind itself, so tenants
# alternate, ``weight`` messages each per unit of virtual time, however many each enqueued.
# A claim reads the order from its head, a plain index range: no walk over tenants, however
# many there are. Messages without a tenant are one more tenant.
#
# - head: the first messages of the order: the batch, and ``reach`` more when some tenant may
#   not be able to take its share (REACH_CTES). Locked with SKIP LOCKED when claims are
#   not serialized;
# - due_again: messages outside the order that are due (scheduled, retried, released:
#   ``fair_order`` -1 in pgq_message_fair_due; leases expired: in pgq_message_leased),
#   oldest first, and, for rows written by other means
#   (``fair_order`` NULL: before fairness was switched on, raw SQL), the oldest ready ones;
#   ``placed`` gives them their place, exactly as an enqueue would have;
# - candidate: both, for FAIR_CHOICE_CTES (fair order, at most ``budget``) or
#   KEYED_CHOICE_CTES (the same, each tenant within its key limit and rate). The placed
#   messages not chosen keep their place (FAIR_SAVE_CTES).
FAIR_CANDIDATE_CTES = f"""
head AS (
    SELECT id, lease_token, tenant, priority, fair_order AS place FROM pgqueue_message
    WHERE queue = %(queue)s AND fair_order >= 0
    ORDER BY priority DESC, fair_order, id
    LIMIT (SELECT CASE WHEN b.n > 0 THEN b.n + (SELECT n FROM reach) ELSE 0 END FROM budget b)
    {{head_lock}}
), due_again AS (
    (SELECT id, lease_token, tenant, priority, available_at FROM pgqueue_message
     WHERE queue = %(queue)s AND fair_order < 0 AND lease_token IS NULL
       AND attempts < max_attempts AND available_at <= now()
     ORDER BY available_at, id
     LIMIT %(place_limit)s)
  UNION ALL
    (SELECT id, lease_token, tenant, priority, available_at FROM pgqueue_message
     WHERE queue = %(queue)s AND fair_order < 0 AND lease_token IS NOT NULL
       AND available_at <= now() AND attempts < max_attempts
     ORDER BY available_at
     LIMIT %(place_limit)s)
  UNION ALL
    SELECT id, lease_token, tenant, priority, available_at FROM (
        SELECT id, lease_token, tenant, priority, available_at, fair_order FROM pgqueue_message
        WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT %(unplaced_window)s) oldest
    WHERE fair_order IS NULL
), entry AS (
    SELECT g.tenant, g.priority, g.step,
           {
    FAIR_ORDER_ENTRY.format(
        queue="%(queue)s", priority="g.priority", tenant="g.tenant", step="g.step"
    )
} AS place
    FROM (SELECT tenant, priority,
                 1.0::float8 / COALESCE((%(weights)s::jsonb ->> tenant)::int, 1) AS step
          FROM due_again GROUP BY tenant, priority) g
), placed AS (
    SELECT d.id, d.lease_token, d.tenant, d.priority,
           e.place + (row_number() OVER (PARTITION BY d.tenant, d.priority
                                         ORDER BY d.available_at, d.id) - 1) * e.step AS place
    FROM due_again d
    JOIN entry e ON e.tenant IS NOT DISTINCT FROM d.tenant AND e.priority = d.priority
), candidate AS (
    SELECT id, lease_token, {{head_locked}} AS locked, tenant, priority, place FROM head
  UNION ALL
    SELECT id, lease_token, false, tenant, priority, place FROM placed
)"""

FAIR_CHOICE_CTES = """
chosen AS (
    SELECT id, lease_token, locked, row_number() OVER (ORDER BY priority DESC, place, id) AS k
    FROM candidate
    ORDER BY priority DESC, place, id
    LIMIT (SELECT n FROM budget)
)"""

# A head-only claim: the head of the fair order alone, nothing placed (flow_control.py runs it
# while nothing waits outside the order; looking for messages to place is a large part of a
# fair claim's cost, whether or not there are any). Two probes tell the client to run the
# placing claim (FAIR_CANDIDATE_CTES) instead:
# - due: a message outside the order is due (a retry, a scheduled message, an expired lease):
#   one index probe each in pgq_message_fair_due and pgq_message_leased. The head is then not
#   taken, so the placing claim that follows at once serves the message in its turn;
# - unplaced: the head came back empty while rows written without a place (``fair_order``
#   NULL) are among the oldest ready ones. (With a head to serve, such rows wait for the
#   periodic placing claim: flow_control.PLACING_INTERVAL.)
# Neither probe runs when the claim may take nothing (paused, no room).
HEAD_CANDIDATE_CTES = """
due AS (
    SELECT (SELECT n FROM budget) > 0
           AND (EXISTS (SELECT 1 FROM pgqueue_message
                        WHERE queue = %(queue)s AND fair_order < 0 AND lease_token IS NULL
                          AND attempts < max_attempts AND available_at <= now())
                OR EXISTS (SELECT 1 FROM pgqueue_message
                           WHERE queue = %(queue)s AND fair_order < 0
                             AND lease_token IS NOT NULL AND available_at <= now()
                             AND attempts < max_attempts)) AS waiting
), head AS (
    SELECT id, lease_token, tenant, priority, fair_order AS place FROM pgqueue_message
    WHERE queue = %(queue)s AND fair_order >= 0
    ORDER BY priority DESC, fair_order, id
    LIMIT (SELECT CASE WHEN b.n > 0 AND NOT d.waiting THEN b.n + (SELECT n FROM reach) ELSE 0 END
           FROM budget b CROSS JOIN due d)
    {head_lock}
), unplaced AS (
    SELECT EXISTS (SELECT 1 FROM (
               SELECT fair_order FROM pgqueue_message
               WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
               ORDER BY priority DESC, available_at, id
               LIMIT %(unplaced_window)s) oldest
           WHERE fair_order IS NULL) AS waiting
    WHERE (SELECT n FROM budget) > 0 AND NOT (SELECT waiting FROM due)
      AND NOT EXISTS (SELECT 1 FROM head)
), candidate AS (
    SELECT id, lease_token, {head_locked} AS locked, tenant, priority, place FROM head
)"""

# The head as read is the fair choice (no tenant can refuse a message): numbered in the order
# the index gave it, without a sort (as LEASE's ``numbered``).
HEAD_CHOICE_CTES = """
chosen AS (
    SELECT id, lease_token, locked, row_number() OVER () AS k FROM candidate
)"""

# The marker rows of a head-only claim that found messages to place.
HEAD_ONLY_MARKERS = """
SELECT '{outcome}', {nulls}, 0 FROM due WHERE waiting
UNION ALL
SELECT '{outcome}', {nulls}, 0 FROM unplaced WHERE waiting"""

# Each tenant met may take least(key limit - in flight, whole tokens in its rate bucket); when
# no tenant can reach its limit (``uncapped``), the fair choice as is.
KEYED_CHOICE_CTES = """
capacity AS (
    SELECT t.tenant,
           LEAST(
               COALESCE((%(key_limits)s::jsonb ->> t.tenant)::int, %(key_limit)s::int, 2147483647)
                 - COALESCE(i.n, 0) - (SELECT credits FROM state),
               CASE WHEN %(key_rate)s::float8 IS NULL THEN 2147483647
                    ELSE floor(LEAST(%(key_burst)s::float8,
                                     COALESCE(b.tokens + %(key_rate)s::float8
                                              * extract(epoch FROM clock_timestamp() - b.refilled_at),
                                              %(key_burst)s::float8)) + 1e-9)::int
               END) AS n
    FROM (SELECT DISTINCT tenant FROM candidate WHERE tenant IS NOT NULL) t
    LEFT JOIN in_flight i ON i.key = t.tenant
    LEFT JOIN pgqueue_flow_key_bucket b ON b.queue = %(queue)s AND b.key = t.tenant
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.tenant ORDER BY c.priority DESC, c.place, c.id)
             AS nth
    FROM candidate c
), keyed_chosen AS (
    SELECT r.id, r.lease_token, r.locked,
           row_number() OVER (ORDER BY r.priority DESC, r.place, r.id) AS k
    FROM ranked r LEFT JOIN capacity c ON c.tenant = r.tenant
    WHERE r.tenant IS NULL OR r.nth <= c.n
    ORDER BY r.priority DESC, r.place, r.id
    LIMIT (SELECT n FROM budget)
), fair_chosen AS (
    SELECT id, lease_token, locked, row_number() OVER (ORDER BY priority DESC, place, id) AS k
    FROM candidate
    ORDER BY priority DESC, place, id
    LIMIT (SELECT n FROM budget)
), chosen AS (
    -- A CTE runs only when read: one of the two choices is computed.
    SELECT * FROM fair_chosen WHERE (SELECT ok FROM uncapped)
  UNION ALL
    SELECT * FROM keyed_chosen WHERE NOT (SELECT ok FROM uncapped)
)"""

# LEASE's ``{candidates}`` in a flow-controlled claim: the chosen messages, locked, in deal
# order (which the claim's RETURNING then follows). Those read from a head taken FOR UPDATE
# SKIP LOCKED (``locked``: fairness alone, optimistic claims) are locked already, re-checked
# on the version locked; the others (placed by this claim, or a serialized claim's head) are
# locked here, by primary key, and re-checked. The re-check is written so that it does not
# match the partial claim index's predicate (``attempts - max_attempts < 0``, not ``attempts <
# max_attempts``): with stale statistics the planner would otherwise scan that index for the
# queue and filter by id. Rows the head locked already are not locked a second time.
RELOCKED_CTES = """
relocked AS (
    SELECT m.id, m.lease_token,
           array_position(ARRAY(SELECT id FROM chosen ORDER BY k), m.id) AS k
    FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM chosen WHERE NOT locked)) AND m.queue = %(queue)s
      AND m.attempts - m.max_attempts < 0 AND m.available_at <= now()
    FOR UPDATE OF m SKIP LOCKED
)"""
FLOW_CANDIDATES = """SELECT id, lease_token FROM (
        SELECT id, lease_token, k FROM chosen WHERE locked
      UNION ALL
        SELECT id, lease_token, k FROM relocked) c
    ORDER BY k"""

# The same when every chosen row was read locked (a head-only claim of a head taken FOR UPDATE
# SKIP LOCKED): nothing to look up again.
LOCKED_CANDIDATES = "SELECT id, lease_token FROM chosen ORDER BY k"
# And when that head is the choice as read (HEAD_CHOICE_CTES): the head itself, in the order
# its index gave it (LEASE's ``numbered`` keeps it), with no numbering and sort to undo.
LOCKED_HEAD_CANDIDATES = "SELECT id, lease_token FROM head"

# Appended after LEASE's ``claimed`` in claims with limits: the queue's rate bucket
# (SAVE_STATE_*_CTES, with a queue rate), the keys' buckets and a few idle (full again)
# buckets dropped (SAVE_KEY_BUCKETS_CTES, with a key rate).
SAVE_STATE_SERIALIZED_CTES = f"""
save_state AS (
    -- Every shard written. Tokens: taken from every shard in proportion; shards not written
    -- yet are created full. Leases: the exact count (and what this claim leased) in shard 1,
    -- none in the others, each keeping what acks committed to it since this statement's
    -- snapshot: EXCLUDED.held less the shard as read, plus the shard as locked now.
    INSERT INTO pgqueue_flow_rate_shard AS b (queue, shard, tokens, refilled_at, held, counted_at)
    SELECT %(queue)s, g.shard,
           COALESCE(t.tokens * (1 - LEAST(1.0::float8,
                                          (SELECT count(*) FROM claimed)::float8
                                          / GREATEST((SELECT tokens FROM state), 1e-9))), 0),
           clock_timestamp(),
           CASE WHEN g.shard = 1 AND {_COUNTED}
                THEN (SELECT members FROM leases) + (SELECT count(*) FROM claimed)::int
                     + (SELECT n FROM credits)
                ELSE 0 END - t.held,
           CASE WHEN {_COUNTED} THEN clock_timestamp() END
    FROM generate_series(1, 2 * %(tickets)s) g(shard)
    CROSS JOIN LATERAL (
        SELECT CASE WHEN g.shard <= %(tickets)s
                    THEN COALESCE((SELECT s.tokens FROM shards s WHERE s.shard = g.shard),
                                  %(burst)s::float8 / %(tickets)s) END AS tokens,
               COALESCE((SELECT s.held FROM shards s WHERE s.shard = g.shard), 0) AS held) t
    WHERE %(rate)s::float8 IS NOT NULL OR {_COUNTED}
    ON CONFLICT (queue, shard) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at,
        held = CASE WHEN {_COUNTED} THEN EXCLUDED.held + b.held ELSE 0 END,
        counted_at = EXCLUDED.counted_at
)"""
_GRANTED = "COALESCE((SELECT allowance FROM granted), 0)"
SAVE_STATE_OPTIMISTIC_CTES = f"""
save_state AS (
    -- A claim credit granted (SAVE_CREDIT_CTES) is spent in full here, tokens and lease
    -- count both.
    -- This claim's shard only: no other claim writes it meanwhile (one ticket, one claim);
    -- acks may have taken leases away from it since it was read: ``held`` as locked now.
    -- The lease count is added to while the shard was counted in the last ``recount``
    -- seconds; past that the shard is marked uncounted in the same write (``counted_at``
    -- NULL: no claim reads the kept count until a serialized claim counts again), and once
    -- it is, a claim of a queue without a rate writes nothing: claims that count (a few
    -- messages, few in flight) write no row while nobody reads the kept count.
    UPDATE pgqueue_flow_rate_shard b
    SET tokens = CASE WHEN %(rate)s::float8 IS NULL THEN b.tokens
                      ELSE {_SHARD_TOKENS}
                           - (SELECT count(*) FROM claimed) - {_GRANTED} END,
        refilled_at = CASE WHEN %(rate)s::float8 IS NULL THEN b.refilled_at
                           ELSE clock_timestamp() END,
        held = CASE WHEN {_COUNTED}
                    THEN b.held + (SELECT count(*) FROM claimed)::int + {_GRANTED}
                    ELSE b.held END,
        counted_at = CASE WHEN b.counted_at {_RECENTLY}
                          THEN b.counted_at END
    WHERE b.queue = %(queue)s
      AND (%(rate)s::float8 IS NOT NULL OR ({_COUNTED} AND b.counted_at IS NOT NULL))
      AND b.shard = {_TICKET}
      AND EXISTS (SELECT 1 FROM claimed)
)"""
SAVE_KEY_BUCKETS_CTES = """
save_buckets AS (
    INSERT INTO pgqueue_flow_key_bucket AS b (queue, key, tokens, refilled_at)
    SELECT %(queue)s, tenant, %(key_burst)s::float8 - count(*), clock_timestamp()
    FROM claimed
    WHERE %(key_rate)s::float8 IS NOT NULL AND tenant IS NOT NULL
    GROUP BY tenant
    ON CONFLICT (queue, key) DO UPDATE
    SET tokens = LEAST(%(key_burst)s::float8,
                       b.tokens + %(key_rate)s::float8
                                  * extract(epoch FROM clock_timestamp() - b.refilled_at))
                 - (%(key_burst)s::float8 - EXCLUDED.tokens),
        refilled_at = clock_timestamp()
), idle_buckets AS (
    -- The idle keys worked out once (an array), then deleted by primary key: as ``key IN
    -- (...)`` the planner may run the subquery again for every bucket of the queue, O(buckets
    -- squared) on every claim.
    DELETE FROM pgqueue_flow_key_bucket
    WHERE queue = %(queue)s AND key = ANY(ARRAY(
        SELECT key FROM pgqueue_flow_key_bucket
        WHERE queue = %(queue)s AND %(key_rate)s::float8 IS NOT NULL
          AND key NOT IN (SELECT tenant FROM claimed WHERE tenant IS NOT NULL)
          AND refilled_at < clock_timestamp()
                            - make_interval(secs => %(key_burst)s::float8 / %(key_rate)s::float8)
        LIMIT 16))
)"""

# Appended in fair queues' claims: the messages placed in the fair order by this claim and
# not leased by it keep their place (re-checked: still outside the order and due).
FAIR_SAVE_CTES = """
save_places AS (
    UPDATE pgqueue_message m SET fair_order = p.place
    FROM placed p
    -- By primary key whatever the plan, as LEASE's ``claimed``.
    WHERE m.id = ANY(ARRAY(SELECT id FROM placed)) AND m.id = p.id
      AND p.id <> ALL(ARRAY(SELECT id FROM chosen))
      AND (m.fair_order < 0 OR m.fair_order IS NULL) AND m.available_at <= now()
)"""

# --- Claim credits (flow_control.CreditBook) -------------------------------------------------
# Checking limits on every claim is most of what limits cost a small claim. An
# optimistic claim that took its whole batch far from every limit grants its session a
# *credit*: an allowance of messages (``credit``, BUDGET_OPTIMISTIC_CTES) that the session may
# lease until ``until`` (``credit_window`` seconds, database time) with claims of fairness
# alone (CREDIT_COMMON_CTES: no count, no bucket, no state) under the queue's shared lock and
# a ticket, as optimistic claims. Why the limits still hold:
# - the grant spends the allowance at once: its tokens (a rate is never exceeded by more
#   than the allowances of the credits live at once) and its place in the kept count of
#   leases, as if it were leased;
# - every claim of a queue that counts leases counts the allowances of the live credits
#   (``until`` after its ``now()``) as in flight (CREDITS_CTES), and of each key's too (all
#   of a credit may go to one key); a serialized recount keeps them in the kept count;
# - a claim under a credit goes ahead only while ``clock_timestamp()`` is before ``until``,
#   after its ticket was granted: a claim that no longer counts the credit (``now()`` past
#   ``until``) sees the leases of every claim under it that ended, and the others hold
#   tickets, which its margin covers as any optimistic claim's; a serialized claim waits for
#   them (exclusive lock);
# - the session keeps its own count of what it leased under the credit and stops at the
#   allowance (one credit per session and queue: a new grant replaces it).
_GRANTS = """EXISTS (SELECT 1 FROM credit k WHERE k.allowance >= %(n)s::int)
     AND (SELECT count(*) FROM claimed) = %(n)s::int"""
SAVE_CREDIT_CTES = f"""
granted AS (
    INSERT INTO pgqueue_flow_credit AS c (queue, holder, allowance, until)
    SELECT %(queue)s, %(holder)s, k.allowance,
           clock_timestamp() + make_interval(secs => %(credit_window)s::float8)
    FROM credit k
    WHERE {_GRANTS}
    ON CONFLICT (queue, holder) DO UPDATE
    SET allowance = EXCLUDED.allowance, until = EXCLUDED.until
    RETURNING c.allowance, c.until
), own_credit_ended AS (
    -- No grant: the session's previous credit (which it no longer claims under) ends now,
    -- not at its deadline: other claims stop counting it.
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = %(holder)s AND NOT ({_GRANTS})
), stale_credits AS (
    -- Credits of sessions long gone, a few at a time, by primary key.
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = ANY(ARRAY(
        SELECT holder FROM pgqueue_flow_credit
        WHERE queue = %(queue)s AND %(credit_size)s::int > 0
          AND until < now() - interval '1 minute'
        LIMIT 8))
)"""

# An optimistic claim that grants no credit (a key rate): none for its shard to spend.
NO_GRANT_CTES = """
granted AS (
    SELECT 0 AS allowance WHERE false
)"""

# A serialized claim ends the session's previous credit too (as ``own_credit_ended``).
END_OWN_CREDIT_CTES = """
own_credit_ended AS (
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = %(holder)s AND %(key_rate)s::float8 IS NULL
)"""

# The marker rows of a grant: the allowance, and ``until`` in microseconds since the epoch.
CREDIT_MARKERS = """
SELECT '{outcome}', {nulls}, allowance FROM granted
UNION ALL
SELECT '{until}', {nulls}, (extract(epoch FROM until) * 1e6)::bigint FROM granted"""

# A claim under a credit: the head of the fair (or plain) order as is, SKIP LOCKED, counting
# nothing, after the queue's shared lock and a ticket (FLOW_LOCK_SHARED: it waits for a
# serialized claim, as optimistic claims do), while the credit is live. Without a ticket, or
# past ``until``, it takes nothing and answers ``contended``: the session drops the credit
# and claims optimistically. The locks are waited for in a statement of their own so that a
# claim under a credit that meets a serialized claim waits for it rather than give up its
# credit, whose tokens are spent already.
CREDIT_COMMON_CTES = """
budget AS (
    SELECT CASE WHEN s.paused OR NOT s.live THEN 0 ELSE %(n)s::int END AS n,
           NOT s.paused AND NOT s.live AS contended
    FROM (SELECT EXISTS (SELECT 1 FROM pgqueue_queue q
                         WHERE q.name = %(queue)s AND q.paused) AS paused,
                 COALESCE(current_setting('pgqueue.claim_ticket', true), '') <> ''
                   AND extract(epoch FROM clock_timestamp()) < %(credit_until)s::float8
                   AS live) s
)"""
