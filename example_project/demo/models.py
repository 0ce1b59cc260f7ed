from django.db import models


class Signup(models.Model):
    """Business data written in the same transaction as the message that follows it up."""

    email = models.EmailField()
    created_at = models.DateTimeField(auto_now_add=True)
    welcomed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.email
