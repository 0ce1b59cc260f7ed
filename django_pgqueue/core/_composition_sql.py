"""Composition in the database: dependencies released, failures passed on, batches counted.

Every move of a message into the archive or the dead table goes through one of two statement
triggers, whichever path made it (a worker's acknowledgement, a claim burying an expired
lease, the admin, the Tasks backend): so a dependent is released by the very statement that
archives its last dependency, and a batch's callbacks are decided by the statement that
counts its last member. The functions run in the writing transaction, as its role.

Why this is race-free, in READ COMMITTED:
- an enqueue with dependencies first locks the dependencies where they wait or live
  (``FOR KEY SHARE``), and only then writes its edges: a move of one of them out of its table
  (a DELETE) waits for that enqueue to commit, and the trigger, run after the move in a new
  snapshot (each statement of a PL/pgSQL function takes one), sees its edges;
- a waiting message's count of unfinished dependencies is decremented by UPDATE, which
  re-reads a row changed by a concurrent transaction: two dependencies finishing at once
  cannot both miss the release;
- a batch's counts are one row, updated the same way; its callbacks are decided under that
  row's lock, each at most once (``completed_at``, ``succeeded_at``).

Only rows marked ``composed`` (batch members, dependencies of waiting messages, messages that
waited) are looked up: a plain message's ack pays one look at the rows it wrote, in memory,
and its claim nothing; a batch member's ack, one probe of the dependency table and the count
of its batch.
"""

from __future__ import annotations

from ._notify import LATER

