from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pgqueue/", include("django_pgqueue.pipeline.urls")),
]
