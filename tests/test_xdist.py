"""pytest -n: one store for all workers, every sink delivering, fixed-port mode, nothing lost."""

from __future__ import annotations

import html
import os
import socket
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from contextlib import closing
from pathlib import Path

import pytest

from pytest_mailbox.contract import Receipt
from pytest_mailbox.plugin import STORE_NAME
from pytest_mailbox.receipts import read_receipts

SEND_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.fixture
def send(mailbox_server):
    def send(to, subject="Verify your account", via=None):
        host, port = via or (mailbox_server.host, mailbox_server.port)
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = subject
        msg.set_content("Open https://app.example.test/verify?token=t0k3n-value")
        with smtplib.SMTP(host, port, local_hostname="client.test") as smtp:
            smtp.send_message(msg)
    return send
"""

GENERATED_SUITE = """
import pytest


@pytest.mark.parametrize("n", range({count}))
def test_user(isolated_mailbox, send, n):
    send(isolated_mailbox.address, subject=f"Verify account {{n}}")
    msg = isolated_mailbox.wait_for(subject=f"Verify account {{n}}")
    msg.ack()
"""


def _store(pytester: pytest.Pytester) -> closing[sqlite3.Connection]:
    # pytester runs pass --basetemp=<parent>/basetemp; the controller's store lives there.
    return closing(sqlite3.connect(pytester.path.parent / "basetemp" / STORE_NAME))


def _run_apart(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, Path]:
    """A run in a process of its own (an interrupt in it stops it alone) and a basetemp of
    its own: its result, and the path of its store."""
    basetemp = pytester.path / "basetemp"
    result = pytester.runpytest_subprocess(*args, f"--basetemp={basetemp}")
    return result, basetemp / STORE_NAME


def _junit_receipts(junit: Path, test: str) -> list[Receipt]:
    """The receipts JUnit XML records for the test case named ``test``."""
    return [
        Receipt.model_validate_json(p.get("value", ""))
        for case in ET.parse(junit).getroot().iter("testcase")
        if case.get("name") == test
        for p in case.iter("property")
        if p.get("name") == "mailbox.receipt"
    ]


def _receipt_count(junit: Path) -> int:
    root = ET.parse(junit).getroot()
    return sum(1 for p in root.iter("property") if p.get("name") == "mailbox.receipt")


INTERRUPTED_SUITE = """
import pytest


def test_interrupted(isolated_mailbox, send):
    send(isolated_mailbox.address, subject="Verify your account")
    isolated_mailbox.wait_for(subject="Verify your account")
    {stop}
"""


#: The two ways a run is stopped from inside a test: Ctrl-C, and pytest.exit() with a code
#: of its own (the run's exit status, 7, tells them apart).
STOPPED_WITH_ITS_CODE = pytest.mark.parametrize(
    "stop",
    ["raise KeyboardInterrupt", 'pytest.exit("the operator stopped the run", returncode=7)'],
    ids=["ctrl-c", "pytest-exit"],
)


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize(
    "stop",
    ["raise KeyboardInterrupt", 'pytest.exit("the operator stopped the run")'],
    ids=["ctrl-c", "pytest-exit"],
)
def test_a_test_cut_short_gives_back_what_it_claimed(
    pytester: pytest.Pytester, workers: str, stop: str
) -> None:
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(INTERRUPTED_SUITE.format(stop=stop))

    # In a process of its own: a Ctrl-C in an in-process run would stop this test too.
    result, store = _run_apart(pytester, "-n", workers)

    assert result.ret == pytest.ExitCode.INTERRUPTED
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")
        ]
        assert db.execute("SELECT state FROM messages").fetchall() == [("waiting",)]
    result.stdout.no_fnmatch_line("*mailbox:*1 consumed*")


@STOPPED_WITH_ITS_CODE
def test_a_test_cut_short_leaves_its_receipt_in_the_receipts_file(
    pytester: pytest.Pytester, stop: str
) -> None:
    # pytest lets the interrupt through with no teardown report: the session's end tore
    # the fixture down unreported, after the run's end had closed the mailbox as an
    # orphan, and the receipts file had no line for the test. (Under -n 2 xdist stops
    # with an internal error of its own; the controller's end closes the mailbox.)
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(INTERRUPTED_SUITE.format(stop=stop))

    result, store = _run_apart(pytester, "--mailbox-receipts=receipts.jsonl")

    assert result.ret == (7 if "returncode" in stop else pytest.ExitCode.INTERRUPTED)
    (line,) = (pytester.path / "receipts.jsonl").read_text().splitlines()
    receipt = Receipt.model_validate_json(line)
    assert receipt.nodeid.endswith("::test_interrupted")
    assert (receipt.state, receipt.close_reason) == ("released", "released_error")
    with closing(sqlite3.connect(store)) as db:
        events = [status for (status,) in db.execute("SELECT status FROM events")]
    assert "orphaned" not in events  # its own teardown closed it, not the run's end


#: What pytest-rerunfailures (16.7) does, in brief, loaded even without --reruns: its
#: makereport wrapper keeps state per test from the setup's report on, and reads it at
#: every later phase's report.
SETUP_STATE_CONFTEST = """
import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "setup":
        item._terminal_errors = {}
    item._terminal_errors[report.when] = False
    return report
"""

INTERRUPTED_IN_SETUP_SUITE = """
import pytest


@pytest.fixture
def signed_up(isolated_mailbox, send):
    send(isolated_mailbox.address, subject="Verify your account")
    isolated_mailbox.wait_for(subject="Verify your account")
    {stop}


def test_interrupted_in_setup(signed_up):
    pass
