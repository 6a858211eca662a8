"""Deterministic fault injection, scoped to one mailbox: scripted SMTP replies for one alias."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from pathlib import Path

import pytest

from pytest_mailbox import ContractError, Mailbox, MailSink, Store
from pytest_mailbox.store import Delivery


class RetryingApp:
    """An app that retries a temporary (4xx) SMTP failure a few times, then gives up."""

    def __init__(self, server: MailSink, attempts: int = 3) -> None:
        self.server = server
        self.attempts = attempts
        self.tries = 0

    def send(self, to: str, subject: str = "Verify your account") -> None:
        mail = EmailMessage()
        mail["From"] = "noreply@app.example.test"
        mail["To"] = to
        mail["Subject"] = subject
        mail.set_content("Enter 552299 to verify.")
        for attempt in range(1, self.attempts + 1):
            self.tries = attempt
            try:
                with smtplib.SMTP(self.server.host, self.server.port) as smtp:
                    smtp.send_message(mail)
            except smtplib.SMTPRecipientsRefused as exc:
                ((code, _),) = exc.recipients.values()
                if code < 500 and attempt < self.attempts:
                    continue
                raise
            except smtplib.SMTPDataError as exc:
                if exc.smtp_code < 500 and attempt < self.attempts:
                    continue
                raise
            return


@pytest.mark.parametrize("stage", ["RCPT", "DATA"])
def test_app_that_retries_survives_one_fault(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    second_mailbox: Mailbox,
    stage: str,
) -> None:
    isolated_mailbox.inject_fault(stage=stage, reply="451 4.3.0 Try again", times=1)
    app = RetryingApp(mailbox_server)

    app.send(second_mailbox.address)  # another run, same sink, same moment: untouched
    assert app.tries == 1
    second_mailbox.wait_for(timeout=10).ack()

    app.send(isolated_mailbox.address)
    assert app.tries == 2  # refused once, delivered on the retry
    msg = isolated_mailbox.wait_for(timeout=10)
    assert msg.code() == "552299"
    msg.ack()
    # the refused attempt stored nothing: one message, the retried one
    assert [m.message_id for m in mailbox_store.messages(isolated_mailbox.mailbox_id)] == [
        msg.message_id
    ]

    events = [(e.status, e.detail) for e in isolated_mailbox.receipt().events]
    assert ("fault_armed", f"{stage} answers 451 x1") in events
    assert ("fault", f"{stage} answered 451 (1 of 1)") in events


@pytest.mark.parametrize("stage", ["RCPT", "DATA"])
def test_app_gives_up_after_too_many_faults(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, stage: str
) -> None:
    isolated_mailbox.inject_fault(stage=stage, reply="451 4.3.0 Try again", times=5)
    app = RetryingApp(mailbox_server, attempts=3)
    with pytest.raises((smtplib.SMTPRecipientsRefused, smtplib.SMTPDataError)) as info:
        app.send(isolated_mailbox.address)
    assert app.tries == 3
    assert "4.3.0 Try again" in str(info.value)
    isolated_mailbox.expect_none(within=0.1)
    faults = [e.detail for e in isolated_mailbox.receipt().events if e.status == "fault"]
    assert faults == [f"{stage} answered 451 ({n} of 5)" for n in (1, 2, 3)]

    app.send(isolated_mailbox.address)  # two faults left: fails twice, then delivered
    assert app.tries == 3
    isolated_mailbox.wait_for(timeout=10).ack()


def test_permanent_fault_is_not_retried(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    isolated_mailbox.inject_fault(stage="RCPT", reply="550 5.1.1 No such user", times=1)
    app = RetryingApp(mailbox_server)
    with pytest.raises(smtplib.SMTPRecipientsRefused) as info:
        app.send(isolated_mailbox.address)
    assert app.tries == 1
    assert info.value.recipients == {isolated_mailbox.address: (550, b"5.1.1 No such user")}


class _Asked(Store):
    """A real store that counts the sink's questions about faults owed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked: list[tuple[str, ...]] = []

    def faults_pending(self, alias: str, domain: str) -> frozenset[str]:
        self.asked.append(("any stage", alias))
        return super().faults_pending(alias, domain)

    def fault_pending(self, alias: str, domain: str, stage: str) -> int | None:
        self.asked.append((stage, alias))
        return super().fault_pending(alias, domain, stage)


