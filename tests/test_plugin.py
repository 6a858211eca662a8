"""The plugin as a user meets it: fixtures, marker, options, receipts, under -n 0 and -n 2."""

from __future__ import annotations

import base64
import codecs
import fcntl
import gc
import html
import importlib.metadata
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from pytest_mailbox import endpoint, plugin
from pytest_mailbox.contract import MessageReceipt, Receipt, ReceiptEvent, dump_receipt
from pytest_mailbox.endpoint import SmtpEndpoint
from pytest_mailbox.receipts import format_table, read_receipts
from pytest_mailbox.receipts import main as receipts_main
from pytest_mailbox.settings import options_table

SENDER_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.fixture
def send(mailbox_server):
    def send(to, subject="Verify your account", body="", headers=None):
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = subject
        for name, value in (headers or {}).items():
            msg[name] = value
        msg.set_content(body or "Welcome. Open https://app.example.test/verify?token=s3cr3t-t0ken-value")
        with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
            smtp.send_message(msg)
    return send
"""

USER_SUITE = """
import pytest


@pytest.mark.email_contract(purpose="signup", ttl=60, lease=30)
@pytest.mark.parametrize("n", range(4))
def test_signup(isolated_mailbox, send, request, n):
    isolated_mailbox.checkpoint()
    send(isolated_mailbox.address, headers={"X-Run-Id": isolated_mailbox.run_id})
    msg = isolated_mailbox.wait_for(subject_contains="Verify")
    assert msg.link(domain="app.example.test").startswith("https://app.example.test/verify")
    msg.ack()
    request.node.user_properties.append(
        ("expected", f"{isolated_mailbox.run_id} {msg.message_id}")
    )


def test_reset(isolated_mailbox, send, request):
    send(isolated_mailbox.address, subject="Reset your password")
    msg = isolated_mailbox.wait_for(subject="Reset your password")
    request.node.user_properties.append(
        ("expected", f"{isolated_mailbox.run_id} {msg.message_id}")
    )
"""


def _junit_cases(path: Path) -> dict[str, tuple[dict[str, str], list[Receipt]]]:
    """{test name: (properties, receipts)} from a JUnit XML file."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        receipts = [
            Receipt.model_validate_json(p.get("value", ""))
            for p in case.iter("property")
            if p.get("name") == "mailbox.receipt"
        ]
        cases[case.get("name", "")] = (props, receipts)
    return cases


def _closes(junit: Path) -> dict[str, tuple[str | None, list[str]]]:
    """{test function: (its receipt's close reason, its messages' states)} from JUnit XML."""
    return {
        name.rsplit("::", 1)[-1]: (receipt.close_reason, [m.state for m in receipt.messages])
        for name, (_, receipts) in _junit_cases(junit).items()
        for receipt in receipts
    }


@pytest.mark.parametrize("workers", ["0", "2"])
def test_user_suite_leaves_one_receipt_per_test(pytester: pytest.Pytester, workers: str) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_suite=USER_SUITE)
    result = pytester.runpytest(
        "-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=out/receipts.jsonl"
    )
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "mailbox: 5 reserved, 5 received, 5 claimed, 5 consumed, "
            "0 expired, 0 claims expired, 0 unrouted"
        ]
    )
    cases = _junit_cases(pytester.path / "junit.xml")
    assert len(cases) == 5
    for props, receipts in cases.values():
        (receipt,) = receipts
        run_id, message_id = props["expected"].split()
        assert receipt.run_id == run_id
        assert [m.message_id for m in receipt.messages] == [message_id]
        assert receipt.messages[0].state == "consumed"
        assert receipt.close_reason == "released_success"
        assert receipt.state == "released"
    # one pytest run: every receipt, whichever worker wrote it, names the same testrun
    (testrun,) = {r.testrun_uid for _, rs in cases.values() for r in rs}
    assert testrun is not None
    assert re.fullmatch(r"[0-9a-f]{32}", testrun)
    lines = (pytester.path / "out" / "receipts.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["run_id"] for line in lines) == sorted(
        r.run_id for _, rs in cases.values() for r in rs
    )


LOGIN_USER = "tok-Vq3Nw8Rz"
LOGIN_PASSWORD = "pw-Zq8vT4nW2xKp9LmR"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_app_that_logs_in_gets_its_mail_and_its_login_is_written_nowhere(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The app keeps its relay's login: it logs in to the sink, and its mail reaches the
    test's mailbox. Neither the password nor the user name (a token, for some relays) is in
    the run's output, at DEBUG, its receipts, its JUnit XML or the store's files."""
    pytester.makepyfile(
        f"""
        import smtplib
        from email.message import EmailMessage
        from pathlib import Path

        def test_signup(mailbox_server, isolated_mailbox):
            msg = EmailMessage()
            msg["From"] = "noreply@app.example.test"
            msg["To"] = isolated_mailbox.address
            msg["Subject"] = "Welcome"
            msg.set_content("Open https://app.example.test/verify?token=s3cr3t-t0ken-value")
            with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
                smtp.login({LOGIN_USER!r}, {LOGIN_PASSWORD!r})
                smtp.send_message(msg)
            isolated_mailbox.wait_for(subject="Welcome", timeout=10).ack()
            Path("store.txt").write_text(str(isolated_mailbox.store.path))
        """
    )
    result = pytester.runpytest(
        "-n", workers, "-vv", "-rA", "--log-level=DEBUG",
        "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl",
    )  # fmt: skip

    result.assert_outcomes(passed=1)
    assert "Using builtin auth_ hook for 'PLAIN'" in result.stdout.str()  # DEBUG is shown
    store = Path((pytester.path / "store.txt").read_text())
    written = {
        "output": (result.stdout.str() + result.stderr.str()).encode(),
        "junit": (pytester.path / "junit.xml").read_bytes(),
        "receipts": (pytester.path / "receipts.jsonl").read_bytes(),
        **{p.name: p.read_bytes() for p in store.parent.glob(f"{store.name}*")},
    }
    stored = b"".join(content for name, content in written.items() if name.startswith(store.name))
    assert b"Subject: Welcome" in stored  # the store's bytes are read, the message is there
    secrets = [
        LOGIN_USER.encode(),
        LOGIN_PASSWORD.encode(),
        base64.b64encode(f"\0{LOGIN_USER}\0{LOGIN_PASSWORD}".encode()),
    ]
    for where, content in written.items():
        for secret in secrets:
            assert secret not in content, where


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_claim_acked_at_teardown_says_so_in_the_receipts_timeline(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A passing test's teardown acks the claim it still holds: a reviewer of the receipt
    can tell that from the test's own ack()."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_acks_itself(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()

        def test_leaves_it_to_teardown(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for()
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")
    result.assert_outcomes(passed=2)
    consumed = {
        name: [e.detail for e in receipt.events if e.status == "consumed"]
        for name, (_, (receipt,)) in _junit_cases(pytester.path / "junit.xml").items()
    }
    (own,) = consumed["test_acks_itself"]
    (at_teardown,) = consumed["test_leaves_it_to_teardown"]
    assert re.fullmatch(r"m-[0-9a-f]+ fence \d+", own)
    assert re.fullmatch(
        r"m-[0-9a-f]+ fence \d+, acked at close as a success, not by ack\(\)", at_teardown
    )


THREADED_WAITS = """
import os
import sys
import threading
from pathlib import Path

import pytest

from pytest_mailbox import store

# The checkpointer's own connection opens on its thread whenever it starts: not counted.
store.CHECKPOINT_EVERY = sys.maxsize


@pytest.mark.parametrize("n", range(40))
def test_waits_in_a_thread(isolated_mailbox, mailbox_store, send, n):
    files = {str(mailbox_store.path), f"{mailbox_store.path}-wal"}
    fds = [f for f in os.listdir("/proc/self/fd") if _target(f) in files]
    with open("fds.txt", "a") as out:
        out.write(f"{len(fds)}\\n")
    send(isolated_mailbox.address)
    claimed = []
    waiter = threading.Thread(target=lambda: claimed.append(isolated_mailbox.wait_for()))
    waiter.start()
    waiter.join()
    claimed[0].ack()


def _target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the descriptor listdir itself had open
        return ""
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_tests_that_wait_from_threads_of_their_own_hold_no_more_descriptors_as_they_go(
    pytester: pytest.Pytester,
) -> None:
    """Each thread that used the store kept its two connections open to the run's end: a
    suite of tests that wait from threads ran out of file descriptors."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_threads=THREADED_WAITS)
    result = pytester.runpytest_subprocess("-n", "0", "-p", "no:cacheprovider")  # its own fds
    result.assert_outcomes(passed=40)
    counts = [int(line) for line in (pytester.path / "fds.txt").read_text().splitlines()]
    assert counts[2:] == [counts[2]] * 38  # the sink's and the first thread's opened by then


#: What pytest-rerunfailures does, in brief: run a failed test's whole protocol again, on
#: the same item (its user_properties kept), and report only the last attempt.
RERUN_CONFTEST = """
import pytest
from _pytest.runner import runtestprotocol


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for attempt in (1, 2):
        item._initrequest()
        reports = runtestprotocol(item, nextitem=nextitem, log=attempt == 2)
        if attempt == 1 and all(r.passed for r in reports):
            for report in reports:
                item.ihook.pytest_runtest_logreport(report=report)
            break
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_rerun_reports_the_receipt_of_its_own_attempt_only(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makeconftest(SENDER_CONFTEST + RERUN_CONFTEST)
    pytester.makepyfile(
        """
        ATTEMPTS = []

        def test_flaky(isolated_mailbox, send, request):
            ATTEMPTS.append(isolated_mailbox.run_id)
            request.node.user_properties.append(("attempt", isolated_mailbox.run_id))
            assert len(ATTEMPTS) == 2, "fails the first time"
        """
    )
    result = pytester.runpytest(
        "-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl"
    )
    result.assert_outcomes(passed=1)
    ((props, receipts),) = _junit_cases(pytester.path / "junit.xml").values()
    (receipt,) = receipts  # the second attempt's, not the first one's as well
    assert receipt.run_id == props["attempt"]
    assert receipt.close_reason == "released_success"  # the first attempt's failure is not its
    lines = (pytester.path / "receipts.jsonl").read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [receipt.run_id]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_rerun_whose_app_sends_to_the_first_attempts_address_is_told_so(
    pytester: pytest.Pytester, workers: str
) -> None:
    """An app that keeps the address a first attempt gave it (a user row, a module's
    cache) sends the rerun's mail there: the rerun never takes it (the earlier attempt's
    mailbox is closed, and not this run's), and its timeout said no mail had arrived at
    all, and asked whether the app sends to the sink."""
    pytester.makeconftest(SENDER_CONFTEST + RERUN_CONFTEST)
    pytester.makepyfile(
        """
        from pathlib import Path

        APP = {}

        def test_flaky(isolated_mailbox, send):
            first = "user" not in APP
            address = APP.setdefault("user", isolated_mailbox.address)
            if first:
                Path("first.txt").write_text(f"{address} {isolated_mailbox.run_id}")
            send(address, subject="Verify your account")
            isolated_mailbox.wait_for(subject="Verify your account", timeout=0.5)
            assert not first, "fails the first time"
        """
    )
    result = pytester.runpytest("-n", workers, "--mailbox-receipts=receipts.jsonl")
    result.assert_outcomes(failed=1)
    first_address, first_run = (pytester.path / "first.txt").read_text().split()
    (rerun,) = read_receipts(pytester.path / "receipts.jsonl")  # the last attempt's
    assert rerun.messages == []  # never the first attempt's mail
    result.stdout.fnmatch_lines(
        [
            "E       near misses (1):",
            "E         - m-* 'Verify your account': sent to "
            f"{first_address}, the address of an earlier run of this test (run {first_run}, "
            f"closed): the app kept the address that run was given; give it this run's, "
            f"{rerun.address}",
        ]
    )
    result.stdout.no_fnmatch_line("*no mail arrived*")
    # Named once, as its own test's earlier attempt, not again as another test's late mail.
    result.stdout.no_fnmatch_line("*mail for an earlier test's mailbox*")


#: What pytest-retry (1.7) does, in brief: inside the failed call's makereport, tear the
#: test down and set it up and call it again through the hooks, with no report of its own
#: for those phases (no makereport, no logreport), until an attempt passes; the call's
#: report then takes the last attempt's outcome. Its wrapper runs outside the plugin's
#: when it is registered after it, inside it otherwise (entry points load in the order the
#: environment lists them): {priority} picks which.
RETRY_CONFTEST = """
import pytest

ATTEMPTS = 3


@pytest.hookimpl(hookwrapper=True{priority})
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or call.excinfo is None:
        return
    hook = item.ihook
    for _ in range(ATTEMPTS - 1):
        hook.pytest_runtest_teardown(
            item=item, nextitem=pytest.Class.from_parent(item.session, name="Fake")
        )
        item._initrequest()
        hook.pytest_runtest_setup(item=item)
        call = pytest.CallInfo.from_call(lambda: hook.pytest_runtest_call(item=item), "call")
        retried = pytest.TestReport.from_item_and_call(item, call)
        if retried.passed:
            break
    report.outcome, report.longrepr = retried.outcome, retried.longrepr
"""


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("priority", [", tryfirst=True", ""], ids=["retry-outside", "retry-inside"])
def test_a_retry_that_reports_only_its_last_attempt_keeps_every_attempts_receipt(
    pytester: pytest.Pytester, workers: str, priority: str
) -> None:
    """pytest-retry reports the phases of its earlier attempts to no one: their receipts
    reach the report of the test's teardown beside the last one's, and the last attempt,
    which passed, is a success whichever plugin's hook wraps the other's."""
    pytester.makeconftest(SENDER_CONFTEST + RETRY_CONFTEST.format(priority=priority))
    pytester.makepyfile(
        """
        ATTEMPTS = []

        def test_flaky(isolated_mailbox, send, request):
            ATTEMPTS.append(isolated_mailbox.run_id)
            send(isolated_mailbox.address, subject=f"Verify attempt {len(ATTEMPTS)}")
            isolated_mailbox.wait_for(subject_contains="Verify")  # claims it
            request.node.user_properties.append(("attempt", isolated_mailbox.run_id))
            assert len(ATTEMPTS) == 3, "fails twice"
        """
    )
    result = pytester.runpytest(
        "-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl"
    )
    result.assert_outcomes(passed=1)
    ((props, receipts),) = _junit_cases(pytester.path / "junit.xml").values()
    assert [(r.close_reason, [m.subject for m in r.messages]) for r in receipts] == [
        ("released_error", ["Verify attempt 1"]),
        ("released_error", ["Verify attempt 2"]),
        ("released_success", ["Verify attempt 3"]),  # what it claimed is consumed
    ]
    assert [m.state for r in receipts for m in r.messages] == ["waiting", "waiting", "consumed"]
    assert receipts[-1].run_id == props["attempt"]
    lines = (pytester.path / "receipts.jsonl").read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [r.run_id for r in receipts]


def test_without_xdist(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_suite=USER_SUITE)
    result = pytester.runpytest("-p", "no:xdist", "--junitxml=junit.xml")
    result.assert_outcomes(passed=5)
    assert all(len(rs) == 1 for _, rs in _junit_cases(pytester.path / "junit.xml").values())


def test_failed_test_gets_a_mailbox_section_and_error_close(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_app_rejects_link(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for(subject_contains="Verify")
            assert False, "the app rejected the link"
        """
    )
    result = pytester.runpytest("--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- mailbox -*",
            "mailbox mail-*@mailbox.test (mbx-*, run r-*, purpose mail): claimed",
            "*reserved*mail-*@mailbox.test fence *",
            "*received*m-*",
            "*waiting*subject_contains='Verify'",
            "*claimed*m-* fence *",
        ]
    )
    ((_, (receipt,)),) = _junit_cases(pytester.path / "junit.xml").values()
    assert receipt.close_reason == "released_error"
    assert receipt.messages[0].state == "waiting"  # the claim was given back, not consumed
    # ... and its timeline says so, before the release.
    assert [e.status for e in receipt.events][-2:] == ["unclaimed", "released"]


OUTCOMES_SUITE = """
import unittest

import pytest


@pytest.fixture
def claimed(isolated_mailbox, send):
    send(isolated_mailbox.address)
    isolated_mailbox.wait_for(subject_contains="Verify")


def test_passes(claimed):
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfails(claimed):
    assert False


def test_calls_xfail(claimed):
    pytest.xfail("known bug")


def test_skips_midway(claimed):
    pytest.skip("no browser today")


@pytest.mark.xfail(reason="fixed since", strict=True)
def test_xpasses_strictly(claimed):
    pass


class TestUnittest(unittest.TestCase):
    @pytest.fixture(autouse=True)
    def _claimed(self, claimed):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.fail("known bug")
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_only_a_test_that_passed_consumes_what_it_claimed(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_outcomes=OUTCOMES_SUITE)

    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")

    result.assert_outcomes(passed=1, xfailed=3, skipped=1, failed=1)
    closed = _closes(pytester.path / "junit.xml")
    given_back = ("released_error", ["waiting"])
    assert closed == {
        "test_passes": ("released_success", ["consumed"]),
        "test_xfails": given_back,
        "test_calls_xfail": given_back,
        "test_skips_midway": given_back,
        "test_xpasses_strictly": given_back,
        "test_expected_failure": given_back,
    }


@pytest.mark.parametrize("workers", ["0", "2"])
def test_mailbox_that_outlives_its_ttl_is_expired(pytester: pytest.Pytester, workers: str) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_mailbox import MailboxClosed

        @pytest.mark.email_contract(ttl=1, lease=1)
        def test_slow(isolated_mailbox):
            with pytest.raises(MailboxClosed) as info:
                isolated_mailbox.expect_none(within=30)
            assert info.value.status.value == "expired"
            assert info.value.result["mailbox_id"] == isolated_mailbox.mailbox_id

        def test_quick(isolated_mailbox):
            pass

        @pytest.mark.email_contract(ttl=1, lease=1)
        def test_slow_and_failing(isolated_mailbox):
            with pytest.raises(MailboxClosed):
                isolated_mailbox.expect_none(within=30)
            assert False, "its report says it"


        @pytest.fixture
        def broken_teardown():
            yield
            raise RuntimeError("its report says it")

        @pytest.mark.email_contract(ttl=1, lease=1)
        def test_slow_with_a_failing_teardown(broken_teardown, isolated_mailbox):
            with pytest.raises(MailboxClosed):
                isolated_mailbox.expect_none(within=30)
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    cases = _junit_cases(pytester.path / "junit.xml")
    (receipt,) = cases["test_slow"][1]
    assert (receipt.state, receipt.close_reason) == ("expired", "expired_timeout")
    # A passing test whose mailbox expired is named at the end: only its receipt said it
    # (a failing one's report shows its timeline already).
    result.stdout.fnmatch_lines(
        [
            "mailbox: 1 passing test(s) outlived their mailbox's ttl, so nothing they claimed "
            "could be acked at teardown (receipt: expired_timeout): "
            "test_mailbox_that_outlives_its_ttl_is_expired.py::test_slow; give them a longer "
            "ttl (email_contract(ttl=...) or mailbox_ttl)"
        ]
    )


PAST_THE_LEASE = """
import threading

import pytest


def past(store, until):
    # As a debugger's pause would: the store's clock is past the lease when this returns.
    while store.clock() <= until.timestamp():
        threading.Event().wait(until.timestamp() - store.clock())


@pytest.mark.email_contract(lease=0.2)
def test_paused(isolated_mailbox, mailbox_store, send):
    send(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject="Verify your account")
    past(mailbox_store, msg.lease_until)


@pytest.mark.email_contract(lease=0.2)
def test_acked_in_time(isolated_mailbox, mailbox_store, send):
    send(isolated_mailbox.address)
    isolated_mailbox.wait_for(subject="Verify your account").ack()


@pytest.mark.email_contract(lease=0.2)
def test_claimed_again(isolated_mailbox, mailbox_store, send):
    send(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject="Verify your account")
    past(mailbox_store, msg.lease_until)
    isolated_mailbox.wait_for(subject="Verify your account")  # acked at teardown
"""

LAPSED_SUMMARY = (
    "mailbox: 1 passing test(s) held a claim whose lease ended before it was acked, so "
    "teardown could not ack it and the message is left unconsumed (receipt: lease_expired): "
    "test_*.py::test_paused; ack() or renew() it while the lease lasts, or give them a "
    "longer lease (email_contract(lease=...) or mailbox_lease)"
)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_passing_test_whose_claim_outlived_its_lease_is_named_with_the_fix(
    pytester: pytest.Pytester, workers: str
) -> None:
    # Its teardown had nothing live to ack: it passed, and only the receipt and the count
    # of expired claims said the message was left unconsumed.
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(PAST_THE_LEASE)

    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")

    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([LAPSED_SUMMARY])
    assert "test_acked_in_time" not in result.stdout.str().split("lease_expired):")[-1]
    cases = _junit_cases(pytester.path / "junit.xml")
    (paused,) = cases["test_paused"][1]
    assert (paused.close_reason, paused.messages[0].state) == ("released_success", "waiting")
    assert [e.status for e in paused.events][-2:] == ["lease_expired", "released"]
    (again,) = cases["test_claimed_again"][1]
    assert again.messages[0].state == "consumed"


def test_a_test_paused_in_the_debugger_past_its_lease_is_told_to_take_a_longer_one(
    pytester: pytest.Pytester,
) -> None:
    # breakpoint(), and "c" typed once the lease has ended: a real pdb pause.
    pytester.makeconftest(SENDER_CONFTEST)
    fifo = pytester.path / "lease_until"
    os.mkfifo(fifo)
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.email_contract(lease=0.2)
        def test_paused(isolated_mailbox, send):
            send(isolated_mailbox.address)
            msg = isolated_mailbox.wait_for(subject="Verify your account")
            with open({str(fifo)!r}, "w") as told:
                told.write(str(msg.lease_until.timestamp()))
            breakpoint()
        """
    )
    proc = pytester.popen(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        until = float(fifo.read_text())  # blocks until the test holds its claim
        while time.time() <= until:
            threading.Event().wait(until - time.time())
        out, _ = proc.communicate(b"c\n", timeout=120)  # a hang's net
    finally:
        proc.kill()
    text = out.decode()
    assert "(Pdb)" in text
    assert " 1 passed" in text
    assert (
        LAPSED_SUMMARY.replace(
            "test_*.py",
            "test_a_test_paused_in_the_debugger_past_its_lease_is_told_to_take_a_longer_one.py",
        )
        in text
    )


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="subtests are built in from pytest 9")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_failing_after_a_passed_subtest_is_not_named_for_its_expired_mailbox(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_mailbox import MailboxClosed

        @pytest.mark.email_contract(ttl=1, lease=1)
        def test_slow_failing_after_a_passed_subtest(isolated_mailbox, subtests):
            with subtests.test("passes"):
                pass
            with pytest.raises(MailboxClosed):
                isolated_mailbox.expect_none(within=30)
            assert False, "its report says it"
        """
    )
    result = pytester.runpytest("-n", workers)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "outlived their mailbox's ttl" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*its report says it*", "mailbox: 1 reserved, *"])


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        (
            "ttl=-1",
            "email_contract: ttl=-1 is invalid: Input should be greater than 0 "
            "(allowed: whole seconds, 1..mailbox_ttl_max)",
        ),
        (
            "tll=5",
            "email_contract: unknown field 'tll'; allowed fields: purpose, ttl, lease, "
            "timeout, max_reads, max_resends, mode, link_domains, run_header",
        ),
        (
            "mode='fast'",
            "email_contract: mode='fast' is invalid: Input should be 'live' or 'dry-run' "
            "(allowed: 'live' or 'dry-run')",
        ),
        (
            "ttl=7200",
            "email_contract: ttl=7200 (marker) exceeds mailbox_ttl_max=3600 (default); "
            "lower ttl or raise mailbox_ttl_max (the ini key, --mailbox-ttl-max or "
            "PYTEST_MAILBOX_TTL_MAX)",
        ),
        (
            "ttl=10, lease=20",
            "email_contract: lease=20 (marker) exceeds ttl=10 (marker); a claim cannot outlive "
            "its mailbox, lower lease or raise ttl",
        ),
        (
            "'signup'",
            "email_contract takes keyword arguments only, "
            "e.g. @pytest.mark.email_contract(purpose='signup', ttl=60); allowed fields: "
            "purpose, ttl, lease, timeout, max_reads, max_resends, mode, link_domains, run_header",
        ),
    ],
)
def test_bad_marker_fails_at_setup(pytester: pytest.Pytester, marker: str, expected: str) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.email_contract({marker})
        def test_it(isolated_mailbox):
            raise AssertionError("never runs")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([expected])
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*never runs*")


MARKER_ONLY_SUITE = """
import pytest


@pytest.mark.email_contract(purpse="signup")
def test_typo():
    raise AssertionError("never runs")


@pytest.mark.email_contract(ttl=7200)
class TestClass:
    def test_inherits(self):
        raise AssertionError("never runs")


@pytest.mark.email_contract("signup")
def test_positional():
    raise AssertionError("never runs")


@pytest.mark.skip(reason="not today")
@pytest.mark.email_contract(purpse="signup")
def test_skipped():
    raise AssertionError("never runs")


@pytest.mark.xfail(reason="known")
@pytest.mark.email_contract(purpse="signup")
def test_xfail():
    raise AssertionError("never runs")


@pytest.mark.email_contract(purpose="signup", ttl=60)
def test_valid():
    pass
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_bad_marker_errors_a_test_without_the_fixture(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A typo in the marker is an error at setup whether or not the test asks for
    ``isolated_mailbox``; skip and xfail marks keep their meaning, as with the fixture."""
    pytester.makepyfile(test_markers=MARKER_ONLY_SUITE)
    result = pytester.runpytest("-n", workers, "-rA")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, errors=3)
    for line in (  # in the order the reports come: under xdist, any
        "email_contract: unknown field 'purpse'; allowed fields: purpose, ttl, lease, "
        "timeout, max_reads, max_resends, mode, link_domains, run_header",
        "email_contract: ttl=7200* exceeds mailbox_ttl_max=3600*; lower ttl or raise "
        "mailbox_ttl_max (the ini key, --mailbox-ttl-max or PYTEST_MAILBOX_TTL_MAX)",
        "email_contract takes keyword arguments only, "
        "e.g. @pytest.mark.email_contract(purpose='signup', ttl=60); allowed fields: purpose, *",
        "ERROR *::test_typo - *",
        "ERROR *::TestClass::test_inherits - *",
        "ERROR *::test_positional - *",
    ):
        result.stdout.fnmatch_lines([line])
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*never runs*")


