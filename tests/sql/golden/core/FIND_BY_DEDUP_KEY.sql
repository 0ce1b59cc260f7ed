SELECT id, enqueued_at, available_at FROM pgqueue_message WHERE queue = %s AND dedup_key = %s
