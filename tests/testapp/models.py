from django.db import models


class Effect(models.Model):
    """One row per handled message: UNIQUE(message_id) turns a double run into an error."""

    message_id = models.BigIntegerField(unique=True)
    worker_pid = models.IntegerField()
    attempt = models.IntegerField()

    def __str__(self) -> str:
        return f"effect of message {self.message_id}"
