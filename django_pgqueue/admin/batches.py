"""Batches as one thing: their progress in the list; on a batch's page its members by state,
its failed members, its callbacks, and "Retry failed members".

Counts come from the batch's row (kept by the triggers as members finish or die), so the list
reads nothing else; a page reads a bounded part of the members (``composition/progress.py``).
The retry runs the dead letters' retry behind the same permission (``retry_deadmessage``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..composition.progress import batch_state, failed_members, member_states
from ..composition.retry import retry_failed_members
from ..core._composition_models import Batch
from .actions import ACTION_LIMIT, CappedPaginator, acting_user_id
from .browsers import BOTH, RetryOnItsPage
from .columns import safe_timestamps, show_timestamp, timestamp_column
from .compat import action
from .composition import locate, message_links

__all__ = ["BatchAdmin", "BatchStateFilter"]

#: A batch's page lists at most this many failed members.
FAILED_MEMBERS_SHOWN = 50
# Ids are bigint: a longer digit string cannot be one.
_MAX_ID_DIGITS = 18


# What each state of ``composition.progress.batch_state`` means.
STATES = {
    "running": "running",
    "failed": "complete, with failed members",
    "retrying": "failed members retried, running again",
    "succeeded": "succeeded",
}


class BatchStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(STATES.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        complete = Q(completed_at__isnull=False, succeeded_at__isnull=True)
        conditions = {
            "running": Q(completed_at__isnull=True),
            "failed": complete & Q(failed__gt=0),
            "retrying": complete & Q(failed=0),
            "succeeded": Q(succeeded_at__isnull=False),
        }
        condition = conditions.get(self.value() or "")
        return queryset.filter(condition) if condition is not None else queryset


def _percent(part: int, total: int) -> str:
    return f"{100 * part / total:.1f}" if total else "0"


@admin.register(Batch)
class BatchAdmin(RetryOnItsPage):
    list_display = (
        "name",
        "id",
        "progress",
        "state_code",
        "created_at_shown",
        "completed_at_shown",
    )
    list_display_links = ("name",)
    list_filter = (BatchStateFilter,)
    show_full_result_count = False
    paginator = CappedPaginator
    list_per_page = 50
    ordering = ("-id",)
    search_fields = ("=id",)  # shows the search box; get_search_results does the work
    search_help_text = "An exact batch id."
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("name", "id", "state"),
                    "progress",
                    ("created_at_shown", "completed_at_shown", "succeeded_at_shown"),
                )
            },
        ),
        ("Members by state", {"fields": ("members_by_state", "failed_members_list")}),
        ("Callbacks", {"fields": ("callbacks",)}),
    )
    readonly_fields = (
        "name",
        "id",
        "state",
        "progress",
        "created_at_shown",
        "completed_at_shown",
        "succeeded_at_shown",
        "members_by_state",
        "failed_members_list",
        "callbacks",
    )
    actions = ("retry_failed_members",)
    retry_action = "retry_failed_members"
    retry_label = "Retry failed members"

    created_at_shown = timestamp_column("created_at", "created")
    completed_at_shown = timestamp_column("completed_at", "completed")
    succeeded_at_shown = timestamp_column("succeeded_at", "succeeded")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        stamps = ("created_at", "completed_at", "succeeded_at")
        return super().get_queryset(request).annotate(**safe_timestamps(*stamps))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit() and len(term) <= _MAX_ID_DIGITS:
            return queryset.filter(id=int(term)), False
        return queryset.none(), False

    @admin.display(description="batch")
    def offers_retry(self, obj: Batch) -> bool:
        return obj.failed > 0

    def name(self, obj: Batch) -> SafeString:
        # Cut to fit by the stylesheet; the whole label on hover.
        text = obj.label or f"batch #{obj.id}"
        return format_html('<span class="pgq-cut" title="{}">{}</span>', text, text)

    @admin.display(description="state")
    def state(self, obj: Batch) -> str:
        return STATES[batch_state(obj)]

    @admin.display(description="state")
    def state_code(self, obj: Batch) -> SafeString:
        # The short word in the list; what it means on hover.
        code = batch_state(obj)
        return format_html('<span title="{}">{}</span>', STATES[code], code)

    @admin.display(description="done / failed / total")
    def progress(self, obj: Batch) -> SafeString:
        bar = format_html(
            '<span class="pgq-progress" title="{} done, {} failed, {} pending">'
            '<span class="pgq-progress-done" style="width: {}%"></span>'
            '<span class="pgq-progress-failed" style="width: {}%"></span></span>',
            f"{obj.succeeded:,}",
            f"{obj.failed:,}",
            f"{obj.pending:,}",
            _percent(obj.succeeded, obj.total),
            _percent(obj.failed, obj.total),
        )
        return format_html(
            '{} <span class="pgq-figures">{} / {} / {}</span>',
            bar,
            f"{obj.succeeded:,}",
            f"{obj.failed:,}",
            f"{obj.total:,}",
        )

    @admin.display(description="members")
    def members_by_state(self, obj: Batch) -> SafeString:
        states = member_states(obj)
        rows: list[tuple[str, str]] = [
            ("finished", f"{states.finished:,}"),
            ("dead", f"{states.dead:,}"),
        ]
        if states.live is None or states.waiting is None:
            rows.append(("live or waiting", f"{states.pending:,}"))
        else:
            rows += [("live", f"{states.live:,}"), ("waiting", f"{states.waiting:,}")]
            others = states.pending - states.live - states.waiting
            if others:
                # Moving between tables as the page was read, or deleted for good.
                rows.append(("elsewhere", f"{others:,}"))
        body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        return format_html('<table class="pgq-activity">{}</table>', body)

    @admin.display(description="failed members")
    def failed_members_list(self, obj: Batch) -> SafeString:
        members = failed_members(obj, limit=FAILED_MEMBERS_SHOWN + 1)
        if not members:
            return format_html("{}", "none")
        shown = members[:FAILED_MEMBERS_SHOWN]
        causes = locate([m.dependency for m in shown if m.dependency is not None], self._site())
        rows = []
        for member in shown:
            url = self._url("deadmessage_change", member.dead_id)
            error = f"{member.error_type or ''}: {member.error_message or ''}".strip(": ")
            cause: SafeString | str = ""
            if member.dependency is not None:
                place = {member.dependency: causes[member.dependency]}
                cause = format_html("after {}", message_links(place))
            rows.append(
                (
                    url,
                    f"#{member.message_id}",
                    member.task,
                    member.reason,
                    cause or error or "—",
                    show_timestamp(member.died_at, None),
                )
            )
        body = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            rows,
        )
        more = ""
        if len(members) > FAILED_MEMBERS_SHOWN:
            more = format_html(
                '<p class="pgq-note">The first {} shown; the dead messages list has them all.</p>',
                FAILED_MEMBERS_SHOWN,
            )
        head = (
            "<tr><th>message</th><th>task</th><th>reason</th><th>error or failed dependency"
            "</th><th>died at</th></tr>"
        )
        return format_html(
            '<table class="pgq-failed-members">{}{}</table>{}', SafeString(head), body, more
        )

    @admin.display(description="callbacks")
    def callbacks(self, obj: Batch) -> SafeString:
        named = [
            ("on_complete", obj.on_complete_id),
            ("on_success", obj.on_success_id),
            ("on_failure", obj.on_failure_id),
        ]
        ids = [message_id for _, message_id in named if message_id is not None]
        if not ids:
            return format_html("{}", "none")
        places = locate(ids, self._site())
        rows = []
        for role, message_id in named:
            if message_id is None:
                continue
            place = places[message_id]
            if role == "on_failure" and place.state == "gone" and obj.succeeded_at is not None:
                rows.append((role, format_html("#{} (not needed: no member failed)", message_id)))
            else:
                rows.append((role, message_links({message_id: place})))
        body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        return format_html('<table class="pgq-composition">{}</table>', body)

    def _site(self) -> str:
        return self.admin_site.name

    def _url(self, name: str, *args: Any) -> str:
        return reverse(f"admin:django_pgqueue_{name}", args=args, current_app=self._site())

    @action(permissions=["retry"], description="Retry failed members", location=BOTH)
    def retry_failed_members(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        selected = list(queryset.order_by("pk").values_list("pk", flat=True)[: ACTION_LIMIT + 1])
        batch_ids = selected[:ACTION_LIMIT]
        outcome = retry_failed_members(batch_ids)
        touched = [Batch(pk=pk) for pk in sorted(outcome.batches)]
        if touched:
            LogEntry.objects.log_actions(
                user_id=acting_user_id(request),
                queryset=touched,
                action_flag=CHANGE,
                change_message="Retried its failed members.",
            )
        text = (
            f"Retried {len(outcome.members):,} failed members of {len(touched):,} batches"
            f" ({len(outcome.retried):,} dead messages retried)."
        )
        if outcome.skipped:
            text += (
                f" Skipped {len(outcome.skipped):,}: retried by someone else meanwhile, a live"
                " message holds the same dedup key, or the message they depend on is no longer"
                " in the dead letters."
            )
        if outcome.truncated or len(selected) > ACTION_LIMIT:
            text += " Only part of the selection was processed; run the action again for the rest."
        clean = outcome.members and not outcome.skipped and not outcome.truncated
        self.message_user(request, text, messages.SUCCESS if clean else messages.WARNING)
