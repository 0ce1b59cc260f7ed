"""System checks: each stable id fires on the broken setting it names, and only then."""

import warnings

import pytest
from django.core import checks
from django.test import override_settings


def ids(**settings_overrides):
    with warnings.catch_warnings():
        # override_settings warns about DATABASES; these checks only read the setting.
        warnings.simplefilter("ignore", UserWarning)
        return _ids(**settings_overrides)


def _ids(**settings_overrides):
    with override_settings(**settings_overrides):
        return [m.id for m in checks.run_checks() if m.id and m.id.startswith("django_pgqueue")]


def test_a_correct_configuration_passes():
    assert ids() == []


def test_e001_non_postgres_engine():
    assert ids(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    ) == ["django_pgqueue.E001"]


def test_e005_database_alias_missing():
    assert "django_pgqueue.E005" in ids(PGQUEUE={"DATABASE_ALIAS": "queue"})


@pytest.mark.parametrize(
    ("pgqueue", "expected"),
    [
        ({"UNKNOWN": 1}, "django_pgqueue.E002"),
        ({"GRACE_PERIOD": -5}, "django_pgqueue.E003"),
        ({"VISIBILITY_TIMEOUT": -1}, "django_pgqueue.E003"),
        ({"DEFAULT_QUEUE": "UPPER"}, "django_pgqueue.E004"),
    ],
)
def test_settings_checks(pgqueue, expected):
    assert ids(PGQUEUE=pgqueue) == [expected]


def test_manage_py_check_reports_broken_settings(capsys):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with override_settings(PGQUEUE={"BATCH_SIZE": 0}), pytest.raises(SystemCheckError) as info:
        call_command("check")
    assert "django_pgqueue.E003" in str(info.value)
