SELECT id, lease_token FROM (
        SELECT id, lease_token, k FROM chosen WHERE locked
      UNION ALL
        SELECT id, lease_token, k FROM relocked) c
    ORDER BY k
