"""docs/getting-started.md: the first test, as written there."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage

import pytest

from pytest_mailbox import Mailbox, MailSink


def send_verification(server: MailSink, to: str, run_id: str) -> None:
    """Stands in for your app: it sends a real verification mail over SMTP."""
    mail = EmailMessage()
    mail["From"] = "noreply@app.example.test"
    mail["To"] = to
    mail["Subject"] = "Verify your address"
    mail["X-Run-Id"] = run_id  # optional: lets the plugin refuse another run's mail
    mail.set_content("Open https://app.example.test/verify?token=abc123 or enter 415926.")
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.send_message(mail)


@pytest.mark.email_contract(purpose="verification", ttl=120, lease=60)
def test_signup(mailbox_server: MailSink, isolated_mailbox: Mailbox) -> None:
    isolated_mailbox.checkpoint()  # only mail committed from now on counts
    send_verification(mailbox_server, isolated_mailbox.address, isolated_mailbox.run_id)
    msg = isolated_mailbox.wait_for(subject_contains="Verify", timeout=10)
    assert msg.link(domain="app.example.test") == "https://app.example.test/verify?token=abc123"
    assert msg.code() == "415926"
    msg.ack()  # consumed: a retry can never read it again
