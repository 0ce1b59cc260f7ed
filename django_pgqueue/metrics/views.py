"""The queue gauges as a Django view, for a project to mount (``urls.py`` or its own path).

Every scrape reads the database (two short statements, ``queues.py``), so any process of a
web server answers the same: nothing is kept between requests, and ``prometheus_client``'s
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) is neither needed nor read. Mount it where
only the scraper reaches it, or wrap it in the project's own access check.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from .exposition import QueueCollector, render

__all__ = ["metrics"]


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """``pgqueue_queue_*``, ``pgqueue_workers_live`` and the tables' row estimates."""
    content_type, body = render(QueueCollector())
    return HttpResponse(body, content_type=content_type)
