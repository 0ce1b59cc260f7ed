"""Admin actions on the change form: Django 6.1 offers them (``ActionLocation``); before, the
same actions run from the change list only."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from django.contrib import admin

__all__ = ["CHANGE_FORM_ACTIONS", "ActionLocation", "action"]

try:
    from django.contrib.admin.options import ActionLocation

    CHANGE_FORM_ACTIONS = True
except ImportError:  # Django < 6.1
    CHANGE_FORM_ACTIONS = False

    class ActionLocation(enum.Enum):  # type: ignore[no-redef]
        """Where an action is offered; before Django 6.1 only the change list exists."""

        CHANGE_FORM = "CHANGE_FORM"
        CHANGE_LIST = "CHANGE_LIST"


def action(
    *,
    permissions: list[str] | None = None,
    description: str | None = None,
    location: list[ActionLocation] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``django.contrib.admin.action``; ``location`` is dropped before Django 6.1."""
    if location is not None and CHANGE_FORM_ACTIONS:
        return admin.action(permissions=permissions, description=description, location=location)
    return admin.action(permissions=permissions, description=description)
