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
)
