"""A module outside every installed app whose import has a side effect: an error type read
from a row must never import it."""

from __future__ import annotations

import os

os.environ["PGQ_ERROR_CANARY_IMPORTED"] = "1"


class CanaryError(Exception):
    """An exception class, so only the import rule keeps the module out."""
