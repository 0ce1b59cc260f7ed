"""Composed work on a message's page: what it runs after, what runs after it, its batch.

A message id moves between tables (waiting, live, archived, dead), each with its own admin
page: :func:`locate` finds where each of a few ids is now, one index probe per id and table,
and links to that page. The panel reads at most ``PANEL_LIMIT`` edges each way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..composition.progress import batch_state
from ..composition.results import batch_of
from ..core._composition_models import Batch, Dependency, WaitingMessage
from ..models import ArchivedMessage, DeadMessage, Message

__all__ = [
    "PANEL_LIMIT",
    "Place",
    "batch_link",
    "batch_role",
    "composition_html",
    "locate",
    "message_links",
]

#: The panel lists at most this many messages each way ("and N more" past it).
PANEL_LIMIT = 20


@dataclass(frozen=True)
class Place:
    """Where a message id is now: ``live``, ``waiting``, ``finished``, ``dead: <reason>``
    or ``gone`` (deleted, or past the archive's retention), and its admin page."""

    state: str
    url: str | None


def _url(site_name: str, model: str, pk: Any) -> str:
    return reverse(f"admin:django_pgqueue_{model}_change", args=[pk], current_app=site_name)


def locate(ids: Iterable[int], site_name: str) -> dict[int, Place]:
    """Where each id is now (four statements, whatever the number of ids)."""
    wanted = sorted(set(ids))
    places: dict[int, Place] = {}
    if not wanted:
        return places
    for pk in Message.objects.filter(id__in=wanted).values_list("id", flat=True):
        places[pk] = Place("live", _url(site_name, "message", pk))
    for pk in WaitingMessage.objects.filter(id__in=wanted).values_list("id", flat=True):
        places.setdefault(pk, Place("waiting", _url(site_name, "waitingmessage", pk)))
    dead = DeadMessage.objects.filter(message_id__in=wanted)
    for message_id, pk, reason in dead.values_list("message_id", "id", "reason"):
        places.setdefault(message_id, Place(f"dead: {reason}", _url(site_name, "deadmessage", pk)))
    archived = ArchivedMessage.objects.filter(message_id__in=wanted)
    for message_id, pk in archived.values_list("message_id", "id"):
        places.setdefault(message_id, Place("finished", _url(site_name, "archivedmessage", pk)))
    return {i: places.get(i, Place("gone", None)) for i in wanted}


def message_links(places: dict[int, Place], *, states: bool = True) -> SafeString:
    """``#12 (finished), #13 (dead (error))``: each id linked to its page when it has one."""
    items = []
    for message_id, place in places.items():
        label = f"#{message_id}"
        state = format_html(" ({})", place.state) if states else ""
        if place.url:
            items.append((format_html('<a href="{}">{}</a>{}', place.url, label, state),))
        else:
            items.append((format_html("{}{}", label, state),))
    return format_html_join(", ", "{}", items)


def batch_link(batch: Batch, site_name: str) -> SafeString:
    url = reverse("admin:django_pgqueue_batch_change", args=[batch.pk], current_app=site_name)
    return format_html(
        '<a href="{}">{}</a> ({}: {} of {} done, {} failed)',
        url,
        f"{batch.label} (#{batch.id})" if batch.label else f"batch #{batch.id}",
        batch_state(batch),
        f"{batch.succeeded:,}",
        f"{batch.total:,}",
        f"{batch.failed:,}",
    )


def batch_role(batch: Batch, message_id: int) -> str:
    """What ``message_id`` is to ``batch``: a member or one of its callbacks."""
    roles = {
        batch.on_complete_id: "its completion callback (on_complete)",
        batch.on_success_id: "its success callback (on_success)",
        batch.on_failure_id: "its failure callback (on_failure)",
    }
    return roles.get(message_id, "a member")


def _edges(condition: Q, column: str) -> tuple[list[int], bool]:
    ids = list(
        Dependency.objects.filter(condition)
        .order_by(column)
        .values_list(column, flat=True)[: PANEL_LIMIT + 1]
    )
    return ids[:PANEL_LIMIT], len(ids) > PANEL_LIMIT


def composition_html(message_id: int, site_name: str) -> SafeString:
    """The panel: prerequisites and dependents with their states, and the batch if any."""
    after, more_after = _edges(Q(dependent_id=message_id), "prerequisite_id")
    before, more_before = _edges(Q(prerequisite_id=message_id), "dependent_id")
    batch = batch_of(message_id)
    if not after and not before and batch is None:
        return format_html("{}", "— (no dependencies, dependents or batch)")
    places = locate([*after, *before], site_name)
    rows = []
    for label, ids, more in (
        ("Runs after", after, more_after),
        ("Runs before (its dependents)", before, more_before),
    ):
        if ids:
            links = message_links({i: places[i] for i in ids})
            suffix = format_html(" and more (first {} shown)", PANEL_LIMIT) if more else ""
            rows.append((label, format_html("{}{}", links, suffix)))
    if batch is not None:
        rows.append(
            (
                "Batch",
                format_html("{}, {}", batch_role(batch, message_id), batch_link(batch, site_name)),
            )
        )
    body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
    return format_html('<table class="pgq-composition">{}</table>', body)
