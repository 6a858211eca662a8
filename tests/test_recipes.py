"""Examples that run as their users run them: docs/examples/django_recipe with its own
pytest.ini and pytest-django, and docs/examples/without_pytest.py as a script."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DJANGO_RECIPE = Path(__file__).parents[1] / "docs" / "examples" / "django_recipe"
WITHOUT_PYTEST = Path(__file__).parents[1] / "docs" / "examples" / "without_pytest.py"
SIGNUP = Path(__file__).parents[1] / "examples" / "signup"


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


@pytest.mark.parametrize("mode", ["prepend", "importlib"])
def test_the_signup_example_passes_in_either_import_mode(
    pytester: pytest.Pytester, mode: str
) -> None:
    # Under importlib its conftest failed: "ModuleNotFoundError: No module named 'app'"
    # (that mode puts no test's directory on sys.path, and app.py was imported as a
    # top-level module). Run as `make demo` runs it, from the project's root.
    if mode == "importlib" and pytest.version_tuple < (8, 2):
        # Measured on pytest 8.1.1 (make mindeps): "No module named 'signup'", as that
        # mode imported no package's parent before 8.2 (pytest-dev/pytest#12208).
        pytest.skip("pytest 8.1's importlib mode cannot import a package's relative imports")
    result = pytester.run(
        sys.executable,
        "-m",
        "pytest",
        SIGNUP,
        f"--import-mode={mode}",
        "-W",
        "error",
        "-p",
        "no:cacheprovider",
        f"--basetemp={pytester.path / 'basetemp'}",
        timeout=300,
    )

    result.assert_outcomes(passed=10)


def copied_from_the_page() -> str:
    """getting-started's "Without pytest" block, as a reader copies it off the page."""
    page = (Path(__file__).parents[1] / "docs" / "getting-started.md").read_text("utf-8")
    section = page.split("## Without pytest", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("copy", ["example", "page"])
def test_the_core_without_pytest_runs_as_a_script(tmp_path: Path, copy: str) -> None:
    """getting-started's "Without pytest": a real sink and store, real SMTP, a receipt;
    ``-W error``, so an unclosed store (Python 3.13 warns of it) or socket fails it. The
    page's block runs too, as copied: an excerpt may leave out lines, such as imports."""
    script = WITHOUT_PYTEST
    if copy == "page":
        script = tmp_path / "copied.py"
        script.write_text(copied_from_the_page(), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-W", "error", script],
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


#: Django projects the recipe's fixture must serve on any Django: one still on the EMAIL_*
#: settings, whose own code reads them (Django 6.1 refuses that beside a MAILERS); one with
#: two mailers in MAILERS, whose view sends with the second; one whose MAILERS has no
#: "default" (a plain send_mail fails, as in production); and one configured in its
#: conftest, where Django's test environment sets EMAIL_BACKEND itself.
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
    "without_a_default_mailer": """
        import django

        if django.VERSION >= (6, 1):
            MAILERS = {
                "transactional": {
                    "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                    "OPTIONS": {"host": "smtp.example.com"},
                }
            }
    """,
    "configured_in_conftest": "",
}
#: The mailers each project has under the fixture, from Django 6.1.
MAILERS = {
    "two_mailers": ["default", "transactional"],
    "without_a_default_mailer": ["transactional"],
    "configured_in_conftest": ["default"],
}

PROJECT_TEST = """
import django
import pytest
from django.conf import settings
from django.core.mail import EmailMessage, send_mail

KIND = "{kind}"
NEW = django.VERSION >= (6, 1)


@pytest.mark.usefixtures("django_mail")
def test_sends_over_smtp(isolated_mailbox):
    mail = EmailMessage("Verify", "Hello", "app@example.test", [isolated_mailbox.address])
    if not NEW or KIND == "on_email_settings":
        assert not hasattr(settings, "MAILERS")
    else:  # every mailer of the project's sends to the sink, and no other
        assert list(settings.MAILERS) == {mailers}[KIND]
    if NEW and "transactional" in {mailers}.get(KIND, ()):
        assert mail.send(using="transactional") == 1
    else:
        assert mail.send() == 1
    if NEW and KIND == "without_a_default_mailer":
        from django.core.mail import MailerDoesNotExist

        with pytest.raises(MailerDoesNotExist):  # as in production
            send_mail("Other", "Hello", "app@example.test", [isolated_mailbox.address])
    if KIND == "on_email_settings":
        assert settings.EMAIL_HOST == "127.0.0.1"  # the project's own code reads it
    isolated_mailbox.wait_for(subject="Verify", timeout=10).ack()
"""


@pytest.mark.parametrize("kind", sorted(PROJECT_SETTINGS))
def test_the_django_recipe_serves_each_kind_of_project(
    pytester: pytest.Pytester, kind: str
) -> None:
    """Under -W error: but for the project on the EMAIL_* settings, of which Django 6.1
    warns as it reads them, no deprecated setting is used."""
    # The recipe's own conftest.py, with its django_mail fixture.
    conftest = (DJANGO_RECIPE / "conftest.py").read_text(encoding="utf-8")
    if kind == "configured_in_conftest":
        conftest += textwrap.dedent(
            """

            def pytest_configure():
                from django.conf import settings

                settings.configure(SECRET_KEY="test")
            """
        )
    pytester.makeconftest(conftest)
    if kind != "configured_in_conftest":
        pytester.makepyfile(
            project_settings='SECRET_KEY = "test"\n' + textwrap.dedent(PROJECT_SETTINGS[kind])
        )
    test = PROJECT_TEST.replace("{kind}", kind).replace("{mailers}", repr(MAILERS))
    pytester.makepyfile(test_project=test)
    ini = [
        "[pytest]",
        "django_find_project = false",
        "pythonpath = .",
        "filterwarnings =",
        "    error",
        '    ignore:The configuration option "asyncio_default_fixture_loop_scope" is unset',
    ]
    if kind != "configured_in_conftest":
        ini.insert(1, "DJANGO_SETTINGS_MODULE = project_settings")
    if kind == "on_email_settings":
        ini.append("    ignore:The EMAIL_\\w+ setting is deprecated")
    pytester.makeini("\n".join(ini))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def ci_steps() -> tuple[list[str], str]:
    """recipes.md's "In CI" block, as a reader copies it: its `run:` lines and the
    artifact's path."""
    page = (Path(__file__).parents[1] / "docs" / "recipes.md").read_text("utf-8")
    block = page.split("## In CI", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    found = [line.strip() for line in block.splitlines()]
    runs = [line.split("run: ", 1)[1] for line in found if "run: " in line]
    (path,) = (line.split("path: ", 1)[1] for line in found if line.startswith("path: "))
    return runs, path


CI_SUITE = """
import smtplib


def send(server, to, subject, body):
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.sendmail("app@example.test", [to], f"Subject: {subject}\\r\\n\\r\\n{body}\\r\\n")


def test_verified(isolated_mailbox, mailbox_server):
    send(mailbox_server, isolated_mailbox.address, "Your code", "Your code is 482913.")
    message = isolated_mailbox.wait_for(subject="Your code", timeout=10)
    assert message.code() == "482913"
    message.ack()


def test_reset_never_sent(isolated_mailbox):
    isolated_mailbox.wait_for(subject="Reset your password", timeout=0.2)
"""


def test_the_ci_recipe_keeps_both_reports_and_prints_the_failed_tests_timeline(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The steps run as copied (`python` is this interpreter), in a project of two tests,
    one of which fails: the failure step then runs, and shows that test alone."""
    (run_tests, show_failed), artifact = ci_steps()
    pytester.makepyfile(test_signup=CI_SUITE)
    pytester.makeini("[pytest]")
    # The outer run's temporary folder must not be cleaned up by the inner run.
    addopts = f"--basetemp={tmp_path / 'basetemp'} -p no:cacheprovider"

    def run(line: str) -> subprocess.CompletedProcess[str]:
        python, *argv = shlex.split(line)
        assert python == "python"
        return subprocess.run(
            [sys.executable, *argv],
            cwd=pytester.path,
            env={**os.environ, "PYTEST_ADDOPTS": addopts},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    tests = run(run_tests)
    assert tests.returncode == 1, tests.stdout + tests.stderr  # the failure step runs
    assert re.search(r"created: \d+/\d+ workers", tests.stdout)  # under xdist
    reports = pytester.path / artifact
    assert sorted(path.name for path in reports.iterdir()) == ["junit.xml", "receipts.jsonl"]
    for report in reports.iterdir():
        text = report.read_text("utf-8")
        assert "mail-" in text  # the receipts are there...
        assert "482913" not in text  # ...and the code is not

    shown = run(show_failed)
    assert shown.returncode == 0, shown.stderr
    assert "test_signup.py::test_reset_never_sent" in shown.stdout
    assert "test_verified" not in shown.stdout
    assert "waiting          subject='Reset your password'" in shown.stdout
    assert "1 receipt(s)" in shown.stdout
