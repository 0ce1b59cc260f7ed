"""Fixtures shared by the whole suite: real PostgreSQL connections for faults and NOTIFY."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_pgqueue.compat import TASKS_FRAMEWORK


def pytest_report_header() -> str:
    return f"tasks framework: {TASKS_FRAMEWORK or 'none (tests/tasks not collected)'}"


def connection_kwargs() -> dict[str, Any]:
    """psycopg connect() arguments for the database the tests are using right now."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return params


@pytest.fixture
def admin_conn(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of our own, beside Django's, for injecting faults."""
    with psycopg.connect(**connection_kwargs(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def listener(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """A second connection LISTENing on the queue channel; read with ``drain(listener)``."""
    from django_pgqueue.core._notify import listen_statement

    with psycopg.connect(**connection_kwargs(), autocommit=True) as conn:
        conn.execute(listen_statement())
        yield conn


def drain(conn: psycopg.Connection[Any], timeout: float = 0.5) -> list[tuple[str, str]]:
    """All notifications that arrive within ``timeout`` seconds: (channel, payload) pairs."""
    return [(n.channel, n.payload) for n in conn.notifies(timeout=timeout)]
