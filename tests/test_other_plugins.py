"""The plugin beside other pytest plugins a project runs with it: pytest-socket,
pytest-json-report and pytest-reportlog (pytest-html, pytest-retry, subtests and the rest
have tests of their own, beside the feature each touches)."""

from __future__ import annotations

import errno
import json
import socket
import threading
from typing import Any

import pytest

from pytest_mailbox import MailSink, Store

pytest_socket = pytest.importorskip("pytest_socket")
pytest.importorskip("pytest_jsonreport")
pytest.importorskip("pytest_reportlog")

#: An app in another process, as a test under pytest-socket starts one: it sends the code
#: to the address given, over SMTP to the host and port given.
APP_CONFTEST = """
import subprocess
import sys

import pytest

APP = '''
import smtplib, sys
from email.message import EmailMessage

mail = EmailMessage()
mail["From"] = "noreply@app.example.test"
mail["To"] = sys.argv[3]
mail["Subject"] = "Your code"
mail.set_content("Your code is 482913.")
with smtplib.SMTP(sys.argv[1], int(sys.argv[2]), timeout=60) as smtp:
    smtp.send_message(mail)
'''


@pytest.fixture
def app(mailbox_server):
    def signup(address):
        where = [mailbox_server.host, str(mailbox_server.port), address]
        subprocess.run([sys.executable, "-c", APP, *where], check=True, timeout=120)  # a hang's net
    return signup
"""

APP_SUITE = """
def test_first(isolated_mailbox, app):
    app(isolated_mailbox.address)
    assert isolated_mailbox.wait_for(subject="Your code").code() == "482913"


def test_second(isolated_mailbox, app):  # the sink started in an earlier test
    app(isolated_mailbox.address)
    assert isolated_mailbox.wait_for(subject="Your code").code() == "482913"
"""


@pytest.mark.parametrize(("workers", "fixed"), [("0", False), ("2", False), ("0", True)])
def test_the_sink_serves_under_pytest_socket_disable_socket(
    pytester: pytest.Pytester, fixed_port: int, workers: str, fixed: bool
) -> None:
    """``--disable-socket`` blocks the sockets a test makes; the sink's own are the
    plugin's: its listener, its event loop's self-pipe, the connections it accepts. The
    sink failed to start in the first test's setup ("A test tried to use socket.socket"),
    and the fixed-port sink, started before any test, accepted an app's connection and
    then dropped it unserved, the app waiting for a banner that never came."""
    pytester.makeconftest(APP_CONFTEST)
    pytester.makepyfile(APP_SUITE)
    port = [f"--mailbox-port={fixed_port}"] if fixed else []

    result = pytester.runpytest("--disable-socket", "-n", workers, *port)

    result.assert_outcomes(passed=2)


LINK = "https://app.example.test/verify?token=Zq8xYtK2mP4rT7wQ9sL1AbCdEfGh"
SENDER_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


LINK = "https://app.example.test/verify?token=Zq8xYtK2mP4rT7wQ9sL1AbCdEfGh"


@pytest.fixture
def send(mailbox_server):
    def send(to):
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = "Verify your account"
        msg.set_content(f"Open {LINK} or use 482913")
        with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
            smtp.send_message(msg)
    return send
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_that_pytest_socket_keeps_from_the_sink_is_told_what_to_allow(
    pytester: pytest.Pytester, workers: str
) -> None:
    """A test whose app sends from the test's own process needs pytest-socket to let it
    reach the sink; its failure says so, and how, whether its error came through as
    pytest-socket's exception or as the warning it gives first (``-W error``). A
    connection refused to another host (a database's) is no business of the sink's."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        from pytest_socket import SocketConnectBlockedError


        def test_signup(isolated_mailbox, send):
            send(isolated_mailbox.address)


        def test_database(isolated_mailbox):
            raise SocketConnectBlockedError(["127.0.0.1"], "192.0.2.7")
        """
    )
    hint = (
        "pytest-socket blocked a connection of this test, and the mailbox sink listens on "
        "127.0.0.1: let the test reach it with --allow-hosts=127.0.0.1 (beside "
        "--disable-socket; add 127.0.0.1 to a list you give) or "
        "@pytest.mark.allow_hosts(['127.0.0.1']) on the test"
    )
    for blocked in (
        ["--disable-socket", "-W", "default"],
        ["--disable-socket", "-W", "error"],
        ["--allow-hosts=192.0.2.7"],
    ):
        result = pytester.runpytest(*blocked, "-n", workers)
        result.assert_outcomes(failed=2)
        assert result.outlines.count(hint) == 1, blocked

    result = pytester.runpytest("--disable-socket", "--allow-hosts=127.0.0.1", "-n", workers)
    result.assert_outcomes(passed=1, failed=1)
    assert hint not in result.outlines


