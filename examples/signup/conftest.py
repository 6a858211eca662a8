from __future__ import annotations

import pytest

from pytest_mailbox import MailSink

from .app import SignupApp


@pytest.fixture
def app(mailbox_server: MailSink) -> SignupApp:
    """The app under test, configured with the session's SMTP sink like any real app."""
    return SignupApp(smtp_host=mailbox_server.host, smtp_port=mailbox_server.port)
