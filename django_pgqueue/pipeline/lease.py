"""One writer per export destination: a lease row in PostgreSQL, expiring in database time.

An export (or a compaction) takes the lease of its destination before it touches a file and
renews it from a background thread while it works. A second writer is refused, with the
holder named. A killed or stalled run stops renewing; once its lease has expired the next run
takes it over and marks that run failed, so no run shows "running" forever.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models.functions import Now

from ..exceptions import DestinationBusy, LeaseLost
from .committed import local_directory
from .models import EXPORT_LEASE_TABLE, ExportRun, ExportRunStatus

DEFAULT_LEASE_SECONDS = 60.0


def lease_key(destination: str) -> str:
    """One key per place on disk: a local path however it is spelled, a URL as given."""
    directory = local_directory(destination.rstrip("/"))
    return os.path.realpath(directory) if directory is not None else destination.rstrip("/")


def holder_name(run_id: int) -> str:
    return f"run #{run_id} on {socket.gethostname()} pid {os.getpid()}"


@dataclass
class Lease:
    destination: str
    run_id: int
    seconds: float
    alias: str
    taken_over_from: int | None = None


def acquire(destination: str, run: ExportRun, seconds: float, alias: str) -> Lease:
    """Take the destination's lease for ``run``, or raise :class:`DestinationBusy`.

    Must run inside the transaction that created ``run``, so a refused run leaves no row.
    """
    if seconds <= 0:
        raise ValueError(f"lease seconds must be > 0, got {seconds}")
    key = lease_key(destination)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EXPORT_LEASE_TABLE} (destination, run_id, holder, acquired_at, "
            "expires_at) VALUES (%s, %s, %s, now(), now() + make_interval(secs => %s)) "
            "ON CONFLICT (destination) DO NOTHING",
            [key, run.pk, holder_name(run.pk), seconds],
        )
        cursor.execute(
            f"SELECT run_id, holder, acquired_at, expires_at, expires_at < now() "
            f"FROM {EXPORT_LEASE_TABLE} WHERE destination = %s FOR UPDATE",
            [key],
        )
        held_by, holder, acquired_at, expires_at, expired = cursor.fetchone()
        if held_by == run.pk:
            previous = None
        elif not expired:
            raise DestinationBusy(_busy(destination, holder, acquired_at, expires_at))
        else:
            previous = int(held_by)
            cursor.execute(
                f"UPDATE {EXPORT_LEASE_TABLE} SET run_id = %s, holder = %s, acquired_at = now(), "
                "expires_at = now() + make_interval(secs => %s) WHERE destination = %s",
                [run.pk, holder_name(run.pk), seconds, key],
            )
    fail_abandoned_runs(destination, run.pk, alias, previous, holder if previous else "")
    return Lease(key, run.pk, seconds, alias, taken_over_from=previous)


def _busy(destination: str, holder: str, acquired_at: Any, expires_at: Any) -> str:
    return (
        f"Export destination {destination} is being written by export {holder} since "
        f"{acquired_at:%Y-%m-%d %H:%M:%S%z}; its lease runs until "
        f"{expires_at:%Y-%m-%d %H:%M:%S%z} unless renewed. Wait for it to finish; a killed "
        "run's lease expires and the next run takes over."
    )


def refuse_if_held(destination: str, alias: str) -> None:
    """:class:`DestinationBusy` at once when a live lease holds ``destination`` (a quick look
    before starting Spark; :func:`acquire` decides)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT holder, acquired_at, expires_at FROM {EXPORT_LEASE_TABLE} "
            "WHERE destination = %s AND expires_at >= now()",
            [lease_key(destination)],
        )
        row = cursor.fetchone()
    if row is not None:
        raise DestinationBusy(_busy(destination.rstrip("/"), *row))


def fail_abandoned_runs(
    destination: str, current: int, alias: str, expired_run: int | None, expired_holder: str
) -> None:
    """Mark failed every other run of the destination still shown running: none holds the lease."""
    abandoned = ExportRun.objects.using(alias).filter(
        destination=destination, status=ExportRunStatus.RUNNING
    )
    for stale in abandoned.exclude(pk=current):
        if stale.pk == expired_run:
            why = f"its lease expired ({expired_holder}): the run was killed or stalled"
        else:
            why = "it held no lease: the run was killed"
        ExportRun.objects.using(alias).filter(pk=stale.pk).update(
            status=ExportRunStatus.FAILED,
            error=f"{why}; export run #{current} took the destination over.",
            finished_at=Now(),
        )


def renew(lease: Lease) -> None:
    """Extend the lease by its length from now (database time); :class:`LeaseLost` if gone."""
    with transaction.atomic(using=lease.alias), connections[lease.alias].cursor() as cursor:
        cursor.execute(
            f"UPDATE {EXPORT_LEASE_TABLE} SET expires_at = now() + make_interval(secs => %s) "
            "WHERE destination = %s AND run_id = %s AND expires_at >= now()",
            [lease.seconds, lease.destination, lease.run_id],
        )
        if cursor.rowcount != 1:
            raise LeaseLost(
                f"Export run #{lease.run_id} lost its lease on {lease.destination} (it expired "
                "and another run may have taken the destination over); nothing more is "
                "committed by this run."
            )


def release(lease: Lease) -> None:
    with connections[lease.alias].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {EXPORT_LEASE_TABLE} WHERE destination = %s AND run_id = %s",
            [lease.destination, lease.run_id],
        )


class Heartbeat:
    """Renews a lease every third of its length from a thread with its own connection."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgq-export-lease", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.lease.seconds / 3):
                try:
                    renew(self.lease)
                except LeaseLost as lost:
                    self.lost = lost
                    return
                except Exception:  # a failed renewal is retried; expiry decides
                    continue
        finally:
            connections[self.lease.alias].close()

    def check(self) -> None:
        """Raise :class:`LeaseLost` before a commit when the lease is no longer ours."""
        if self.lost is not None:
            raise self.lost
        renew(self.lease)
