"""Mail for a test that reached the sink but not its mailbox is named in its timeout: mail
the sink refused for its alias (also a step of its timeline), and mail the app sent to an
earlier test's address.

An app is told of a refusal by the reply, and often says nothing: smtplib's ``sendmail``
returns the recipients refused past the cap and sends the rest, Django's backend does
the same. The test then waited for mail the sink never stored, and its timeout said "no
mail arrived ... is the app sending to the sink?" while the sink had answered it.
"""

from __future__ import annotations

import json
import smtplib
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mailbox import EmailContract, Mailbox, MailSink, Store, WaitTimeout
from pytest_mailbox.store import REFUSED_MORE, REFUSED_STEPS

#: A tag that looks like a reply-by-mail token: masked wherever a refusal names it.
TOKEN_TAG = "k7qx9pzl2mn4vb8w"


class Client:
    """A plain SMTP client on a socket: one command, one reply, and nothing added."""

    def __init__(self, server: MailSink) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=30)
        self.file = self.sock.makefile("rb")
        assert self.reply().startswith(b"220")

    def reply(self) -> bytes:
        line = self.file.readline()
        while line[3:4] == b"-":
            line = self.file.readline()
        return line

    def cmd(self, line: str) -> bytes:
        self.sock.sendall(line.encode() + b"\r\n")
        return self.reply()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def refused_steps(store: Store, mailbox: Mailbox) -> list[str]:
    return [row["detail"] for row in store.events(mailbox.mailbox_id) if row["status"] == "refused"]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_recipient_past_the_cap_is_named_in_the_timeout_and_the_receipt(
    pytester: pytest.Pytester, workers: str
) -> None:
    """smtplib sends to the first 100 recipients and returns the 101st as refused; the
    test's timeout said "no mail arrived", its receipt had no trace of the refusal."""
    pytester.makepyfile(
        test_newsletter=f"""
        import smtplib

        def test_newsletter(mailbox_server, isolated_mailbox):
            others = [f"reader{{i}}@mailbox.test" for i in range(100)]
            me = isolated_mailbox.tagged("{TOKEN_TAG}")
            with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
                refused = smtp.sendmail("news@app.example.test", others + [me],
                                        "Subject: News\\r\\n\\r\\nhello\\r\\n")
            assert list(refused) == [me]  # what an app that ignores it never looks at
            isolated_mailbox.wait_for(subject="News", timeout=0)
        """
    )

    result = pytester.runpytest("-n", workers, "--mailbox-receipts=receipts.jsonl")

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       refused by the sink for this alias, and not stored (1):",
            "E         - *UTC RCPT to mail-*+••••••••••••••8w@mailbox.test: 452 4.5.3 Too many "
            "recipients: at most 100 per message (mailbox_max_recipients); send the rest in "
            "another message",
            "*refused          RCPT to mail-*+••••••••••••••8w@mailbox.test: 452 4.5.3*",
        ]
    )
    result.stdout.no_fnmatch_line("*no mail arrived for this mailbox*")
    assert [line for line in result.stdout.lines if "RCPT to" in line and TOKEN_TAG in line] == []
    receipts = Path(pytester.path, "receipts.jsonl").read_text()
    assert TOKEN_TAG not in receipts
    (receipt,) = map(json.loads, receipts.splitlines())
    steps = [event["status"] for event in receipt["events"]]
    assert steps == ["reserved", "refused", "waiting", "released"]
    assert receipt["messages"] == []


@pytest.mark.parametrize(
    ("rcpt", "smtputf8", "reply"),
    [
        pytest.param(
            "{alias}@mailbox.tst",
            False,
            "550 5.7.1 Relaying denied: mailbox.tst is not a test domain of this sink",
            id="alias-at-a-domain-the-sink-does-not-take",
        ),
        pytest.param(
            "{alias}+тег@{domain}",
            False,
            "553 5.6.7 A non-ASCII address needs SMTPUTF8: send MAIL FROM:<...> SMTPUTF8 "
            "(the sink offers it in EHLO)",
            id="tag-in-another-script-without-smtputf8",
        ),
    ],
)
def test_a_recipient_refused_at_rcpt_is_named_in_the_timeout(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    rcpt: str,
    smtputf8: bool,
    reply: str,
) -> None:
    address = rcpt.format(alias=isolated_mailbox.alias, domain=isolated_mailbox.domain)
    client = Client(mailbox_server)
    try:
        assert client.cmd("EHLO app.example.test").startswith(b"250")
        assert client.cmd("MAIL FROM:<app@example.test>").startswith(b"250")
        assert client.cmd(f"RCPT TO:<{address}>").decode() == reply + "\r\n"
    finally:
        client.close()

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(timeout=0)

    assert f"RCPT to {address}: {reply}" in str(caught.value)
    assert "no mail arrived" not in str(caught.value)
    assert refused_steps(mailbox_store, isolated_mailbox) == [f"RCPT to {address}: {reply}"]


