UPDATE pgqueue_message SET refund_on_expiry = false
WHERE id = %s AND lease_token = %s
RETURNING id