"""


@STOPPED_WITH_ITS_CODE
def test_a_test_cut_short_in_its_setup_leaves_its_receipt_beside_a_plugin_that_saw_no_setup(
    pytester: pytest.Pytester, stop: str
) -> None:
    # pytest reports no setup stopped so; the teardown's report the plugin made for the
    # test went through every plugin's makereport, and pytest-rerunfailures', which reads
    # what its setup's report set, ended the run in an INTERNALERROR (AttributeError:
    # 'Function' object has no attribute '_terminal_errors'), without the receipt.
    pytester.makeconftest(SEND_CONFTEST + SETUP_STATE_CONFTEST)
    pytester.makepyfile(INTERRUPTED_IN_SETUP_SUITE.format(stop=stop))

    result, store = _run_apart(pytester, "--mailbox-receipts=receipts.jsonl")

    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert result.ret == (7 if "returncode" in stop else pytest.ExitCode.INTERRUPTED)
    (line,) = (pytester.path / "receipts.jsonl").read_text().splitlines()
    receipt = Receipt.model_validate_json(line)
    assert receipt.nodeid.endswith("::test_interrupted_in_setup")
    assert (receipt.state, receipt.close_reason) == ("released", "released_error")
    assert [m.state for m in receipt.messages] == ["waiting"]  # its claim given back
    with closing(sqlite3.connect(store)) as db:
        events = [status for (status,) in db.execute("SELECT status FROM events")]
        claims = db.execute("SELECT state FROM claims").fetchall()
    assert "orphaned" not in events  # its own teardown closed it, not the run's end
    assert claims == [("released",)]


INTERRUPTED_IN_TEARDOWN_SUITE = """
import pytest


@pytest.fixture
def stopped_in_teardown(isolated_mailbox):
    # Set up after the mailbox, so torn down before it: Ctrl-C in a slow teardown.
    yield
    raise KeyboardInterrupt


def test_interrupted_in_teardown(isolated_mailbox, stopped_in_teardown):
    pass
"""


def test_a_test_interrupted_in_its_teardown_is_not_torn_down_twice(
    pytester: pytest.Pytester,
) -> None:
    # The interrupt came once its teardown had begun: the test was torn down a second
    # time, and pytest's logging plugin, whose teardown had run, failed it with an error
    # (KeyError) that the test never had; its mailbox, whose finalizer pytest had already
    # taken off its stack, stayed open all the same.
    pytester.makepyfile(INTERRUPTED_IN_TEARDOWN_SUITE)

    result, store = _run_apart(pytester, "--mailbox-receipts=receipts.jsonl")

    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "KeyError" not in result.stdout.str() + result.stderr.str()
    assert "errors" not in result.parseoutcomes()
    with closing(sqlite3.connect(store)) as db:  # the run's end closed it, as before
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")
        ]


STOPPED_IN_TEARDOWN_SUITE = """
import pytest


@pytest.fixture
def stopped_in_teardown(isolated_mailbox):
    yield
    {stop}


def test_stopped_in_teardown(isolated_mailbox, stopped_in_teardown, send):
    send(isolated_mailbox.address, subject="Verify your account")
    isolated_mailbox.wait_for(subject="Verify your account").ack()
    send(isolated_mailbox.address, subject="Welcome")
    isolated_mailbox.wait_for(subject="Welcome")  # held when the teardown stops
"""


@STOPPED_WITH_ITS_CODE
def test_a_test_stopped_in_its_teardown_leaves_its_receipt_as_no_success(
    pytester: pytest.Pytester, stop: str
) -> None:
    # pytest reports nothing of a teardown stopped so. Under pytest.exit() (which lets
    # the other finalizers run) the mailbox's teardown acked the held claim and released
    # it as released_success, and its receipt went nowhere; under Ctrl-C (which stops
    # them) the mailbox stayed open until the run's end closed it as an orphan, and its
    # receipt went nowhere either. Under xdist the crash report says released_error.
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(STOPPED_IN_TEARDOWN_SUITE.format(stop=stop))

    result, store = _run_apart(pytester, "--mailbox-receipts=receipts.jsonl")

    assert result.ret == (7 if "returncode" in stop else pytest.ExitCode.INTERRUPTED)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    (line,) = (pytester.path / "receipts.jsonl").read_text().splitlines()
    receipt = Receipt.model_validate_json(line)
    assert receipt.nodeid.endswith("::test_stopped_in_teardown")
    assert (receipt.state, receipt.close_reason) == ("released", "released_error")
    # What the test held: pytest.exit() lets the mailbox's teardown run, which acked it
    # (the call passed), as before any later failure of a teardown; Ctrl-C stops it, and
    # the claim is given back.
    held = "consumed" if "exit" in stop else "waiting"
    assert [(m.subject, m.state) for m in receipt.messages] == [
        ("Verify your account", "consumed"),
        ("Welcome", held),
    ]
    assert receipt.events[-1].detail.startswith(
        "released_error: the test did not pass" if "exit" in stop else "released_error"
    )
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")
        ]
        events = [status for (status,) in db.execute("SELECT status FROM events")]
        claims = sorted(state for (state,) in db.execute("SELECT state FROM claims"))
    assert "orphaned" not in events  # closed for its test, not by the run's end
    assert claims == sorted(["consumed", "consumed" if "exit" in stop else "released"])


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_teardown_that_stops_the_tests_other_finalizers_leaves_its_mailbox_no_success(
    pytester: pytest.Pytester, workers: str
) -> None:
    # sys.exit() in a fixture's teardown (or Ctrl-C under --pdb) is an error pytest reports
    # and goes on from, but it stops the test's other finalizers: the mailbox's teardown
    # never ran, the session's end closed it as released_success (acking what the test
    # held) and its receipt reached no receipts file.
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(STOPPED_IN_TEARDOWN_SUITE.format(stop="raise SystemExit(3)"))

    result, store = _run_apart(pytester, "-n", workers, "--mailbox-receipts=receipts.jsonl")

    result.assert_outcomes(passed=1, errors=1)
    (line,) = (pytester.path / "receipts.jsonl").read_text().splitlines()
    receipt = Receipt.model_validate_json(line)
    assert (receipt.state, receipt.close_reason) == ("released", "released_error")
    assert [(m.subject, m.state) for m in receipt.messages] == [
        ("Verify your account", "consumed"),
        ("Welcome", "waiting"),  # given back, not acked as a success's
    ]
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")
        ]


CONTROLLER_EXITS_CONFTEST = """
import pytest

