"""The demo's handlers: what a worker runs for the messages the views enqueue."""

import logging

from django.utils import timezone

import django_pgqueue

from .models import Signup

logger = logging.getLogger("demo")


@django_pgqueue.handler("demo.send-welcome", queue="emails")
def send_welcome(payload: dict) -> dict:
    # Idempotent: a redelivered message finds the signup already welcomed and does nothing.
    updated = Signup.objects.filter(pk=payload["signup_id"], welcomed_at__isnull=True).update(
        welcomed_at=timezone.now()
    )
    logger.info(
        "welcome e-mail for signup %s (%s)",
        payload["signup_id"],
        "sent" if updated else "already sent",
    )
    return {"sent": bool(updated)}
