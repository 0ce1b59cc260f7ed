room AS (
    SELECT COALESCE(current_setting('pgqueue.claim_ticket', true), '') <> ''
           AND s.known AND s.held IS NOT NULL
           AND COALESCE(%(queue_limit)s::int - s.held >= %(margin)s::int, true)
           AND (%(rate)s::float8 IS NULL OR COALESCE(s.own_tokens >= %(n)s::int, false))
           AND COALESCE(%(key_limit)s::int >= %(margin)s::int, true)
           AND COALESCE(%(key_burst)s::float8 >= %(margin)s::int, true)
           -- Room for every key: the queue's whole in flight leaves the default key limit
           -- ``margin`` away (no key has more), or else counted key by key.
           AND CASE WHEN %(key_limits)s::jsonb = '{}'::jsonb AND %(key_rate)s::float8 IS NULL
                         AND COALESCE(%(key_limit)s::int - s.held >= %(margin)s::int, true)
                    THEN true
                    ELSE NOT EXISTS (SELECT 1 FROM key_room WHERE room < %(margin)s::int) END
               AS ok
    FROM state s
), budget AS (
    SELECT CASE WHEN s.paused OR NOT r.ok THEN 0 ELSE GREATEST(0, LEAST(
               %(n)s::int,
               COALESCE(%(queue_limit)s::int - s.held, %(n)s::int),
               COALESCE(floor(s.own_tokens + 1e-9)::int, %(n)s::int))) END AS n,
           NOT s.paused AND NOT r.ok AS contended
    FROM state s CROSS JOIN room r
), credit AS (
    -- The claim credit this claim may grant its session (``credit_size`` > 0: see "Claim
    -- credits"): a ticket's share of what is left to spare under each limit once the margin
    -- and this batch are kept (the grants side by side, which do not see each other, fit
    -- together), and the tokens its shard has left; none with a key rate. Whole batches:
    -- what a session cannot lease in claims of its batch size is not taken from the others.
    SELECT GREATEST(0, LEAST(
               %(credit_size)s::int,
               (%(queue_limit)s::int - s.held - %(margin)s::int - b.n) / %(tickets)s,
               (%(least_key_limit)s::int - s.held - %(margin)s::int - b.n) / %(tickets)s,
               floor(s.own_tokens + 1e-9)::int - b.n)) / %(n)s::int * %(n)s::int AS allowance
    FROM state s CROSS JOIN budget b
    WHERE %(credit_size)s::int > 0 AND b.n = %(n)s::int AND %(key_rate)s::float8 IS NULL
)
