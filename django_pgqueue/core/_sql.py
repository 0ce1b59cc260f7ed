"""Every hot-path SQL statement, named and kept readable in one place.

Rules these follow:
- database time only (``now()`` is the transaction's start; claims are short transactions);
- each move between the live, archive and dead tables is ONE statement
  (``WITH moved AS (DELETE ... RETURNING ...) INSERT ...``), so a crash cannot leave a
  message in two tables or in none;
- completions and failures are fenced by ``(id, lease_token)`` pairs: a worker whose lease
  expired and was taken over changes nothing;
- batch inputs travel as arrays: one round trip for N messages.
"""

from __future__ import annotations

# Columns every table shares (see models.MessageFields).
SHARED_COLUMNS = (
    "queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors"
)

# Columns ``lease()`` returns, in this order (core/_manager.py builds Message objects from them).
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
# texts per row costs a worker more than the rest of the row (_manager.py rebuilds them).
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


# A message's place when it enters its queue's fair order (core/_flow_sql.py): the tenant's
# newest place + its step, or the head of the order when the tenant has none there.
# That is max(the head, the tenant's newest place + its step), since a tenant's places are at
# or after the head; but COALESCE stops at the first that is not NULL, so the head, whose walk
# passes the dead entries of every message claimed since the last vacuum, is probed only for
# a tenant with nothing waiting. The second probe is for messages without a tenant (a
# one-time filter skips it otherwise).
FAIR_ORDER_ENTRY = """COALESCE(
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE t.queue = {queue} AND t.tenant = {tenant} AND t.priority = {priority}
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE {tenant} IS NULL AND t.queue = {queue} AND t.tenant IS NULL
       AND t.priority = {priority} AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT h.fair_order FROM pgqueue_message h
     WHERE h.queue = {queue} AND h.priority = {priority} AND h.fair_order >= 0
     ORDER BY h.fair_order LIMIT 1),
    0)"""


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
# ``MessageManager.lease`` (it selects ``id, lease_token, available_at``), CANDIDATES_FROM, or
# the flow-control function (``id, lease_token, place``); ``{walk_position}`` is where each
# candidate was in the walk of its claim order (``available_at`` in seconds since the epoch,
# or the place in the fair order), which the claimer's bounds move up to
# (core/_claim_bound.py); ``{reap_limit}`` bounds the reaper; ``{leased_order}`` is a leased
# message's ``fair_order``: -1 (out of the fair order while leased) in a fair queue's claim,
# else LEASED_ORDER.
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
    SELECT candidates.*, row_number() OVER () AS position FROM candidates
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
    RETURNING {leased_columns}, c.lease_token IS NOT NULL AS redelivered, c.position,
              {walk_position} AS walk_position
)
SELECT 'claimed' AS outcome, claimed.* FROM claimed
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0, NULL
FROM buried
ORDER BY position
"""

# LEASE's ``{candidates}`` in a plain claim walked from lower bounds on ``available_at``
# (core/_claim_bound.py), one per priority level, highest first: each level's walk seeks its
# bound in the claim index, so the entries below it are passed over without being read. (A
# single walk across levels could not seek past the unconstrained ``priority`` column.) The
# claim order of ``MessageManager.claimable``: the levels come in the order given and each
# walk in index order; the outer LIMIT stops the walks, and their locks, once the batch is
# full. Parameters: the levels, their bounds (seconds since the epoch), the queue, the queue.
CANDIDATES_FROM = """SELECT m.id, m.lease_token, m.available_at
    FROM unnest(%s::int2[], %s::float8[]) AS level(priority, bound)
    CROSS JOIN LATERAL (
        SELECT id, lease_token, available_at FROM pgqueue_message
        WHERE queue = %s AND priority = level.priority AND attempts < max_attempts
          AND available_at >= to_timestamp(level.bound)
          AND available_at <= statement_timestamp()
        ORDER BY available_at, id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ) m
    WHERE NOT EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %s AND q.paused)
    LIMIT {limit}"""

# The first messages a claim from the head would take, looked at without claiming them
# (``MessageManager.look_from_head``): each one's priority, ``available_at`` (seconds since
# the epoch) and id. Parameters: the queue, how many.
HEAD_OF_QUEUE = """SELECT priority, extract(epoch FROM available_at)::float8, id
    FROM pgqueue_message
    WHERE queue = %s AND attempts < max_attempts AND available_at <= statement_timestamp()
    ORDER BY priority DESC, available_at, id
    LIMIT %s"""

# LEASE's ``{walk_position}`` in a plain claim (its candidates' ``available_at``).
WALKED_AT = "extract(epoch FROM c.available_at)::float8"

# HEAD_OF_QUEUE in a fair queue whose claims walk its fair order from bounds: each message's
# priority, place in that order (``pgq_flow_head_v2``) and id.
FAIR_HEAD_OF_QUEUE = """SELECT priority, fair_order, id FROM pgqueue_message
    WHERE queue = %s AND fair_order >= 0
    ORDER BY priority DESC, fair_order, id
    LIMIT %s"""

# A leased message's ``fair_order``: -1 in flow-controlled claims (out of any fair order, and
# counted in flight: see FLOW_COMMON_CTES); in plain claims -1 only for a row that had a place
# (its queue was fair), others stay NULL.
LEASED_ORDER = "CASE WHEN m.fair_order IS NULL THEN NULL ELSE -1 END"
LEASED_OUT_OF_ORDER = "-1"

# The acknowledgements below take their batch as arrays (``batch``, inlined: its arrays are
# the statement's parameters) and find their rows by ``m.id = ANY(b.ids)``: an index
# condition on the primary key in any plan, with no join. Each is prepared once per session
# with a generic plan; a join of the table with the batch, planned while the table held a few
# rows (a drained queue after a vacuum), may walk the whole primary key for every batch once
# a backlog arrives, and one planned on a backlog may match every row against every pair in
# a join filter. A row is one of the batch's leases when the id paired with its current
# lease token is its own: the token fences it, and the token's position finds its values.
# ``array_position`` finds NULL too, so a row that is not leased is ruled out first.
LEASE_IN_BATCH = (
    "m.id = ANY(b.ids) AND m.lease_token IS NOT NULL"
    " AND b.ids[array_position(b.tokens, m.lease_token)] = m.id"
)

# Completed -> archive, fenced by lease token. Results travel as JSON text (NULL allowed).
COMPLETE = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::bigint[] AS ids, %s::uuid[] AS tokens, %s::text[] AS results
), done AS (
    DELETE FROM pgqueue_message m
    USING batch b
    WHERE {LEASE_IN_BATCH}
    RETURNING m.*, b.results[array_position(b.tokens, m.lease_token)] AS result
)
INSERT INTO pgqueue_archive
    (message_id, {SHARED_COLUMNS}, started_at, finished_at, worker_id, result)
SELECT id, {SHARED_COLUMNS}, leased_at, now(), leased_by, result::jsonb
FROM done
RETURNING message_id
"""