CONFIGS = []


def pytest_configure(config):
    CONFIGS.append(config)


def pytest_runtest_logreport(report):
    # A plugin of the controller's that ends the run with an exit code of its own.
    controller = not hasattr(CONFIGS[-1], "workerinput")
    if controller and report.when == "setup" and report.nodeid.endswith("_stops"):
        pytest.exit("the controller stops the run", returncode=1)
"""

CONTROLLER_STOPS_SUITE = """
import os
import signal

import pytest
from pytest_mailbox import MailboxClosed


def test_the_controller_stops(isolated_mailbox):
    {stop}
    # Until the run's end closes the mailbox, or the worker is stopped.
    with pytest.raises(MailboxClosed):
        isolated_mailbox.expect_none(within=120)


def test_after_it(isolated_mailbox):
    pass
"""


@pytest.mark.parametrize(
    ("stop", "conftest", "code"),
    [
        pytest.param(
            "os.kill(os.getppid(), signal.SIGINT)  # the worker's parent: xdist's controller",
            "",
            pytest.ExitCode.INTERRUPTED,
            id="interrupted-alone",
        ),
        # pytest.exit(returncode=1) is no INTERRUPTED: the worker went on as well.
        pytest.param("pass", CONTROLLER_EXITS_CONFTEST, 1, id="exits-with-a-code"),
    ],
)
def test_a_controller_that_stops_early_stops_the_workers_before_the_bookkeeping(
    pytester: pytest.Pytester, stop: str, conftest: str, code: int
) -> None:
    # Its loop ended, and the run's end closed the mailboxes while the worker went on:
    # its next test reserved a mailbox that the summary did not count, and no report
    # carried its receipt.
    pytester.makeconftest(conftest)
    pytester.makepyfile(CONTROLLER_STOPS_SUITE.format(stop=stop))

    result, store = _run_apart(pytester, "-n", "1", "-p", "no:randomly")

    assert result.ret == code
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")  # the first test's, its worker stopped in it
        ]
    result.stdout.fnmatch_lines(["mailbox: 1 reserved, *"])


TWICE_INTERRUPTED_SUITE = """
import os
import signal

import pytest
from pytest_mailbox import MailboxClosed


def test_interrupts_the_controller_twice(isolated_mailbox):
    os.kill(os.getppid(), signal.SIGINT)
    try:
        isolated_mailbox.expect_none(within=120)
    except KeyboardInterrupt:
        # execnet's own, while the controller waits for this worker to stop: interrupt
        # that wait, then stay until the run's end closes the mailbox.
        os.kill(os.getppid(), signal.SIGINT)
        with pytest.raises(MailboxClosed):
            isolated_mailbox.expect_none(within=120)
        raise
"""


def test_a_second_interrupt_while_the_workers_stop_still_closes_the_mailboxes(
    pytester: pytest.Pytester,
) -> None:
    # The second interrupt ended the run's end in the wait for the workers: nothing closed
    # the mailbox but the worker's own teardown, and the run's summary was never made.
    pytester.makepyfile(TWICE_INTERRUPTED_SUITE)

    _, store = _run_apart(pytester, "-n", "1", "-p", "no:randomly")

    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT state, close_reason FROM mailboxes").fetchall() == [
            ("released", "released_error")
        ]
        assert db.execute("SELECT detail FROM events WHERE status = 'orphaned'").fetchall() == [
            ("the run ended with the mailbox open",)
        ]


SECOND_RUN_SUITE = """
from pathlib import Path

from pytest_mailbox import EmailContract, Mailbox
from pytest_mailbox.store import Store


def test_meets_a_second_run(mailbox_store):
    if {emptied}:
        # The second run started later: it emptied the basetemp, store included.
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(f"{{mailbox_store.path}}{{suffix}}").unlink(missing_ok=True)
    else:
        # This run forgets a mailbox of its own in the store it shares.
        Mailbox.reserve(mailbox_store, contract=EmailContract(), domain="mailbox.test")
    # The second run's test holds a mailbox in the same file.
    second = Store(mailbox_store.path, testrun="the-second-run")
    Mailbox.reserve(second, contract=EmailContract(purpose="second"), domain="mailbox.test")
    second.close()
"""


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("emptied", [True, False], ids=["second-run-emptied-it", "shared"])
def test_the_end_of_a_run_closes_only_its_own_mailboxes(
    pytester: pytest.Pytester, workers: str, emptied: bool
) -> None:
    pytester.makepyfile(SECOND_RUN_SUITE.format(emptied=emptied))

    result, store = _run_apart(pytester, "-n", workers)

    result.assert_outcomes(passed=1)
    with closing(sqlite3.connect(store)) as db:
        states = db.execute("SELECT purpose, state, close_reason FROM mailboxes").fetchall()
    mine = [] if emptied else [("mail", "released", "released_error")]
    assert sorted(states) == sorted([*mine, ("second", "reserved", None)])
    result.stdout.fnmatch_lines(
        [f"mailbox: another pytest run shares {store} (two runs were given *"]
    )
    result.stdout.no_fnmatch_line("mailbox: 2 reserved*")


def _failed_at_its_end(
    pytester: pytest.Pytester, suite: str, workers: str
) -> tuple[pytest.RunResult, Path]:
    """Run ``suite`` (one test that passes) apart: its run fails at its end, exit status 3
    (the harness failed, not a test), for what happened to its store."""
    pytester.makepyfile(suite)
    result, store = _run_apart(pytester, "-n", workers)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    return result, store


REPLACED_STORE_SUITE = """
from pathlib import Path

