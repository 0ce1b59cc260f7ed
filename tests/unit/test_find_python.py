"""scripts/find_python.sh: the Python that scripts/bootstrap.sh builds .venv with, found on a
machine with only 3.13, only ``python3``, or only pyenv's versions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "find_python.sh"


def fake_python(path: Path, minor: int | None) -> Path:
    """An executable answering the version probe like a Python 3.<minor> (None: broken, like
    a pyenv shim whose version is not installed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {minor}\n" if minor is not None else "#!/bin/sh\nexit 127\n")
    path.chmod(0o755)
    return path


def find_python(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """find_python with only ``tmp_path/bin`` on PATH and ``tmp_path/pyenv`` as pyenv's root."""
    return subprocess.run(
        ["/bin/bash", "-c", f"source {SCRIPT} && find_python"],
        env={
            "PATH": str(tmp_path / "bin"),
            "HOME": str(tmp_path),
            "PYENV_ROOT": str(tmp_path / "pyenv"),
        },
        capture_output=True,
        text=True,
    )


def test_only_python3_13_on_path(tmp_path: Path) -> None:
    fake_python(tmp_path / "bin" / "python3", 11)
    chosen = fake_python(tmp_path / "bin" / "python3.13", 13)
    found = find_python(tmp_path)
    assert (found.returncode, found.stdout.strip()) == (0, str(chosen))


def test_only_python3_when_it_is_new_enough(tmp_path: Path) -> None:
    chosen = fake_python(tmp_path / "bin" / "python3", 13)
    found = find_python(tmp_path)
    assert (found.returncode, found.stdout.strip()) == (0, str(chosen))


def test_3_12_first_for_the_embedded_postgresql(tmp_path: Path) -> None:
    fake_python(tmp_path / "bin" / "python3.13", 13)
    fake_python(tmp_path / "bin" / "python3", 13)
    chosen = fake_python(tmp_path / "bin" / "python3.12", 12)
    assert find_python(tmp_path).stdout.strip() == str(chosen)


def test_pyenv_versions_behind_shims_that_do_not_run(tmp_path: Path) -> None:
    fake_python(tmp_path / "bin" / "python3.12", None)
    fake_python(tmp_path / "bin" / "python3.13", None)
    fake_python(tmp_path / "bin" / "python3", 11)
    chosen = fake_python(tmp_path / "pyenv" / "versions" / "3.13.0" / "bin" / "python", 13)
    found = find_python(tmp_path)
    assert (found.returncode, found.stdout.strip()) == (0, str(chosen))


@pytest.mark.parametrize("minor", [11, None])
def test_nothing_new_enough_says_what_was_tried(tmp_path: Path, minor: int | None) -> None:
    fake_python(tmp_path / "bin" / "python3", minor)
    found = find_python(tmp_path)
    assert found.returncode == 1 and found.stdout == ""
    assert found.stderr.strip() == (
        "tried: python3 (3.11)" if minor else "tried: python3 (does not run)"
    )
