"""``path("metrics/", include("django_pgqueue.metrics.urls"))`` serves the queue gauges."""

from django.urls import path

from . import views

urlpatterns = [path("", views.metrics, name="pgqueue-metrics")]
