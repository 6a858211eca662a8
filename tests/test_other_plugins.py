"""The plugin beside other pytest plugins a project runs with it: pytest-socket
(pytest-html, pytest-retry, subtests and the rest have tests of their own, beside the
feature each touches)."""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_socket")

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


SENDER_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


TOKEN = "Zq8xYtK2mP4rT7wQ9sL1AbCdEfGh"


@pytest.fixture
def send(mailbox_server):
    def send(to):
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = "Verify your account"
        msg.set_content(f"Open https://app.example.test/verify?token={TOKEN} or use 482913")
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
