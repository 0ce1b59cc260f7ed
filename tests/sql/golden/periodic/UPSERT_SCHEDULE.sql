INSERT INTO pgqueue_periodic (name, task, queue, spec, next_run_at, paused, updated_at)
VALUES (%s, %s, %s, %s, %s, FALSE, now())
ON CONFLICT (name) DO UPDATE
SET task = EXCLUDED.task, queue = EXCLUDED.queue, spec = EXCLUDED.spec,
    next_run_at = EXCLUDED.next_run_at, updated_at = now()
WHERE (pgqueue_periodic.task, pgqueue_periodic.queue, pgqueue_periodic.spec)
      IS DISTINCT FROM (EXCLUDED.task, EXCLUDED.queue, EXCLUDED.spec)
