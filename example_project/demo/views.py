from typing import Any

from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import django_pgqueue
from django_pgqueue.tasks.framework import TaskResultDoesNotExist, TaskResultStatus

from .models import Signup
from .tasks import signup_digest


@csrf_exempt  # a demo API endpoint; real forms keep CSRF protection
@require_POST
def signup(request: HttpRequest) -> HttpResponse:
    email = request.POST.get("email", "").strip()
    if "@" not in email:
        return JsonResponse({"error": "email required"}, status=400)
    with transaction.atomic():
        user = Signup.objects.create(email=email)
        # Written only if the transaction commits: no welcome mail for a signup that failed.
        django_pgqueue.enqueue_on_commit(
            "demo.send-welcome", {"signup_id": user.pk}, queue="emails"
        )
    return JsonResponse({"signup_id": user.pk}, status=201)


def home(request: HttpRequest) -> HttpResponse:
    total = Signup.objects.count()
    welcomed = Signup.objects.filter(welcomed_at__isnull=False).count()
    return HttpResponse(
        f"<h1>django-pgqueue demo</h1><p>{total} signups, {welcomed} welcomed.</p>"
        "<p>POST email=... to <code>/signup/</code>; operators see the queue at "
        '<a href="/admin/">/admin/</a>.</p>'
    )


@csrf_exempt  # a demo API endpoint
@require_POST
def digest(request: HttpRequest) -> HttpResponse:
    """Enqueue the digest task; the row commits with the request's transaction."""
    with transaction.atomic():
        result = signup_digest.enqueue(note=request.POST.get("note", ""))
    return JsonResponse({"task_id": result.id, "status": result.status}, status=201)


def task_status(request: HttpRequest, task_id: str) -> HttpResponse:
    """Where the task is: READY, RUNNING, SUCCESSFUL (with its value) or FAILED."""
    try:
        result = signup_digest.get_result(task_id)
    except TaskResultDoesNotExist:
        raise Http404("no such task") from None
    body: dict[str, Any] = {
        "task_id": result.id,
        "status": result.status,
        "attempts": result.attempts,
        "errors": [e.exception_class_path for e in result.errors],
    }
    if result.status == TaskResultStatus.SUCCESSFUL:
        body["return_value"] = result.return_value
    return JsonResponse(body)
