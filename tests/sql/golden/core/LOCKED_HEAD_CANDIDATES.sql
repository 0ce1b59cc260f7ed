SELECT id, lease_token FROM head
