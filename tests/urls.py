"""The admin alone, for runs without a Tasks framework (the demo's URLs enqueue tasks)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