from pytest_mailbox import EmailContract, Mailbox
from pytest_mailbox.store import Store


def test_its_store_is_replaced(isolated_mailbox, mailbox_store):
    # A second run, started later with the same --basetemp, emptied it and made its own.
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{mailbox_store.path}{suffix}").unlink(missing_ok=True)
    second = Store(mailbox_store.path, testrun="the-second-run")
    Mailbox.reserve(second, contract=EmailContract(purpose="second"), domain="mailbox.test")
    second.close()
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_whose_store_another_run_replaced_does_not_count_the_other_s(
    pytester: pytest.Pytester, workers: str
) -> None:
    # It said "mailbox: 0 reserved, ...", and that it counted only its own mailboxes.
    # Then with exit status 0, as no store gone at the end has: its counts are missing.
    result, store = _failed_at_its_end(pytester, REPLACED_STORE_SUITE, workers)

    result.stdout.fnmatch_lines(
        [
            f"mailbox: {store} holds 0 of the 1 mailboxes this run's reports "
            "name: it was removed or replaced while the run used it (another pytest run "
            "given the same --basetemp, a cleanup), so this run's mailboxes are not "
            "counted, and those its tests left open were not closed (their receipts, in "
            "the reports, are whole): give each run its own --basetemp"
        ]
    )
    result.stdout.no_fnmatch_line("mailbox: 0 reserved*")
    result.stdout.no_fnmatch_line("*another pytest run shares*")


BROKEN_STORE_SUITE = """
import os


def test_its_store_is_lost(isolated_mailbox, mailbox_store):
    # Another program put something else in its place: what the run's end opens is no
    # store (this process's connections keep the file they opened).
    for suffix in ("", "-wal", "-shm"):
        os.unlink(f"{mailbox_store.path}{suffix}")
    mailbox_store.path.write_bytes(b"not a database\\n" * 4096)
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_store_the_end_of_the_run_cannot_use_is_a_line_in_the_summary_not_a_traceback(
    pytester: pytest.Pytester, workers: str
) -> None:
    # The StoreError left pytest_sessionfinish: a traceback in place of the summary (a
    # process that stopped inside a write held the store, in the case that found it).
    # Then the line alone, with exit status 0: a CI run whose mailboxes were left open
    # looked green. The tests' own outcomes stand; the run's status says the harness failed.
    result, store = _failed_at_its_end(pytester, BROKEN_STORE_SUITE, workers)

    result.stdout.fnmatch_lines(
        [
            "mailbox: the end of the run could not open its store: the store "
            f"{store} failed: file is not a database *",
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


REMOVED_STORE_SUITE = """
import os


def test_its_store_is_removed(isolated_mailbox, mailbox_store):
    # A cleanup removed the basetemp's files (this process's connections keep the file
    # they opened, so the test's own teardown still closes its mailbox).
    for suffix in ("", "-wal", "-shm"):
        os.unlink(f"{mailbox_store.path}{suffix}")
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_store_removed_during_the_run_fails_the_run_at_its_end(
    pytester: pytest.Pytester, workers: str
) -> None:
    # The run's end found no file and said nothing: exit status 0, the counts missing.
    result, store = _failed_at_its_end(pytester, REMOVED_STORE_SUITE, workers)

    result.stdout.fnmatch_lines(
        [
            f"mailbox: the end of the run could not open its store: {store} is gone: "
            "something removed it while the run used it (a cleanup, another pytest run "
            "given the same --basetemp); the mailboxes its tests left open were not closed",
        ]
    )
    result.stdout.no_fnmatch_line("mailbox: * reserved*")
    assert not store.exists()


REMOVED_BEFORE_A_WORKER_OPENS_IT = {
    "test_removes": """
import os
from pathlib import Path


def test_removes_the_store(isolated_mailbox, mailbox_store):
    for suffix in ("", "-wal", "-shm"):
        os.unlink(f"{mailbox_store.path}{suffix}")
    with open(Path(__file__).with_name("gate"), "w") as gate:  # the other worker goes on
        gate.write("removed\\n")
""",
    "test_opens_later": """
from pathlib import Path


def test_opens_the_store_later(request):
    with open(Path(__file__).with_name("gate")) as gate:  # once the store is gone
        assert gate.read() == "removed\\n"
    request.getfixturevalue("isolated_mailbox")
""",
}


def test_a_store_removed_before_another_worker_opens_it_fails_the_run(
    pytester: pytest.Pytester,
) -> None:
    # The worker that opened the store after the removal made it again, empty: the run's
    # end found a file, said another run had replaced it, and exited 0. (--dist loadfile
    # gives each of the two files to a worker of its own; the FIFO orders them.)
    pytester.makepyfile(**REMOVED_BEFORE_A_WORKER_OPENS_IT)
    os.mkfifo(pytester.path / "gate")
    basetemp = pytester.path / "basetemp"

    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadfile", f"--basetemp={basetemp}", timeout=120
    )

    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(
        [
            f"mailbox: {basetemp / STORE_NAME} holds 1 of the 2 mailboxes this run's "
            "reports name: it was removed or replaced while the run used it *"
        ]
    )


