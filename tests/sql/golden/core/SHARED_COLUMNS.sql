queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors
