save_state AS (
    -- A claim credit granted (SAVE_CREDIT_CTES) is spent in full here, tokens and lease
    -- count both.
    -- This claim's shard only: no other claim writes it meanwhile (one ticket, one claim);
    -- acks may have taken leases away from it since it was read: ``held`` as locked now.
    -- The lease count is added to while the shard was counted in the last ``recount``
    -- seconds; past that the shard is marked uncounted in the same write (``counted_at``
    -- NULL: no claim reads the kept count until a serialized claim counts again), and once
    -- it is, a claim of a queue without a rate writes nothing: claims that count (a few
    -- messages, few in flight) write no row while nobody reads the kept count.
    UPDATE pgqueue_flow_rate_shard b
    SET tokens = CASE WHEN %(rate)s::float8 IS NULL THEN b.tokens
                      ELSE LEAST(%(burst)s::float8 / %(tickets)s, b.tokens + %(rate)s::float8 / %(tickets)s * extract(epoch FROM clock_timestamp() - b.refilled_at))
                           - (SELECT count(*) FROM claimed) - COALESCE((SELECT allowance FROM granted), 0) END,
        refilled_at = CASE WHEN %(rate)s::float8 IS NULL THEN b.refilled_at
                           ELSE clock_timestamp() END,
        held = CASE WHEN %(counted)s::boolean
                    THEN b.held + (SELECT count(*) FROM claimed)::int + COALESCE((SELECT allowance FROM granted), 0)
                    ELSE b.held END,
        counted_at = CASE WHEN b.counted_at > now() - make_interval(secs => %(recount)s::float8)
                          THEN b.counted_at END
    WHERE b.queue = %(queue)s
      AND (%(rate)s::float8 IS NOT NULL OR (%(counted)s::boolean AND b.counted_at IS NOT NULL))
      AND b.shard = NULLIF(current_setting('pgqueue.claim_ticket', true), '')::int
      AND EXISTS (SELECT 1 FROM claimed)
)
