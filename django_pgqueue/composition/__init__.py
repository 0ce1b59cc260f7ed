"""Composition: chains and batches with callbacks, built on dependencies (``after=``).

Everything here is written in the caller's transaction: a chain or a batch exists entirely or
not at all. What runs when is decided in the database (``core/_composition_sql.py``).
"""
