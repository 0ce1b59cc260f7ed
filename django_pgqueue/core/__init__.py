"""The queue core: validation, enqueue, leasing and transitions, with the SQL in ``_sql.py``."""