def test_marker_overlays_ini_defaults(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        mailbox_purpose = login
        mailbox_ttl = 90
        mailbox_lease = 15
        mailbox_link_domains = app.example.test
        """
    )
    pytester.makepyfile(
        """
        import pytest

        def test_defaults(email_contract, isolated_mailbox):
            assert (email_contract.purpose, email_contract.ttl, email_contract.lease) == (
                "login", 90, 15.0)
            assert email_contract.link_domains == ("app.example.test",)
            assert isolated_mailbox.address.startswith("login-")

        @pytest.mark.email_contract(purpose="reset", lease=5)
        def test_overlay(email_contract):
            assert (email_contract.purpose, email_contract.ttl, email_contract.lease) == (
                "reset", 90, 5.0)

        # Compared as the option's are: IDNA form, lower case, no trailing dot.
        @pytest.mark.email_contract(link_domains=["Bücher.Test.", "app.example.test"])
        def test_marker_domains(email_contract):
            assert email_contract.link_domains == ("xn--bcher-kva.test", "app.example.test")
        """
    )
    pytester.runpytest().assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ("args", "ini", "env", "expected"),
    [
        (
            ["--mailbox-port=abc"],
            "",
            {},
            "pytest-mailbox: --mailbox-port='abc' is invalid; allowed: an integer 0..65535",
        ),
        (
            [],
            "mailbox_ttl_max = 0",
            {},
            "pytest-mailbox: ini mailbox_ttl_max='0' is invalid; allowed: an integer 1..86400",
        ),
        (
            [],
            "",
            {"PYTEST_MAILBOX_MODE": "yolo"},
            "pytest-mailbox: PYTEST_MAILBOX_MODE='yolo' is invalid; allowed: 'live' or 'dry-run'",
        ),
        (
            [],
            "mailbox_ttl = 30\nmailbox_lease = 60",
            {},
            "pytest-mailbox: settings: lease=60 (ini mailbox_lease) exceeds ttl=30 "
            "(ini mailbox_ttl); a claim cannot outlive its mailbox*",
        ),
        (
            ["--mailbox-purpose=Sign Up"],
            "",
            {},
            "pytest-mailbox: settings: purpose='Sign Up' (--mailbox-purpose) is invalid: "
            "String should match pattern*",
        ),
        (  # the value came from the environment, the limit from the ini file
            [],
            "mailbox_ttl_max = 600",
            {"PYTEST_MAILBOX_TTL": "900"},
            "pytest-mailbox: settings: ttl=900 (PYTEST_MAILBOX_TTL) exceeds "
            "mailbox_ttl_max=600 (ini mailbox_ttl_max); lower ttl or raise mailbox_ttl_max*",
        ),
        (
            ["--mailbox-max-recipients=0"],
            "",
            {},
            "pytest-mailbox: --mailbox-max-recipients='0' is invalid; allowed: an integer 1..10000",
        ),
        (
            [],
            "mailbox_idle_timeout = soon",
            {},
            "pytest-mailbox: ini mailbox_idle_timeout='soon' is invalid; "
            "allowed: seconds 0.1..3600",
        ),
        (
            [],
            "",
            {"PYTEST_MAILBOX_DATA_POLICY": "strict"},
            "pytest-mailbox: PYTEST_MAILBOX_DATA_POLICY='strict' is invalid; "
            "allowed: 'flag' or 'refuse'",
        ),
        (
            [],
            "mailbox_ttll = 5",
            {},
            "pytest-mailbox: unknown ini key 'mailbox_ttll'; pytest-mailbox knows: "
            "mailbox_allowed_domains, mailbox_data_policy, *",
        ),
        (
            [],
            "",
            {"PYTEST_MAILBOX_TIMOUT": "5"},
            "pytest-mailbox: unknown environment variable 'PYTEST_MAILBOX_TIMOUT'; *",
        ),
        (
            ["--mailbox-timeout=inf"],
            "",
            {},
            "pytest-mailbox: --mailbox-timeout='inf' is invalid; allowed: seconds > 0",
        ),
        (  # its directory would be inside a file: no INTERNALERROR, the option named
            ["--mailbox-receipts=test_bad_option_is_a_usage_error.py/r.jsonl"],
            "",
            {},
            "pytest-mailbox: --mailbox-receipts='*test_bad_option_is_a_usage_error.py/r.jsonl'"
            " cannot be written (*); give a file path in a writable directory",
        ),
    ],
)
def test_bad_option_is_a_usage_error(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    ini: str,
    env: dict[str, str],
    expected: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_it(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}"])


def test_cli_beats_env_beats_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_MAILBOX_DOMAIN", "env.test")
    pytester.makeini("[pytest]\nmailbox_domain = ini.test\nmailbox_ttl = 42\nmailbox_lease = 7\n")
    pytester.makepyfile(
        """
        def test_it(isolated_mailbox, email_contract):
            assert isolated_mailbox.domain == "cli.test"
            assert email_contract.ttl == 42
        """
    )
    pytester.runpytest("--mailbox-domain=CLI.test.").assert_outcomes(passed=1)
    pytester.makepyfile(
        """
        def test_it(isolated_mailbox):
            assert isolated_mailbox.domain == "env.test"
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mailbox: env.test on 127.0.0.1:a free port per worker*"])


def test_markers_and_fixtures_say_where_a_contracts_defaults_come_from(
    pytester: pytest.Pytester,
) -> None:
    # They said "defaults from the mailbox_* ini keys" and ttl=300: an option or a variable
    # gives them too, and mailbox_ttl_max lowers the ttl nobody gave.
    pytester.makepyfile("def test_it(isolated_mailbox): pass")

    markers = pytester.runpytest("--markers")
    fixtures = pytester.runpytest("--fixtures")

    markers.stdout.fnmatch_lines(
        [
            "@pytest.mark.email_contract(*, purpose='mail', ttl=min(300, mailbox_ttl_max), "
            "lease=min(60, ttl), *): the rules of this test's isolated_mailbox; the closest "
            "marker counts, over the mailbox_* settings (--mailbox-* options, "
            "PYTEST_MAILBOX_* variables, ini keys), which give the defaults"
        ]
    )
    fixtures.stdout.fnmatch_lines(
        [
            "email_contract -- *",
            "    This test's EmailContract: the mailbox_* settings (--mailbox-* options,",
            "    PYTEST_MAILBOX_* variables, ini keys), overlaid by its closest email_contract*",
            "isolated_mailbox -- *",
            "    A Mailbox of this test's own: a fresh alias on the session's sink, under its",
            "    email_contract. Released at teardown (its live claims acked if the test passed*",
        ]
    )


def test_the_report_header_writes_an_ipv6_host_as_a_url_does(pytester: pytest.Pytester) -> None:
    # It said "on ::1:2525": which colon began the port? (--co tries no host, binds no port.)
    result = pytester.runpytest("--mailbox-host=::1", "--mailbox-port=2525", "--co")

    result.stdout.fnmatch_lines(["mailbox: mailbox.test on [[]::1]:2525, ttl_max 3600s"])


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="pytest 8 has no [tool.pytest] table")
def test_native_toml_numbers_are_taken_as_written(pytester: pytest.Pytester) -> None:
    # pytest 9's [tool.pytest] keeps TOML types: ttl = 120 is an int, lease = 7.5 a float.
    pytester.makepyprojecttoml(
        """
        [tool.pytest]
        mailbox_ttl = 120
        mailbox_lease = 7.5
        mailbox_max_reads = 5.0
        mailbox_max_resends = 1_0
        mailbox_link_domains = "app.example.test, cdn.example.test"
        """
    )
    pytester.makepyfile(
        """
        def test_it(email_contract):
            assert (email_contract.ttl, email_contract.lease, email_contract.max_reads) == (
                120, 7.5, 5
            )
            assert email_contract.max_resends == 10  # TOML's 1_0, as configuration.md says
            assert email_contract.link_domains == ("app.example.test", "cdn.example.test")
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)

    pytester.makepyprojecttoml("[tool.pytest]\nmailbox_ttl = 1.5\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini mailbox_ttl=1.5 is invalid; allowed: whole seconds, 1..mailbox_ttl_max*"]
    )


def test_only_the_closest_marker_counts(pytester: pytest.Pytester) -> None:
    # As documented: a test's own marker replaces its module's, it is not merged with it.
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.email_contract(purpose="module", ttl=120)

        def test_module_marker(email_contract):
            assert (email_contract.purpose, email_contract.ttl) == ("module", 120)

        @pytest.mark.email_contract(purpose="own")
        def test_own_marker(email_contract):
            assert (email_contract.purpose, email_contract.ttl) == ("own", 300)
        """
    )
    pytester.runpytest().assert_outcomes(passed=2)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_two_markers_on_one_test_and_a_typo_a_closer_marker_hides_are_errors(
    pytester: pytest.Pytester, workers: str
) -> None:
    # The closest marker counts; one it overrides is still checked, and two on the same
    # node (stacked, or a parametrized case's beside the test's) are refused, not guessed.
    pytester.makepyfile(
        test_markers="""
        import pytest

        pytestmark = pytest.mark.email_contract(tll=9)

        @pytest.mark.email_contract(ttl=30)
        def test_module_typo_hidden(email_contract):
            pass
        """,
        test_stacked="""
        import pytest

        @pytest.mark.email_contract(purpse="signup", ttl=5)
        @pytest.mark.email_contract(ttl=30)
        def test_stacked(email_contract):
            pass

        @pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.email_contract(ttl=9))])
        @pytest.mark.email_contract(ttl=20)
        def test_case_and_test(email_contract, n):
            pass

        @pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.email_contract(ttl=9))])
        def test_case_alone(email_contract, n):
            assert email_contract.ttl == 9
        """,
    )
    result = pytester.runpytest("-n", workers)
    result.assert_outcomes(passed=1, errors=3)
    result.stdout.fnmatch_lines(
        [
            "email_contract: unknown field 'tll'; allowed fields: purpose, *"
            " (in email_contract(tll=9) on module test_markers.py)",
        ]
    )
    tail = (
        "; only one counts, so give it one marker with the whole contract (a parametrized "
        "case that needs its own takes it in pytest.param(..., marks=...), and the test none; "
        "a hook that adds one as a default adds it where get_closest_marker finds none)"
    )
    result.stdout.fnmatch_lines(
        [
            "email_contract: 2 markers on function test_stacked.py::test_stacked: "
            f"email_contract(purpse='signup', ttl=5); email_contract(ttl=30){tail}",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "email_contract: 2 markers on function test_stacked.py::test_case_and_test[[]1[]]: "
            "email_contract(*); email_contract(*)*",
        ]
    )


