"""List filters whose choices come from cheap sources, never from a scan of the table."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from ..core._registry import registry
from .overview import known_queues

__all__ = ["LiveStateFilter", "QueueFilter", "TaskFilter"]


class _ExactValueFilter(admin.SimpleListFilter):
    """Keeps the rows whose column named ``parameter_name`` equals the chosen value."""

    parameter_name: str

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.parameter_name: value}) if value else queryset


class QueueFilter(_ExactValueFilter):
    """Queues found by a skip scan over the indexes (one probe per queue)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, f"{name} (paused)" if paused else name) for name, paused in known_queues()]


class TaskFilter(_ExactValueFilter):
    """Tasks with a registered handler; any other task name still works from the URL."""

    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = registry.names()
        value = self.value()
        if value and value not in names:
            names = sorted([*names, value])
        return [(name, name) for name in names]


class LiveStateFilter(admin.SimpleListFilter):
    """What a live message is doing now, judged by database time."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("ready", "ready"),
            ("scheduled", "scheduled"),
            ("in_flight", "in flight (leased)"),
            ("retrying", "retrying (failed before, not leased)"),
            ("expired", "lease expired"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        leased = Q(lease_token__isnull=False)
        due = Q(available_at__lte=Now())
        conditions = {
            "ready": due & Q(attempts__lt=F("max_attempts")),
            "scheduled": ~due & ~leased,
            "in_flight": ~due & leased,
            "retrying": Q(attempts__gt=0) & ~leased,
            "expired": due & leased,
        }
        condition = conditions.get(self.value() or "")
        return queryset.filter(condition) if condition is not None else queryset
