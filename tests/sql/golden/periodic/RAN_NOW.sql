UPDATE pgqueue_periodic SET last_message_id = %s, updated_at = now() WHERE name = %s
