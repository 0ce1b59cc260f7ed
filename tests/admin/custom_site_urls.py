"""A second admin site, to show the admin classes work on any AdminSite instance."""

from django.contrib import admin
from django.urls import path

from django_pgqueue.admin import (
    ArchivedMessageAdmin,
    DeadMessageAdmin,
    MessageAdmin,
    QueueStateAdmin,
    WorkerHeartbeatAdmin,
)
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message, QueueState, WorkerHeartbeat

ops_site = admin.AdminSite(name="ops")
ops_site.register(Message, MessageAdmin)
ops_site.register(ArchivedMessage, ArchivedMessageAdmin)
ops_site.register(DeadMessage, DeadMessageAdmin)
ops_site.register(QueueState, QueueStateAdmin)
ops_site.register(WorkerHeartbeat, WorkerHeartbeatAdmin)

urlpatterns = [path("admin/", admin.site.urls), path("ops/", ops_site.urls)]
