budget AS (
    SELECT CASE WHEN s.paused OR NOT s.live THEN 0 ELSE %(n)s::int END AS n,
           NOT s.paused AND NOT s.live AS contended
    FROM (SELECT EXISTS (SELECT 1 FROM pgqueue_queue q
                         WHERE q.name = %(queue)s AND q.paused) AS paused,
                 COALESCE(current_setting('pgqueue.claim_ticket', true), '') <> ''
                   AND extract(epoch FROM clock_timestamp()) < %(credit_until)s::float8
                   AS live) s
)
