budget AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM pgqueue_queue q
                             WHERE q.name = %(queue)s AND q.paused)
                THEN 0 ELSE %(n)s::int END AS n,
           false AS contended
)