OUTPUT_SUITE = """
import logging
import sys

import pytest


@pytest.mark.parametrize("fails", [False, True])
def test_signup(isolated_mailbox, send, json_metadata, fails):
    send(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for()
    link, code = msg.link(), msg.code()
    print("opening", link, "code", code)
    print("code", code, file=sys.stderr)
    logging.getLogger("app").warning("sent %s", link, extra={"code": code})
    json_metadata["link"] = link
    assert not fails
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_pytest_json_report_and_reportlog_files_show_no_secret(
    pytester: pytest.Pytester, workers: str
) -> None:
    """pytest-json-report keeps its own copy of a test's output: its stdout, stderr and
    log records (each whole: the ``extra`` fields too) and its ``json_metadata``, on the
    report, and pytest-reportlog writes the report with it. Both files had the link and
    the code in clear, a passing test's too; they keep the receipts."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(OUTPUT_SUITE)

    result = pytester.runpytest(
        "-n", workers, "--json-report", "--json-report-file=report.json", "--report-log=log.jsonl"
    )

    result.assert_outcomes(passed=1, failed=1)
    report = (pytester.path / "report.json").read_text()
    log = (pytester.path / "log.jsonl").read_text()
    for text in (report, log):
        for secret in ("Zq8xYtK2m", "AbCdEfGh", "482913"):
            assert secret not in text, secret
    tests = json.loads(report)["tests"]
    assert [len(t["user_properties"]) for t in tests] == [1, 1]  # the receipts
    assert all("mailbox.receipt" in t["user_properties"][0] for t in tests)
    passed, failed = tests[0]["call"], tests[1]["call"]
    assert passed["stdout"].endswith("code ••••13\n")
    assert failed["stderr"] == "code ••••13\n"
    [record] = [r for r in failed["log"] if r["name"] == "app"]  # the root logger's level
    assert record["code"] == "••••13"
    masked_link = "•" * (len(LINK) - 2) + LINK[-2:]  # extracted whole, masked whole
    assert record["msg"] == f"sent {masked_link}"
    assert tests[1]["metadata"]["link"] == masked_link


def test_a_connection_refused_to_another_loopback_address_is_told_only_what_helps(
    pytester: pytest.Pytester,
) -> None:
    """The sink listens on 127.0.0.1 only: a connection pytest-socket refused to 127.0.0.2
    (a service of the test's own) is none of its business, and one refused to ``::1`` (the
    address ``localhost`` names first on many machines) needs ``::1`` allowed too. The
    hint told both to allow 127.0.0.1, which the run already allowed."""
    pytester.makepyfile(
        """
        import socket

        import pytest


        @pytest.mark.parametrize("host", ["127.0.0.2", "::1"])
        def test_connect(isolated_mailbox, host):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.connect((host, 9))
        """
    )

    result = pytester.runpytest("--allow-hosts=127.0.0.1", "-n", "0")

    result.assert_outcomes(failed=2)
    hints = [line for line in result.outlines if line.startswith("pytest-socket blocked")]
    assert hints == [
        "pytest-socket blocked a connection of this test, and the mailbox sink listens on "
        "127.0.0.1: let the test reach it with --allow-hosts=127.0.0.1,::1 (beside "
        "--disable-socket; add 127.0.0.1,::1 to a list you give) or "
        "@pytest.mark.allow_hosts(['127.0.0.1', '::1']) on the test"
    ]


