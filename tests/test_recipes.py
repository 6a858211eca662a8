"""Examples that run as their users run them: docs/examples/django_recipe with its own
pytest.ini and pytest-django, and docs/examples/without_pytest.py as a script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DJANGO_RECIPE = Path(__file__).parents[1] / "docs" / "examples" / "django_recipe"
WITHOUT_PYTEST = Path(__file__).parents[1] / "docs" / "examples" / "without_pytest.py"


@pytest.mark.parametrize("workers", ["0", "2"], ids=["n0", "n2"])
def test_django_recipe_passes_beside_pytest_django(pytester: pytest.Pytester, workers: str) -> None:
    result = pytester.run(
        sys.executable,
        "-m",
        "pytest",
        "-c",
        DJANGO_RECIPE / "pytest.ini",
        "--rootdir",
        DJANGO_RECIPE,
        DJANGO_RECIPE,
        "-n",
        workers,
        "-p",
        "no:cacheprovider",
        f"--basetemp={pytester.path / 'basetemp'}",
        timeout=300,
    )

    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        [
            "django: version: *, settings: mysite.settings (from ini)",
            "mailbox: 6 reserved, 6 received, 6 claimed, 6 consumed, "
            "0 expired, 0 claims expired, 0 unrouted",
        ]
    )
    if workers == "2":
        result.stdout.fnmatch_lines(["created: 2/2 workers"])


def test_the_core_without_pytest_runs_as_a_script(tmp_path: Path) -> None:
    """getting-started's "Without pytest": a real sink and store, real SMTP, a receipt;
    ``-W error``, so an unclosed store (Python 3.13 warns of it) or socket fails it."""
    done = subprocess.run(
        [sys.executable, "-W", "error", WITHOUT_PYTEST],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    receipt = json.loads(done.stdout)
    assert (receipt["state"], receipt["close_reason"]) == ("released", "released_success")
    assert [(m["subject"], m["state"]) for m in receipt["messages"]] == [("Welcome", "consumed")]
    assert receipt["nodeid"] == ""  # no pytest test ran it
    assert (tmp_path / "mail.sqlite3").is_file()
