SELECT name, next_run_at, next_run_at <= now(),
       extract(epoch FROM next_run_at - now())::float8, now()
FROM pgqueue_periodic
WHERE name = ANY(%s) AND NOT paused
