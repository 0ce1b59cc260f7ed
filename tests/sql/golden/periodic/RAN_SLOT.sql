UPDATE pgqueue_periodic SET last_message_id = %s WHERE name = %s