# A failed attempt: back off while attempts remain (and the failure is retryable), else
# bury with its reason. Fenced by lease token; ``delay`` is seconds added to database time.
# A buried row comes back with the reason it was buried with (``cancelled`` may override
# the caller's).
FAIL = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::bigint[] AS ids, %s::uuid[] AS tokens, %s::text[] AS errors,
           %s::text[] AS final_reasons, %s::float8[] AS delays
), target AS (
    -- Each error records when its attempt started and failed (database time), unless the
    -- caller set them: the Tasks backend reports a task's first start from this history.
    SELECT m.id, m.queue, m.fair_order,
           jsonb_build_object('started_at', m.leased_at, 'at', now()) || b.errors[at]::jsonb
               AS error,
           -- A message flagged by cancel() while it ran is never retried.
           CASE WHEN m.cancel_requested_at IS NULL THEN b.final_reasons[at] ELSE 'cancelled' END
               AS final_reason,
           b.delays[at] AS delay,
           (b.delays[at] IS NOT NULL AND m.attempts < m.max_attempts
            AND m.cancel_requested_at IS NULL) AS retry
    FROM pgqueue_message m
    CROSS JOIN batch b
    CROSS JOIN LATERAL array_position(b.tokens, m.lease_token) AS at
    WHERE m.id = ANY(b.ids) AND m.lease_token IS NOT NULL AND b.ids[at] = m.id
    FOR UPDATE OF m
), retried AS (
    UPDATE pgqueue_message m
    SET available_at = now() + make_interval(secs => t.delay),
        lease_token = NULL, leased_by = NULL, leased_at = NULL,
        last_error = t.error,
        errors = m.errors || jsonb_build_array(t.error)
    FROM target t
    WHERE m.id = ANY(ARRAY(SELECT id FROM target WHERE retry)) AND m.id = t.id AND t.retry
    RETURNING m.id
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = ANY(ARRAY(SELECT id FROM target WHERE NOT retry)) AND m.id = t.id
      AND NOT t.retry
    RETURNING m.*, t.error, t.final_reason
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts, errors || jsonb_build_array(error), final_reason, error, leased_by, now()
    FROM removed
    RETURNING message_id, reason
)
SELECT id, 'retried', NULL FROM retried
UNION ALL
SELECT message_id, 'buried', reason FROM buried
"""

# Lengthen (or shorten) a lease: PGMQ's set_vt, fenced by lease token. Also tells which of
# them cancel() flagged meanwhile (the worker's heartbeat passes that on to the handlers).
EXTEND = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::float8 AS seconds, %s::bigint[] AS ids, %s::uuid[] AS tokens
)
UPDATE pgqueue_message m
SET available_at = now() + make_interval(secs => b.seconds)
FROM batch b
WHERE {LEASE_IN_BATCH}
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
RELEASE = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::boolean AS reset_attempt, %s::bigint[] AS ids, %s::uuid[] AS tokens
), released AS (
    UPDATE pgqueue_message m
    SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL,
        attempts = CASE WHEN b.reset_attempt THEN GREATEST(m.attempts - 1, 0)
                        ELSE m.attempts END
    FROM batch b
    WHERE {LEASE_IN_BATCH}
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
# to dead with reason ``cancelled``; one a worker holds is flagged for its handler to see,
# and comes back with that worker's id (``cancel()`` tells it). One statement: the row lock
# taken by ``target`` orders it against a concurrent claim.
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
    RETURNING m.id, m.leased_by
)
SELECT message_id, 'cancelled', NULL FROM buried
UNION ALL
SELECT id, 'flagged', leased_by FROM flagged
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
