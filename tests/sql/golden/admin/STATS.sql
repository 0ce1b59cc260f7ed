WITH RECURSIVE 
qp(queue, priority) AS (
    (SELECT queue, priority FROM pgqueue_message
     WHERE attempts < max_attempts AND queue = ANY(%(queues)s)
     ORDER BY queue, priority DESC LIMIT 1)
    UNION ALL
    SELECT nxt.queue, nxt.priority FROM qp CROSS JOIN LATERAL (
        (SELECT m.queue, m.priority FROM pgqueue_message m
         WHERE m.attempts < m.max_attempts AND m.queue = qp.queue AND m.priority < qp.priority
         ORDER BY m.priority DESC LIMIT 1)
        UNION ALL
        (SELECT m.queue, m.priority FROM pgqueue_message m
         WHERE m.attempts < m.max_attempts AND m.queue > qp.queue AND m.queue = ANY(%(queues)s)
         ORDER BY m.queue, m.priority DESC LIMIT 1)
        LIMIT 1
    ) nxt
)
SELECT q.queue,
       (SELECT count(*) FROM (
    SELECT x.* FROM qp CROSS JOIN LATERAL (
        SELECT 1 FROM pgqueue_message m
        WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
          AND m.priority = qp.priority AND m.available_at <= now()
        ORDER BY m.available_at
        LIMIT %(cap)s + 1
    ) x
    WHERE qp.queue = q.queue
    LIMIT %(cap)s + 1) r) AS due_total,
       (SELECT count(*) FROM (
    SELECT x.* FROM qp CROSS JOIN LATERAL (
        SELECT 1 FROM pgqueue_message m
        WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
          AND m.priority = qp.priority AND m.available_at > now()
        ORDER BY m.available_at
        LIMIT %(cap)s + 1
    ) x
    WHERE qp.queue = q.queue
    LIMIT %(cap)s + 1) r) AS future_total,
       due.seen, due.retrying,
       future.seen, future.leased, future.retrying,
       last.seen, last.leased,
       (SELECT count(*) FROM (
            SELECT 1 FROM pgqueue_dead d WHERE d.queue = q.queue LIMIT %(cap)s + 1) dd),
       -- In seconds, computed here: '-infinity' or a date BC is a valid, very old value.
       (SELECT extract(epoch FROM now())::float8 - extract(epoch FROM min(o.available_at))::float8
        FROM qp CROSS JOIN LATERAL (
            SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
              AND m.priority = qp.priority AND m.available_at <= now()
            ORDER BY m.available_at LIMIT 1) o
        WHERE qp.queue = q.queue),
       (SELECT count(*) FROM (
        SELECT 1 FROM pgqueue_archive t
        WHERE t.queue = q.queue AND t.finished_at > now() - interval '5 minutes'
        LIMIT %(throughput_cap)s + 1) w),
       (SELECT count(*) FROM (
        SELECT 1 FROM pgqueue_archive t
        WHERE t.queue = q.queue AND t.finished_at > now() - interval '60 minutes'
        LIMIT %(throughput_cap)s + 1) w),
       failures.failed5, failures.failed60, failures.walked,
       now()
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE r.lease_token IS NULL AND r.attempts > 0) AS retrying
    FROM (
    SELECT x.* FROM qp CROSS JOIN LATERAL (
        SELECT m.lease_token, m.attempts FROM pgqueue_message m
        WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
          AND m.priority = qp.priority AND m.available_at <= now()
        ORDER BY m.available_at
        LIMIT %(sample)s + 1
    ) x
    WHERE qp.queue = q.queue
    LIMIT %(sample)s + 1) r
) due
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE f.lease_token IS NOT NULL) AS leased,
           count(*) FILTER (WHERE f.lease_token IS NULL AND f.attempts > 0) AS retrying
    FROM (
    SELECT x.* FROM qp CROSS JOIN LATERAL (
        SELECT m.lease_token, m.attempts FROM pgqueue_message m
        WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
          AND m.priority = qp.priority AND m.available_at > now()
        ORDER BY m.available_at
        LIMIT %(sample)s + 1
    ) x
    WHERE qp.queue = q.queue
    LIMIT %(sample)s + 1) f
) future
CROSS JOIN LATERAL (
    -- Rows past their attempts are leased on their last attempt (or expired, awaiting burial).
    SELECT count(*) AS seen, count(*) FILTER (WHERE e.available_at > now()) AS leased
    FROM (SELECT m.available_at FROM pgqueue_message m
          WHERE m.queue = q.queue AND m.attempts >= m.max_attempts
          LIMIT %(cap)s + 1) e
) last
CROSS JOIN LATERAL (
    -- Where a failed attempt of the last hour can be recorded; ``walked`` tells whether any
    -- of the three walks stopped at its cap (the count is then a lower bound).
    -- Each row's history is read once, for the hour; the 5 minutes from that (short) part.
    SELECT coalesce(sum(jsonb_array_length(jsonb_path_query_array_tz(h.hour, '$[*] ? (@.at.datetime() >= $since.datetime())',
        jsonb_build_object('since', now() - interval '5 minutes'), true))), 0) AS failed5,
           coalesce(sum(jsonb_array_length(h.hour)), 0) AS failed60,
           GREATEST(count(*) FILTER (WHERE r.walk = 1), count(*) FILTER (WHERE r.walk = 2),
                    count(*) FILTER (WHERE r.walk = 3)) AS walked
    FROM (
        (SELECT d.errors, 1 AS walk FROM pgqueue_dead d
         WHERE d.queue = q.queue AND d.died_at > now() - interval '60 minutes'
         LIMIT %(failure_rows)s + 1)
        UNION ALL
        (SELECT a.errors, 2 FROM pgqueue_archive a
         WHERE a.queue = q.queue AND a.errors <> '[]'::jsonb
           AND a.finished_at > now() - interval '60 minutes'
         LIMIT %(failure_rows)s + 1)
        UNION ALL
        (SELECT m.errors, 3 FROM pgqueue_message m
         WHERE m.queue = q.queue AND m.errors <> '[]'::jsonb
         LIMIT %(failure_rows)s + 1)
    ) r
    CROSS JOIN LATERAL (SELECT jsonb_path_query_array_tz(r.errors, '$[*] ? (@.at.datetime() >= $since.datetime())',
        jsonb_build_object('since', now() - interval '60 minutes'), true) AS hour) h
) failures
ORDER BY q.queue
