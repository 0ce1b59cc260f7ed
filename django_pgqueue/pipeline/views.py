"""The stats page: the hourly stats table drawn as charts (staff with the stats table's view
permission; no Spark needed)."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from . import charts
from .models import QueueStatsHourly

DEFAULT_HOURS = 48
MAX_HOURS = 24 * 31
# Staff status alone is not enough: the page shows every queue's tasks and error signatures.
STATS_PERMISSION = "django_pgqueue_pipeline.view_queuestatshourly"


def _hours(request: HttpRequest) -> int:
    try:
        hours = int(request.GET.get("hours", DEFAULT_HOURS))
    except ValueError:
        hours = DEFAULT_HOURS
    return min(max(hours, 1), MAX_HOURS)


def stats_context(hours: int, queue: str | None) -> dict[str, Any]:
    """Everything the page shows, from the stats table only (cheap: one indexed range read)."""
    rows = QueueStatsHourly.objects.all()
    latest = rows.order_by("-hour").values_list("hour", flat=True).first()
    end = (latest or timezone.now()).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=hours - 1)
    queues = sorted(set(rows.values_list("queue", flat=True)))
    window = rows.filter(hour__gte=start, hour__lte=end)
    if queue:
        window = window.filter(queue=queue)
    hour_list = [start + timedelta(hours=i) for i in range(hours)]
    index = {h: i for i, h in enumerate(hour_list)}
    processed = [0.0] * hours
    dead = [0.0] * hours
    failed = [0.0] * hours
    wait95: list[float | None] = [None] * hours
    run95: list[float | None] = [None] * hours
    reasons: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    tasks: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: {"processed": 0, "failed": 0, "dead": 0, "run_p95": None, "wait_p95": None}
    )
    for stat in window.order_by("hour"):
        i = index.get(stat.hour)
        if i is None:
            continue
        processed[i] += stat.processed
        dead[i] += stat.dead
        failed[i] += stat.failed
        # The worst task of the hour: what an operator chases.
        if stat.wait_p95 is not None:
            wait95[i] = max(wait95[i] or 0.0, stat.wait_p95)
        if stat.run_p95 is not None:
            run95[i] = max(run95[i] or 0.0, stat.run_p95)
        reasons.update(stat.dead_by_reason)
        for entry in stat.top_errors:
            errors[entry["signature"]] += entry["count"]
        summary = tasks[(stat.queue, stat.task)]
        summary["processed"] += stat.processed
        summary["failed"] += stat.failed
        summary["dead"] += stat.dead
        for key in ("run_p95", "wait_p95"):
            value = getattr(stat, key)
            if value is not None:
                summary[key] = max(summary[key] or 0.0, value)
    labels = [_label(h, hours) for h in hour_list]
    empty = not any(processed) and not any(dead) and not any(failed)
    context: dict[str, Any] = {
        "hours": hours,
        "queue": queue or "",
        "queues": queues,
        "start": start,
        "end": end + timedelta(hours=1),
        "empty": empty,
        "task_rows": sorted(
            ({"queue": q, "task": t, **v} for (q, t), v in tasks.items()),
            key=lambda r: (-r["processed"] - r["dead"], r["queue"], r["task"]),
        ),
    }
    if not empty:
        context["throughput_chart"] = charts.stacked_bars(
            "Messages per hour",
            labels,
            [
                charts.Series("processed", processed, charts.PALETTE[0]),
                charts.Series("dead", dead, charts.PALETTE[1]),
            ],
        )
        context["failed_chart"] = charts.stacked_bars(
            "Failed attempts per hour",
            labels,
            [charts.Series("failed attempts", failed, charts.PALETTE[2])],
        )
        context["latency_chart"] = charts.lines(
            "p95 per hour, worst task (seconds)",
            labels,
            [
                charts.Series("wait p95 (enqueued -> started)", wait95, charts.PALETTE[4]),
                charts.Series("run p95 (started -> finished)", run95, charts.PALETTE[0]),
            ],
            unit="s",
        )
        if reasons:
            context["reasons_chart"] = charts.horizontal_bars(
                "Dead letters by reason", reasons.most_common(), charts.PALETTE[1]
            )
        if errors:
            context["errors_chart"] = charts.horizontal_bars(
                "Top error signatures", errors.most_common(10), charts.PALETTE[2]
            )
    return context


def _label(hour: datetime, hours: int) -> str:
    return f"{hour:%H:00}" if hours <= 24 else f"{hour:%m-%d %H}h"


def render_stats(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The page, framed by ``site``; ``?hours=N`` (1-744, default 48) and ``?queue=name``
    narrow the window. Callers check the permission."""
    context = {
        **site.each_context(request),
        "title": "Queue statistics",
        **stats_context(_hours(request), request.GET.get("queue") or None),
    }
    return render(request, "django_pgqueue/pipeline/stats.html", context)


@staff_member_required
@permission_required(STATS_PERMISSION, raise_exception=True)
def stats_view(request: HttpRequest) -> HttpResponse:
    """The page outside the admin's URLs (``pipeline/urls.py``), on the default admin site."""
    return render_stats(request, admin.site)
