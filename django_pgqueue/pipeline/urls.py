"""``path("pgqueue/", include("django_pgqueue.pipeline.urls"))`` mounts the stats page."""

from django.urls import path

from .views import stats_view

app_name = "pgqueue_pipeline"
urlpatterns = [path("stats/", stats_view, name="stats")]
