"""Send the site's mail to pytest-mailbox, over real SMTP, instead of Django's test outbox."""

from __future__ import annotations

import pytest
from pytest_django import Settings

from pytest_mailbox import MailSink


@pytest.fixture
def django_mail(settings: Settings, mailbox_server: MailSink) -> None:
    """MAILERS (Django 6.1 and later) or EMAIL_HOST, EMAIL_PORT, ...: the settings this
    Django reads; pytest-django restores them after the test."""
    for key, value in mailbox_server.settings["django"].items():
        setattr(settings, key, value)