FAILS_WITH_ITS_STORE_GONE_SUITE = """
import os


def test_fails_with_its_store_gone(isolated_mailbox, mailbox_store):
    for suffix in ("", "-wal", "-shm"):
        os.unlink(f"{mailbox_store.path}{suffix}")
    mailbox_store.close()  # the next call opens a connection: to no file
    assert False
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_that_fails_once_its_store_is_gone_is_reported_not_an_internal_error(
    pytester: pytest.Pytester, workers: str
) -> None:
    # Its report's timeline read the store: the StoreError left pytest_runtest_makereport,
    # an INTERNALERROR that ended the run there.
    pytester.makepyfile(FAILS_WITH_ITS_STORE_GONE_SUITE)

    result, store = _run_apart(pytester, "-n", workers)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes()["failed"] == 1
    result.stdout.fnmatch_lines(
        [
            "*- mailbox -*",
            f"mail-*@mailbox.test: its timeline could not be read: the store {store} failed: "
            "unable to open database file (the file is gone: something removed it while the "
            "run used it *",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def _assert_consumed_exactly_once(pytester: pytest.Pytester, count: int) -> None:
    with _store(pytester) as db:
        assert db.execute("SELECT COUNT(*) FROM messages WHERE state = 'consumed'").fetchone() == (
            count,
        )
        doubles = db.execute(
            "SELECT message_id FROM claims WHERE state = 'consumed' "
            "GROUP BY message_id HAVING COUNT(*) > 1"
        ).fetchall()
        assert doubles == []
        assert db.execute("SELECT COUNT(*) FROM messages WHERE mailbox_id IS NULL").fetchone() == (
            0,
        )


@pytest.mark.parametrize("workers", ["2", "4"])
@pytest.mark.parametrize("mode", ["per-worker", "fixed-port"])
def test_generated_suite_of_300(
    pytester: pytest.Pytester, workers: str, mode: str, fixed_port: int
) -> None:
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(test_generated=GENERATED_SUITE.format(count=300))
    args = ["-n", workers, "--junitxml=junit.xml"]
    if mode == "fixed-port":
        args.append(f"--mailbox-port={fixed_port}")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=300)
    result.stdout.fnmatch_lines(
        [
            "mailbox: 300 reserved, 300 received, 300 claimed, 300 consumed, "
            "0 expired, 0 claims expired, 0 unrouted"
        ]
    )
    assert "database is locked" not in result.stdout.str() + result.stderr.str()
    assert _receipt_count(pytester.path / "junit.xml") == 300
    _assert_consumed_exactly_once(pytester, 300)
    with _store(pytester) as db:
        sinks = {row[0] for row in db.execute("SELECT DISTINCT sink FROM messages")}
    if mode == "fixed-port":
        assert sinks == {"main"}  # the controller served the port for every worker
    else:
        assert sinks <= {f"gw{i}" for i in range(int(workers))}
        assert len(sinks) >= 2


def test_cross_worker_delivery(pytester: pytest.Pytester) -> None:
    """A test on one worker receives mail that another worker's sink accepted."""
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(
        """
        import os
        import threading
        from pathlib import Path

        import pytest

        HANDOFF = Path("handoff.txt")

        def test_receiver(isolated_mailbox, mailbox_store):
            me = os.environ["PYTEST_XDIST_WORKER"]
            aside = Path(f"{HANDOFF}.{me}")
            aside.write_text(f"{me} {isolated_mailbox.address}")
            aside.replace(HANDOFF)  # whole or not at all
            msg = isolated_mailbox.wait_for(subject="from the other worker", timeout=30)
            sink = mailbox_store.message(msg.message_id).sink
            assert sink.startswith("gw") and sink != me

        def test_sender(send):
            wake = threading.Event()
            for _ in range(6000):  # the handoff file is the synchronisation; a minute at most
                if HANDOFF.exists():
                    break
                wake.wait(0.01)
            else:
                pytest.fail("the receiver never wrote its address")
            worker, address = HANDOFF.read_text().split()
            assert worker != os.environ["PYTEST_XDIST_WORKER"]
            send(address, subject="from the other worker")
        """
    )
    result = pytester.runpytest("-n", "2")
    result.assert_outcomes(passed=2)


def test_fixed_port_survives_an_early_worker(pytester: pytest.Pytester, fixed_port: int) -> None:
    """The worker that finishes first takes nothing with it: the other still gets its mail."""
    pytester.makeconftest(
        SEND_CONFTEST
        + """
import os
from pathlib import Path


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        Path(f"finished-{worker}").write_text("done")
"""
    )
    pytester.makepyfile(
        """
        import os
        import threading
        from pathlib import Path

        import pytest

        def test_quick(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()

        def test_slow(isolated_mailbox, send, mailbox_server):
            me = os.environ["PYTEST_XDIST_WORKER"]
            other = "gw0" if me == "gw1" else "gw1"
            wake = threading.Event()
            for _ in range(6000):  # until the other worker's session is over; a minute at most
                if Path(f"finished-{other}").exists():
                    break
                wake.wait(0.01)
            else:
                pytest.fail(f"{other} never finished its session")
            for n in range(5):
                send(isolated_mailbox.address, subject=f"late {n}")
                isolated_mailbox.wait_for(subject=f"late {n}").ack()
        """
    )
    result = pytester.runpytest("-n", "2", f"--mailbox-port={fixed_port}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["mailbox: 2 reserved, 6 received, 6 claimed, 6 consumed, *"])


def test_fixed_port_taken_by_another_program(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_it(isolated_mailbox): pass")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = pytester.runpytest("-n", "2", f"--mailbox-port={port}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: pytest-mailbox cannot listen on 127.0.0.1:{port}: the port is already in "
            "use by another program; free it, or choose another port with --mailbox-port / "
            "mailbox_port (0 picks a free one)"
        ]
    )


