"""docs/recipes.md, tests that freeze time: the app's clock moves, the mailbox's does not."""

from __future__ import annotations

import smtplib
import time
from datetime import datetime, timedelta, timezone
from email.message import EmailMessage

import freezegun
import pytest
import time_machine

from pytest_mailbox import Mailbox, MailSink

LINK_LIFETIME = 24 * 3600  # seconds


def send_verification(server: MailSink, to: str) -> None:
    """The app: mails a link that expires 24 hours after it was sent, by its own clock."""
    expires = int(time.time()) + LINK_LIFETIME
    mail = EmailMessage()
    mail["From"], mail["To"] = "noreply@app.example.test", to
    mail["Subject"] = "Verify your address"
    mail.set_content(f"Verify: https://app.example.test/verify?expires={expires}\n")
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.send_message(mail)


def link_expired(link: str) -> bool:
    """The app's check of the link, by its own clock: the test's fake one."""
    return int(link.rpartition("expires=")[2]) < time.time()


@pytest.mark.email_contract(purpose="signup", ttl=60)
def test_the_link_expires_after_a_day(isolated_mailbox: Mailbox, mailbox_server: MailSink) -> None:
    start = datetime(2030, 1, 1, 12, tzinfo=timezone.utc)
    with time_machine.travel(start, tick=False) as traveller:
        send_verification(mailbox_server, isolated_mailbox.address)
        traveller.shift(timedelta(hours=25))  # the mailbox's ttl of 60 s is not over
        msg = isolated_mailbox.wait_for(subject="Verify your address", timeout=10)
        assert link_expired(msg.link(domain="app.example.test"))
        msg.ack()


@pytest.mark.email_contract(purpose="signup", ttl=60)
def test_the_link_works_an_hour_later(isolated_mailbox: Mailbox, mailbox_server: MailSink) -> None:
    with freezegun.freeze_time("2030-01-01 12:00:00") as frozen:
        since = isolated_mailbox.checkpoint()  # not datetime.now(): that is 2030
        send_verification(mailbox_server, isolated_mailbox.address)
        frozen.tick(timedelta(hours=1))
        msg = isolated_mailbox.wait_for(subject="Verify your address", received_after=since)
        assert not link_expired(msg.link(domain="app.example.test"))
        msg.ack()
