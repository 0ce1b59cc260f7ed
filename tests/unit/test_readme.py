"""The README's install and settings instructions agree with the package and run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def lowest_allowed(requirement: Requirement, series: str) -> Version:
    """The first patch release of ``series`` (say "6.0") the requirement lets pip install."""
    for patch in range(100):
        version = Version(f"{series}.{patch}")
        if requirement.specifier.contains(version):
            return version
    raise AssertionError(f"no {series}.x release is allowed by {requirement}")


def test_the_minimum_django_patch_releases_are_the_requirements() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (django,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "django"]
    series = [c.removeprefix("Framework :: Django :: ") for c in project["classifiers"]]
    series = [s for s in series if re.fullmatch(r"\d+\.\d+", s)]
    assert series == ["5.2", "6.0", "6.1"]
    for each in series:
        assert f"**{lowest_allowed(django, each)}**" in README, each


def test_install_from_a_checkout_or_a_wheel_before_the_first_release() -> None:
    assert 'pip install -e "./django-pgqueue[binary]"' in README
    assert "python -m build" in README
    assert 'wheel="$(echo "$PWD"/dist/django_pgqueue_mq-*.whl)"' in README
    assert 'pip install "$wheel[binary]"' in README


def test_the_settings_read_databases_from_the_environment_with_django_environ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (example,) = [block for block in python_blocks(README) if "env.db(" in block]
    monkeypatch.setenv("DATABASE_URL", "postgres://app:secret@db.internal:5433/shop")
    monkeypatch.delenv("CONN_MAX_AGE", raising=False)
    settings_file = tmp_path / "project" / "settings.py"
    namespace: dict[str, Any] = {"__file__": str(settings_file)}
    exec(example, namespace)
    default = namespace["DATABASES"]["default"]
    assert default["ENGINE"] == "django.db.backends.postgresql"
    assert (default["NAME"], default["USER"], default["HOST"], default["PORT"]) == (
        "shop",
        "app",
        "db.internal",
        5433,
    )
    assert default["CONN_MAX_AGE"] == 60
