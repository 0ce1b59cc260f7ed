from django.urls import path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("signup/", views.signup, name="signup"),
    path("tasks/digest/", views.digest, name="digest"),
    path("tasks/<str:task_id>/", views.task_status, name="task-status"),
]
