"""The queue core: validation, enqueue, leasing and transitions.

The named SQL lives in ``_claim_sql.py`` (the claims), ``_sql.py`` (enqueue, acks, operator
moves) and ``_flow_sql.py`` (flow control's functions). A module whose name starts with ``_``
is internal: the package's other modules may import it, users do not; what users need from it
is exported by ``django_pgqueue/__init__.py``. ``operations.py`` and ``transitions.py`` are
public as they are (documented in the API reference).
"""
