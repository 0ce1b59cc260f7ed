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