# Waiting messages -> live: ready now, or after their own delay; a fair queue's message
# enters the fair order once due (fair_order -1, as a scheduled one). The workers of each
# queue are woken once per statement.
RELEASE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgq_release(ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    woken bigint;
BEGIN
    WITH released AS (
        DELETE FROM pgqueue_waiting WHERE id = ANY(ids) RETURNING *
    ), inserted AS (
        INSERT INTO pgqueue_message
            (id, queue, task, payload, priority, tenant, enqueued_at, max_attempts, composed,
             headers, available_at, fair_order)
        SELECT id, queue, task, payload, priority, tenant, enqueued_at, max_attempts, true,
               headers,
               GREATEST(statement_timestamp() + make_interval(secs => delay),
                        COALESCE(run_at, '-infinity')),
               CASE WHEN fair THEN -1 END
        FROM released
        RETURNING id, queue, available_at
    )
    SELECT count(pg_notify(w.wake_channel,
                           w.queue || CASE WHEN w.later THEN '{LATER}' ELSE '' END))
    INTO woken
    FROM (SELECT DISTINCT r.wake_channel, r.queue,
                 i.available_at > statement_timestamp() AS later
          FROM released r JOIN inserted i ON i.id = r.id
          WHERE r.wake_channel IS NOT NULL) w;
END $$
"""

# Waiting messages -> dead, reason ``dependency_failed``, each with why (``causes``, in the
# order of ``ids``: type, message, what failed). Their dead rows keep what they need to wait
# again as they were (``release``), should what failed be retried.
BURY_WAITING_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_bury_waiting(ids bigint[], causes jsonb[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH doomed AS (
        SELECT * FROM unnest(ids, causes) AS t(id, cause)
    ), moved AS (
        DELETE FROM pgqueue_waiting w USING doomed
        WHERE w.id = doomed.id
        RETURNING w.*, doomed.cause
    )
    INSERT INTO pgqueue_dead
        (message_id, queue, task, payload, priority, tenant, enqueued_at, attempts,
         max_attempts, composed, headers, reason, details, died_at)
    SELECT m.id, m.queue, m.task, m.payload, m.priority, m.tenant, m.enqueued_at, 0,
           m.max_attempts, true, m.headers, 'dependency_failed',
           m.cause || jsonb_build_object(
               'traceback', '',
               'release', jsonb_build_object('run_at', m.run_at, 'delay', m.delay,
                                             'fair', m.fair, 'wake_channel', m.wake_channel)),
           now()
    FROM moved m;
END $$
"""

# Waiting messages that depend, directly or through others, on ``failed`` -> dead, naming
# the failed one. Their own trigger run finds nothing left to bury: the whole descent moves
# at once.
BURY_DEPENDENTS_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_bury_dependents(failed bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    causes jsonb[];
BEGIN
    WITH RECURSIVE doomed(id, cause) AS (
        SELECT d.dependent_id, d.prerequisite_id
        FROM pgqueue_dependency d JOIN pgqueue_waiting w ON w.id = d.dependent_id
        WHERE d.prerequisite_id = ANY(failed)
        UNION
        SELECT d.dependent_id, doomed.cause
        FROM doomed
        JOIN pgqueue_dependency d ON d.prerequisite_id = doomed.id
        JOIN pgqueue_waiting w ON w.id = d.dependent_id
    ), first_cause AS (
        SELECT id, min(cause) AS cause FROM doomed GROUP BY id
    )
    SELECT array_agg(id),
           array_agg(jsonb_build_object(
               'type', 'DependencyFailed',
               'message', format('message %s, which this one depends on, failed', cause),
               'dependency', cause))
    INTO ids, causes
    FROM first_cause;
    IF ids IS NOT NULL THEN
        PERFORM pgq_bury_waiting(ids, causes);
    END IF;
END $$
"""

# Messages that died of a failed dependency -> waiting again, counting the dependencies they
# still wait for (none: released at once, as a batch's success callback is). What it keeps
# of its waiting (delay, fair queue, wake-up channel) comes back from its dead row. Returns
# the ids moved.
REWAIT_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_rewait(ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    moved_ids bigint[];
    ready bigint[];
BEGIN
    WITH moved AS (
        DELETE FROM pgqueue_dead x
        WHERE x.message_id = ANY(ids) AND x.reason = 'dependency_failed'
        RETURNING x.*
    ), rewaited AS (
        INSERT INTO pgqueue_waiting
            (id, queue, task, payload, priority, tenant, enqueued_at, max_attempts, pending,
             run_at, delay, fair, wake_channel, headers)
        SELECT m.message_id, m.queue, m.task, m.payload, m.priority, m.tenant, m.enqueued_at,
               m.max_attempts,
               (SELECT count(*) FROM pgqueue_dependency d
                WHERE d.dependent_id = m.message_id
                  AND NOT EXISTS (SELECT 1 FROM pgqueue_archive a
                                  WHERE a.message_id = d.prerequisite_id)),
               (m.details #>> '{release,run_at}')::timestamptz,
               COALESCE((m.details #>> '{release,delay}')::float8, 0),
               COALESCE((m.details #>> '{release,fair}')::boolean, false),
               m.details #>> '{release,wake_channel}', m.headers
        FROM moved m
        RETURNING id, pending
    )
    SELECT array_agg(id), array_agg(id) FILTER (WHERE pending = 0)
    INTO moved_ids, ready
    FROM rewaited;
    IF ready IS NOT NULL THEN
        PERFORM pgq_release(ready);
    END IF;
    RETURN COALESCE(moved_ids, '{}');
END $$
"""

# What died of a failed dependency, directly or through others, when that one came back
# (``back``: retried, live or waiting again) -> waiting again, the whole descent at once.
REVIVE_DEPENDENTS_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_revive_dependents(back bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgq_rewait(ARRAY(
        WITH RECURSIVE revived(id) AS (
            SELECT d.dependent_id
            FROM pgqueue_dependency d
            JOIN pgqueue_dead x
              ON x.message_id = d.dependent_id AND x.reason = 'dependency_failed'
            WHERE d.prerequisite_id = ANY(back)
            UNION
            SELECT d.dependent_id
            FROM revived r
            JOIN pgqueue_dependency d ON d.prerequisite_id = r.id
            JOIN pgqueue_dead x
              ON x.message_id = d.dependent_id AND x.reason = 'dependency_failed'
        )
        SELECT id FROM revived));
END $$
"""

# Members of batches finished (``outcome`` 'succeeded'), died ('failed') or came back from
# the dead table ('revived'): their batches' counts, then, for the batches whose counts now
# call for a callback, what follows from them.
COUNT_BATCH_MEMBERS_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_count_batch_members(ids bigint[], outcome text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    touched bigint[];
BEGIN
    WITH counts AS (
        SELECT m.batch_id, count(*)::int AS n
        FROM pgqueue_batch_member m WHERE m.message_id = ANY(ids)
        GROUP BY m.batch_id
    ), counted AS (
        UPDATE pgqueue_batch b
        SET succeeded = b.succeeded + CASE WHEN outcome = 'succeeded' THEN c.n ELSE 0 END,
            failed = b.failed + CASE outcome WHEN 'failed' THEN c.n
                                             WHEN 'revived' THEN -c.n ELSE 0 END
        FROM counts c WHERE b.id = c.batch_id
        RETURNING b.id, (b.completed_at IS NULL AND b.succeeded + b.failed >= b.total)
                        OR (b.succeeded_at IS NULL AND b.succeeded >= b.total) AS due
    )
    SELECT array_agg(id) INTO touched FROM counted WHERE due;
    IF touched IS NOT NULL THEN
        PERFORM pgq_settle_batches(touched);
    END IF;
END $$
"""

# A batch's callbacks, each decided once under the batch row's lock. On its first completion
# (every member finished or dead): the completion callback runs; with no member dead the
# success callback runs and the failure callback is not needed; otherwise the failure
# callback runs and the success callback is buried, to run after all should the failed
# members be retried and every member finish.
SETTLE_BATCHES_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_settle_batches(ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b pgqueue_batch%ROWTYPE;
BEGIN
    FOR b IN
        UPDATE pgqueue_batch SET completed_at = now()
        WHERE id = ANY(ids) AND completed_at IS NULL AND succeeded + failed >= total
        RETURNING *
    LOOP
        PERFORM pgq_release(array_remove(ARRAY[b.on_complete_id], NULL));
        IF b.failed > 0 THEN
            PERFORM pgq_release(array_remove(ARRAY[b.on_failure_id], NULL));
            IF b.on_success_id IS NOT NULL THEN
                PERFORM pgq_bury_waiting(ARRAY[b.on_success_id], ARRAY[jsonb_build_object(
                    'type', 'BatchFailed',
                    'message', format('%s of the %s members of batch %s failed',
                                      b.failed, b.total, b.id),
                    'batch', b.id)]);
            END IF;
        ELSE
            DELETE FROM pgqueue_waiting WHERE id = b.on_failure_id;
        END IF;
    END LOOP;
    FOR b IN
        UPDATE pgqueue_batch SET succeeded_at = now()
        WHERE id = ANY(ids) AND succeeded_at IS NULL AND succeeded >= total
        RETURNING *
    LOOP
        IF b.on_success_id IS NOT NULL THEN
            -- Waiting since the batch was enqueued, or buried when it completed with failures.
            PERFORM pgq_release(ARRAY[b.on_success_id]);
            PERFORM pgq_rewait(ARRAY[b.on_success_id]);
        END IF;
    END LOOP;
END $$
"""

# The hot path of every acknowledgement: a plain message's stops at the first look; a batch
# member's, which has no edges, at the probe of the dependency table's two indexes.
ON_FINISHED_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_on_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[] := ARRAY(SELECT message_id FROM finished WHERE composed);
    ready bigint[];
BEGIN
    -- Also for statements that wrote no row, and for the plain messages' acks: nothing to do.
    IF cardinality(ids) = 0 THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM pgqueue_dependency d
               WHERE d.prerequisite_id = ANY(ids) OR d.dependent_id = ANY(ids)) THEN
        WITH counted AS (
            SELECT d.dependent_id AS id, count(*)::int AS n
            FROM pgqueue_dependency d WHERE d.prerequisite_id = ANY(ids)
            GROUP BY d.dependent_id
        ), decremented AS (
            UPDATE pgqueue_waiting w SET pending = w.pending - c.n
            FROM counted c WHERE w.id = c.id
            RETURNING w.id, w.pending
        ), done_with AS (
            -- A finished message has read its dependencies' results: its edges are done.
            DELETE FROM pgqueue_dependency d WHERE d.dependent_id = ANY(ids)
        )
        SELECT array_agg(id) INTO ready FROM decremented WHERE pending <= 0;
        IF ready IS NOT NULL THEN
            PERFORM pgq_release(ready);
        END IF;
    END IF;
    PERFORM pgq_count_batch_members(ids, 'succeeded');
    RETURN NULL;
END $$
"""

ON_BURIED_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_on_buried() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[] := ARRAY(SELECT message_id FROM buried WHERE composed);
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM pgq_bury_dependents(ids);
    PERFORM pgq_count_batch_members(ids, 'failed');
    RETURN NULL;
END $$
"""

# Rows leaving the dead table: retried (live again, or waiting again when they died of a
# dependency), or deleted for good (retention, an operator), and their edges with them.
ON_UNBURIED_FUNCTION = """
CREATE OR REPLACE FUNCTION pgq_on_unburied() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    back bigint[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM unburied WHERE composed) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(r.message_id) INTO back FROM unburied r
    WHERE r.composed
      AND (EXISTS (SELECT 1 FROM pgqueue_message m WHERE m.id = r.message_id)
           OR EXISTS (SELECT 1 FROM pgqueue_waiting w WHERE w.id = r.message_id));
    IF back IS NOT NULL THEN
        PERFORM pgq_revive_dependents(back);
        PERFORM pgq_count_batch_members(back, 'revived');
    END IF;
    DELETE FROM pgqueue_dependency d USING unburied r
    WHERE r.composed AND d.dependent_id = r.message_id
      AND r.message_id <> ALL(COALESCE(back, '{}'));
    RETURN NULL;
END $$
"""

TRIGGERS = """
CREATE TRIGGER pgq_on_finished AFTER INSERT ON pgqueue_archive
    REFERENCING NEW TABLE AS finished FOR EACH STATEMENT EXECUTE FUNCTION pgq_on_finished();
CREATE TRIGGER pgq_on_buried AFTER INSERT ON pgqueue_dead
    REFERENCING NEW TABLE AS buried FOR EACH STATEMENT EXECUTE FUNCTION pgq_on_buried();
CREATE TRIGGER pgq_on_unburied AFTER DELETE ON pgqueue_dead
    REFERENCING OLD TABLE AS unburied FOR EACH STATEMENT EXECUTE FUNCTION pgq_on_unburied();
"""

#: Applied by the migration, in this order.
DEFINITIONS = [
    RELEASE_FUNCTION,
    BURY_WAITING_FUNCTION,
    BURY_DEPENDENTS_FUNCTION,
    REWAIT_FUNCTION,
    REVIVE_DEPENDENTS_FUNCTION,
    SETTLE_BATCHES_FUNCTION,
    COUNT_BATCH_MEMBERS_FUNCTION,
    ON_FINISHED_FUNCTION,
    ON_BURIED_FUNCTION,
    ON_UNBURIED_FUNCTION,
    TRIGGERS,
]

DROP = [
    "DROP TRIGGER IF EXISTS pgq_on_finished ON pgqueue_archive",
    "DROP TRIGGER IF EXISTS pgq_on_buried ON pgqueue_dead",
    "DROP TRIGGER IF EXISTS pgq_on_unburied ON pgqueue_dead",
    "DROP FUNCTION IF EXISTS pgq_on_finished(), pgq_on_buried(), pgq_on_unburied()",
    "DROP FUNCTION IF EXISTS pgq_count_batch_members(bigint[], text)",
    "DROP FUNCTION IF EXISTS pgq_settle_batches(bigint[])",
    "DROP FUNCTION IF EXISTS pgq_revive_dependents(bigint[])",
    "DROP FUNCTION IF EXISTS pgq_rewait(bigint[])",
    "DROP FUNCTION IF EXISTS pgq_bury_dependents(bigint[])",
    "DROP FUNCTION IF EXISTS pgq_bury_waiting(bigint[], jsonb[])",
    "DROP FUNCTION IF EXISTS pgq_release(bigint[])",
]

# -- statements of an enqueue with dependencies ---------------------------------------------

# The dependencies that wait or live, locked until the enqueue commits: none of them can move
# out of its table before its new edges are visible. A live one is marked ``composed`` (the
# lock is that update's): its archiving or burial looks for its dependents.
LOCK_DEPENDENCIES = """
WITH live AS (
    UPDATE pgqueue_message SET composed = true WHERE id = ANY(%(ids)s) RETURNING id
), waiting AS (
    SELECT id FROM pgqueue_waiting WHERE id = ANY(%(ids)s) FOR KEY SHARE
)
SELECT id FROM live UNION ALL SELECT id FROM waiting
"""

# The others, looked for after the lock (a new snapshot): finished or dead.
ENDED_DEPENDENCIES = """
SELECT message_id, true FROM pgqueue_archive WHERE message_id = ANY(%(ids)s)
UNION ALL
SELECT message_id, false FROM pgqueue_dead WHERE message_id = ANY(%(ids)s)
"""

INSERT_WAITING = """
INSERT INTO pgqueue_waiting
    (id, queue, task, payload, priority, tenant, max_attempts, pending, run_at, delay, fair,
     wake_channel, headers)
VALUES
    (nextval(pg_get_serial_sequence('pgqueue_message', 'id')), %(queue)s, %(task)s,
     %(payload)s::jsonb, %(priority)s, %(tenant)s, %(max_attempts)s, %(pending)s,
     %(run_at)s, %(delay)s, %(fair)s, %(channel)s, %(headers)s::jsonb)
RETURNING id, enqueued_at
"""

INSERT_DEPENDENCIES = """
INSERT INTO pgqueue_dependency (prerequisite_id, dependent_id)
SELECT DISTINCT unnest(%(prerequisites)s::bigint[]), %(dependent)s
"""

RELEASE = "SELECT pgq_release(%(ids)s::bigint[])"
AVAILABLE_AT = "SELECT available_at FROM pgqueue_message WHERE id = %(id)s"

# A dead dependency marked ``composed``: its retry brings back what was buried with it.
MARK_DEAD_COMPOSED = "UPDATE pgqueue_dead SET composed = true WHERE message_id = ANY(%(ids)s)"

# Retried by an operator: what died of a failed dependency waits again (``pgq_rewait``).
REWAIT_DEAD = "SELECT unnest(pgq_rewait(%(ids)s::bigint[]))"

BURY_DEPENDENTS_OF = "SELECT pgq_bury_dependents(%(ids)s::bigint[])"

# -- statements of a batch ------------------------------------------------------------------

INSERT_BATCH = """
INSERT INTO pgqueue_batch (label, total, succeeded, failed, on_complete_id, on_success_id,
                           on_failure_id)
VALUES (%(label)s, %(total)s, 0, 0, %(on_complete)s, %(on_success)s, %(on_failure)s)
RETURNING id, created_at
"""

INSERT_BATCH_MEMBERS = """
INSERT INTO pgqueue_batch_member (message_id, batch_id)
SELECT unnest(%(members)s::bigint[]), %(batch)s
"""

# A batch without members is complete as soon as it exists.
SETTLE_BATCH = "SELECT pgq_settle_batches(ARRAY[%(batch)s]::bigint[])"
