"""Examples that run as their users run them: docs/examples/django_recipe with its own
pytest.ini and pytest-django, and docs/examples/without_pytest.py as a script."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
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


#: Two Django projects the recipe's fixture must serve on any Django: one still on the
#: EMAIL_* settings, whose own code reads them (Django 6.1 refuses that beside a MAILERS),
#: and one with two mailers in MAILERS (Django 6.1), whose view sends with the second.
PROJECT_SETTINGS = {
    "on_email_settings": """
        EMAIL_HOST = "smtp.example.com"
        EMAIL_PORT = 2525
    """,
    "two_mailers": """
        import django

        if django.VERSION >= (6, 1):
            MAILERS = {
                alias: {
                    "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                    "OPTIONS": {"host": "smtp.example.com"},
                }
                for alias in ("default", "transactional")
            }
    """,
}

PROJECT_TEST = """
import django
import pytest
from django.conf import settings
from django.core.mail import EmailMessage


@pytest.fixture
def django_mail(settings, mailbox_server):  # the recipe's fixture, as recipes.md shows it
    for key, value in mailbox_server.settings["django"].items():
        setattr(settings, key, value)


@pytest.mark.usefixtures("django_mail")
def test_sends_over_smtp(isolated_mailbox):
    mail = EmailMessage("Verify", "Hello", "app@example.test", [isolated_mailbox.address])
    if "{kind}" == "on_email_settings" or django.VERSION < (6, 1):
        assert not hasattr(settings, "MAILERS")
    else:  # every mailer of the project's sends to the sink
        assert list(settings.MAILERS) == ["default", "transactional"]
    if "{kind}" == "two_mailers" and django.VERSION >= (6, 1):
        assert mail.send(using="transactional") == 1
    else:
        assert mail.send() == 1
    if "{kind}" == "on_email_settings":
        assert settings.EMAIL_HOST == "127.0.0.1"  # the project's own code reads it
    isolated_mailbox.wait_for(subject="Verify", timeout=10).ack()
"""


@pytest.mark.parametrize("kind", sorted(PROJECT_SETTINGS))
def test_the_django_recipe_serves_projects_on_email_settings_and_on_several_mailers(
    pytester: pytest.Pytester, kind: str
) -> None:
    pytester.makepyfile(
        project_settings='SECRET_KEY = "test"\n' + textwrap.dedent(PROJECT_SETTINGS[kind])
    )
    pytester.makepyfile(test_project=PROJECT_TEST.replace("{kind}", kind))
    pytester.makeini(
        """
        [pytest]
        DJANGO_SETTINGS_MODULE = project_settings
        django_find_project = false
        pythonpath = .
        filterwarnings =
            error
            ignore:The EMAIL_\\w+ setting is deprecated
            ignore:The configuration option "asyncio_default_fixture_loop_scope" is unset
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
