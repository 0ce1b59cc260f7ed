"""Handlers for the flow-control acceptance tests (installed only in their worker processes)."""
