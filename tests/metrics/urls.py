"""The queue gauges mounted as a project would (tests/metrics/test_view.py)."""

from django.urls import include, path

urlpatterns = [path("metrics/", include("django_pgqueue.metrics.urls"))]
