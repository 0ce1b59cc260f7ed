INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at, fair_order)
SELECT queue, task, payload::jsonb, priority, tenant, dedup_key, max_attempts,
       COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), fair_order
FROM unnest(%s::text[], %s::text[], %s::text[], %s::smallint[], %s::text[], %s::text[],
            %s::int[], %s::timestamptz[], %s::float8[], %s::float8[])
     AS t(queue, task, payload, priority, tenant, dedup_key, max_attempts, run_at, delay,
          fair_order)
ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