def test_a_message_refused_at_data_is_named_for_each_test_among_its_recipients(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    second_mailbox: Mailbox,
) -> None:
    """A line over RFC 5321's 998 octets: the whole message is refused, for both tests; a
    scripted fault before it is recorded as its own step only."""
    isolated_mailbox.inject_fault(stage="DATA", reply="451 4.3.0 Try again", times=1)
    client = Client(mailbox_server)
    replies = []
    try:
        assert client.cmd("EHLO app.example.test").startswith(b"250")
        for body in ("short", "x" * 999):
            assert client.cmd("MAIL FROM:<app@example.test>").startswith(b"250")
            for mailbox in (isolated_mailbox, second_mailbox):
                assert client.cmd(f"RCPT TO:<{mailbox.address}>").startswith(b"250")
            assert client.cmd("DATA").startswith(b"354")
            replies.append(client.cmd(f"Subject: Welcome\r\n\r\n{body}\r\n.").decode())
    finally:
        client.close()
    too_long = "500 Line too long (see RFC5321 4.5.3.1.6)"
    assert replies == ["451 4.3.0 Try again\r\n", too_long + "\r\n"]

    for mailbox in (isolated_mailbox, second_mailbox):
        with pytest.raises(WaitTimeout) as caught:
            mailbox.wait_for(subject="Welcome", timeout=0)
        assert f"DATA to {mailbox.address}: {too_long}" in str(caught.value)
        assert refused_steps(mailbox_store, mailbox) == [f"DATA to {mailbox.address}: {too_long}"]
    steps = [row["status"] for row in mailbox_store.events(isolated_mailbox.mailbox_id)]
    assert steps == ["reserved", "fault_armed", "fault", "refused", "waiting"]
    assert mailbox_store.messages(isolated_mailbox.mailbox_id) == []
    assert mailbox_store.messages(second_mailbox.mailbox_id) == []


@pytest.mark.parametrize(
    "workers",
    [pytest.param(["-n", "0"], id="n0"), pytest.param(["-n", "2", "--dist", "loadfile"], id="n2")],
)
def test_mail_for_an_earlier_tests_released_mailbox_is_named_in_the_timeout(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    """An app that kept a user made in an earlier test sends that user's mail to the
    earlier test's address: the mail reached the sink, its mailbox was released, and the
    test waiting for it was told "no mail arrived ... is the app sending to the sink?"."""
    pytester.makepyfile(
        test_kept_user="""
        import smtplib
        import pytest

        class App:
            def __init__(self, host, port):
                self.host, self.port, self.user = host, port, None

            def signup(self, email):
                self.user = email

            def reset_password(self):
                with smtplib.SMTP(self.host, self.port) as smtp:
                    mail = f"To: {self.user}\\r\\nSubject: Reset\\r\\n\\r\\ncode 482913\\r\\n"
                    smtp.sendmail("app@example.test", [self.user], mail)

        @pytest.fixture(scope="module")
        def app(mailbox_server):
            return App(mailbox_server.host, mailbox_server.port)

        def test_signup(app, isolated_mailbox):
            app.signup(isolated_mailbox.address)

        def test_reset(app, isolated_mailbox):
            app.reset_password()  # to the user test_signup made, at test_signup's address
            isolated_mailbox.wait_for(subject="Reset", timeout=0)
        """
    )

    result = pytester.runpytest(*workers)

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       mail for an earlier test's mailbox, released before it came (1): is the app "
            "sending to an address it kept from that test?",
            "E         - *UTC to mail-*@mailbox.test (test test_kept_user.py::test_signup, "
            "released at *UTC)",
        ]
    )
    result.stdout.no_fnmatch_line("*no mail arrived for this mailbox*")
    result.stdout.no_fnmatch_line("*482913*")


