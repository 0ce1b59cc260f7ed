"""The queue core: validation, enqueue, leasing and transitions, with the SQL in ``sql.py``."""