@pytest.mark.parametrize(
    "command",
    [
        ["--collect-only", "-q"],
        ["--collect-only", "-q", "-n", "2"],
        ["--fixtures"],
        ["--fixtures-per-test"],
        ["--setup-plan"],
    ],
    ids=["collect-only", "collect-only-xdist", "fixtures", "fixtures-per-test", "setup-plan"],
)
def test_a_listing_run_beside_a_fixed_port_run_neither_binds_nor_makes_a_store(
    pytester: pytest.Pytester, command: list[str]
) -> None:
    # An IDE lists the tests while the suite runs on its fixed port: the port is taken.
    pytester.makepyfile("def test_it(isolated_mailbox): pass")
    with socket.socket() as running_suite:
        running_suite.bind(("127.0.0.1", 0))
        running_suite.listen()
        port = running_suite.getsockname()[1]
        result = pytester.runpytest(*command, f"--mailbox-port={port}", "--basetemp=listing")

    assert result.ret == pytest.ExitCode.OK
    assert "cannot listen" not in "\n".join(result.outlines + result.errlines)
    assert not (pytester.path / "listing" / STORE_NAME).exists()


def _outputs(runs: dict[str, subprocess.Popen[str]]) -> dict[str, str]:
    """Each run's output; if one hangs, every run is stopped and the outputs shown."""
    deadline = time.monotonic() + 120  # for them all: a bound, never a synchronisation
    try:
        return {
            name: proc.communicate(timeout=max(0.0, deadline - time.monotonic()))[0]
            for name, proc in runs.items()
        }
    except subprocess.TimeoutExpired:
        for proc in runs.values():
            proc.kill()
        out = {name: proc.communicate()[0] for name, proc in runs.items()}
        pytest.fail("a run hung:\n" + "\n".join(f"--- {n}:\n{o}" for n, o in out.items()))


def test_two_concurrent_runs_are_isolated(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Run B sends to run A's address while both run: A never sees it, B keeps it unrouted."""
    shared = tmp_path / "shared"
    shared.mkdir()
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(
        test_runs=f"""
        import threading
        from pathlib import Path

        import pytest

        SHARED = Path({str(shared)!r})

        def _tell(name, text):
            # Written aside and renamed: the other run never reads a file half written.
            part = SHARED / (name + ".part")
            part.write_text(text)
            part.replace(SHARED / name)

        def _wait_for(name):
            wake = threading.Event()
            for _ in range(6000):  # a minute at most
                if (SHARED / name).exists():
                    return (SHARED / name).read_text()
                wake.wait(0.01)
            pytest.fail(f"the other run never wrote {{name}}")

        def test_run_a(isolated_mailbox, send):
            _tell("a.address", isolated_mailbox.address)
            _wait_for("b.sent")
            isolated_mailbox.expect_none(within=0.5)
            send(isolated_mailbox.address, subject="own mail")
            isolated_mailbox.wait_for(subject="own mail").ack()

        def test_run_b(isolated_mailbox, send):
            send(_wait_for("a.address"), subject="for the other run")
            _tell("b.sent", "sent")
        """
    )
    runs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-n",
                "2",
                f"--basetemp={tmp_path / name}",
                "-k",
                f"test_run_{name}",
            ],
            cwd=pytester.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    }
    out = _outputs(runs)
    assert runs["a"].returncode == 0, out["a"]
    assert runs["b"].returncode == 0, out["b"]
    assert (
        "mailbox: 1 reserved, 1 received, 1 claimed, 1 consumed, "
        "0 expired, 0 claims expired, 0 unrouted" in out["a"]
    )
    assert (
        "mailbox: 1 reserved, 0 received, 0 claimed, 0 consumed, "
        "0 expired, 0 claims expired, 1 unrouted" in out["b"]
    )


