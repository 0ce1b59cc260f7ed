"""The ``PGQUEUE`` settings namespace: defaults, validation and live reload.

Every key is documented in ``docs/reference/settings.md``. Read settings through
:func:`get_settings`; the value is rebuilt whenever Django's ``setting_changed`` fires
(``override_settings`` in tests), so nothing caches a stale copy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .core._validation import MAX_ATTEMPTS_LIMIT, valid_max_attempts
from .exceptions import SettingsError

SETTINGS_NAME = "PGQUEUE"

#: Channel names become SQL identifiers in LISTEN; keep them plain and short.
CHANNEL_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

#: Keys allowed inside ``PGQUEUE["QUEUES"][<name>]``: per-queue overrides.
PER_QUEUE_KEYS = frozenset(
    {
        "VISIBILITY_TIMEOUT",
        "MAX_ATTEMPTS",
        "TASK_TIMEOUT",
        "CONCURRENCY_LIMIT",
        "RATE_LIMIT",
        "ARCHIVE_RETENTION",
        "DEAD_RETENTION",
        "MAX_SNOOZES",
    }
)
#: Flow-control keys (core/_flow_control.py) that exist only per queue, not at the top level.
PER_QUEUE_ONLY_KEYS = frozenset(
    {
        "FAIRNESS",
        "TENANT_WEIGHTS",
        "KEY_CONCURRENCY_LIMIT",
        "KEY_CONCURRENCY_LIMITS",
        "KEY_RATE_LIMIT",
    }
)
PER_QUEUE_KEYS = PER_QUEUE_KEYS | PER_QUEUE_ONLY_KEYS

#: Upper bounds of ``BATCH_SIZE`` and ``CONCURRENCY`` (and of ``pgq_worker``'s flags).
MAX_BATCH_SIZE = 10_000
MAX_CONCURRENCY = 1_000
#: Most days of archive partitions kept created ahead.
MAX_PARTITIONS_AHEAD = 60


@dataclass(frozen=True)
class PgQueueSettings:
    """The effective settings: ``PGQUEUE`` laid over these defaults."""

    DATABASE_ALIAS: str = "default"
    DEFAULT_QUEUE: str = "default"
    MAX_ATTEMPTS: int = 3
    VISIBILITY_TIMEOUT: float = 30.0
    BACKOFF_BASE: float = 1.0
    BACKOFF_MAX: float = 3600.0
    BACKOFF_JITTER: float = 0.2
    MAX_PAYLOAD_BYTES: int = 256 * 1024
    NOTIFY: bool = True
    NOTIFY_CHANNEL: str = "django_pgqueue"
    POLL_INTERVAL: float = 5.0
    BATCH_SIZE: int = 100
    CONCURRENCY: int = 4
    GRACE_PERIOD: float = 30.0
    TASK_TIMEOUT: float | None = None
    HEARTBEAT_INTERVAL: float = 10.0
    COMPLETION_FLUSH_INTERVAL: float = 0.05
    STALE_READY_WARNING: float = 60.0
    SYNCHRONOUS_ACKS: bool = False
    MAX_RESULT_BYTES: int = 1024 * 1024
    MAX_ERROR_MESSAGE_CHARS: int = 4096
    MAX_TRACEBACK_CHARS: int = 16384
    LOG_ERROR_CHARS: int = 200
    PERIODIC_GRACE: float = 60.0
    ARCHIVE_RETENTION: float | None = 7 * 86400.0
    DEAD_RETENTION: float | None = 30 * 86400.0
    RETENTION_INTERVAL: float | None = 300.0
    ARCHIVE_PARTITIONS_AHEAD: int = 7
    RETENTION_DELETE_BATCH: int = 5000
    RETENTION_DELETE_LIMIT: int = 100_000
    ADMIN_STATEMENT_TIMEOUT: float | None = 10.0
    MAX_SNOOZES: int = 100
    PROGRESS_INTERVAL: float = 1.0
    QUEUES: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_queue(self, queue: str, key: str) -> Any:
        """A per-queue override from ``QUEUES`` if there is one, else the global value."""
        override = self.QUEUES.get(queue, {})
        if key in override:
            return override[key]
        return getattr(self, key, None)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _non_negative(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _optional_positive(value: Any) -> bool:
    return value is None or _positive(value)


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# One rule per key: (predicate, what a valid value looks like).
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "DATABASE_ALIAS": (lambda v: isinstance(v, str) and bool(v), "a database alias"),
    "DEFAULT_QUEUE": (lambda v: isinstance(v, str), "a queue name"),
    "MAX_ATTEMPTS": (valid_max_attempts, f"a whole number in [1, {MAX_ATTEMPTS_LIMIT}]"),
    "VISIBILITY_TIMEOUT": (_positive, "a number of seconds > 0"),
    "BACKOFF_BASE": (_non_negative, "a number of seconds >= 0"),
    "BACKOFF_MAX": (_non_negative, "a number of seconds >= 0"),
    "BACKOFF_JITTER": (lambda v: _non_negative(v) and v <= 1, "a fraction between 0 and 1"),
    "MAX_PAYLOAD_BYTES": (_positive_int, "a whole number of bytes >= 1"),
    "NOTIFY": (lambda v: isinstance(v, bool), "True or False"),
    "NOTIFY_CHANNEL": (
        lambda v: isinstance(v, str) and bool(CHANNEL_PATTERN.match(v)),
        f"a channel name matching {CHANNEL_PATTERN.pattern}",
    ),
    "POLL_INTERVAL": (lambda v: _positive(v) and v <= 30, "a number of seconds in (0, 30]"),
    "BATCH_SIZE": (
        lambda v: _positive_int(v) and v <= MAX_BATCH_SIZE,
        f"a whole number in [1, {MAX_BATCH_SIZE}]",
    ),
    "CONCURRENCY": (
        lambda v: _positive_int(v) and v <= MAX_CONCURRENCY,
        f"a whole number in [1, {MAX_CONCURRENCY}]",
    ),
    "GRACE_PERIOD": (_non_negative, "a number of seconds >= 0"),
    "TASK_TIMEOUT": (_optional_positive, "None or a number of seconds > 0"),
    "HEARTBEAT_INTERVAL": (_positive, "a number of seconds > 0"),
    "COMPLETION_FLUSH_INTERVAL": (_non_negative, "a number of seconds >= 0"),
    "STALE_READY_WARNING": (_positive, "a number of seconds > 0"),
    "SYNCHRONOUS_ACKS": (lambda v: isinstance(v, bool), "True or False"),
    "MAX_RESULT_BYTES": (_positive_int, "a whole number of bytes >= 1"),
    "MAX_ERROR_MESSAGE_CHARS": (_positive_int, "a whole number of characters >= 1"),
    "MAX_TRACEBACK_CHARS": (_positive_int, "a whole number of characters >= 1"),
    "LOG_ERROR_CHARS": (_non_negative_int, "a whole number of characters >= 0"),
    "PERIODIC_GRACE": (_non_negative, "a number of seconds >= 0"),
    "ARCHIVE_RETENTION": (_optional_positive, "None (keep) or a number of seconds > 0"),
    "DEAD_RETENTION": (_optional_positive, "None (keep) or a number of seconds > 0"),
    "RETENTION_INTERVAL": (_optional_positive, "None (workers never expire) or seconds > 0"),
    "ARCHIVE_PARTITIONS_AHEAD": (
        lambda v: _positive_int(v) and v <= MAX_PARTITIONS_AHEAD,
        f"a whole number of days in [1, {MAX_PARTITIONS_AHEAD}]",
    ),
    "RETENTION_DELETE_BATCH": (_positive_int, "a whole number of rows >= 1"),
    "RETENTION_DELETE_LIMIT": (_positive_int, "a whole number of rows >= 1"),
    "ADMIN_STATEMENT_TIMEOUT": (_optional_positive, "None (no limit) or a number of seconds > 0"),
    "MAX_SNOOZES": (_non_negative_int, "a whole number >= 0"),
    "PROGRESS_INTERVAL": (_non_negative, "a number of seconds >= 0"),
    "QUEUES": (lambda v: isinstance(v, Mapping), "a dict of queue name -> overrides"),
}

KNOWN_KEYS = frozenset(f.name for f in fields(PgQueueSettings))


def _optional_positive_int(value: Any) -> bool:
    return value is None or _positive_int(value)


def _int_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and k and _positive_int(v) for k, v in value.items()
    )


# Rules of the keys that exist only inside ``QUEUES[<name>]`` (and stricter ones for the
# flow-control limits than the generic "None or a number > 0").
_PER_QUEUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "FAIRNESS": (lambda v: isinstance(v, bool), "True or False"),
    "TENANT_WEIGHTS": (_int_map, "a dict of tenant -> whole number >= 1"),
    "CONCURRENCY_LIMIT": (_optional_positive_int, "None or a whole number >= 1"),
    "KEY_CONCURRENCY_LIMIT": (_optional_positive_int, "None or a whole number >= 1"),
    "KEY_CONCURRENCY_LIMITS": (_int_map, "a dict of key -> whole number >= 1"),
    "RATE_LIMIT": (_optional_positive, "None or a number of messages per second > 0"),
    "KEY_RATE_LIMIT": (_optional_positive, "None or a number of messages per second > 0"),
}


def settings_problems(raw: Any) -> list[SettingsError]:
    """Every problem in a raw ``PGQUEUE`` value, in a stable order (used by checks too)."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [SettingsError(f"{SETTINGS_NAME} must be a dict, not {type(raw).__name__}.", "E002")]
    from .core._validation import QueueNameError, validate_queue_name

    problems: list[SettingsError] = []
    for key in sorted(set(raw) - KNOWN_KEYS):
        problems.append(
            SettingsError(
                f"Unknown key {key!r} in {SETTINGS_NAME}. Known keys: {', '.join(sorted(KNOWN_KEYS))}.",
                "E002",
            )
        )
    for key, (is_valid, expected) in _RULES.items():
        if key in raw and not is_valid(raw[key]):
            problems.append(
                SettingsError(
                    f"{SETTINGS_NAME}[{key!r}] must be {expected}; got {raw[key]!r}.", "E003"
                )
            )
    if "DEFAULT_QUEUE" in raw and isinstance(raw["DEFAULT_QUEUE"], str):
        try:
            validate_queue_name(raw["DEFAULT_QUEUE"])
        except QueueNameError as exc:
            problems.append(SettingsError(f"{SETTINGS_NAME}['DEFAULT_QUEUE']: {exc}", "E004"))
    queues = raw.get("QUEUES")
    if isinstance(queues, Mapping):
        for name, overrides in queues.items():
            try:
                validate_queue_name(name)
            except QueueNameError as exc:
                problems.append(SettingsError(f"{SETTINGS_NAME}['QUEUES']: {exc}", "E004"))
            if not isinstance(overrides, Mapping):
                problems.append(
                    SettingsError(f"{SETTINGS_NAME}['QUEUES'][{name!r}] must be a dict.", "E003")
                )
                continue
            for key in sorted(set(overrides) - PER_QUEUE_KEYS):
                problems.append(
                    SettingsError(
                        f"Unknown key {key!r} in {SETTINGS_NAME}['QUEUES'][{name!r}]. "
                        f"Known keys: {', '.join(sorted(PER_QUEUE_KEYS))}.",
                        "E002",
                    )
                )
            for key in sorted(set(overrides) & PER_QUEUE_KEYS):
                rule = _PER_QUEUE_RULES.get(key) or _RULES.get(key)
                value = overrides[key]
                if rule is not None and not rule[0](value):
                    problems.append(
                        SettingsError(
                            f"{SETTINGS_NAME}['QUEUES'][{name!r}][{key!r}] must be {rule[1]}; "
                            f"got {value!r}.",
                            "E003",
                        )
                    )
                elif rule is None and not _optional_positive(value):
                    problems.append(
                        SettingsError(
                            f"{SETTINGS_NAME}['QUEUES'][{name!r}][{key!r}] must be None or a "
                            f"number > 0; got {value!r}.",
                            "E003",
                        )
                    )
    return problems


def _build() -> PgQueueSettings:
    raw = getattr(django_settings, SETTINGS_NAME, None)
    problems = settings_problems(raw)
    if problems:
        raise problems[0]
    return PgQueueSettings(**dict(raw or {}))


_cached: PgQueueSettings | None = None


def get_settings() -> PgQueueSettings:
    """The effective ``PGQUEUE`` settings; raises :class:`SettingsError` when they are broken."""
    global _cached
    if _cached is None:
        _cached = _build()
    return _cached


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == SETTINGS_NAME:
        _cached = None
