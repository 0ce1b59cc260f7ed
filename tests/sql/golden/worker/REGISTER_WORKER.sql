INSERT INTO pgqueue_worker
    (worker_id, hostname, pid, queues, concurrency, started_at, last_seen_at, stats)
VALUES (%s, %s, %s, %s::jsonb, %s, now(), now(), %s::jsonb)
ON CONFLICT (worker_id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    concurrency = EXCLUDED.concurrency, started_at = now(), last_seen_at = now(),
    stats = EXCLUDED.stats
