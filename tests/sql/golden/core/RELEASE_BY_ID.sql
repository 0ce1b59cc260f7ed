UPDATE pgqueue_message
SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL
WHERE id = ANY(%s) AND lease_token IS NOT NULL
RETURNING id, queue
