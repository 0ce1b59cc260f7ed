SELECT worker_id, hostname, pid, queues, concurrency,
       CASE WHEN started_at BETWEEN %(low)s AND %(high)s THEN started_at END,
       CASE WHEN last_seen_at BETWEEN %(low)s AND %(high)s THEN last_seen_at END,
       extract(epoch FROM now())::float8 - extract(epoch FROM last_seen_at)::float8, stats
FROM pgqueue_worker
WHERE last_seen_at > now() - make_interval(secs => %(live_window)s)
ORDER BY worker_id
