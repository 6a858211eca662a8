"""docs/recipes.md, unittest: a TestCase gets the test's mailbox from an autouse fixture."""

from __future__ import annotations

import smtplib
import unittest
from email.message import EmailMessage

import pytest

from pytest_mailbox import Mailbox, MailSink


@pytest.mark.email_contract(purpose="signup")
class SignupTest(unittest.TestCase):
    mailbox: Mailbox
    server: MailSink

    @pytest.fixture(autouse=True)
    def _mailbox(self, isolated_mailbox: Mailbox, mailbox_server: MailSink) -> None:
        # pytest passes no fixture to a TestCase's methods: an autouse fixture keeps them
        self.mailbox, self.server = isolated_mailbox, mailbox_server

    def test_signup_mails_a_code(self) -> None:
        mail = EmailMessage()
        mail["From"], mail["To"] = "noreply@app.example.test", self.mailbox.address
        mail["Subject"] = "Your sign-in code"
        mail.set_content("Your code is 482913.\n")
        with smtplib.SMTP(self.server.host, self.server.port) as smtp:
            smtp.send_message(mail)

        msg = self.mailbox.wait_for(subject="Your sign-in code", timeout=10)
        self.assertEqual(msg.code(), "482913")  # noqa: PT009 - a TestCase asserts so
        msg.ack()
