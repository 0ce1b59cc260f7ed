from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    default_auto_field = "django.db.models.BigAutoField"
    # demo/handlers.py needs no import here: django_pgqueue imports every installed app's
    # handlers module at startup.
