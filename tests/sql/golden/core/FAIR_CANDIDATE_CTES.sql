head AS (
    SELECT id, lease_token, tenant, priority, fair_order AS place FROM pgqueue_message
    WHERE queue = %(queue)s AND fair_order >= 0
    ORDER BY priority DESC, fair_order, id
    LIMIT (SELECT CASE WHEN b.n > 0 THEN b.n + (SELECT n FROM reach) ELSE 0 END FROM budget b)
    {head_lock}
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
           GREATEST(
    COALESCE((SELECT h.fair_order FROM pgqueue_message h
              WHERE h.queue = %(queue)s AND h.priority = g.priority AND h.fair_order >= 0
              ORDER BY h.fair_order LIMIT 1), 0),
    (SELECT t.fair_order + g.step FROM pgqueue_message t
     WHERE t.queue = %(queue)s AND t.tenant = g.tenant AND t.priority = g.priority
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + g.step FROM pgqueue_message t
     WHERE g.tenant IS NULL AND t.queue = %(queue)s AND t.tenant IS NULL
       AND t.priority = g.priority AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1)) AS place
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
    SELECT id, lease_token, {head_locked} AS locked, tenant, priority, place FROM head
  UNION ALL
    SELECT id, lease_token, false, tenant, priority, place FROM placed
)
