SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(queue)s));