@pytest.mark.parametrize("armed", [None, "RCPT", "DATA"])
def test_the_sink_asks_about_faults_once_per_recipient_unless_one_is_owed(
    tmp_path: Path, armed: str | None
) -> None:
    store = _Asked(tmp_path / "store.sqlite3")
    mailbox, _ = store.reserve(run_id="r-f", purpose="f", ttl=600, domain="mailbox.test")
    if armed is not None:
        assert (
            store.add_fault(
                mailbox.mailbox_id, mailbox.fence, stage=armed, reply="451 4.3.0 Later", times=1
            )
            is None
        )
    app = RetryingApp(MailSink(store, domains=["mailbox.test"], name="asked").start(), attempts=2)
    try:
        app.send(mailbox.address)
    finally:
        app.server.stop()

    asked = [(stage, alias) for stage, alias in store.asked if alias == mailbox.alias]
    # Each attempt asks once, as it accepts the recipient; only a DATA fault seen then makes
    # the sink ask at DATA (and the writer thread's take asks once more, to count it).
    looked = ("any stage", mailbox.alias)
    expected = {
        None: [looked],
        "RCPT": [looked, ("RCPT", mailbox.alias), looked],
        "DATA": [looked, ("DATA", mailbox.alias), ("DATA", mailbox.alias), looked],
    }[armed]
    assert asked == expected
    assert app.tries == (1 if armed is None else 2)
    assert len(store.messages(mailbox.mailbox_id)) == 1
    store.close()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"stage": "MAIL"},
            "inject_fault: stage='MAIL' is invalid; allowed: 'RCPT' or 'DATA'",
        ),
        (
            {"stage": "RCPT", "reply": "250 OK"},
            "inject_fault: reply='250 OK' is invalid; allowed: a 4xx or 5xx SMTP reply on one "
            "line of printable ASCII, e.g. '451 4.3.0 Try again later'",
        ),
        (
            {"stage": "RCPT", "reply": "451 4.3.0 x\r\n250 smuggled"},
            "inject_fault: reply='451 4.3.0 x\\r\\n250 smuggled' is invalid; allowed: a 4xx or "
            "5xx SMTP reply on one line of printable ASCII, e.g. '451 4.3.0 Try again later'",
        ),
        (
            {"stage": "DATA", "times": 0},
            "inject_fault: times=0 is invalid; allowed: an integer 1..1000",
        ),
        (
            {"stage": "DATA", "times": 1001},
            "inject_fault: times=1001 is invalid; allowed: an integer 1..1000",
        ),
        (  # not a str at all: a ContractError too, not the regex's TypeError
            {"stage": "RCPT", "reply": 451},
            "inject_fault: reply=451 is invalid; allowed: a 4xx or 5xx SMTP reply on one "
            "line of printable ASCII, e.g. '451 4.3.0 Try again later'",
        ),
        (
            {"stage": "RCPT", "reply": b"451 4.3.0 Later"},
            "inject_fault: reply=b'451 4.3.0 Later' is invalid; allowed: a 4xx or 5xx SMTP "
            "reply on one line of printable ASCII, e.g. '451 4.3.0 Try again later'",
        ),
    ],
)
def test_bad_fault_is_refused_naming_the_field(
    isolated_mailbox: Mailbox, kwargs: dict[str, object], expected: str
) -> None:
    with pytest.raises(ContractError) as info:
        isolated_mailbox.inject_fault(**kwargs)  # type: ignore[arg-type]
    assert str(info.value) == expected
    assert not [e for e in isolated_mailbox.receipt().events if e.status == "fault_armed"]


def test_faults_reach_every_worker_in_fixed_port_mode(
    pytester: pytest.Pytester, fixed_port: int
) -> None:
    """The controller's sink serves the port; the fault armed on a worker still applies."""
    pytester.makepyfile(
        """
        import smtplib
        from email.message import EmailMessage

        import pytest

        @pytest.mark.parametrize("n", range(4))
        def test_retry(isolated_mailbox, mailbox_server, n):
            isolated_mailbox.inject_fault(stage="DATA", times=1)
            mail = EmailMessage()
            mail["From"] = "a@app.example.test"
            mail["To"] = isolated_mailbox.address
            mail["Subject"] = f"hello {n}"
            mail.set_content("hi")
            with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
                with pytest.raises(smtplib.SMTPDataError):
                    smtp.send_message(mail)
                smtp.send_message(mail)
            isolated_mailbox.wait_for(subject=f"hello {n}").ack()
        """
    )
    result = pytester.runpytest("-n", "2", f"--mailbox-port={fixed_port}")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["mailbox: 4 reserved, 4 received, 4 claimed, 4 consumed, *"])


def test_a_fault_another_sink_took_first_leaves_the_message_to_be_stored(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    isolated_mailbox.inject_fault(stage="DATA", times=1)
    mailbox = isolated_mailbox
    taken = mailbox_store.take_fault(mailbox.alias, mailbox.domain, "DATA")  # another sink
    delivery = Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)

    # What the sink's writer thread runs once its loop saw the fault pending.
    reply = mailbox_server.receive("app@example.test", [delivery], b"Subject: late\r\n\r\nhi\r\n")

    assert taken is not None
    assert reply is None
    assert mailbox.wait_for(subject="late", timeout=5).subject == "late"