def test_a_flood_of_refusals_records_a_bounded_number_of_steps(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    """A client that repeats a refused RCPT for a test's alias, on one connection and on
    another: each wrote a step, a store write and a line of the timeout, into the receipt
    and JUnit's report (3,000 RCPTs made a 650 KB receipt and an 840 KB JUnit file)."""
    address = f"{isolated_mailbox.alias}@mailbox.tst"
    reply = "550 5.7.1 Relaying denied: mailbox.tst is not a test domain of this sink"
    for _ in range(2):
        client = Client(mailbox_server)
        try:
            assert client.cmd("EHLO app.example.test").startswith(b"250")
            assert client.cmd("MAIL FROM:<app@example.test>").startswith(b"250")
            for _ in range(REFUSED_STEPS * 3):
                assert client.cmd(f"RCPT TO:<{address}>").decode() == reply + "\r\n"
        finally:
            client.close()

    steps = refused_steps(mailbox_store, isolated_mailbox)
    assert steps == [f"RCPT to {address}: {reply}"] * (REFUSED_STEPS - 1) + [
        f"RCPT to {address}: {reply}{REFUSED_MORE}"
    ]
    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(timeout=0)
    text = str(caught.value)
    assert f"refused by the sink for this alias, and not stored ({REFUSED_STEPS}):" in text
    assert text.count(f"RCPT to {address}") == REFUSED_STEPS


def test_a_refusal_is_not_recorded_in_a_mailbox_closed_before_its_write(
    mailbox_store: Store, isolated_mailbox: Mailbox, second_mailbox: Mailbox
) -> None:
    """The sink finds the open mailbox on its event loop and writes the step on its writer
    thread: a mailbox released in between got a step after its receipt was made."""
    second_mailbox.release()
    mailbox_store.note_refused(
        [(second_mailbox.mailbox_id, "RCPT to x: 452"), (isolated_mailbox.mailbox_id, "RCPT to y")]
    )

    assert refused_steps(mailbox_store, second_mailbox) == []
    assert refused_steps(mailbox_store, isolated_mailbox) == ["RCPT to y"]


def test_a_recipient_taken_and_then_refused_again_past_the_cap_is_no_refusal(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    """The alias taken first, then again as the 101st recipient (To and Bcc): the message
    reached the mailbox, and the timeout said it was "refused ... and not stored"."""
    client = Client(mailbox_server)
    try:
        assert client.cmd("EHLO app.example.test").startswith(b"250")
        assert client.cmd("MAIL FROM:<app@example.test>").startswith(b"250")
        others = [f"reader{i}@mailbox.test" for i in range(99)]
        for rcpt in [isolated_mailbox.address, *others]:
            assert client.cmd(f"RCPT TO:<{rcpt}>").startswith(b"250")
        assert client.cmd(f"RCPT TO:<{isolated_mailbox.address}>").startswith(b"452 4.5.3")
        assert client.cmd("DATA").startswith(b"354")
        assert client.cmd("Subject: Welcome\r\n\r\nhello\r\n.").startswith(b"250")
    finally:
        client.close()

    assert refused_steps(mailbox_store, isolated_mailbox) == []
    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Reset", timeout=0)
    assert "refused by the sink" not in str(caught.value)
    assert "'Welcome': subject is not 'Reset'" in str(caught.value)


def test_a_message_refused_at_data_is_one_step_for_an_alias_it_names_twice(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    """The alias in To and in Cc: one message refused, and one step, not one a recipient."""
    client = Client(mailbox_server)
    try:
        assert client.cmd("EHLO app.example.test").startswith(b"250")
        assert client.cmd("MAIL FROM:<app@example.test>").startswith(b"250")
        for _ in range(3):
            assert client.cmd(f"RCPT TO:<{isolated_mailbox.address}>").startswith(b"250")
        assert client.cmd("DATA").startswith(b"354")
        assert client.cmd(f"Subject: Welcome\r\n\r\n{'x' * 999}\r\n.").startswith(b"500")
    finally:
        client.close()

    too_long = "500 Line too long (see RFC5321 4.5.3.1.6)"
    assert refused_steps(mailbox_store, isolated_mailbox) == [
        f"DATA to {isolated_mailbox.address}: {too_long}"
    ]


def test_mail_for_another_programs_released_mailbox_is_not_named_outside_a_test_run(
    tmp_path: Path,
) -> None:
    """Mailboxes reserved through the library API (getting-started's script) have no
    worker and no test run: every process's were "this process's", and a script's timeout
    named the mailbox another program, or its run before, had released."""
    path = tmp_path / "mail.sqlite3"
    script = f"""
from pytest_mailbox import EmailContract, Mailbox, Store
with Store({str(path)!r}) as store:
    box = Mailbox.reserve(store, contract=EmailContract(purpose="signup"), domain="mailbox.test")
    box.close(success=True)
    print(box.address)
"""
    earlier = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout.strip()
    with Store(path) as store, MailSink(store, domains=["mailbox.test"]) as sink:
        box = Mailbox.reserve(store, contract=EmailContract(purpose="reset"), domain="mailbox.test")
        with smtplib.SMTP(sink.host, sink.port) as smtp:
            smtp.sendmail("app@example.test", [earlier], "Subject: Reset\r\n\r\nhi\r\n")
        with pytest.raises(WaitTimeout) as caught:
            box.wait_for(subject="Reset", timeout=0)
        box.close(success=True)

    assert earlier.split("@")[0] not in str(caught.value)
    assert "no mail arrived for this mailbox" in str(caught.value)


def test_a_refused_recipients_character_that_shows_nothing_is_escaped_in_the_timeout(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    """A direction override in the domain of a refused recipient (taken with SMTPUTF8):
    the refused step named it as sent, and the timeout printed it raw, which reorders the
    terminal's line, where a near miss's recipient shows it escaped."""
    address = f"{isolated_mailbox.alias}@mailbox\u202etest.example"
    client = Client(mailbox_server)
    try:
        assert client.cmd("EHLO app.example.test").startswith(b"250")
        assert client.cmd("MAIL FROM:<app@example.test> SMTPUTF8").startswith(b"250")
        assert client.cmd(f"RCPT TO:<{address}>").startswith(b"550")
    finally:
        client.close()

    (step,) = refused_steps(mailbox_store, isolated_mailbox)
    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(timeout=0)
    for shown in (step, str(caught.value)):
        assert "\u202e" not in shown
        assert f"RCPT to {isolated_mailbox.alias}@mailbox\\u202etest.example: 550" in shown
