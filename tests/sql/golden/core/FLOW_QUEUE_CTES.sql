chosen AS (
    SELECT id, lease_token, {head_locked} AS locked,
           row_number() OVER (ORDER BY priority DESC, available_at, id) AS k
    FROM (SELECT id, lease_token, priority, available_at FROM pgqueue_message
          WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
          ORDER BY priority DESC, available_at, id
          LIMIT (SELECT n FROM budget)
          {head_lock}) head
)