def test_a_classs_own_marker_overrides_the_one_it_inherits(pytester: pytest.Pytester) -> None:
    # pytest lists a base class's markers before the class's own; the class's own counts,
    # and one a hook repeats word for word is the same marker, not a second one.
    pytester.makeconftest(
        """
        import pytest

        def pytest_collection_modifyitems(items):
            for item in items:
                if item.name == "test_default":
                    item.add_marker(pytest.mark.email_contract(purpose="default"))
                    item.add_marker(pytest.mark.email_contract(purpose="default"))
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.email_contract(purpose="base")
        class TestBase:
            def test_which(self, email_contract, request):
                expected = "base" if request.cls is TestBase else "child"
                assert email_contract.purpose == expected

        @pytest.mark.email_contract(purpose="child")
        class TestChild(TestBase):
            pass

        class TestGrandchild(TestChild):
            pass

        @pytest.mark.email_contract(purpse="typo")
        class TestTypo:
            pass

        @pytest.mark.email_contract(purpose="fine")
        class TestHidesTheTypo(TestTypo):
            def test_hidden(self, email_contract):
                pass

        def test_default(email_contract):
            assert email_contract.purpose == "default"
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        [
            "email_contract: unknown field 'purpse'; * (in email_contract(purpse='typo') on "
            "class test_a_classs_own_marker_overrides_the_one_it_inherits.py::TestHidesTheTypo "
            "(from its base class TestTypo))"
        ]
    )


def test_a_contract_is_the_one_its_setup_found(pytester: pytest.Pytester) -> None:
    """A marker added while a test runs (a fixture's ``request.node.add_marker``) changes no
    contract: a test without a marker keeps the settings' one, as a marked test keeps its
    marker's. With the marker check off (``-p no:mailbox-marker``) the fixture reads and
    checks the marker itself."""
    pytester.makeini("[pytest]\nmailbox_lease = 45\n")
    pytester.makepyfile(
        test_late="""
        import pytest

        @pytest.fixture
        def late(request):
            request.node.add_marker(pytest.mark.email_contract(ttl=40, purpose="late"))

        def test_unmarked(late, email_contract):
            assert (email_contract.purpose, email_contract.ttl, email_contract.lease) == (
                "mail", 300, 45
            )

        @pytest.mark.email_contract(ttl=50, purpose="marked")
        def test_marked(late, email_contract):
            assert (email_contract.purpose, email_contract.ttl) == ("marked", 50)
        """,
        test_unchecked="""
        import pytest

        @pytest.mark.email_contract(purpose="direct")
        def test_direct(email_contract):
            assert (email_contract.purpose, email_contract.lease) == ("direct", 45)

        @pytest.mark.email_contract(purpse="typo")
        def test_typo(email_contract):
            pass
        """,
    )
    pytester.runpytest("test_late.py").assert_outcomes(passed=2)
    result = pytester.runpytest("test_unchecked.py", "-p", "no:mailbox-marker")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*email_contract: unknown field 'purpse'*"])


def test_a_raised_ttl_max_lets_a_longer_marker_ttl_through(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.email_contract(ttl=7200)
        def test_it(isolated_mailbox):
            row = isolated_mailbox.store.mailbox(isolated_mailbox.mailbox_id)
            assert row.expires_at - row.created_at == 7200
        """
    )
    pytester.runpytest("--mailbox-ttl-max=86400").assert_outcomes(passed=1)


def test_an_ini_receipts_path_is_taken_from_the_ini_files_directory(
    pytester: pytest.Pytester,
) -> None:
    # As pytest's own paths settings: running from a subdirectory writes the same file.
    pytester.makeini("[pytest]\nmailbox_receipts = out/receipts.jsonl\n")
    pytester.mkpydir("sub")
    pytester.makepyfile(**{"sub/test_it": "def test_it(isolated_mailbox): pass"})
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(pytester.path / "sub")
        pytester.runpytest().assert_outcomes(passed=1)

    (line,) = (pytester.path / "out" / "receipts.jsonl").read_text().splitlines()
    assert json.loads(line)["state"] == "released"
    assert not (pytester.path / "sub" / "out").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["--collect-only"],
        ["--collect-only", "-n", "2"],
        ["--fixtures"],
        ["--fixtures-per-test"],
        ["--markers"],
        ["--setup-plan"],
    ],
    ids=[
        "collect-only",
        "collect-only-xdist",
        "fixtures",
        "fixtures-per-test",
        "markers",
        "setup-plan",
    ],
)
def test_a_command_that_runs_no_test_leaves_the_receipts_file_alone(
    pytester: pytest.Pytester, command: list[str]
) -> None:
    pytester.makepyfile("def test_it(isolated_mailbox): pass")
    pytester.runpytest("--mailbox-receipts=receipts.jsonl").assert_outcomes(passed=1)
    before = (pytester.path / "receipts.jsonl").read_text()
    assert before

    # ... even while another run writes it (an IDE lists tests beside a running suite).
    with (pytester.path / "receipts.jsonl").open("a") as other_run:
        fcntl.flock(other_run.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = pytester.runpytest(*command, "--mailbox-receipts=receipts.jsonl")

    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "receipts.jsonl").read_text() == before
    # The next run that runs tests starts the file afresh: its own receipt only.
    pytester.runpytest("-n", "2", "--mailbox-receipts=receipts.jsonl").assert_outcomes(passed=1)
    (line,) = (pytester.path / "receipts.jsonl").read_text().splitlines()
    assert line not in before


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_receipts_path_that_holds_something_else_is_refused_not_emptied(
    pytester: pytest.Pytester, workers: str
) -> None:
    # `--mailbox-receipts test_signup.py`, its value forgotten: the test module was taken
    # for the receipts file and emptied at collection, so "no tests ran".
    module = pytester.makepyfile(test_signup="def test_it(isolated_mailbox): pass")
    source = module.read_bytes()
    pytester.path.joinpath("README.md").write_text("# notes\n", encoding="utf-8")

    forgotten = pytester.runpytest("-n", workers, "--mailbox-receipts", "test_signup.py")
    pytester.makeini("[pytest]\nmailbox_receipts = README.md\n")
    in_the_ini = pytester.runpytest("-n", workers)

    assert forgotten.ret == in_the_ini.ret == pytest.ExitCode.USAGE_ERROR
    forgotten.stderr.fnmatch_lines(
        [
            "ERROR: pytest-mailbox: --mailbox-receipts='test_signup.py' holds something other "
            "than receipts, and the run would empty it; give a new file or a receipts file, "
            "such as receipts.jsonl (the option takes the word after it as its value: write "
            "--mailbox-receipts=receipts.jsonl)"
        ]
    )
    in_the_ini.stderr.fnmatch_lines(
        [
            "ERROR: pytest-mailbox: ini mailbox_receipts='*README.md' holds something other "
            "than receipts, and the run would empty it; give a new file or a receipts file, "
            "such as receipts.jsonl"
        ]
    )
    assert module.read_bytes() == source
    assert pytester.path.joinpath("README.md").read_text(encoding="utf-8") == "# notes\n"
    # A receipts file an earlier run wrote, behind a BOM or not, and an empty one, are taken.
    pytester.makeini("[pytest]\n")
    pytester.runpytest("-n", workers, "--mailbox-receipts=r.jsonl").assert_outcomes(passed=1)
    written = pytester.path.joinpath("r.jsonl").read_bytes()
    pytester.path.joinpath("r.jsonl").write_bytes(codecs.BOM_UTF8 + written)
    pytester.runpytest("-n", workers, "--mailbox-receipts=r.jsonl").assert_outcomes(passed=1)
    pytester.path.joinpath("empty.jsonl").write_bytes(b"")
    pytester.runpytest("-n", workers, "--mailbox-receipts=empty.jsonl").assert_outcomes(passed=1)


