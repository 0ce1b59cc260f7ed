"""What a URL may ask of an admin page, and how long the page's reads may take.

A change list applies the field lookups its URL names, and Django accepts any lookup on the
model's own fields (``?payload__icontains=``, ``?task__regex=``): each one a scan of a table
that may hold millions of rows. Only the parameters of the filters a list offers are taken.
Every page's reads then run in one transaction under ``ADMIN_STATEMENT_TIMEOUT``, so nothing
a page asks for can hold the database for longer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin import FieldListFilter, ModelAdmin, SimpleListFilter
from django.contrib.admin.utils import get_fields_from_path
from django.db import OperationalError, connections, router, transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse

from ..conf import get_settings

__all__ = ["bounded_reads", "offered_lookups"]

# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout.
QUERY_CANCELED = "57014"


def offered_lookups(model_admin: ModelAdmin[Any], request: HttpRequest) -> set[str]:
    """The URL parameters the list filters of ``model_admin`` read."""
    names: set[str | None] = set()
    for item in model_admin.get_list_filter(request):
        if isinstance(item, type) and issubclass(item, SimpleListFilter):
            names.add(item.parameter_name)
            continue
        field_path: Any
        create: Any
        field_path, create = item if isinstance(item, list | tuple) else (item, None)
        field = get_fields_from_path(model_admin.model, field_path)[-1]
        # Built with no parameters: the filter only says which ones it reads.
        spec = (create or FieldListFilter.create)(
            field, request, {}, model_admin.model, model_admin, field_path=field_path
        )
        names.update(spec.expected_parameters())
    return {name for name in names if name}


def bounded_reads(
    request: HttpRequest, model: type[Any], view: Callable[[], HttpResponse]
) -> HttpResponse:
    """``view()``, rendered, in one transaction whose statements each stop after
    ``ADMIN_STATEMENT_TIMEOUT``; past it, a short page that says so. Requests that change
    something (POST) run as they are: an action may take longer than a page."""
    timeout = get_settings().ADMIN_STATEMENT_TIMEOUT
    if timeout is None or request.method not in ("GET", "HEAD"):
        return view()
    alias = router.db_for_read(model)
    try:
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                milliseconds = max(1, round(timeout * 1000))
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [f"{milliseconds}ms"]
                )
            response = view()
            if isinstance(response, SimpleTemplateResponse):
                response.render()  # the list's rows are read while the template renders
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != QUERY_CANCELED:
            raise
        return HttpResponse(
            f"This page's reads took longer than PGQUEUE['ADMIN_STATEMENT_TIMEOUT'] "
            f"({timeout:g} s) and were stopped. Narrow the list with its filters, or raise "
            "the setting.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    return response
