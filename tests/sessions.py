"""A session that loses its prepared statements, as behind a pooler in transaction mode."""

from __future__ import annotations

from typing import Any


def lose_prepared_statements(connection: Any) -> None:
    """Drop the session's prepared statements behind psycopg's back (psycopg forgets its
    own when it runs a ``DEALLOCATE ALL`` itself; a pooler's switch of sessions it never
    sees)."""
    connection.ensure_connection()
    result = connection.connection.pgconn.exec_(b"DEALLOCATE ALL")
    assert result.error_message == b"", result.error_message
