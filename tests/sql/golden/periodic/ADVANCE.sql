UPDATE pgqueue_periodic
SET next_run_at = %s, last_run_at = COALESCE(%s, last_run_at), updated_at = now()
WHERE name = %s AND next_run_at = %s AND NOT paused
RETURNING name
