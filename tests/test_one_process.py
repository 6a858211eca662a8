"""One Python process, many pytest sessions: what an IDE, a notebook (ipytest) or a test
harness does when it calls ``pytest.main`` again and again, and how the plugin is loaded
there (by its entry point, by name, or both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: What these tests' inner runs leave out: plugins that would change them (see conftest.py).
BLOCKED = ["-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry"]

SUITE = """
import smtplib


def test_mail(isolated_mailbox, mailbox_server):
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.sendmail(
            "noreply@app.example.test",
            [isolated_mailbox.address],
            "Subject: Verify\\r\\n\\r\\nhttps://app.example.test/v?token=t0k3n-A7k9Q2x8Zr5w\\r\\n",
        )
    isolated_mailbox.wait_for(subject="Verify", timeout=10).ack()
"""


def _drive(path: Path, script: str, *, env: dict[str, str] | None = None) -> str:
    """Run ``script`` in a Python process of its own in ``path``, warnings as errors; its
    output. The timeout is a hang net only."""
    driver = path / "driver.py"
    driver.write_text(script)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(driver)],
        cwd=path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("loaded_by", ["entry point", "conftest"])
def test_pytest_main_in_a_process_that_imported_the_plugin_before_warns_of_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, loaded_by: str
) -> None:
    """A harness or a notebook that imports ``pytest_mailbox`` (for ``Mailbox`` in a type
    hint, say) before it calls ``pytest.main``: pytest marks an installed plugin's package
    for assertion rewriting, and warned that it was imported already and cannot be
    (``PytestAssertRewriteWarning``), which ``-W error`` or ``filterwarnings = error``
    made the run's end at its start. The plugin's modules hold no test asserts: it asks
    for none (``PYTEST_DONT_REWRITE``). So with the plugin named in a conftest, the way to load it
    where plugins are not loaded by themselves."""
    pytester.makepyfile(test_suite=SUITE)
    if loaded_by == "conftest":
        pytester.makeconftest('pytest_plugins = ["pytest_mailbox.plugin"]')
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    out = _drive(
        pytester.path,
        f"""
import sys
import pytest
import pytest_mailbox
import pytest_mailbox.plugin

for _ in range(2):
    code = pytest.main([*{BLOCKED!r}, "-p", "no:cacheprovider", "-W", "error", "-q"])
    print("exit", int(code))
""",
    )
    assert out.count("exit 0") == 2, out
    assert "PytestAssertRewriteWarning" not in out


@pytest.mark.parametrize(
    ("conftest", "args"),
    [
        ('pytest_plugins = ["pytest_mailbox.plugin"]', ()),
        ("", ("-p", "pytest_mailbox.plugin")),
        ("", ("-p", "mailbox")),
        ('pytest_plugins = ["pytest_mailbox.plugin"]', ("-p", "mailbox")),
    ],
    ids=["conftest", "-p module", "-p mailbox", "conftest and -p mailbox"],
)
@pytest.mark.parametrize("autoload", [True, False], ids=["autoload", "no autoload"])
def test_the_plugin_named_beside_its_entry_point_is_loaded_once(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    conftest: str,
    args: tuple[str, ...],
    autoload: bool,
) -> None:
    """Naming the plugin, as a project does for runs with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``
    (many CI setups), in a conftest or with ``-p``, while its entry point loads it too: the
    run was an INTERNALERROR, ``ValueError: Plugin already registered under a different
    name`` (the module was both ``mailbox`` and ``pytest_mailbox.plugin``)."""
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    assert "already registered" not in result.stdout.str() + result.stderr.str()


def test_without_autoload_and_unnamed_the_plugin_is_off(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` loads no entry point: ``-p mailbox`` (or the
    conftest line) is what turns it on, as the docs say."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'isolated_mailbox' not found*"])
