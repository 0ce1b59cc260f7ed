"""Settings: defaults, overrides, live reload and the precise error for broken values."""

import pytest
from django.test import override_settings

from django_pgqueue.conf import KNOWN_KEYS, PgQueueSettings, SettingsError, get_settings


def test_defaults_apply_when_pgqueue_is_empty():
    with override_settings(PGQUEUE={}):
        conf = get_settings()
    assert conf == PgQueueSettings()
    assert conf.VISIBILITY_TIMEOUT == 30.0
    assert conf.MAX_PAYLOAD_BYTES == 256 * 1024
    assert conf.POLL_INTERVAL <= 30


def test_override_is_read_again_when_the_setting_changes():
    with override_settings(PGQUEUE={"VISIBILITY_TIMEOUT": 7}):
        assert get_settings().VISIBILITY_TIMEOUT == 7
        with override_settings(PGQUEUE={"VISIBILITY_TIMEOUT": 9}):
            assert get_settings().VISIBILITY_TIMEOUT == 9
        assert get_settings().VISIBILITY_TIMEOUT == 7
    assert get_settings().VISIBILITY_TIMEOUT == 30.0


def test_per_queue_override_falls_back_to_global():
    with override_settings(PGQUEUE={"MAX_ATTEMPTS": 4, "QUEUES": {"emails": {"MAX_ATTEMPTS": 9}}}):
        conf = get_settings()
        assert conf.for_queue("emails", "MAX_ATTEMPTS") == 9
        assert conf.for_queue("other", "MAX_ATTEMPTS") == 4


@pytest.mark.parametrize(
    ("pgqueue", "check_id", "fragment"),
    [
        ({"VISIBILTY_TIMEOUT": 5}, "E002", "Unknown key 'VISIBILTY_TIMEOUT'"),
        ({"VISIBILITY_TIMEOUT": -1}, "E003", "VISIBILITY_TIMEOUT"),
        ({"POLL_INTERVAL": 60}, "E003", "POLL_INTERVAL"),
        ({"MAX_ATTEMPTS": 0}, "E003", "MAX_ATTEMPTS"),
        ({"NOTIFY": "yes"}, "E003", "NOTIFY"),
        ({"NOTIFY_CHANNEL": "bad channel;"}, "E003", "NOTIFY_CHANNEL"),
        ({"DEFAULT_QUEUE": "Bad Queue"}, "E004", "Invalid queue name"),
        ({"QUEUES": {"ok": {"MAX_ATEMPTS": 2}}}, "E002", "MAX_ATEMPTS"),
        ({"QUEUES": {"ok": {"VISIBILITY_TIMEOUT": 0}}}, "E003", "VISIBILITY_TIMEOUT"),
        ({"QUEUES": {"no way": {}}}, "E004", "Invalid queue name"),
        ("not a dict", "E002", "must be a dict"),
    ],
)
def test_broken_settings_raise_a_precise_error(pgqueue, check_id, fragment):
    with override_settings(PGQUEUE=pgqueue), pytest.raises(SettingsError) as info:
        get_settings()
    assert info.value.check_id == check_id
    assert fragment in str(info.value)


def test_every_known_key_has_a_validation_rule_and_a_documented_entry():
    from pathlib import Path

    from django_pgqueue.conf import _RULES

    assert set(_RULES) == set(KNOWN_KEYS)
    doc = (Path(__file__).resolve().parents[2] / "docs/reference/settings.md").read_text()
    missing = [key for key in KNOWN_KEYS if f"`{key}`" not in doc]
    assert not missing, f"undocumented settings: {missing}"