def test_crashed_worker_claim_is_recovered(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(
        """
        import os

        def test_crashes_holding_a_claim(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for()
            os._exit(1)

        def test_fine(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()
        """
    )
    result = pytester.runpytest(
        "-n", "2", "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*crashed*",
            # the crash report shows the mailbox's timeline, as a failing test's does
            "*- mailbox -*",
            "*orphaned*worker gw* crashed while running the test",
            "*released*released_error",
            "mailbox: 2 reserved, 2 received, 2 claimed, 1 consumed, "
            "0 expired, 0 claims expired, 0 unrouted",
        ]
    )
    assert "database is locked" not in result.stdout.str()
    # Its receipt is in the JUnit XML and the JSON Lines file, like every other test's.
    crashed = _junit_receipts(pytester.path / "junit.xml", "test_crashes_holding_a_claim")
    # Its test never released it: an error, and the ttl it was given stays as it was.
    assert [(r.state, r.close_reason) for r in crashed] == [("released", "released_error")]
    assert (crashed[0].expires_at - crashed[0].created_at).total_seconds() == 300
    assert [m.state for m in crashed[0].messages] == ["waiting"]
    assert [e.status for e in crashed[0].events][-2:] == ["orphaned", "released"]
    # the same run id as every other receipt of the run (xdist's testrunuid)
    uids = {
        Receipt.model_validate_json(p.get("value", "")).testrun_uid
        for p in ET.parse(pytester.path / "junit.xml").getroot().iter("property")
        if p.get("name") == "mailbox.receipt"
    }
    assert len(uids) == 1
    assert None not in uids
    lines = (pytester.path / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(Receipt.model_validate_json(line).state for line in lines) == [
        "released",
        "released",
    ]
    with _store(pytester) as db:
        states = db.execute(
            "SELECT m.state, m.close_reason, g.state FROM mailboxes m "
            "JOIN messages g ON g.mailbox_id = m.mailbox_id WHERE m.owner LIKE '%crashes%'"
        ).fetchall()
        claims = db.execute("SELECT state FROM claims ORDER BY fence").fetchall()
        [(worker, detail)] = db.execute(
            "SELECT m.worker, e.detail FROM mailboxes m JOIN events e USING (mailbox_id) "
            "WHERE m.owner LIKE '%crashes%' AND e.status = 'orphaned'"
        ).fetchall()
    # only the crashed worker's reservation of that test was closed, naming the worker
    assert detail == f"worker {worker} crashed while running the test"
    assert worker in ("gw0", "gw1")
    # the orphaned mailbox was released; its claim ended and the message is claimable again
    assert states == [("released", "released_error", "waiting")]
    assert sorted(c[0] for c in claims) == ["consumed", "released"]


def test_a_crash_whose_store_another_program_replaced_is_said_in_its_report(
    pytester: pytest.Pytester,
) -> None:
    # The controller's crash handler opened the store unguarded: its StoreError stopped
    # the run with an INTERNALERROR traceback instead of the crash's report.
    pytester.makepyfile(BROKEN_STORE_SUITE + "\n    os._exit(1)\n\n\ndef test_other():\n    pass\n")

    result, store = _run_apart(pytester, "-n", "2")

    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "worker 'gw*' crashed while running '*::test_its_store_is_lost'",
            "*- mailbox -*",
            f"pytest-mailbox could not close this test's mailboxes: the store {store} failed: "
            "file is not a database *",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_crashed_test_that_released_its_mailbox_early_is_no_success(
    pytester: pytest.Pytester,
) -> None:
    """A crash is no pass: a mailbox its test released as released_success before the
    worker died is released_error in the crash report's receipt, as at any failed test's
    teardown."""
    pytester.makepyfile(
        """
        import os

        def test_crashes_after_releasing(isolated_mailbox):
            isolated_mailbox.release()  # released_success, the default
            os._exit(1)
        """
    )
    result = pytester.runpytest("-n", "1", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    (crashed,) = _junit_receipts(pytester.path / "junit.xml", "test_crashes_after_releasing")
    assert (crashed.state, crashed.close_reason) == ("released", "released_error")
    assert [(e.status, e.detail) for e in crashed.events][-2:] == [
        ("released", "released_success"),
        (
            "released",
            "released_error: the test did not pass (it was released as released_success "
            "before its end)",
        ),
    ]


def test_a_crashed_attempt_marked_rerun_keeps_its_receipt_on_a_named_testcase(
    pytester: pytest.Pytester,
) -> None:
    """pytest-rerunfailures marks a crash report "rerun" (as the conftest here does, in
    brief), which JUnit never records: the receipt the crash report carried was written on
    a <testcase> with no name."""
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_handlecrashitem(crashitem, report, sched):
            report.outcome = "rerun"  # what pytest-rerunfailures does before rescheduling
        """
    )
    pytester.makepyfile(
        """
        import os

        def test_crashes(isolated_mailbox):
            os._exit(3)
        """
    )
    pytester.runpytest("-n", "1", "--junitxml=junit.xml")
    cases = list(ET.parse(pytester.path / "junit.xml").getroot().iter("testcase"))
    assert cases
    assert all(case.get("name") == "test_crashes" for case in cases)
    (receipt,) = _junit_receipts(pytester.path / "junit.xml", "test_crashes")
    assert receipt.close_reason == "released_error"


def test_a_crashed_workers_receipt_masks_a_code_it_took_from_inside_a_word(
    pytester: pytest.Pytester,
) -> None:
    """The controller rebuilds the crashed test's receipt with the store's digests alone:
    the code inside the subject's word is masked as the worker's own receipt masks it."""
    pytester.makepyfile(
        """
        import os
        import smtplib
        from email.message import EmailMessage

        def test_crashes_after_the_code(isolated_mailbox, mailbox_server):
            msg = EmailMessage()
            msg["From"], msg["To"] = "noreply@app.example.test", isolated_mailbox.address
            msg["Subject"] = "認証コードはQXKZTRです"
            msg.set_content("コード: QXKZTR")
            with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
                smtp.send_message(msg)
            assert isolated_mailbox.wait_for().code(pattern=r"コード: ([A-Z]{6})") == "QXKZTR"
            os._exit(1)
        """
    )
    result = pytester.runpytest(
        "-n", "2", "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl"
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    crashed = _junit_receipts(pytester.path / "junit.xml", "test_crashes_after_the_code")
    assert [m.subject for m in crashed[0].messages] == ["認証コードは••••TRです"]
    for written in ("junit.xml", "receipts.jsonl"):
        assert "QXKZTR" not in (pytester.path / written).read_text(encoding="utf-8")


def test_a_worker_killed_after_the_mailbox_teardown_still_leaves_its_receipt(
    pytester: pytest.Pytester,
) -> None:
    """A later fixture's teardown kills the worker (pytest-timeout's thread method calls
    ``os._exit``): the mailbox's own teardown had released it and made its receipt, which
    died with the worker. The controller rebuilds it from the store for the crash report."""
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(
        """
        import os

        import pytest


        @pytest.fixture
        def killed_in_teardown():
            yield
            os._exit(1)


        def test_dies_after(killed_in_teardown, isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()


        @pytest.mark.parametrize("n", range(2))
        def test_fine(isolated_mailbox, send, n):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()
        """
    )
    result = pytester.runpytest(
        "-n", "2", "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl"
    )
    # its call passed and was reported; then the crash report fails it, and its receipt:
    # a crash is no pass, even in a teardown after the mailbox's own
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        ["*crashed*", "*- mailbox -*", "*released*released_success", "*released_error: the test*"]
    )
    died = _junit_receipts(pytester.path / "junit.xml", "test_dies_after")
    assert [(r.state, r.close_reason) for r in died] == [("released", "released_error")]
    assert [m.state for m in died[0].messages] == ["consumed"]
    assert "orphaned" not in [e.status for e in died[0].events]  # released, not expired
    # one receipt per mailbox: the two passing tests' receipts are not repeated
    lines = (pytester.path / "receipts.jsonl").read_text(encoding="utf-8").splitlines()
    assert len({Receipt.model_validate_json(line).mailbox_id for line in lines}) == len(lines) == 3


@pytest.mark.parametrize("stop", ["-x", "--maxfail=1"])
def test_stopping_early_leaves_no_orphans(pytester: pytest.Pytester, stop: str) -> None:
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("n", range(20))
        def test_user(isolated_mailbox, send, n):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for()
            assert n != 3
        """
    )
    result = pytester.runpytest("-n", "2", stop, "--junitxml=junit.xml")
    # xdist reports a stop after the first failure as an interrupted session
    assert result.ret in (pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.INTERRUPTED)
    result.stdout.fnmatch_lines(["FAILED *test_user[[]3[]]*"])
    with _store(pytester) as db:
        open_claims = db.execute("SELECT COUNT(*) FROM claims WHERE state = 'claimed'").fetchone()
        orphaned = db.execute("SELECT COUNT(*) FROM events WHERE status = 'orphaned'").fetchone()
        releases = db.execute(
            "SELECT mailbox_id, COUNT(*) FROM events WHERE status = 'released' GROUP BY mailbox_id"
        ).fetchall()
        reserved = db.execute("SELECT COUNT(*) FROM mailboxes").fetchone()[0]
    assert open_claims == (0,)
    assert orphaned == (0,)
    assert len(releases) == reserved
    assert all(count == 1 for _, count in releases)  # one teardown per mailbox
    assert _receipt_count(pytester.path / "junit.xml") == reserved


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_property_that_borrows_the_receipt_name_does_not_stop_the_run(
    pytester: pytest.Pytester, workers: str
) -> None:
    """The controller reads every teardown report's receipts (xdist's crash bookkeeping,
    pytest-html's rows): a test's own property of that name, holding something else, is
    passed over, not an INTERNALERROR that ends everyone's run."""
    pytester.makeconftest(SEND_CONFTEST)
    pytester.makepyfile(
        """
        def test_text(request):
            request.node.user_properties.append(("mailbox.receipt", "not a receipt"))


        def test_json_of_another_shape(request):
            request.node.user_properties.append(("mailbox.receipt", '["a", "list"]'))


        def test_an_id_and_nothing_else(request):
            request.node.user_properties.append(("mailbox.receipt", '{"mailbox_id": "mbx-1"}'))


        def test_nested_too_deep_for_json(request):
            request.node.user_properties.append(("mailbox.receipt", "[" * 100_000))


        def test_no_text_at_all(request):
            request.node.user_properties.append(("mailbox.receipt", 42))


        def test_mail(isolated_mailbox, send):
            send(isolated_mailbox.address)
            isolated_mailbox.wait_for().ack()
        """
    )
    result = pytester.runpytest(
        "-n", workers, "--html=report.html", "--junitxml=junit.xml", "--mailbox-receipts=r.jsonl"
    )
    result.assert_outcomes(passed=6)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    (receipt,) = _junit_receipts(pytester.path / "junit.xml", "test_mail")
    assert receipt.close_reason == "released_success"
    assert read_receipts(pytester.path / "junit.xml") == [receipt]  # what the CLI reads
    (line,) = (pytester.path / "r.jsonl").read_text(encoding="utf-8").splitlines()
    assert Receipt.model_validate_json(line) == receipt
    page = html.unescape((pytester.path / "report.html").read_text(encoding="utf-8"))
    assert page.count("mailbox-receipt") == 1  # test_mail's row; the others have none


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_address_that_is_not_utf8_in_the_log_does_not_kill_a_worker(
    pytester: pytest.Pytester, workers: str
) -> None:
    """aiosmtpd logs a refused address as it decoded it, a lone surrogate in place of the
    byte; pytest keeps the record in the report, which xdist could not send (INTERNALERROR)."""
    pytester.makepyfile(
        """
        import socket


        def test_raw(mailbox_server):
            with socket.create_connection((mailbox_server.host, mailbox_server.port)) as sock:
                replies = sock.makefile("rb")
                replies.readline()
                for line in (b"HELO c.test", b"MAIL FROM:<a@example.test>"):
                    sock.sendall(line + b"\\r\\n")
                    assert replies.readline().startswith(b"250")
                sock.sendall(b"RCPT TO:<a@mailbox.test\\xff>\\r\\n")
                assert replies.readline().startswith(b"553 5.6.7")
        """
    )
    result = pytester.runpytest("-n", workers, "-o", "log_level=INFO", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*recip: a@mailbox.test\\udcff"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_crash_in_a_rerun_brings_only_the_receipts_no_report_brought(
    pytester: pytest.Pytester,
) -> None:
    """The first attempt's reports brought its receipt; the worker then died in the rerun:
    the crash report adds the rerun's mailbox alone, not the first attempt's again."""
    pytester.makeconftest(
        """
        import pytest
        from _pytest.runner import runtestprotocol

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(item, nextitem):
            item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            for _ in (1, 2):
                item._initrequest()
                reports = runtestprotocol(item, nextitem=nextitem)
                if all(r.passed for r in reports):
                    break
            item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            return True
        """
    )
    pytester.makepyfile(
        """
        import os

        ATTEMPTS = []

        def test_crashes_when_rerun(isolated_mailbox):
            ATTEMPTS.append(isolated_mailbox.run_id)
            if len(ATTEMPTS) == 2:
                os._exit(3)
            assert False, "fails the first time"
        """
    )
    pytester.runpytest("-n", "1", "--mailbox-receipts=receipts.jsonl")
    receipts = read_receipts(pytester.path / "receipts.jsonl")
    run_ids = [receipt.run_id for receipt in receipts]
    assert len(run_ids) == 2
    assert len(set(run_ids)) == 2  # each attempt's receipt, once
