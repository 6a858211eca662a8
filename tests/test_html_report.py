"""pytest-html: each test's row carries its receipt's timeline."""

from __future__ import annotations

import html
import json
import re

import pytest

SUITE = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.mark.parametrize("n", range(3))
def test_signup(isolated_mailbox, mailbox_server, n):
    mail = EmailMessage()
    mail["From"] = "noreply@app.example.test"
    mail["To"] = isolated_mailbox.address
    mail["Subject"] = f"Verify {n}"
    mail.set_content("code 918273")
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(mail)
    msg = isolated_mailbox.wait_for(subject=f"Verify {n}")
    assert msg.code() == "918273"
    msg.ack()


def test_plain():
    pass
"""


def _report_tests(text: str) -> dict[str, list[dict[str, object]]]:
    """The per-test data pytest-html embeds in its page as a JSON blob."""
    blob = re.search(r'data-jsonblob="([^"]*)"', text)
    assert blob is not None
    tests: dict[str, list[dict[str, object]]] = json.loads(html.unescape(blob.group(1)))["tests"]
    return tests


@pytest.mark.parametrize("workers", ["0", "2"])
def test_html_report_rows_hold_the_receipts(pytester: pytest.Pytester, workers: str) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-n", workers, "--html=report.html", "--self-contained-html")
    result.assert_outcomes(passed=4)
    page = (pytester.path / "report.html").read_text()
    tests = _report_tests(page)
    for n in range(3):
        (row,) = tests[f"test_suite.py::test_signup[{n}]"]
        log = str(row["log"])  # the row's expandable panel, where our hook appends
        assert 'class="mailbox-receipt"' in log
        timeline = html.unescape(log)
        assert "released_success" in timeline
        assert re.search(r"consumed\s+m-[0-9a-f]{12} fence \d+", timeline)
    (plain,) = tests["test_suite.py::test_plain"]
    assert "mailbox-receipt" not in str(plain["log"])
    assert "918273" not in page


#: Counts, at the end of the run, in the process that writes the report (the only one, or
#: xdist's controller), the receipts still held as models.
COUNTING_CONFTEST = """
import gc

from pytest_mailbox.contract import Receipt


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        gc.collect()
        alive = sum(isinstance(o, Receipt) for o in gc.get_objects())
        (session.config.rootpath / "receipts-alive.txt").write_text(str(alive))
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_html_report_keeps_no_receipt_of_a_row_it_has_written(
    pytester: pytest.Pytester, workers: str
) -> None:
    """Each test's receipts were kept, parsed, to the end of the run once its row was
    written: 2,000 tests held 2,000 receipts and their events (about 12 models each)."""
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(  # its own process: only its receipts are counted
        *("-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry"),
        *("-n", workers, "--html=report.html", "--self-contained-html"),
    )
    result.assert_outcomes(passed=4)
    assert (pytester.path / "receipts-alive.txt").read_text() == "0"
    tests = _report_tests((pytester.path / "report.html").read_text())
    for n in range(3):
        (row,) = tests[f"test_suite.py::test_signup[{n}]"]
        assert 'class="mailbox-receipt"' in str(row["log"])
