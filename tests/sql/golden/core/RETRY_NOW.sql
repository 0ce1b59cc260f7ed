UPDATE pgqueue_message SET available_at = now()
WHERE id = ANY(%s) AND lease_token IS NULL AND available_at > now()
RETURNING id, queue
