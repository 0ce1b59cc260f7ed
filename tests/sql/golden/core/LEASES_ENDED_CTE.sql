, uncounted AS (
    UPDATE pgqueue_flow_rate_shard b SET held = b.held - e.n
    FROM (SELECT count(*)::int AS n FROM {ended} WHERE queue = %s AND fair_order < 0) e
    WHERE b.queue = %s AND b.shard = 1 + {tickets} + pg_backend_pid() %% {tickets} AND e.n > 0
)
