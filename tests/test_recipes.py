"""docs/examples/django_recipe runs as its users run it: its own pytest.ini, with pytest-django."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

DJANGO_RECIPE = Path(__file__).parents[1] / "docs" / "examples" / "django_recipe"


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