def test_a_receipts_file_whose_first_receipt_was_cut_short_is_taken(
    pytester: pytest.Pytester,
) -> None:
    # A run cut short as it wrote its first receipt (a full disk, a kill) left half a line:
    # the file is a receipts file still, not "something other than receipts" to delete.
    pytester.makepyfile("def test_it(isolated_mailbox): pass")
    receipts = pytester.path / "r.jsonl"
    pytester.runpytest("-n", "0", f"--mailbox-receipts={receipts}").assert_outcomes(passed=1)
    line = receipts.read_bytes()
    receipts.write_bytes(line[: len(line) // 2])

    result = pytester.runpytest("-n", "0", f"--mailbox-receipts={receipts}")

    result.assert_outcomes(passed=1)
    (written,) = receipts.read_text(encoding="utf-8").splitlines()
    assert (
        json.loads(written)["nodeid"]
        == "test_a_receipts_file_whose_first_receipt_was_cut_short_is_taken.py::test_it"
    )


def test_a_session_that_fails_in_collection_leaves_no_receipts_of_the_last_run(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_ok="def test_it(isolated_mailbox): pass")
    pytester.runpytest("--mailbox-receipts=receipts.jsonl").assert_outcomes(passed=1)
    assert (pytester.path / "receipts.jsonl").read_text()
    pytester.makepyfile(test_broken="import no_such_module_here")

    result = pytester.runpytest("-x", "--mailbox-receipts=receipts.jsonl")

    result.stdout.fnmatch_lines(["*ModuleNotFoundError*no_such_module_here*"])
    assert (pytester.path / "receipts.jsonl").read_text() == ""  # nothing that looks current


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_second_run_on_the_same_receipts_file_is_refused_and_changes_nothing(
    pytester: pytest.Pytester, workers: str
) -> None:
    # Two runs at once on one file: the second would empty it and mix its receipts in.
    receipts = pytester.path / "receipts.jsonl"
    pytester.makepyfile(
        f"""
        import subprocess
        import sys

        def test_first(isolated_mailbox, tmp_path):
            (tmp_path / "test_second.py").write_text("def test_second(isolated_mailbox): pass")
            second = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:asyncio", "-p", "no:cacheprovider",
                 "-n", "2", "test_second.py", "--mailbox-receipts={receipts}"],
                cwd=tmp_path, capture_output=True, text=True, timeout=300,  # a hang's net
            )
            assert second.returncode == 4, second.stdout + second.stderr
            assert "is being written by another pytest run; give each run its own file" in (
                second.stderr
            )
            assert "test_second" not in second.stdout  # refused before it ran anything
            assert "workers" not in second.stdout  # ... and before xdist started any
        """
    )

    result = pytester.runpytest("-n", workers, f"--mailbox-receipts={receipts}")

    result.assert_outcomes(passed=1)
    (line,) = receipts.read_text().splitlines()
    assert json.loads(line)["nodeid"].endswith("::test_first")
    # The lock ends with the run: the next one on the file writes it as usual.
    pytester.runpytest(f"--mailbox-receipts={receipts}").assert_outcomes(passed=1)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_receipts_file_inside_the_basetemp_outlives_pytest_emptying_it(
    pytester: pytest.Pytester, workers: str
) -> None:
    """One folder for all a CI keeps (``--basetemp=out --junitxml=out/junit.xml
    --mailbox-receipts=out/receipts.jsonl``): pytest empties a given basetemp when it first
    makes it, after the file was opened; it was written on to no name."""
    out = pytester.path / "out"
    pytester.makepyfile("def test_it(isolated_mailbox): pass")
    for _ in range(2):  # the second time, the basetemp holds the first run's files
        result = pytester.runpytest(
            "-n",
            workers,
            f"--basetemp={out}",
            "--junitxml=out/junit.xml",
            "--mailbox-receipts=out/receipts.jsonl",
        )
        result.assert_outcomes(passed=1)
        (line,) = (out / "receipts.jsonl").read_text().splitlines()
        ((_, (receipt,)),) = _junit_cases(out / "junit.xml").values()
        assert json.loads(line)["run_id"] == receipt.run_id


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_second_run_on_a_receipts_file_inside_the_basetemp_is_refused_before_emptying_it(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The first run's lock is on the file it writes, not on one its basetemp lost: a second
    run given the same basetemp and file is refused before it empties that basetemp (the
    first run's store with it)."""
    out = pytester.path / "out"
    options = [f"--basetemp={out}", f"--mailbox-receipts={out / 'receipts.jsonl'}"]
    second = pytester.mkdir("second")  # not inside the basetemp: pytest refuses that cwd
    (second / "second_run.py").write_text("def test_second(isolated_mailbox): pass")
    pytester.makepyfile(
        f"""
        import subprocess
        import sys

        def test_first(isolated_mailbox, tmp_path):
            second = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:asyncio", "-p", "no:cacheprovider",
                 "-n", "{workers}", "second_run.py", *{options!r}],
                cwd={str(second)!r}, capture_output=True, text=True, timeout=300,  # a hang's net
            )
            assert second.returncode == 4, second.stdout + second.stderr
            assert "is being written by another pytest run" in second.stderr
            assert tmp_path.exists()  # nothing of this run's basetemp was emptied
        """
    )

    result = pytester.runpytest("-n", workers, *options)

    result.assert_outcomes(passed=1)
    (line,) = (out / "receipts.jsonl").read_text().splitlines()
    assert json.loads(line)["nodeid"].endswith("::test_first")


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_second_run_that_opened_the_receipts_file_before_the_basetemp_was_emptied_is_refused(
    pytester: pytest.Pytester, workers: str
) -> None:
    """Two runs started at once: the second one opened the file (at its start-up) before
    the first one emptied its basetemp, and tries to take it after. The first run must
    still hold that file, or the second takes it and empties the first run's basetemp."""
    out = pytester.path / "out"
    options = [f"--basetemp={out}", f"--mailbox-receipts={out / 'receipts.jsonl'}"]
    second = pytester.mkdir("second")  # not inside the basetemp: pytest refuses that cwd
    (second / "second_run.py").write_text("def test_second(isolated_mailbox): pass")
    # Two pipes order the runs; a run that ends closes its end, so neither waits for ever.
    (second / "conftest.py").write_text(
        """
import os
import pytest

@pytest.hookimpl(trylast=True)  # pytest-mailbox has opened the receipts file
def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        os.write(int(os.environ["OPENED"]), b"x")

@pytest.hookimpl(wrapper=True, tryfirst=True)  # it takes the file: once the first holds it
def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        os.read(int(os.environ["GO"]), 1)
    return (yield)
"""
    )
    pytester.makeconftest(
        f"""
import os, subprocess, sys
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    opened, tell_opened = os.pipe()
    wait_go, go = os.pipe()
    env = {{**os.environ, "OPENED": str(tell_opened), "GO": str(wait_go)}}
    with open("second.stderr", "w") as stderr:
        config.second = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:asyncio", "-p", "no:cacheprovider",
             "-n", "{workers}", "second_run.py", *{options!r}],
            cwd={str(second)!r}, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
            pass_fds=(tell_opened, wait_go),
        )
    os.close(tell_opened)
    os.close(wait_go)
    os.read(opened, 1)  # the second run has opened the file before this one empties out/
    os.close(opened)
    config.go = go

@pytest.hookimpl(wrapper=True, tryfirst=True)  # this run holds the file, in an emptied out/
def pytest_runtestloop(session):
    if not hasattr(session.config, "workerinput"):
        os.close(session.config.go)
        with open("second.returncode", "w") as returncode:
            returncode.write(str(session.config.second.wait()))
    return (yield)
"""
    )
    first = pytester.makepyfile(
        "def test_first(isolated_mailbox, tmp_path): assert tmp_path.exists()"
    )

    result = pytester.runpytest("-n", workers, *options, first)

    result.assert_outcomes(passed=1)  # its store was not emptied under it
    stderr = (pytester.path / "second.stderr").read_text()
    assert (pytester.path / "second.returncode").read_text() == "4", stderr
    assert "is being written by another pytest run" in stderr
    (line,) = (out / "receipts.jsonl").read_text().splitlines()
    assert json.loads(line)["nodeid"].endswith("::test_first")


def test_a_child_that_a_test_forked_does_not_keep_the_receipts_file(
    pytester: pytest.Pytester,
) -> None:
    # flock belongs to the open file, which a forked child shares: a child that outlives
    # the run (an app server, a multiprocessing worker) must not hold it against the next.
    pytester.makepyfile(
        test_after="def test_after(isolated_mailbox): pass",
        test_forks="""
        import os
        import signal
        import warnings
        from pathlib import Path

        def test_forks(isolated_mailbox):
            ready, told = os.pipe()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: threads
                pid = os.fork()
            if pid == 0:
                os.write(told, b"x")
                signal.pause()  # until the outer test kills it
                os._exit(0)
            os.read(ready, 1)  # the child runs, past the fork handlers
            Path("child.pid").write_text(str(pid))
        """,
    )
    try:
        pytester.runpytest_subprocess(
            "-p", "no:asyncio", "-n", "0", "test_forks.py", "--mailbox-receipts=receipts.jsonl"
        ).assert_outcomes(passed=1)
        # The child lives on, its copy of the file's descriptor with it; the next run is
        # not refused.
        result = pytester.runpytest("-n", "0", "test_after.py", "--mailbox-receipts=receipts.jsonl")
        assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    finally:
        child = pytester.path / "child.pid"
        if child.exists():  # not if the first run failed before it forked
            os.kill(int(child.read_text()), signal.SIGKILL)


def test_a_forked_child_lets_go_of_the_lock_and_the_parent_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the fork handler does in the child, here in one process: the child's descriptor
    # no longer refers to the locked file, and its stream stays usable.
    monkeypatch.setattr(plugin, "_LOCKED", weakref.WeakSet())
    receipts = tmp_path / "receipts.jsonl"
    with receipts.open("a") as run, receipts.open("a") as other:
        assert plugin._lock(run)
        assert not plugin._lock(other)

        plugin._unlock_in_child()

        run.write("to /dev/null\n")
        run.flush()
        assert plugin._lock(other)  # only the "child's" descriptor held it
    assert receipts.read_text() == ""


def test_without_pytests_tmpdir_plugin_a_run_without_mailboxes_passes_and_one_with_is_told(
    pytester: pytest.Pytester, fixed_port: int
) -> None:
    """-p no:tmpdir took the basetemp the store lives in: every run crashed at its end,
    mail tests or not (AttributeError), and a fixed port was an INTERNALERROR."""
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    for workers in ("0", "2"):
        result = pytester.runpytest_subprocess("-p", "no:tmpdir", "-n", workers)
        assert (result.ret, result.parseoutcomes()) == (0, {"passed": 1})
    pytester.makepyfile(test_mail="def test_mail(isolated_mailbox):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:tmpdir", "test_mail.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pytest-mailbox keeps its store in pytest's basetemp*"])
    # A fixed port: its sink's store is opened at the start.
    fixed = pytester.runpytest_subprocess("-p", "no:tmpdir", f"--mailbox-port={fixed_port}")
    assert fixed.ret == pytest.ExitCode.USAGE_ERROR
    fixed.stderr.fnmatch_lines(["*pytest-mailbox keeps its store in pytest's basetemp*"])


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_fixed_port_s_store_that_cannot_be_opened_is_a_usage_error_not_a_traceback(
    pytester: pytest.Pytester, fixed_port: int, workers: str
) -> None:
    """The fixed-port sink's store is opened at the session's start: a StoreError there
    (a --basetemp too deep for SQLite's 504 bytes) was an INTERNALERROR traceback."""
    pytester.makepyfile(test_mail="def test_mail(isolated_mailbox):\n    pass\n")
    deep = pytester.path.joinpath(*["d" * 100] * 5)
    deep.parent.mkdir(parents=True)

    result = pytester.runpytest_subprocess(
        f"--basetemp={deep}", f"--mailbox-port={fixed_port}", "-n", workers
    )

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: pytest-mailbox: the store {deep / 'pytest-mailbox.sqlite3'} failed: unable "
            "to open database file (its path is * bytes long, and SQLite opens none longer "
            "than 504: give pytest a shorter --basetemp, or TMPDIR); no store was opened"
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("policy", ["failed", "none"])
@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_summary_line_outlives_a_basetemp_removed_at_the_end(
    pytester: pytest.Pytester, workers: str, policy: str
) -> None:
    """tmp_path_retention_policy removes the basetemp (the store in it) at the session's
    end, in pytest's own sessionfinish, which ran before the plugin's: no summary line,
    and no end-of-run close of what a crashed worker left open."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_one(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()
        """
    )
    # Not pytester's runpytest: it gives every run --basetemp, which pytest never removes.
    result = pytester.run(
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-n",
        workers,
        "-o",
        f"tmp_path_retention_policy={policy}",
        timeout=300,
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mailbox: 1 reserved, 1 received, 1 claimed, 1 consumed, *"])


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_summary_line_is_left_out_under_qq_as_pytest_leaves_out_its_counts(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_mailbox import MailboxClosed

        def test_one(isolated_mailbox):
            pass

        @pytest.mark.email_contract(ttl=1, lease=1)
        def test_slow(isolated_mailbox):
            with pytest.raises(MailboxClosed):
                isolated_mailbox.expect_none(within=30)
        """
    )
    quiet = pytester.runpytest("-n", workers, "-qq")
    shown = pytester.runpytest("-n", workers, "-q")

    assert quiet.ret == 0
    assert "mailbox: 2 reserved" not in quiet.stdout.str()
    shown.stdout.fnmatch_lines(["mailbox: 2 reserved, *"])
    # a warning is no count: -qq shows it
    quiet.stdout.fnmatch_lines(["mailbox: 1 passing test(s) outlived their mailbox's ttl, *"])


@pytest.mark.parametrize("second", ["passes", "skips"])
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_rerun_after_a_failed_teardown_reports_its_own_attempt_only(
    pytester: pytest.Pytester, workers: str, second: str
) -> None:
    """The first attempt's call passed and a later fixture's teardown failed it, so its
    receipt was amended to released_error: the rerun's reports carry the rerun's receipt
    alone, and whether it is a success is the rerun's own call's to say."""
    pytester.makeconftest(RERUN_CONFTEST)
    pytester.makepyfile(
        f"""
        import pytest

        ATTEMPTS = []

        @pytest.fixture
        def cleanup_before():  # torn down after the mailbox
            yield
            if len(ATTEMPTS) == 1:
                raise RuntimeError("cleanup failed the first time")

        def test_flaky(cleanup_before, isolated_mailbox):
            ATTEMPTS.append(isolated_mailbox.run_id)
            if len(ATTEMPTS) == 2 and {second == "skips"!r}:
                pytest.skip("the second attempt skips midway")
        """
    )
    result = pytester.runpytest("-n", workers, "--mailbox-receipts=receipts.jsonl")
    result.assert_outcomes(**{"passed" if second == "passes" else "skipped": 1})
    lines = (pytester.path / "receipts.jsonl").read_text().splitlines()
    (receipt,) = (json.loads(line) for line in lines)  # the second attempt's only
    assert receipt["close_reason"] == (
        "released_success" if second == "passes" else "released_error"
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_fixture_teardown_that_fails_after_the_mailbox_closed_is_no_success(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The call passed, the mailbox's teardown released it as released_success, then a
    fixture's teardown failed: pytest counts an error, and the receipt (JUnit, JSON Lines)
    and the report's mailbox section now say released_error too."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def cleanup_after(isolated_mailbox):  # torn down before the mailbox
            yield
            raise RuntimeError("cleanup failed")

        @pytest.fixture
        def cleanup_before():  # torn down after the mailbox
            yield
            raise RuntimeError("cleanup failed")

        def test_torn_down_first(isolated_mailbox, cleanup_after):
            pass

        def test_torn_down_last(cleanup_before, isolated_mailbox):
            pass
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=r.jsonl")
    result.assert_outcomes(passed=2, errors=2)
    for path in ("junit.xml", "r.jsonl"):
        receipts = read_receipts(pytester.path / path)
        assert sorted((r.nodeid.split("::")[1], r.close_reason) for r in receipts) == [
            ("test_torn_down_first", "released_error"),
            ("test_torn_down_last", "released_error"),
        ]
    assert result.stdout.str().count("released_error: the test did not pass") == 2
    # The last test's teardown report comes after the session's store closed: what the
    # plugin opened again to amend its receipt is closed too (Python 3.13, -W error).
    gc.collect()


def test_a_refusals_traceback_ends_at_the_tests_own_line(pytester: pytest.Pytester) -> None:
    """contract.md: "its traceback ends at the test's own line", for every misuse the
    mailbox refuses, not only the waits: no frame of the plugin is shown."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def claimed(isolated_mailbox, send):
            send(isolated_mailbox.address, "Hi")
            return isolated_mailbox.wait_for()

        def test_renew(claimed):
            claimed.renew(lease=-5)

        def test_ack_twice(claimed):
            claimed.ack()
            claimed.ack()

        def test_expect_none(isolated_mailbox):
            isolated_mailbox.expect_none(within=-1)

        def test_wait_for_lease(isolated_mailbox):
            isolated_mailbox.wait_for(lease=0)

        def test_claim(isolated_mailbox):
            isolated_mailbox.claim("m-000000000000")

        def test_inject_fault_closed(isolated_mailbox):
            isolated_mailbox.release()
            isolated_mailbox.inject_fault(stage="RCPT")

        def test_checkpoint_closed(isolated_mailbox):
            isolated_mailbox.release()
            isolated_mailbox.checkpoint()

        def test_release_twice(isolated_mailbox):
            isolated_mailbox.release()
            isolated_mailbox.release()

        def test_link(claimed):
            claimed.link(domain="https://app.example.test/verify")

        def test_code(claimed):
            claimed.code(pattern="(")

        def test_selector(isolated_mailbox):
            isolated_mailbox.wait_for(subjet="Hi")

        def test_agent_tools(isolated_mailbox):
            isolated_mailbox.agent_tools(resend=5)

        def test_reveal(isolated_mailbox):
            isolated_mailbox.agent_tools().reveal("m-000000000000")
        """
    )
    result = pytester.runpytest("--tb=short", "-p", "no:randomly")

    result.assert_outcomes(failed=13)
    shown = re.findall(r"^\S*pytest_mailbox[/\\]\w+\.py:\d+.*$", result.stdout.str(), re.M)
    assert shown == []


def test_a_failing_waits_traceback_shows_no_extracted_code(pytester: pytest.Pytester) -> None:
    # pytest prints the arguments of each frame it shows: the selector must not be one.
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_it(isolated_mailbox, send):
            send(isolated_mailbox.address, "Your code", body="Your code is QXKZ" + "TRWB")
            code = isolated_mailbox.wait_for().code(pattern=r"is (\\w+)")
            isolated_mailbox.wait_for(timeout=0.01, body_regex=rf"\\b{code}\\b")
        """
    )
    result = pytester.runpytest("--junitxml=junit.xml", "--mailbox-receipts=r.jsonl")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*WaitTimeout*body_regex=*••••••WB*"])
    for text in (
        result.stdout.str(),
        (pytester.path / "junit.xml").read_text(),
        (pytester.path / "r.jsonl").read_text(),
    ):
        assert "QXKZTRWB" not in text


class _DjangoSettings:
    """What the endpoint reads of ``django.conf.settings``: ``configured``, ``MAILERS``
    (only when the project has one) and ``is_overridden``."""

    def __init__(self, explicit: dict[str, object], *, configured: bool = True) -> None:
        self.configured = configured
        self._explicit = explicit
        if "MAILERS" in explicit:
            self.MAILERS = explicit["MAILERS"]

    def is_overridden(self, name: str) -> bool:
        return name in self._explicit


SMTP_TO_SINK = {
    "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
    "OPTIONS": {
        "host": "127.0.0.1",
        "port": 2525,
        "username": "",
        "password": "",
        "use_tls": False,
        "use_ssl": False,
    },
}
EMAIL_SETTINGS = ["EMAIL_BACKEND", "EMAIL_HOST", "EMAIL_PORT"]


@pytest.mark.parametrize(
    ("version", "project", "expected"),
    [
        ((5, 2, 8, "final", 0), None, EMAIL_SETTINGS),
        ((6, 0, 0, "final", 0), None, EMAIL_SETTINGS),
        ((6, 1, 0, "alpha", 0), None, ["default"]),
        ((7, 0, 0, "final", 0), None, ["default"]),
        # A project's own settings, once configured:
        (
            (6, 1, 3, "final", 0),
            _DjangoSettings({"EMAIL_HOST": "smtp.example.com"}),
            EMAIL_SETTINGS,
        ),
        (
            (6, 1, 3, "final", 0),
            _DjangoSettings({"EMAIL_HOST": "x"}, configured=False),
            ["default"],
        ),
        ((6, 1, 3, "final", 0), _DjangoSettings({"SECRET_KEY": "x"}), ["default"]),
        (
            (6, 1, 3, "final", 0),
            _DjangoSettings({"MAILERS": {"bulk": {}, "default": {}, "transactional": {}}}),
            ["bulk", "default", "transactional"],
        ),
        # No "default" added: send_mail() fails in the tests as in production.
        ((6, 1, 3, "final", 0), _DjangoSettings({"MAILERS": {"bulk": {}}}), ["bulk"]),
        # A MAILERS beside a leftover EMAIL_* setting: the MAILERS counts.
        (
            (6, 1, 3, "final", 0),
            _DjangoSettings({"MAILERS": {"bulk": {}}, "EMAIL_HOST": "smtp.example.com"}),
            ["bulk"],
        ),
        # Django's test environment sets EMAIL_BACKEND itself in a project without MAILERS.
        ((6, 1, 3, "final", 0), _DjangoSettings({"EMAIL_BACKEND": "x"}), ["default"]),
        ((5, 2, 8, "final", 0), _DjangoSettings({"MAILERS": {"default": {}}}), EMAIL_SETTINGS),
    ],
)
def test_django_settings_follow_the_django_in_use(
    monkeypatch: pytest.MonkeyPatch,
    version: tuple[object, ...],
    project: _DjangoSettings | None,
    expected: list[str],
) -> None:
    """Django 6.1 deprecates the EMAIL_* settings for MAILERS, refuses them beside one, and
    refuses a read of one once a MAILERS is set: ``settings["django"]`` is a MAILERS that
    points every mailer of the project's (else ``default``) at the sink, unless the Django
    is older or the project still sets EMAIL_* settings and no MAILERS. (The newest-versions
    run sends through Django 6.1 itself: tests/test_clients.py and tests/test_recipes.py.)"""
    monkeypatch.setitem(sys.modules, "django", types.SimpleNamespace(VERSION=version))
    monkeypatch.setitem(sys.modules, "django.conf", types.SimpleNamespace(settings=project))
    django = SmtpEndpoint("127.0.0.1", 2525).settings["django"]
    if expected == EMAIL_SETTINGS:
        assert [key for key in expected if key in django] == expected
        assert "MAILERS" not in django
        assert (django["EMAIL_HOST"], django["EMAIL_PORT"]) == ("127.0.0.1", 2525)
    else:
        assert list(django) == ["MAILERS"]
        assert django["MAILERS"] == dict.fromkeys(expected, SMTP_TO_SINK)
        assert list(django["MAILERS"]) == expected


@pytest.fixture
def installed_django_lookup() -> Iterator[None]:
    """The installed Django's version is looked up once per process: each test anew."""
    endpoint._installed_django.cache_clear()
    yield
    endpoint._installed_django.cache_clear()


@pytest.mark.usefixtures("installed_django_lookup")
@pytest.mark.parametrize(
    ("installed", "expected"), [("6.1.3", (6, 1)), ("5.2", (5, 2)), ("6.1a1", (6, 1))]
)
def test_django_version_without_an_imported_django_is_the_installed_one(
    monkeypatch: pytest.MonkeyPatch, installed: str, expected: tuple[int, int]
) -> None:
    monkeypatch.delitem(sys.modules, "django", raising=False)
    monkeypatch.setattr(importlib.metadata, "version", {"django": installed}.__getitem__)
    assert endpoint.django_version() == expected
    endpoint._installed_django.cache_clear()
    monkeypatch.setattr(importlib.metadata, "version", _not_installed)
    assert endpoint.django_version() == (0, 0)
    assert "EMAIL_HOST" in SmtpEndpoint("127.0.0.1", 2525).settings["django"]


def _not_installed(name: str) -> str:
    raise importlib.metadata.PackageNotFoundError(name)


def test_server_settings_for_frameworks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_it(mailbox_server):
            assert mailbox_server.host == "127.0.0.1"
            assert mailbox_server.port > 0
            assert mailbox_server.smtp_url == f"smtp://127.0.0.1:{mailbox_server.port}"
            django = mailbox_server.settings["django"]
            if "MAILERS" in django:  # Django 6.1 and later
                django = django["MAILERS"]["default"]["OPTIONS"]
                assert (django["host"], django["port"]) == ("127.0.0.1", mailbox_server.port)
            else:
                assert django["EMAIL_HOST"] == "127.0.0.1"
                assert django["EMAIL_PORT"] == mailbox_server.port
            flask = mailbox_server.settings["flask"]
            assert (flask["MAIL_SERVER"], flask["MAIL_PORT"]) == ("127.0.0.1", mailbox_server.port)
            assert mailbox_server.settings["env"]["SMTP_PORT"] == str(mailbox_server.port)
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


SECRET_SUITE = """
import logging
import smtplib
from email.message import EmailMessage
from pathlib import Path

CODE = "482913"
TOKEN = "Zq8vT4nW2xKp9LmR"


def _send(server, to):
    msg = EmailMessage()
    msg["From"] = "noreply@app.example.test"
    msg["To"] = to
    msg["Subject"] = f"Your code is {CODE}"
    msg.set_content(f"Code {CODE}. Link https://app.example.test/verify?token={TOKEN}")
    msg.add_alternative(f'<a href="https://app.example.test/verify?token={TOKEN}">go</a>',
                        subtype="html")
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.set_debuglevel(0)
        smtp.send_message(msg)


def test_extracts(isolated_mailbox, mailbox_server):
    _send(mailbox_server, isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject_contains="Your code")
    assert msg.code(pattern=r"Code (\\d{6})") == CODE
    assert msg.link(domain="app.example.test").endswith(TOKEN)
    logging.getLogger("app").debug("verified %s", isolated_mailbox.address)


def test_fails_after_extracting(isolated_mailbox, mailbox_server):
    _send(mailbox_server, isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject_contains="Your code")
    msg.code(pattern=r"Code (\\d{6})")
    msg.link(domain="app.example.test")
    raise AssertionError("the app rejected the verification")
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_no_secret_reaches_any_output(pytester: pytest.Pytester, workers: str) -> None:
    pytester.makepyfile(test_secrets=SECRET_SUITE)
    result = pytester.runpytest(
        "-n", workers, "-rA", "--log-level=DEBUG", "-o", "log_cli=true",
        "--log-cli-level=DEBUG", "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*the app rejected the verification*", "*- mailbox -*"])
    outputs = {
        "terminal": "\n".join(result.outlines + result.errlines),
        "junit": (pytester.path / "junit.xml").read_text(),
        "jsonl": (pytester.path / "receipts.jsonl").read_text(),
    }
    for name, text in outputs.items():
        assert "482913" not in text, name
        assert "Zq8vT4nW2xKp9LmR" not in text, name
    receipts = read_receipts(pytester.path / "receipts.jsonl")
    assert len(receipts) == 2
    for receipt in receipts:
        (message,) = receipt.messages
        assert message.subject == "Your code is ••••13"
        kinds = {s.kind: s for s in message.secrets}
        assert kinds["code"].last2 == "13"
        assert kinds["link"].last2 == "mR"
        assert kinds["link"].host == "app.example.test"
        assert len(kinds["code"].sha256) == 64


SUBJECT_SUITE = """
LINK = "https://app.example.test/verify?token=Jx7Lm2Qv9Rk4Tw8Z"


def test_extracts_from_subjects(isolated_mailbox, send):
    send(isolated_mailbox.address, subject=f"Sign in: {LINK}", body=f"Open {LINK}")
    send(isolated_mailbox.address, subject="認証コードはQXKZTRです", body="コード: QXKZTR")
    assert isolated_mailbox.wait_for(subject_contains="Sign in").link() == LINK
    glued = isolated_mailbox.wait_for(subject_contains="認証")
    assert glued.code(pattern=r"コード: (\\w+)") == "QXKZTR"


def test_extracts_nothing(isolated_mailbox, send):
    send(isolated_mailbox.address, subject="Your code A7K9Q2, token Hq3mV8sLx2Rt7Wk9Pz4N")
    isolated_mailbox.wait_for(subject_contains="Your code").ack()


def test_fails_on_the_links_it_listed(isolated_mailbox, send):
    body = "Open https://app.example.test/reset?token=Nq5Vb8Xw3Kc6Pd2M"
    body += " or read https://app.example.test/help"
    send(isolated_mailbox.address, body=body)
    links = isolated_mailbox.wait_for().links()
    assert "https://app.example.test/welcome" in links
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_subjects_and_listed_links_show_no_token_or_code(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_subjects=SUBJECT_SUITE)
    result = pytester.runpytest(
        "-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl"
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    outputs = {
        "terminal": "\n".join(result.outlines + result.errlines),
        "junit": (pytester.path / "junit.xml").read_text(),
        "jsonl": (pytester.path / "receipts.jsonl").read_text(),
    }
    secrets = ("Jx7Lm2Qv9Rk4Tw8Z", "QXKZTR", "A7K9Q2", "Hq3mV8sLx2Rt7Wk9Pz4N", "Nq5Vb8Xw3Kc6Pd2M")
    for name, text in outputs.items():
        for secret in secrets:
            assert secret not in text, (name, secret)
    subjects = {
        receipt.nodeid.partition("::")[2]: [m.subject for m in receipt.messages]
        for receipt in read_receipts(pytester.path / "receipts.jsonl")
    }
    assert subjects["test_extracts_from_subjects"] == [
        "Sign in: https://app.example.test/…?token=…",
        "認証コードは••••TRです",
    ]
    assert subjects["test_extracts_nothing"] == ["Your code ••••Q2, token ••••••••••••••••••4N"]
    # The listed links: the token masked in the failure, the rest of them readable.
    result.stdout.fnmatch_lines(
        ["*'https://app.example.test/reset?token=••••••••••••••2M', *app.example.test/help'*"]
    )


MASKED_SUITE = """
import logging

import pytest

CODE = "103853"
PIN = "QZ7W"  # shorter than the process remembers: masked by its own mailbox only
LINK = "https://shop.example.test/verify?token=QqTc9vR2xLp7WmZk"


@pytest.fixture
def extracted(isolated_mailbox, send):
    send(isolated_mailbox.address, body=f"Code {CODE}. PIN {PIN}. Open {LINK}")
    msg = isolated_mailbox.wait_for()
    return msg.code(), msg.link(domain="shop.example.test"), msg.code(pattern=r"PIN (\\w{4})")


def check(link):
    assert link.startswith("https://other.example.test")


def test_code(extracted):
    code = extracted[0]
    assert code == None


def test_link(extracted):
    print("the app sent", extracted[1])
    logging.getLogger("app").warning("verification link %s", extracted[1])
    check(extracted[1])


def test_chained(extracted):
    try:
        int(extracted[1])
    except ValueError as exc:
        raise RuntimeError("not a number") from exc


def test_fail_without_traceback(extracted):
    pytest.fail(f"the app refused {extracted[0]}", pytrace=False)


def test_skip(extracted):
    pytest.skip(f"no use for {extracted[0]}")


def test_xfail(extracted):
    pytest.xfail(f"slow with {extracted[0]}")


@pytest.fixture
def broken_setup(extracted):
    raise RuntimeError(f"setup saw {extracted[1]}")


def test_setup(broken_setup):
    pass


@pytest.fixture
def broken_teardown(extracted):
    yield
    raise RuntimeError(f"teardown saw {extracted[2]}")


def test_teardown(broken_teardown):
    pass
"""


@pytest.mark.parametrize(
    ("workers", "tb"), [("0", "long"), ("2", "long"), ("0", "native"), ("2", "native")]
)
def test_a_failure_report_masks_what_the_test_extracted(
    pytester: pytest.Pytester, workers: str, tb: str
) -> None:
    """Traceback lines, arguments, locals, the crash message (short summary, JUnit),
    captured output, skip and xfail reasons, in every phase: each shows the mask."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_masked=MASKED_SUITE)
    result = pytester.runpytest(
        "-n", workers, f"--tb={tb}", "--showlocals", "-rA", "--junitxml=junit.xml"
    )
    result.assert_outcomes(failed=4, passed=1, skipped=1, xfailed=1, errors=2)
    link = "•" * 53 + "Zk"
    shown = [
        "*AssertionError: assert '••••53' == None",
        "the app sent " + link,
        "WARNING  app:* verification link " + link,
        "the app refused ••••53",
        "*RuntimeError: setup saw " + link,
        "*RuntimeError: teardown saw ••7W",
        "SKIPPED [[]1[]] *: no use for ••••53",
        "XFAIL *::test_xfail - *slow with ••••53",  # pytest 8 says "- reason: slow…"
        "FAILED *::test_code - AssertionError: assert '••••53'*",
    ]
    if tb == "long":  # locals and arguments: --tb=native shows neither
        shown[1:1] = ["code * = '••••53'", f"link = '{link}'", f"E * = '{link}'.startswith"]
    for line in shown:  # in no particular order: errors come before failures
        result.stdout.fnmatch_lines([line])
    junit = (pytester.path / "junit.xml").read_text()
    failures = {
        case.get("name"): case.find("failure")
        for case in ET.fromstring(junit).iter("testcase")
        if case.find("failure") is not None
    }
    assert failures["test_code"].get("message") == "AssertionError: assert '••••53' == None"
    assert f"{link}'.startswith" in (failures["test_link"].text or "")
    for text in ("\n".join(result.outlines + result.errlines), junit):
        for secret in ("103853", "QZ7W", "QqTc9vR2xLp7WmZk", "https://shop.example.test/"):
            assert secret not in text


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_passing_tests_captured_output_is_masked_too(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import logging

        def test_it(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Code 551207")
            code = isolated_mailbox.wait_for().code()
            print("the code is", code)
            logging.getLogger("app").warning("sent code %s", code)
        """
    )
    result = pytester.runpytest(
        "-n", workers, "-rP", "--junitxml=junit.xml", "-o", "junit_logging=all"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- Captured stdout call -*", "the code is ••••07"])
    junit = (pytester.path / "junit.xml").read_text()
    assert "sent code ••••07" in junit
    for text in (result.stdout.str(), junit):
        assert "551207" not in text


NOTHING_EXTRACTED_CONFTEST = """
from pathlib import Path

import pytest_mailbox.plugin


def _mask_report(report, mask):
    with Path("masked.txt").open("a") as out:
        out.write(f"{report.nodeid}\\n")


pytest_mailbox.plugin._mask_report = _mask_report
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_process_that_extracted_nothing_masks_nothing(
    pytester: pytest.Pytester, workers: str
) -> None:
    """No work for a failure when nothing was extracted (a fresh process: pytester's
    in-process runs share this one's memory of what its tests extracted)."""
    pytester.makeconftest(SENDER_CONFTEST + NOTHING_EXTRACTED_CONFTEST)
    pytester.makepyfile(
        """
        def test_waits(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Code 551207")
            assert isolated_mailbox.wait_for().text == "551207"


        def test_plain():
            assert "551207" == None
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-n", workers)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["E * assert '551207' == None"], consecutive=False)
    assert not (pytester.path / "masked.txt").exists()


def test_receipts_cli_prints_a_table(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_suite=USER_SUITE)
    pytester.runpytest("--junitxml=junit.xml").assert_outcomes(passed=5)
    junit = pytester.path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_mailbox", "receipts", str(junit)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "test", "run_id", "address", "state", "close_reason", "msgs", "consumed"
    ]  # fmt: skip
    assert lines[-1] == "5 receipt(s)"
    assert sum("test_suite.py::test_signup[" in line for line in lines) == 4
    assert all("released_success" in line for line in lines[2:-1])


def test_receipts_are_read_back_whatever_their_subject_holds_and_behind_a_bom(
    pytester: pytest.Pytester,
) -> None:
    """JSON leaves U+0085, U+2028 and U+2029 as they are, and str.splitlines() broke a
    JSON Lines receipt at them (a cp1252 "…" sent as iso-8859-1 decodes to U+0085); a
    tool that re-saves a file may put a byte-order mark before it."""
    pytester.makepyfile(
        """
        import smtplib

        def test_odd_subject(isolated_mailbox, mailbox_server):
            to = isolated_mailbox.address
            subject = "=?utf-8?q?Verify=C2=85_now=E2=80=A8or=E2=80=A9later?="
            head = f"From: app@example.test\\r\\nTo: {to}\\r\\nSubject: {subject}\\r\\n"
            raw = head + "\\r\\nhi\\r\\n"
            with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
                smtp.sendmail("app@example.test", [to], raw.encode())
            isolated_mailbox.wait_for(subject_contains="Verify").ack()
        """
    )
    pytester.runpytest("--junitxml=junit.xml", "--mailbox-receipts=r.jsonl").assert_outcomes(
        passed=1
    )
    for name in ("r.jsonl", "junit.xml"):
        written = pytester.path / name
        bom = pytester.path / f"bom-{name}"
        bom.write_bytes(b"\xef\xbb\xbf" + written.read_bytes())
        for path in (written, bom):
            (receipt,) = read_receipts(path)
            assert [m.subject for m in receipt.messages] == ["Verify\x85 now\u2028or\u2029later"]


NOT_RECEIPTS = "not JUnit XML or pytest-mailbox JSON Lines receipts"


def _receipts_command(path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m pytest_mailbox receipts PATH``, run as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_mailbox", "receipts", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "not a file"),  # a directory
        ("missing", "no such file"),
        (b'{"run_id": 1}\n', f"{NOT_RECEIPTS} (line 1 is not a receipt ("),
        # which line, in a file of thousands: one cut short when its writer died, say
        (b'\n\n{"run_id": "r-1", "nodeid": "t.py::te\n', f"{NOT_RECEIPTS} (line 3 is not a"),
        (b"<testsuites><testsuite>", NOT_RECEIPTS),
        # XML that is no JUnit report (an HTML report named .xml) listed no runs, rc 0
        (
            b"<html><body>5 passed</body></html>",
            f"{NOT_RECEIPTS} (XML whose root is <html>, not a JUnit report's <testsuites> or "
            "<testsuite>)",
        ),
        (b"\xff\xfe\x00binary", NOT_RECEIPTS),
    ],
)
def test_receipts_cli_names_a_file_it_cannot_read(
    tmp_path: Path, content: bytes | str | None, expected: str
) -> None:
    path = tmp_path / "receipts"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)

    proc = _receipts_command(path)

    assert proc.returncode == 2
    assert f"error: {path}: {expected}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("usage: python -m pytest_mailbox receipts ")  # its own


@pytest.mark.parametrize("kind", ["no-permission", "io-error"])
def test_receipts_cli_names_a_file_whose_read_fails(tmp_path: Path, kind: str) -> None:
    """docs/receipts.md: a file it cannot read is refused with exit status 2 and the
    reason. A file the user may not read, or whose read fails, raised a traceback."""
    if kind == "no-permission":
        if os.geteuid() == 0:  # root reads it all the same
            pytest.skip("root may read a file of mode 000")
        path = tmp_path / "r.jsonl"
        path.write_text("")
        path.chmod(0)
        reason = "Permission denied"
    else:
        path = Path("/proc/self/mem")  # a regular file whose read at offset 0 fails: EIO
        if not path.is_file():
            pytest.skip("no /proc/self/mem on this system")
        reason = "Input/output error"

    proc = _receipts_command(path)

    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(f"error: {path}: cannot be read ({reason})")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["name-too-long", "folder-not-searchable", "symlink-loop"])
def test_receipts_cli_names_a_file_it_cannot_even_look_at(tmp_path: Path, kind: str) -> None:
    """Before the read, the check for a regular file raised a traceback (exit 1) for a
    name longer than the system takes, or a file in a folder this user may not search."""
    if kind == "name-too-long":
        path, reason = tmp_path / ("r" * 300), "File name too long"
    elif kind == "symlink-loop":
        path, reason = tmp_path / "loop", "Too many levels of symbolic links"
        path.symlink_to(path)
    else:
        if os.geteuid() == 0:  # root searches it all the same
            pytest.skip("root may search a folder of mode 000")
        path, reason = tmp_path / "locked" / "r.jsonl", "Permission denied"
        path.parent.mkdir()
        path.write_text("")
        path.parent.chmod(0)

    try:
        proc = _receipts_command(path)
    finally:
        path.parent.chmod(0o700)

    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(f"error: {path}: cannot be read ({reason})")


def test_receipts_cli_says_an_unknown_option_with_its_own_usage(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text("")
    argv = [sys.executable, "-m", "pytest_mailbox", "receipts", str(tmp_path / "r.jsonl")]

    proc = subprocess.run([*argv, "--timline"], capture_output=True, text=True, check=False)

    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: python -m pytest_mailbox receipts ")
    assert proc.stderr.endswith("error: unrecognized arguments: --timline\n")
    # an option of the command's, before the command: said where it goes
    before = [*argv[:3], "--timeline", *argv[3:]]
    proc = subprocess.run(before, capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.endswith(
        "error: unrecognized arguments: --timeline (--timeline: options go after 'receipts')\n"
    )


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        # the command named, and where to read what it takes ("required: command" named none)
        (
            [],
            "python -m pytest_mailbox: error: give a command: receipts "
            "(python -m pytest_mailbox receipts --help)",
        ),
        (["receipts"], "receipts: error: the following arguments are required: FILE"),
        # an option given as --name=value, before the command: said where it goes too
        (
            ["--state=expired", "receipts", "r.jsonl"],
            "receipts: error: unrecognized arguments: --state=expired (--state=expired: "
            "options go after 'receipts')",
        ),
    ],
)
def test_receipts_cli_refuses_an_incomplete_command_line_with_a_usage_error(
    tmp_path: Path, argv: list[str], error: str
) -> None:
    (tmp_path / "r.jsonl").write_text("")

    proc = subprocess.run(
        [sys.executable, "-m", "pytest_mailbox", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )

    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(error)
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_receipts_cli_help_shows_the_options_receipts_md_shows() -> None:
    """docs/receipts.md writes the command out with each option and its argument; its
    --help showed --test TEST, and --state with all nine states inline, three lines long."""
    page = (Path(__file__).parent.parent / "docs" / "receipts.md").read_text(encoding="utf-8")
    (synopsis,) = re.findall(r"^\$ python -m pytest_mailbox receipts .*$", page, re.MULTILINE)
    option = re.compile(r"\[(--[a-z]+(?: [A-Z]+)?)\]")

    proc = subprocess.run(
        [sys.executable, "-m", "pytest_mailbox", "receipts", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )

    usage = " ".join(proc.stdout.split("\n\n")[0].split())
    expected = ["--test TEXT", "--state STATE", "--timeline"]
    assert option.findall(usage) == option.findall(synopsis) == expected
    assert "FILE [FILE ...]" in usage
    text = " ".join(proc.stdout.split())
    assert "FILE A JUnit XML report (pytest --junitxml) or a JSON Lines file" in text
    assert (
        "(one of: reserved, waiting, claimed, consumed, released, expired, released_success, "
        "released_error, expired_timeout)" in text
    )


def test_python_m_pytest_mailbox_help_names_its_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_mailbox", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )

    assert proc.stdout.startswith("usage: python -m pytest_mailbox [-h] COMMAND ...\n")
    text = " ".join(proc.stdout.split())
    assert "Read back the receipts pytest-mailbox left (docs/receipts.md)." in text
    assert "receipts Print the receipts in JUnit XML or JSONL files" in text
    assert "'python -m pytest_mailbox receipts --help' says what the command takes." in text


def test_receipts_cli_refuses_an_unknown_state(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text("")
    argv = [sys.executable, "-m", "pytest_mailbox", "receipts", str(tmp_path / "r.jsonl")]

    proc = subprocess.run([*argv, "--state", "bogus"], capture_output=True, text=True, check=False)

    assert proc.returncode == 2
    assert "argument --state: invalid choice: 'bogus' (choose from " in proc.stderr
    assert "'expired', 'released_success'" in proc.stderr


def test_receipts_cli_filters_and_timelines(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_suite=USER_SUITE)
    pytester.runpytest("--mailbox-receipts=r.jsonl").assert_outcomes(passed=5)
    capsys.readouterr()
    assert receipts_main(["receipts", str(pytester.path / "r.jsonl"), "--test", "reset",
                          "--state", "released", "--timeline"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.endswith("1 receipt(s)\n")
    assert "test_suite.py::test_reset" in out
    assert "consumed" in out
    assert "test_signup" not in out
    assert (
        receipts_main(["receipts", str(pytester.path / "r.jsonl"), "--state", "released_error"])
        == 0
    )
    assert capsys.readouterr().out.endswith("0 receipt(s)\n")  # every run closed with success
    assert (
        receipts_main(["receipts", str(pytester.path / "r.jsonl"), "--state", "released_success"])
        == 0
    )
    assert capsys.readouterr().out.endswith("5 receipt(s)\n")
    with pytest.raises(SystemExit):
        receipts_main(["receipts", str(pytester.path / "missing.xml")])


def test_receipts_cli_lists_a_run_given_in_two_files_once(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_suite=USER_SUITE)
    pytester.runpytest("--mailbox-receipts=r.jsonl", "--junitxml=r.xml").assert_outcomes(passed=5)
    pytester.runpytest("--mailbox-receipts=again.jsonl").assert_outcomes(passed=5)
    capsys.readouterr()
    files = [str(pytester.path / name) for name in ("r.xml", "r.jsonl", "again.jsonl")]

    assert receipts_main(["receipts", *files]) == 0

    out = capsys.readouterr().out
    assert out.endswith("10 receipt(s)\n")  # 5 from the first run (in two files), 5 from the second
    run_ids = {r.run_id for r in [*read_receipts(files[0]), *read_receipts(files[2])]}
    assert len(run_ids) == 10
    assert all(out.count(run_id) == 1 for run_id in run_ids)


def test_configuration_reference_is_current() -> None:
    """docs/configuration.md embeds the table generated from the option definitions."""
    text = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    start = text.index("-->\n", text.index("<!-- options-table")) + len("-->\n")
    end = text.index("<!-- /options-table -->")
    assert text[start:end].strip() == options_table()


FREED_SUITE = """
import gc
import weakref

import pytest

seen = []


def test_reads_its_mail(isolated_mailbox, send):
    send(isolated_mailbox.address, body="Your code is 482913")
    message = isolated_mailbox.wait_for(subject="Verify your account")
    assert message.code() == "482913"  # parses the body: the mailbox now holds the parse
    message.ack()
    seen.append(weakref.ref(isolated_mailbox))


def test_the_previous_mailbox_is_gone(isolated_mailbox):
    gc.collect()
    assert seen[0]() is None
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_finished_tests_mailbox_is_not_kept_for_the_rest_of_the_session(
    pytester: pytest.Pytester, workers: str
) -> None:
    """pytest keeps every item until the session ends; only the receipt may stay with it."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_freed=FREED_SUITE)
    result = pytester.runpytest("-n", workers, "--dist", "loadfile")
    result.assert_outcomes(passed=2)


#: What a sink or a test needs, and the xdist controller does not.
HEAVY = ("asyncio", "aiosmtpd", "pytest_mailbox.sink", "pytest_mailbox.mailbox")
#: What a contract, a receipt or a message needs (pydantic, the e-mail parser): nor does it,
#: and nor does a run none of whose tests asks for a contract.
MODELS = ("pydantic", "pytest_mailbox.contract", "pytest_mailbox.message")

CONTROLLER_CONFTEST = f"""
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        found = sorted(m for m in {HEAVY + MODELS!r} if m in sys.modules)
        (config.rootpath / "controller.txt").write_text(repr(found))


def pytest_collection_finish(session):
    name = getattr(session.config, "workerinput", {{}}).get("workerid", "main")
    found = sorted(m for m in {HEAVY!r} if m in sys.modules)
    (session.config.rootpath / f"collected-{{name}}.txt").write_text(repr(found))
"""


def test_the_xdist_controller_never_imports_the_sink(pytester: pytest.Pytester) -> None:
    """The controller runs no test and no sink: before it starts the workers it reads the
    options only, and it never imports asyncio and aiosmtpd (about 0.1 s of every start),
    nor pydantic and the models (about 0.07 s more), not even to reconcile the store at the
    end. A process that runs mailbox tests imports them once collected, not in its first
    test."""
    pytester.makeconftest(SENDER_CONFTEST + CONTROLLER_CONFTEST)
    pytester.makepyfile(test_suite=USER_SUITE)
    others = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    off = [f"-pno:{name}" for name in sorted(others - {"mailbox", "xdist", "xdist.looponfail"})]
    # The controller reconciles the store at the end, so it imports filelock, and some
    # filelock releases import asyncio on their own (4.1 does, for Python 3.10).
    lock_imports = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, filelock; print(sorted(set({HEAVY + MODELS!r}) & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result = pytester.runpytest_subprocess(*off, "-n", "2")  # smtpdfix imports aiosmtpd
    result.assert_outcomes(passed=5)
    assert (pytester.path / "controller.txt").read_text() == lock_imports
    # pytest-html installed, no report asked for: no receipt to parse for it.
    with_html = [o for o in off if o not in ("-pno:html", "-pno:metadata")]
    result = pytester.runpytest_subprocess(*with_html, "-n", "2")
    result.assert_outcomes(passed=5)
    assert (pytester.path / "controller.txt").read_text() == lock_imports
    result = pytester.runpytest_subprocess(*off, "-n", "0")
    result.assert_outcomes(passed=5)
    every = repr(sorted(HEAVY))
    for name in ("gw0", "gw1", "main"):
        assert (pytester.path / f"collected-{name}.txt").read_text() == every
    # `--dist` without `-n` (an ini's addopts, with `-n` given in CI only) runs the tests
    # in this one process: it imports them before the first test too.
    main = pytester.path / "collected-main.txt"
    main.unlink()
    result = pytester.runpytest_subprocess(*off, "--dist", "loadscope")
    result.assert_outcomes(passed=5)
    assert main.read_text() == every
    # Collecting only runs no test: nothing to import.
    result = pytester.runpytest_subprocess(*off, "-n", "0", "--collect-only")
    assert result.ret == 0
    assert main.read_text() == "[]"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_where_one_test_asks_for_a_mailbox_imports_the_sink_once_collected(
    pytester: pytest.Pytester, workers: str
) -> None:
    """One mailbox test among others is enough: the sink is imported once collected, not
    inside the setup of that test (where a per-test timeout would count the imports)."""
    pytester.makeconftest(CONTROLLER_CONFTEST)
    pytester.makepyfile(
        test_mixed="def test_plain():\n    pass\n\n\ndef test_mail(isolated_mailbox):\n    pass\n"
    )
    result = _alone(pytester, "-n", workers)
    result.assert_outcomes(passed=2)
    collected = sorted(pytester.path.glob("collected-*.txt"))
    assert len(collected) == (1 if workers == "0" else 2)
    assert all(path.read_text() == repr(sorted(HEAVY)) for path in collected)


def _alone(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A run in a process of its own with no installed plugin but this one and xdist: what
    a project pays for loading the plugin is measured without what the others import."""
    others = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    off = [f"-pno:{name}" for name in sorted(others - {"mailbox", "xdist", "xdist.looponfail"})]
    return pytester.runpytest_subprocess(*off, *args)


def _imported_at_the_end(pytester: pytest.Pytester) -> list[str]:
    """What each process of the run had imported of ``ended_conftest``'s modules."""
    return [path.read_text() for path in sorted(pytester.path.glob("ended-*.txt"))]


def ended_conftest(modules: tuple[str, ...]) -> str:
    """A conftest that writes which of ``modules`` each process imported, as it ends."""
    return f"""
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    name = getattr(config, "workerinput", {{}}).get("workerid", "main")
    found = sorted(m for m in {modules!r} if m in sys.modules)
    (config.rootpath / f"ended-{{name}}.txt").write_text(repr(found))
"""


NO_MAIL_CONFTEST = ended_conftest(HEAVY)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_that_made_no_store_never_imports_the_store(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The run's end imported the store (so sqlite3 and filelock) in every run, for the
    text it says when the store is gone: a project's other suites paid for it. (sqlite3
    itself is not looked for: coverage's data file, under ``make unit``, imports it.)"""
    pytester.makeconftest(ended_conftest(("pytest_mailbox.store", "filelock")))
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = _alone(pytester, "-n", workers)
    result.assert_outcomes(passed=1)
    assert _imported_at_the_end(pytester) == (["[]"] if workers == "0" else ["[]"] * 3)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_without_mailbox_tests_never_imports_the_sink(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The plugin is loaded in every pytest run of a project that installs it; a run of the
    project's other tests pays for no sink, no event loop and no mailbox."""
    pytester.makeconftest(NO_MAIL_CONFTEST)
    pytester.makepyfile(
        test_plain="""
        import pytest


        def test_one(email_contract):  # the contract alone needs no sink
            assert email_contract.purpose


        @pytest.mark.email_contract(purpose="plain")  # nor does checking the marker
        def test_two():
            pass
        """
    )
    result = _alone(pytester, "-n", workers)
    result.assert_outcomes(passed=2)
    ended = sorted(path.name for path in pytester.path.glob("ended-*.txt"))
    assert ended == (
        ["ended-main.txt"]
        if workers == "0"
        else ["ended-gw0.txt", "ended-gw1.txt", "ended-main.txt"]
    )
    assert all(pytester.path.joinpath(name).read_text() == "[]" for name in ended)


def test_the_vocabulary_is_still_where_it_was() -> None:
    """The names that moved to ``vocabulary`` (no pydantic) are still exported where code
    found them before: ``contract``, and ``message`` for ``digest``."""
    from pytest_mailbox import contract, message, vocabulary  # noqa: PLC0415

    moved = [name for name in vocabulary.__all__ if name != "digest"]
    assert [getattr(contract, name) for name in moved] == [
        getattr(vocabulary, name) for name in moved
    ]
    assert set(moved) <= set(contract.__all__)
    assert message.digest is vocabulary.digest


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_without_mail_tests_never_imports_pydantic(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A project's other tests (no mailbox, no contract, no marker) pay for no pydantic and
    no contract models: loading the plugin costs a pytest run about 15 ms, where it cost
    about 0.1 s."""
    pytester.makeconftest(ended_conftest(HEAVY + MODELS))
    pytester.makepyfile(test_plain="def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    result = _alone(pytester, "-n", workers)
    result.assert_outcomes(passed=2)
    assert _imported_at_the_end(pytester) == (["[]"] if workers == "0" else ["[]"] * 3)


def test_a_mailbox_asked_for_at_run_time_imports_what_it_needs(
    pytester: pytest.Pytester,
) -> None:
    """No collected test names a sink fixture, so nothing was imported at collection; a
    test that asks for one with ``request.getfixturevalue`` gets it all the same."""
    pytester.makeconftest(NO_MAIL_CONFTEST)
    pytester.makepyfile(
        test_dynamic="""
        import smtplib
        import sys


        def test_asks(request):
            assert "pytest_mailbox.sink" not in sys.modules
            box = request.getfixturevalue("isolated_mailbox")
            server = request.getfixturevalue("mailbox_server")
            with smtplib.SMTP(server.host, server.port) as smtp:
                smtp.sendmail("app@example.test", [box.address], "Subject: Hi\\r\\n\\r\\nhello")
            box.wait_for(subject="Hi").ack()
        """
    )
    result = _alone(pytester, "-n", "0")
    result.assert_outcomes(passed=1)


def test_the_package_imports_the_mailbox_and_the_sink_when_first_asked() -> None:
    code = (
        "import sys\n"
        "import pytest_mailbox.plugin\n"
        f"heavy = {(*HEAVY, 'filelock', 'pytest_mailbox.store')!r}\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from pytest_mailbox import ClaimedMessage, MailSink, Mailbox, Message, Store\n"
        "import pytest_mailbox\n"
        "print(MailSink.__module__, 'Store' in dir(pytest_mailbox))\n"
        "pytest_mailbox.NoSuchName\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.splitlines() == ["[]", "pytest_mailbox.sink True"]
    assert "AttributeError: module 'pytest_mailbox' has no attribute 'NoSuchName'" in done.stderr


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="subtests are built in from pytest 9")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_subtest_that_passed_is_not_its_test_passing(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        def test_xfails_after_a_subtest(isolated_mailbox, send, subtests):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for(subject_contains="Verify")
            with subtests.test("the link works"):
                pass
            pytest.xfail("known bug")

        def test_passes_with_a_subtest(isolated_mailbox, send, subtests):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for(subject_contains="Verify")
            with subtests.test("the link works"):
                pass

        def test_fails_in_a_subtest(isolated_mailbox, send, subtests):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for(subject_contains="Verify")
            with subtests.test("the link works"):
                assert False  # the body goes on and passes: the test has failed all the same
        """
    )

    pytester.runpytest("-n", workers, "--junitxml=junit.xml")

    closed = _closes(pytester.path / "junit.xml")
    assert closed == {
        "test_xfails_after_a_subtest": ("released_error", ["waiting"]),
        "test_passes_with_a_subtest": ("released_success", ["consumed"]),
        "test_fails_in_a_subtest": ("released_error", ["waiting"]),
    }


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="subtests are built in from pytest 9")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_subtests_captured_output_is_masked(pytester: pytest.Pytester, workers: str) -> None:
    """pytest's subtests add the captured output after pytest_runtest_makereport."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_sub(isolated_mailbox, send, subtests):
            send(isolated_mailbox.address, body="Your code is 482913")
            code = isolated_mailbox.wait_for().code()
            with subtests.test("check"):
                print("got code", code)
                assert code == "000000"
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")
    result.stdout.fnmatch_lines(["*AssertionError: assert '••••13' == '000000'", "got code ••••13"])
    for text in (result.stdout.str(), (pytester.path / "junit.xml").read_text()):
        assert "482913" not in text


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="subtests are built in from pytest 9")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_subtests_description_is_masked(pytester: pytest.Pytester, workers: str) -> None:
    """``subtests.test(msg=..., **kwargs)`` is shown on the subtest's line and above its
    failure, passed or failed: its report's context, not its traceback or output."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_sub(isolated_mailbox, send, subtests):
            send(isolated_mailbox.address, body="Your code is 61803398")
            code = isolated_mailbox.wait_for().code()
            with subtests.test(msg=f"code {code}"):
                assert code == "1"
            with subtests.test(code=code):
                assert code == "2"
            with subtests.test(msg=f"again {code}", code=code):
                pass
        """
    )
    result = pytester.runpytest("-n", workers, "-v", "-rA")
    result.stdout.fnmatch_lines(
        ["*SUBFAILED*[[]code ••••••98[]]*", "*test_sub [[]code ••••••98[]]*"]
    )
    result.stdout.fnmatch_lines(["*SUBFAILED*(code=*'••••••98'*)*"])
    assert "61803398" not in result.stdout.str()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_what_a_test_records_for_junit_itself_is_masked(
    pytester: pytest.Pytester, workers: str
) -> None:
    """``record_property`` and ``record_testsuite_property`` go to JUnit XML as given: a
    passing test's too, which has no report to mask. (xdist's workers have no testsuite
    properties: that fixture does nothing there.)"""
    pytester.makeconftest(
        SENDER_CONFTEST
        + """

def pytest_runtest_logreport(report):  # what a report consumer gets: values keep their type
    if report.when == "teardown":
        kinds = sorted((name, type(value).__name__) for name, value in report.user_properties)
        with open("kinds.txt", "a") as out:
            print(kinds, file=out)
"""
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def suite_url(record_testsuite_property):
            links = []
            yield links
            record_testsuite_property("teardown_url", links[0])  # after the call's report

        def test_records(
            isolated_mailbox, send, record_property, record_testsuite_property, suite_url, request
        ):
            send(isolated_mailbox.address, body="Open https://app.example.test/v?token=Wd5Fg8Hj2Kl4Mn7Pq")
            link = isolated_mailbox.wait_for().link()
            record_property("opened_url", link)
            record_property("token_length", 17)
            record_testsuite_property("last_url", link)
            request.node.user_properties.append(["as_a_list", link])  # JUnit takes it too
            suite_url.append(link)
        """
    )
    # record_property warns under xunit2, the default: "use 'legacy' or 'xunit1'"
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml", "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=1)
    xml = (pytester.path / "junit.xml").read_text()
    masked = "•" * (len("https://app.example.test/v?token=Wd5Fg8Hj2Kl4Mn7Pq") - 2) + "Pq"
    assert f'name="opened_url" value="{masked}"' in xml  # the link, masked whole
    assert f'name="as_a_list" value="{masked}"' in xml
    assert 'name="token_length" value="17"' in xml  # what hides nothing stays as it was
    if workers == "0":
        assert f'name="last_url" value="{masked}"' in xml
        assert f'name="teardown_url" value="{masked}"' in xml
    assert "Wd5Fg8Hj2Kl4Mn7Pq" not in xml
    kinds = set((pytester.path / "kinds.txt").read_text().splitlines())
    assert kinds == {
        "[('as_a_list', 'str'), ('mailbox.receipt', 'str'), ('opened_url', 'str'), "
        "('token_length', 'int')]"
    }


def test_a_recorded_value_with_no_text_is_left_to_whatever_shows_it(
    pytester: pytest.Pytester,
) -> None:
    """Masking it must not end the run: without JUnit XML nothing ever asks for its text."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        class NoText:
            def __str__(self):
                raise RuntimeError("no text")

        def test_records(isolated_mailbox, send, record_property):
            send(isolated_mailbox.address, body="Your code is 482913")
            assert isolated_mailbox.wait_for().code() == "482913"
            record_property("odd", NoText())
        """
    )
    result = pytester.runpytest("-o", "junit_family=xunit1")

    result.assert_outcomes(passed=1)
    assert result.ret == 0


def test_words_of_another_tests_link_do_not_garble_a_report(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_a_extracts(isolated_mailbox, send):
            send(
                isolated_mailbox.address,
                body="Reset: https://app.example.test/reset?token=Zq8xYtK2mPw9RvLs"
                "&utm_campaign=password_reset&next=/dashboard",
            )
            assert isolated_mailbox.wait_for().link()

        def test_password_reset_page_renders():
            page = "<h1>Reset your password</h1> go to /dashboard"
            assert "Zq8xYtK2mPw9RvLs" in page
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*def test_password_reset_page_renders():",
            '*page = "<h1>Reset your password</h1> go to /dashboard"',
            "*assert '••••••••••••••Ls' in *",
        ]
    )
    assert "Zq8xYtK2mPw9RvLs" not in result.stdout.str()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_short_code_an_earlier_test_extracted_does_not_mask_a_later_tests_report(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A test's report masks a short code it extracted (a four-digit PIN) wherever it
    stands; the next test's report, in the same process, shows that number as it is: the
    process remembers values of six characters or more only."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        def test_a_extracts(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Your PIN is 4821")
            pin = isolated_mailbox.wait_for().code(r"PIN is (\\d{4})")
            assert pin == "0000", f"PIN {pin}"

        def test_b_shows_its_own_room_number():
            assert "room 4821" == "room 0"
        """
    )
    result = pytester.runpytest("-n", workers, "--dist", "loadfile", "-p", "no:randomly")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*PIN ••21*", "*room 4821*"])
    assert "PIN 4821" not in result.stdout.str()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_short_code_from_the_tests_own_mailbox_is_masked(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A mailbox a fixture of the user's reserves, not isolated_mailbox, with a 4-digit code
    (too short for the process-wide memory)."""
    pytester.makeconftest(
        SENDER_CONFTEST
        + """

from pytest_mailbox import EmailContract, Mailbox


@pytest.fixture
def own_mailbox(mailbox_store):
    mailbox = Mailbox.reserve(mailbox_store, contract=EmailContract(), domain="mailbox.test")
    yield mailbox
    mailbox.close(success=True)
"""
    )
    pytester.makepyfile(
        """
        def test_pin(own_mailbox, send):
            send(own_mailbox.address, body="PIN 4821")
            assert own_mailbox.wait_for().code() == "0000"
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: assert '••21' == '0000'"])
    for text in (result.stdout.str(), (pytester.path / "junit.xml").read_text()):
        # masked where no digit touches it: an object's address may hold it among digits
        assert re.search(r"(?<!\d)4821(?!\d)", text) is None


SHOWN_SUITE = '''
import warnings
from urllib.parse import urlsplit

import pytest
from pytest_mailbox import EmailContract, Mailbox

TOKEN = "Zq8xYtK2mPw9RvLsAb3dEf7hJk1mNp4Q"
BODY = "y" * 50 + " open https://shop.example.test/verify?token=" + TOKEN + " " + "x" * 300


@pytest.fixture(scope="session")
def session_pin(mailbox_store, mailbox_server):
    """A mailbox of the whole session, with a PIN too short for the process's memory."""
    import smtplib
    from email.message import EmailMessage

    mailbox = Mailbox.reserve(mailbox_store, contract=EmailContract(), domain="mailbox.test")
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "a@app.example.test", mailbox.address, "PIN"
    msg.set_content("PIN 7342")
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(msg)
    yield mailbox.wait_for().code()
    mailbox.close(success=True)


def test_first(session_pin):
    pass


def test_second_sees_the_session_pin(session_pin):
    assert session_pin == "0000"


def test_a_client_error_quotes_the_path(isolated_mailbox, send):
    send(isolated_mailbox.address, body="Sign in: https://app.example.test/magic/aB3dE5fG7h2k?next=%2Fhome")
    link = isolated_mailbox.wait_for().link()
    split = urlsplit(link)
    raise ConnectionError(f"Max retries exceeded with url: {split.path}?{split.query}")


def test_a_long_text_cut_short(isolated_mailbox, send):
    send(isolated_mailbox.address, body=BODY)
    msg = isolated_mailbox.wait_for()
    assert msg.link()
    assert "Welcome" in msg.text


def test_a_raw_message_printed(isolated_mailbox, send):
    send(isolated_mailbox.address, body=BODY)
    msg = isolated_mailbox.wait_for()
    assert msg.link()
    print(msg.raw.decode())
    assert False


def test_a_warning(isolated_mailbox, send):
    send(isolated_mailbox.address, body="Your code is 482913")
    warnings.warn(f"old login flow used with code {isolated_mailbox.wait_for().code()}")
'''


@pytest.mark.parametrize("workers", ["0", "2"])
def test_output_pytest_shows_is_masked_however_it_quotes_a_value(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A session fixture's short PIN in a later test, a link's path and query as an HTTP
    client's error quotes them, a repr pytest cut short, a raw message's quoted-printable
    soft line breaks, and the warnings summary."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_shown=SHOWN_SUITE)
    result = pytester.runpytest(
        "-n", workers, "-p", "no:randomly", "-W", "default::UserWarning", "--junitxml=junit.xml"
    )
    result.assert_outcomes(passed=2, failed=4, warnings=1)
    for line in (  # in no particular order: xdist's workers report as they finish
        "*assert '••42' == '0000'",
        "*ConnectionError: Max retries exceeded with url: •••*",
        "*old login flow used with code ••••13",
    ):
        result.stdout.fnmatch_lines([line])
    text = result.stdout.str() + (pytester.path / "junit.xml").read_text()
    for secret in ("aB3dE5fG7h2k", "482913", "Zq8xYtK2m", "mNp4Q"):
        assert secret not in text
    # the short PIN is masked where it stands alone; an object's address may hold its digits
    assert re.search(r"(?<![\w.])7342(?![\w])", text) is None
    assert "open https://shop.example.test/verify?token=••••" in text  # cut in the token


#: A link whose token a failing test's report must hide, however the report cuts it.
SPLIT_LINK = "https://app.example.test/verify?token=XjunxHf4YdBn5xS_EWg-BeLwh6rGtydGIbI9ZdKxHdc"
#: Pieces of its token, as the quoted-printable and encoded-word forms cut them.
SPLIT_PIECES = ("XjunxHf4Yd", "5xS=5FEWg", "BeLwh6rGty", "dGIbI9Z", "dKxHdc")
#: A subject long enough to be folded into encoded words, the link's token split.
FOLDED_SUBJECT = "Please verify your new account at Example Corp now: {LINK}"


def _failing_report(pytester: pytest.Pytester, workers: str, subject: str, *then: str) -> str:
    """What ``-vv`` and JUnit XML show of a test that sends ``SPLIT_LINK`` (in the body,
    and in the f-string ``subject``), waits for it, then fails at ``then``'s lines."""
    pytester.makeconftest(SENDER_CONFTEST)
    steps = "\n".join(f"    {line}" for line in then)
    pytester.makepyfile(
        f"""
LINK = {SPLIT_LINK!r}


def test_it(isolated_mailbox, send):
    send(isolated_mailbox.address, subject=f"{subject}", body=LINK)
    msg = isolated_mailbox.wait_for()
    assert msg.link() == LINK
{steps}
"""
    )
    result = pytester.runpytest("-n", workers, "-vv", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    return result.stdout.str() + (pytester.path / "junit.xml").read_text()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_token_in_a_folded_subjects_encoded_words_is_masked_in_a_printed_raw_message(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A subject with a link in it, long enough that the email package folds it into RFC
    2047 encoded words: ``print(msg.raw)`` and an assertion on it showed the token, cut
    and escaped (``5xS=5FEWg``), in clear."""
    then = ("print(msg.raw)", "print(msg.raw.decode())", 'assert b"Welcome" in msg.raw')
    text = _failing_report(pytester, workers, "Verify your account: {LINK}", *then)

    assert "Subject: Verify your account: =?utf-8?q?" in text
    for piece in SPLIT_PIECES:
        assert piece not in text, piece


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize(
    "assertion",
    [
        'msg.raw.decode() == "x\\ny"',  # a diff of lines: ``E   + …Z=`` ``E   + dKxHdc``
        'msg.raw.decode().splitlines() == ["x"]',  # ``'…Z=', 'dKxHdc'``
        '{"raw": msg.raw.decode()} == {"raw": "x"}',  # ``'…Z=\\r\\n'`` ``'dKxHdc\\r\\n'``
    ],
)
def test_a_token_split_by_a_soft_line_break_is_masked_in_a_diff_of_the_raw_message(
    pytester: pytest.Pytester, workers: str, assertion: str
) -> None:
    """``-vv`` shows an assertion on ``msg.raw`` as a diff of its lines, each after ``E``
    and ``+ `` (or as a list's items, or a string cut at each line break): the mask read a
    quoted-printable soft line break only where the next line went on at once, so the
    token before the break (37 of its 43 characters) was shown in clear."""
    text = _failing_report(pytester, workers, "Verify your account", f"assert {assertion}")

    assert "Content-Transfer-Encoding: quoted-printable" in text
    for piece in SPLIT_PIECES:
        assert piece not in text, piece


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize(
    "assertion",
    [
        'msg.raw.decode() == "x\\ny"',  # ``E   +  =?utf-8?q?…`` on each line
        'msg.raw.decode().splitlines() == ["x"]',  # ``…?=', ' =?utf-8?q?…``
    ],
)
def test_a_token_split_across_encoded_words_is_masked_in_a_diff_of_the_raw_message(
    pytester: pytest.Pytester, workers: str, assertion: str
) -> None:
    """A long subject with a link is folded into encoded words that split the token
    (``…token=3DXjunxHf4YdBn5xS=5FEWg-?=`` then `` =?utf-8?q?BeLwh6r…``). ``-vv`` shows an
    assertion on ``msg.raw`` as a diff of its lines, each after ``E`` and ``+ ``: the mask
    took the words of two lines for two runs, neither holding the whole token, and showed
    it in clear."""
    text = _failing_report(pytester, workers, FOLDED_SUBJECT, f"assert {assertion}")

    assert "Example Corp now: =?utf-8?q?" in text
    for piece in SPLIT_PIECES:
        assert piece not in text, piece


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_passing_tests_output_is_masked_for_any_report_consumer(
    pytester: pytest.Pytester, workers: str
) -> None:
    """pytest-reportlog, pytest-json-report, allure… write a passing test's sections too:
    a conftest hook stands in for them."""
    pytester.makeconftest(
        SENDER_CONFTEST
        + """
from pathlib import Path


def pytest_runtest_logreport(report):
    with Path("consumer.txt").open("a") as out:
        out.write("".join(content for _, content in report.sections))
"""
    )
    pytester.makepyfile(
        """
        def test_it(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Code 551207")
            print("the code is", isolated_mailbox.wait_for().code())
        """
    )
    result = pytester.runpytest("-n", workers)
    result.assert_outcomes(passed=1)
    written = (pytester.path / "consumer.txt").read_text()
    assert "the code is ••••07" in written
    assert "551207" not in written


@pytest.mark.parametrize("verbosity", ["-q", "-v", "-vv"])
def test_a_links_end_in_pytests_diff_of_two_strings_is_masked(
    pytester: pytest.Pytester, verbosity: str
) -> None:
    """The default diff of two long strings says "Skipping 55 identical leading characters"
    and prints their ends alone; the repr above it keeps ``https://app.`` before ``...``."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        TOKEN = "Zq8xYtK2mP4rT7wQ9sL1AbCdEfGh"


        def test_end(isolated_mailbox, send):
            send(isolated_mailbox.address, body=f"Go https://app.example.test/verify?token={TOKEN}")
            link = isolated_mailbox.wait_for().link()
            assert link == link + "&next=home"  # as the app's database has it, say


        def test_start(isolated_mailbox, send):
            send(isolated_mailbox.address, body=f"Code {TOKEN}.")
            code = isolated_mailbox.wait_for().code(r"Code (\\w+)")
            tail = " and a long tail of words that pytest skips over"
            assert "a: " + code + tail == "b: " + code + tail
        """
    )
    result = pytester.runpytest("-n", "0", verbosity, "--junitxml=junit.xml")
    result.assert_outcomes(failed=2)
    text = result.stdout.str() + (pytester.path / "junit.xml").read_text()
    for piece in ("AbCdEfGh", "Zq8xYtK", "Q9sL1AbC", "sL1AbCdEfGh"):
        assert piece not in text, piece


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_diffs_guide_lines_are_dropped_where_a_value_was_masked(
    pytester: pytest.Pytester, workers: str
) -> None:
    """difflib's guide lines (``?      ^``) point at the characters in which the masked
    value differs from the expected one, which is shown: ``- 482914``, ``?      ^``,
    ``+ ••••13`` gave the code away. They are dropped wherever the mask changed the text:
    the report's lines, the crash message (JUnit's message, the short summary), and
    ``--tb=native``. A line of the test's own diff that starts with "?" is kept."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        URL = "https://app.example.test/verify?token="

        def test_code(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Your code is 482913.")
            assert isolated_mailbox.wait_for().code() == "482914"

        def test_link(isolated_mailbox, send):
            send(isolated_mailbox.address, body=f"Go {URL}Zq8xYtK2mP4rT7wQ9sL1AbCdEfGh")
            link = isolated_mailbox.wait_for().link()
            assert link + "\\n? -- --" == f"{URL}Zq8xYtK2mP4rT7wQwrong" + "\\n? -- --"
        """
    )
    for tb in ("auto", "native"):
        result = pytester.runpytest(
            "-n", workers, "-vv", "-rf", f"--tb={tb}", f"--junitxml={tb}.xml"
        )
        result.assert_outcomes(failed=2)
        junit = (pytester.path / f"{tb}.xml").read_text()
        for text in (result.stdout.str(), html.unescape(junit)):
            assert not re.search(r"^[E ]*\?  +[\^+-]", text, re.MULTILINE), text
            assert re.search(r"^[E ]*  \? -- --", text, re.MULTILINE), text  # the test's own
            assert "- 482914" in text
            assert "+ ••••13" in text


CUT_SUITE = """
import unittest

import pytest

CODE = "K7QM2PZ9TXW4"
HEX = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
TAIL = "Thanks,\\\\nThe Example team, 123 Long Street, Springfield"


def test_indented(isolated_mailbox, send):
    body = f"Hello Ann,\\\\n\\\\nYour recovery details:\\\\n    code={CODE}\\\\n\\\\n{TAIL}"
    send(isolated_mailbox.address, body=body)
    msg = isolated_mailbox.wait_for()
    assert msg.code(r"code=(\\\\w+)") == CODE
    assert msg.text.strip() == body.replace("code=", "code:")


def test_context_line(isolated_mailbox, send):
    body = f"Hello Ann,\\\\n\\\\nYour recovery code is on the next line:\\\\n{CODE}\\\\n\\\\n{TAIL}"
    send(isolated_mailbox.address, body=body)
    msg = isolated_mailbox.wait_for()
    assert msg.code(r"line:\\\\s+(\\\\w+)") == CODE
    assert msg.text.strip() == body.replace("line:", "line.")


@pytest.fixture
def link(isolated_mailbox, send):
    send(isolated_mailbox.address, body=f"Confirm: https://app.example.test/confirm/{HEX}?utm=mail")
    return isolated_mailbox.wait_for().link()


class TestSignup(unittest.TestCase):
    @pytest.fixture(autouse=True)
    def _inject(self, link):
        self.link = link

    def test_redirect(self):
        self.assertEqual(self.link, "https://app.example.test/login")


class TestSignIn(unittest.TestCase):
    @pytest.fixture(autouse=True)
    def _inject(self, isolated_mailbox, send):
        send(isolated_mailbox.address, body="Hello! Your sign-in code for the example.test "
             "application, valid for ten minutes, is 815274.")
        self.msg = isolated_mailbox.wait_for()
        self.code = self.msg.code(r"is (\\d{6})")

    def test_text(self):  # unittest shows '…[47 chars]274.': half of the code
        self.assertEqual(self.msg.text.strip(), "something else entirely")


def test_strings_of_one_length_cut_on_both_sides(isolated_mailbox, send):
    intro = "Hello Alice, welcome to the example application. Click "
    send(isolated_mailbox.address, body=f"{intro}https://app.example.test/v?t={CODE} to confirm"
         + " your account within the next forty-eight hours. Thanks, the team at Example.")
    msg = isolated_mailbox.wait_for()
    assert msg.link()
    text = msg.body_text.strip()
    assert text == text.replace("to confirm", "to approve")


def test_strings_that_differ_inside_the_token(isolated_mailbox, send):
    token = "Zq8xYtK2mP4rW9vBn7Lc3Hs5Jd1Fg6Kw"
    send(isolated_mailbox.address, body=f"Click https://app.example.test/v?t={token} now")
    link = isolated_mailbox.wait_for().link()
    other = link[:-16] + link[-16:].swapcase()[:1] + link[-15:]  # one character differs
    assert "see " + link + " " + "x" * 60 == "see " + other + " " + "x" * 60


def test_a_pin_remembered_by_the_process(isolated_mailbox, send):
    send(isolated_mailbox.address, body="Your PIN is 812024")
    assert isolated_mailbox.wait_for().code() == "812024"


def test_dates_of_a_test_that_extracted_nothing():
    print("Changes\\\\n- 2024 rewrite of the parser\\\\n+ Loading.... fixed")
    assert "2024-05-01" == "2024-05-02"
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_values_cut_by_a_diff_or_by_unittest_are_masked_and_nothing_else(
    pytester: pytest.Pytester, workers: str
) -> None:
    """An indented line and a context line of a diff cut at "Skipping N identical
    trailing characters", and unittest's ``[36 chars]``; another test's dates and output
    keep their digits although a remembered code ends in them."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(test_cut=CUT_SUITE)
    result = pytester.runpytest("-n", workers, "-p", "no:randomly", "--junitxml=junit.xml")
    result.assert_outcomes(failed=7, passed=1)
    text = result.stdout.str() + (pytester.path / "junit.xml").read_text()
    for piece in ("K7QM", "TXW4", "9f86d081884c", "c55ad015a", "W9vBn7Lc", "Lc3Hs5Jd", "]274"):
        assert piece not in text, piece
    assert "chars]•••." in text
    result.stdout.fnmatch_lines(["*- 2024-05-02", "*+ 2024-05-01"])
    assert "- 2024 rewrite of the parser" in text


#: When the receipts built by hand below were made.
AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _receipt(**fields: Any) -> Receipt:
    """A released mailbox's receipt built by hand, with ``fields`` on top."""
    base = {
        "run_id": "r-1",
        "nodeid": "t::x",
        "mailbox_id": "mbx-1",
        "address": "a@mailbox.test",
        "purpose": "mail",
        "state": "released",
        "fence": 1,
        "created_at": AT,
        "expires_at": AT,
    }
    return Receipt(**(base | fields))


def test_the_receipts_table_counts_consumed_messages_only() -> None:
    receipt = _receipt(
        messages=[
            MessageReceipt(message_id="m-1", received_at=AT, subject="s", state="consumed"),
            MessageReceipt(message_id="m-2", received_at=AT, subject="s", state="waiting"),
        ],
    )
    assert format_table([receipt]).splitlines()[2].split()[-2:] == ["2", "1"]


def test_a_receipts_timeline_names_its_state_and_close_reason() -> None:
    receipt = _receipt(
        close_reason="released_success",
        events=[ReceiptEvent(at=AT + timedelta(seconds=1.5), status="claimed", detail="m-1")],
    )
    assert receipt.timeline().splitlines() == [
        "mailbox a@mailbox.test (mbx-1, run r-1, purpose mail): released, released_success",
        "  +   1.500s  claimed          m-1",
    ]


def test_the_receipts_command_aligns_its_columns_and_times_only_the_runs_it_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each column as wide as its widest cell, two spaces apart, no trailing blanks; a run
    whose mailbox could not be closed (its store file was replaced) has "-" for its close
    reason; --timeline prints the timelines of the runs in the table, not of the others."""
    done = _receipt(
        nodeid="t.py::test_a[long]",
        close_reason="released_success",
        messages=[MessageReceipt(message_id="m-1", received_at=AT, subject="s", state="consumed")],
        events=[ReceiptEvent(at=AT + timedelta(seconds=2), status="consumed", detail="m-1")],
    )
    held = _receipt(
        run_id="r-22",
        nodeid="t.py::test_b",
        address="bb@mailbox.test",
        state="claimed",
        events=[ReceiptEvent(at=AT + timedelta(seconds=1), status="claimed", detail="m-2")],
    )
    path = tmp_path / "r.jsonl"
    path.write_text(f"{dump_receipt(done)}\n{dump_receipt(held)}\n", encoding="utf-8")

    assert receipts_main(["receipts", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "test                run_id  address          state     close_reason      msgs  consumed",
        "------------------  ------  ---------------  --------  ----------------  ----  --------",
        "t.py::test_a[long]  r-1     a@mailbox.test   released  released_success  1     1",
        "t.py::test_b        r-22    bb@mailbox.test  claimed   -                 0     0",
        "2 receipt(s)",
    ]  # fmt: skip
    out = io.StringIO()  # main() writes where it is told, not to sys.stdout
    assert receipts_main(["receipts", str(path), "--state", "claimed", "--timeline"], out) == 0
    assert capsys.readouterr().out == ""
    assert out.getvalue().splitlines() == [
        "test          run_id  address          state    close_reason  msgs  consumed",
        "------------  ------  ---------------  -------  ------------  ----  --------",
        "t.py::test_b  r-22    bb@mailbox.test  claimed  -             0     0",
        "",
        "mailbox bb@mailbox.test (mbx-1, run r-22, purpose mail): claimed",
        "  +   1.000s  claimed          m-2",
        "1 receipt(s)",
    ]


def test_junit_receipts_are_read_from_their_own_property_only(tmp_path: Path) -> None:
    receipt = _receipt()
    value = html.escape(receipt.model_dump_json(), quote=True)
    path = tmp_path / "junit.xml"
    # A line break before the root element, and a test's own property holding a copy.
    path.write_text(
        "\n<testsuites><testsuite><testcase><properties>"
        f'<property name="mailbox.receipt" value="{value}"/>'
        f'<property name="copy.of.receipt" value="{value}"/>'
        "</properties></testcase></testsuite></testsuites>\n",
        encoding="utf-8",
    )

    assert read_receipts(path) == [receipt]


def test_a_fixture_that_fails_after_a_claim_shows_the_mailbox_section(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def verified(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for(subject_contains="Verify")
            raise RuntimeError("the app rejected the link")

        def test_uses_it(verified):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*- mailbox -*", "*claimed*m-* fence *"])


def test_a_mailbox_a_test_never_closed_is_released_as_an_error_at_session_end(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        from pytest_mailbox import EmailContract, Mailbox

        def test_forgets_to_close(mailbox_store):
            Mailbox.reserve(mailbox_store, contract=EmailContract(), domain="mailbox.test")
        """
    )
    basetemp = pytester.path / "basetemp"
    pytester.runpytest(f"--basetemp={basetemp}").assert_outcomes(passed=1)
    with closing(sqlite3.connect(basetemp / plugin.STORE_NAME)) as db:
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")
        ]
        assert ("orphaned",) in db.execute("SELECT status FROM events").fetchall()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_that_released_its_mailbox_then_xfailed_or_skipped_is_no_success(
    pytester: pytest.Pytester, workers: str
) -> None:
    """An xfail or a skip in the middle of the test is no pass, though no failed report
    says so: a mailbox released as released_success before it becomes released_error,
    with the step that says why, in the receipt."""
    pytester.makepyfile(
        """
        import pytest

        def test_releases_then_xfails(isolated_mailbox):
            isolated_mailbox.release()
            pytest.xfail("known bug")

        def test_releases_then_skips(isolated_mailbox):
            isolated_mailbox.release()
            pytest.skip("no browser today")
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")
    result.assert_outcomes(xfailed=1, skipped=1)
    receipts = read_receipts(pytester.path / "junit.xml")
    assert sorted(r.nodeid.split("::")[1] for r in receipts) == [
        "test_releases_then_skips",
        "test_releases_then_xfails",
    ]
    for receipt in receipts:
        assert (receipt.state, receipt.close_reason) == ("released", "released_error")
        assert [(e.status, e.detail) for e in receipt.events][-2:] == [
            ("released", "released_success"),
            (
                "released",
                "released_error: the test did not pass (it was released as released_success "
                "before its end)",
            ),
        ]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_that_released_its_mailbox_then_failed_shows_it_in_its_failure(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The failed call's report shows the mailbox's timeline as the receipt will end: a
    release as released_success before the failure is released_error there already."""
    pytester.makepyfile(
        """
        def test_releases_then_fails(isolated_mailbox):
            isolated_mailbox.release()
            assert False, "the page never loaded"
        """
    )
    result = pytester.runpytest("-n", workers)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- mailbox -*",
            "mailbox *: released, released_error",
            "*released *released_success",
            "*released *released_error: the test did not pass (it was released as "
            "released_success before its end)",
        ]
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_value_pytest_shows_with_escapes_is_masked_in_its_repr(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A temporary password with a backslash: pytest's assertion shows its repr, where
    the backslash is doubled; that form is masked as the value itself is."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        r"""
        def test_signs_in(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Your temporary password is Kq7\\Zt9mWp4x")
            password = isolated_mailbox.wait_for().code(r"password is (\S+)")
            assert password == "not-the-one"
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    text = result.stdout.str() + (pytester.path / "junit.xml").read_text()
    assert "Zt9mWp" not in text


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_receipt_is_left_whole_where_it_holds_what_the_test_extracted(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A receipt is secret-free, so it is never masked: not even where its node id holds
    the code the test extracted (a case named for the code a seeded fake sends)."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("expected", ["482913"])
        def test_code(isolated_mailbox, send, record_property, expected):
            send(isolated_mailbox.address, body=f"Your code is {expected}")
            code = isolated_mailbox.wait_for().code()
            record_property("code", code)
            assert code == expected
        """
    )
    result = pytester.runpytest(
        "-n", workers, "--junitxml=junit.xml", "-o", "junit_family=xunit1",
        "--mailbox-receipts=receipts.jsonl",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    xml = (pytester.path / "junit.xml").read_text()
    assert 'name="code" value="••••13"' in xml  # the test's own property is masked
    for path in ("junit.xml", "receipts.jsonl"):
        (receipt,) = read_receipts(pytester.path / path)
        assert receipt.nodeid.endswith(".py::test_code[482913]")


RETRIED_SUITE = """
def test_retried(isolated_mailbox, send):
    send(isolated_mailbox.address, subject="Code", body="Your code is 731604 ok")
    code = isolated_mailbox.wait_for(subject="Code").code()
    print("got", code)
    assert code == "000000", f"wrong code {code}"
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_code_in_pytest_retrys_reports_and_summary_is_masked(
    pytester: pytest.Pytester, workers: str
) -> None:
    """pytest-retry (the real one, in a run of its own: it can be configured once a
    process) wrote each attempt's exception into its terminal summary in clear, and under
    xdist its report of a retried attempt, and the last attempt's traceback it gives the
    test's report, reached pytest-html in clear."""
    pytest.importorskip("pytest_retry")
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(RETRIED_SUITE)

    result = pytester.runpytest_subprocess(
        "-p", "no:asyncio", "-n", workers, "--retries", "1", "-rA",
        "--junitxml=junit.xml", "--html=report.html", "--self-contained-html",
    )  # fmt: skip

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*the following tests were retried*", "*AssertionError: wrong code ••••04"]
    )
    for shown in ("\n".join(result.outlines + result.errlines), *_reports(pytester)):
        assert "731604" not in shown


GROUPED_CODE_SUITE = """
def test_grouped(isolated_mailbox, send):
    send(isolated_mailbox.address, subject="Code", body="Your code is 731 604.")
    msg = isolated_mailbox.wait_for(subject="Code")
    code = msg.code()
    print("the mail says", msg.text)
    assert msg.text == f"Your code is {code}."
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_code_found_in_groups_is_masked_as_the_mail_wrote_it(
    pytester: pytest.Pytester, workers: str
) -> None:
    """code() returns ``731604`` for a mail's ``731 604``: the report of a test that then
    showed the mail's text masked the digits it returned, and the code as written was
    in clear in the assertion's diff, the captured output and JUnit."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(GROUPED_CODE_SUITE)

    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["the mail says Your code is •••••04."])
    junit = (pytester.path / "junit.xml").read_text()
    for text in ("\n".join(result.outlines + result.errlines), junit):
        assert "731604" not in text
        assert "731 604" not in text


INVISIBLE_CODE_SUITE = """
def test_split(isolated_mailbox, send):
    send(isolated_mailbox.address, subject="Code", body="Your code is 7316\\u200b04.")
    msg = isolated_mailbox.wait_for(subject="Code")
    code = msg.code()
    print("the mail says", ascii(msg.text))
    assert msg.text == f"Your code is {code}."
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_code_an_invisible_character_splits_is_found_whole_and_masked_as_written(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A zero-width space inside a code (``7316\u200b04``): code() returned ``7316``, a
    part of it, and the report showed the rest. Now it returns the whole code, and the
    report masks it as the mail wrote it, the invisible character included."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(INVISIBLE_CODE_SUITE)

    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: assert 'Your code is ••••••••••04.\\n' == "
            "'Your code is ••••04.'",
        ]
    )
    junit = (pytester.path / "junit.xml").read_text()
    for text in ("\n".join(result.outlines + result.errlines), junit):
        assert "7316" not in text
        assert "731604" not in text


INVISIBLE_REFERENCE_CODE_SUITE = """
import smtplib
from email.message import EmailMessage

def test_split(isolated_mailbox, mailbox_server):
    mail = EmailMessage()
    mail["From"] = "noreply@app.example.test"
    mail["To"] = isolated_mailbox.address
    mail["Subject"] = "Code"
    mail.set_content("<p>Your code is <b>7316&zwnj;04</b> (7316&#x200B;04).</p>", subtype="html")
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(mail)
    msg = isolated_mailbox.wait_for(subject="Code")
    assert msg.code() == "731604"
    print("the mail says", msg.html)
    assert msg.html == "no mail"
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_code_an_html_reference_to_an_invisible_character_splits_is_masked_as_written(
    pytester: pytest.Pytester, workers: str
) -> None:
    """An HTML mail's ``7316&zwnj;04``: code() reads ``731604``, and the report of a test
    that showed ``msg.html`` had the code in clear, its invisible character written as a
    reference, which the mask's search for the code as written did not read."""
    pytester.makepyfile(INVISIBLE_REFERENCE_CODE_SUITE)

    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["the mail says <p>Your code is <b>••••••••••04</b>*"])
    junit = (pytester.path / "junit.xml").read_text()
    for text in ("\n".join(result.outlines + result.errlines), junit):
        assert "7316" not in text


def _reports(pytester: pytest.Pytester) -> tuple[str, str]:
    """The run's JUnit XML and its pytest-html report, with the HTML's escapes undone."""
    junit = (pytester.path / "junit.xml").read_text()
    report = html.unescape(html.unescape((pytester.path / "report.html").read_text()))
    return junit, report


HTML_GROUPED_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.fixture(params=[
    "<p>Your code is <b>731&nbsp;604</b></p>",
    "<p>Your code is <b>731\\u00a0604</b></p>",
    "<p>Your code is <b>731\\u202f604</b></p>",
    "<p>Your code is <span>731</span> <span>604</span></p>",
    "<p>Your code is <b>731&nbsp604</b></p>",
    "<p>Your code is <b>731&NonBreakingSpace;604</b></p>",
    "<p>Your code is <b>731&#XA0;604</b></p>",
    "<p>Your code is <b>731&#32;604</b></p>",
    "<p>Your code is <span style='" + "font-family:Helvetica,Arial;" * 9 + "'>731</span> "
    "<span>604</span></p>",
    "<p>Your code is\\n        <b>731</b>\\n" + " " * 24 + "<b>604</b></p>",
], ids=[
    "entity", "nbsp", "narrow", "tags", "no-semicolon", "named", "upper-hex", "numeric",
    "long-style", "indented-lines",
])
def sent(request, isolated_mailbox, mailbox_server):
    msg = EmailMessage()
    msg["From"] = "noreply@app.example.test"
    msg["To"] = isolated_mailbox.address
    msg["Subject"] = "Code"
    msg.set_content(request.param, subtype="html")
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(msg)
    return isolated_mailbox.wait_for(subject="Code")
"""

HTML_GROUPED_SUITE = """
def test_grouped(sent):
    code = sent.code()
    print("the mail's HTML", sent.html)
    assert sent.html == code
"""


def test_a_code_found_in_groups_is_masked_as_the_html_source_writes_it(
    pytester: pytest.Pytester,
) -> None:
    """code() read ``731 604`` in an HTML body's text: the test's report masked that, but
    the HTML's source as the test showed it (``msg.html`` in a diff or its output) wrote
    the code with an entity, a no-break space, or tags between its groups, and was in
    clear there."""
    pytester.makeconftest(HTML_GROUPED_CONFTEST)
    pytester.makepyfile(HTML_GROUPED_SUITE)

    result = pytester.runpytest("-vv", "--junitxml=junit.xml")

    result.assert_outcomes(failed=10)
    junit = (pytester.path / "junit.xml").read_text()
    # Not "731" anywhere: the run's random ids (hex) and times (time="0.731") may hold it.
    clear = re.compile(r"(?<![0-9a-fA-F.])731(?![0-9a-fA-F])")
    for text in ("\n".join(result.outlines + result.errlines), junit):
        assert clear.search(text) is None, text


ONE_DIGIT_A_LINE_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest

CELLS = "".join(f"<td class='digit'>\\n  {digit}\\n</td>\\n" for digit in "731604")


@pytest.fixture
def sent(isolated_mailbox, mailbox_server):
    msg = EmailMessage()
    msg["From"] = "noreply@app.example.test"
    msg["To"] = isolated_mailbox.address
    msg["Subject"] = "Code"
    msg.set_content(f"<p>Enter this code:</p><table><tr>\\n{CELLS}</tr></table>", subtype="html")
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(msg)
    return isolated_mailbox.wait_for(subject="Code")
"""

ONE_DIGIT_A_LINE_SUITE = """
def test_html(sent):
    code = sent.code()
    print("the mail's HTML", sent.html)
    assert sent.html == code


def test_raw(sent):
    code = sent.code()
    assert sent.raw == code
"""


def test_a_code_written_one_digit_a_line_is_masked_on_every_line(
    pytester: pytest.Pytester,
) -> None:
    """A template's cells each hold one digit of the code on a line of its own
    (``<td>\\n  7\\n</td>``): code() reads ``7 3 1 6 0 4``, and the report masked the HTML
    a line at a time, each line as ``••7``, its last two characters: the diff, the
    captured output and the raw message showed the code, a digit a line."""
    pytester.makeconftest(ONE_DIGIT_A_LINE_CONFTEST)
    pytester.makepyfile(ONE_DIGIT_A_LINE_SUITE)

    result = pytester.runpytest("-vv", "--junitxml=junit.xml")

    result.assert_outcomes(failed=2)
    junit = (pytester.path / "junit.xml").read_text()
    for text in ("\n".join(result.outlines + result.errlines), junit):
        assert "the mail's HTML" in text
        # A digit alone on a line of the HTML: in the diff, the captured output, a repr.
        alone = re.findall(r"(?:^|\n|\\r\\n)(?:E\s+[-+])?\s*\u2022*([0-9])(?=$|\n|\\r\\n)", text)
        assert alone == [], text


#: Mail whose link ``link()`` reads whole, its token cut by a line break in the raw message.
WRAPPED_TOKEN = {
    "flowed": (
        "Content-Type: text/plain; charset=utf-8; format=flowed; delsp=yes\r\n\r\n"
        "Sign in:  \r\nhttps://app.example.test/verify?token=Zq8xYtK2m \r\n"
        "P4rT7wQ9sL1  \r\nto go on.\r\n"
    ),
    # Quoted-printable writes the space at a flowed line's end as ``=20`` (RFC 2045 6.7),
    # and cuts a line its ``=3D`` made too long with a soft line break of its own, as the
    # email package encodes flowed text with non-ASCII in it.
    "flowed-quoted-printable": (
        "Content-Type: text/plain; charset=utf-8; format=flowed; delsp=yes\r\n"
        "Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        "Sign in: =20\r\nhttps://app.example.test/verify?token=3DZq8x=\r\nYtK2m=20\r\n"
        "P4rT7wQ9sL1 =20\r\nto go on.\r\n"
    ),
    "angle-brackets": (
        "Content-Type: text/plain; charset=utf-8\r\n\r\n"
        "Sign in: <https://app.example.test/verify?token=Zq8xYtK2m\r\n"
        "    P4rT7wQ9sL1> to go on.\r\n"
    ),
}


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("body", sorted(WRAPPED_TOKEN))
@pytest.mark.parametrize(
    "then",
    [
        "print(msg.raw.decode())",
        'assert msg.raw.decode() == "x\\ny"',  # a diff of lines: ``E   + …Zq8xYtK2m `` …
    ],
)
def test_a_token_cut_by_a_line_break_link_reads_through_is_masked_in_the_raw_message(
    pytester: pytest.Pytester, workers: str, body: str, then: str
) -> None:
    """``format=flowed; delsp=yes`` (Apple Mail's) cuts a long link at a line's end with
    nothing between its halves, and a link in angle brackets may be wrapped anywhere (RFC
    3986, appendix C); link() reads either whole. The raw message a failing test printed
    or compared showed both halves of the token in clear (``Zq8xYtK2m``,
    ``P4rT7wQ9sL1``), in the terminal and in JUnit XML."""
    pytester.makepyfile(
        f"""
import smtplib

LINK = "https://app.example.test/verify?token=Zq8xYtK2mP4rT7wQ9sL1"


def test_it(mailbox_server, isolated_mailbox):
    raw = (
        f"From: noreply@app.example.test\\r\\nTo: {{isolated_mailbox.address}}\\r\\n"
        "Subject: Verify your account\\r\\nMIME-Version: 1.0\\r\\n"
        {WRAPPED_TOKEN[body]!r}
    )
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.sendmail("noreply@app.example.test", [isolated_mailbox.address], raw)
    msg = isolated_mailbox.wait_for()
    assert msg.link() == LINK
    {then}
    assert False
"""
    )
    result = pytester.runpytest("-n", workers, "-vv", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    text = result.stdout.str() + (pytester.path / "junit.xml").read_text()

    assert "Subject: Verify your account" in text
    for piece in ("Zq8x", "YtK2m", "P4rT7wQ9sL1"):
        assert piece not in text, piece
