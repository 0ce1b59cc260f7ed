granted AS (
    INSERT INTO pgqueue_flow_credit AS c (queue, holder, allowance, until)
    SELECT %(queue)s, %(holder)s, k.allowance,
           clock_timestamp() + make_interval(secs => %(credit_window)s::float8)
    FROM credit k
    WHERE EXISTS (SELECT 1 FROM credit k WHERE k.allowance >= %(n)s::int)
     AND (SELECT count(*) FROM claimed) = %(n)s::int
    ON CONFLICT (queue, holder) DO UPDATE
    SET allowance = EXCLUDED.allowance, until = EXCLUDED.until
    RETURNING c.allowance, c.until
), own_credit_ended AS (
    -- No grant: the session's previous credit (which it no longer claims under) ends now,
    -- not at its deadline: other claims stop counting it.
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = %(holder)s AND NOT (EXISTS (SELECT 1 FROM credit k WHERE k.allowance >= %(n)s::int)
     AND (SELECT count(*) FROM claimed) = %(n)s::int)
), stale_credits AS (
    -- Credits of sessions long gone, a few at a time, by primary key.
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = ANY(ARRAY(
        SELECT holder FROM pgqueue_flow_credit
        WHERE queue = %(queue)s AND %(credit_size)s::int > 0
          AND until < now() - interval '1 minute'
        LIMIT 8))
)