def test_sinks_starting_in_two_threads_at_once_both_start_under_pytest_socket(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink puts the real socket class back in ``socket.socket`` while it makes its event
    loop. A second sink that began its own loop in another thread meanwhile saw the real
    class, swapped nothing, and had the guard put back under it by the first: its
    loop's self-pipe was refused ("A test tried to use socket.socket."). The two sinks'
    loops are made in this order, each at the point it waits for: the second begins its
    self-pipe inside the first's swap and makes it once the first has started."""
    socketpair = socket.socketpair
    second_waits, first_started = threading.Event(), threading.Event()
    calls: list[str] = []
    failure: list[BaseException] = []
    second = MailSink(store, domains=["mail.test"])

    def start_second() -> None:
        try:
            second.start()
        except BaseException as exc:  # reported by the test
            failure.append(exc)
            second_waits.set()

    def ordered(*args: Any, **kwargs: Any) -> tuple[socket.socket, socket.socket]:
        if not calls:  # the first sink's self-pipe: the second sink starts meanwhile
            calls.append("first")
            thread.start()
            assert second_waits.wait(60)  # a hang's net, not a timing
        else:
            calls.append("second")
            second_waits.set()
            assert first_started.wait(60)
        return socketpair(*args, **kwargs)

    thread = threading.Thread(target=start_second)
    monkeypatch.setattr(socket, "socketpair", ordered)
    pytest_socket.disable_socket()
    try:
        with MailSink(store, domains=["mail.test"]):
            first_started.set()
            thread.join()
    finally:
        pytest_socket.enable_socket()
        second.stop()

    assert failure == []
    assert calls == ["first", "second"]


# asyncio's loop, whose __init__ failed, is left unclosed: its own, reported when collected
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sink_whose_loop_cannot_be_made_leaves_no_listener_open(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink binds and listens, then makes its event loop, whose self-pipe takes two
    more descriptors: with none left (EMFILE) the start failed and the listener stayed
    open, its port taken, until the garbage collector found it."""
    bound: list[socket.socket] = []
    bind = MailSink._bind

    def recorded(self: MailSink) -> socket.socket:
        bound.append(bind(self))
        return bound[-1]

    def exhausted(*args: Any, **kwargs: Any) -> tuple[socket.socket, socket.socket]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(MailSink, "_bind", recorded)
    monkeypatch.setattr(socket, "socketpair", exhausted)
    sink = MailSink(store, domains=["mail.test"])
    with pytest.raises(OSError, match="Too many open files"):
        sink.start()

    [listener] = bound
    assert listener.fileno() == -1  # closed


def test_pytest_json_report_shows_no_code_kept_as_a_number(pytester: pytest.Pytester) -> None:
    """A code kept as a number (``int(code)``) in ``json_metadata`` or a log record's
    ``extra`` is written as that number: it was in clear in the JSON file, where
    ``record_property`` with the same value is masked (by its text)."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import logging


        def test_signup(isolated_mailbox, send, json_metadata):
            send(isolated_mailbox.address)
            code = int(isolated_mailbox.wait_for().code())
            json_metadata["code"] = code
            json_metadata["codes"] = [code, code + 1]
            logging.getLogger("app").warning("sent", extra={"code": code, "ok": True})
        """
    )

    result = pytester.runpytest("-n", "0", "--json-report", "--json-report-file=report.json")

    result.assert_outcomes(passed=1)
    [test] = json.loads((pytester.path / "report.json").read_text())["tests"]
    assert test["metadata"] == {"code": "••••13", "codes": ["••••13", 482914]}
    [record] = [r for r in test["call"]["log"] if r["name"] == "app"]
    assert (record["code"], record["ok"]) == ("••••13", True)
