from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import django_pgqueue

from .models import Signup


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
