SELECT pg_advisory_xact_lock_shared(%(lock_class)s, hashtext(%(queue)s)),
       set_config('pgqueue.claim_ticket',
                  COALESCE((SELECT t::text FROM generate_series(1, %(tickets)s) t
                            WHERE pg_try_advisory_xact_lock(%(lock_class)s + t,
                                                            hashtext(%(queue)s))
                            LIMIT 1), ''),
                  true);
