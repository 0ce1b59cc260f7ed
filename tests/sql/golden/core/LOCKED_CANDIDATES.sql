SELECT id, lease_token FROM chosen ORDER BY k
