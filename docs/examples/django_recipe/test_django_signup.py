"""The Django recipe: a view sends a verification mail over SMTP; the test claims and uses it."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from pytest_mailbox import Mailbox

pytestmark = pytest.mark.usefixtures("django_mail")


@pytest.mark.email_contract(purpose="signup", ttl=120, lease=30)
def test_signup_sends_a_working_link(client: Client, isolated_mailbox: Mailbox) -> None:
    isolated_mailbox.checkpoint()
    response = client.post("/signup/", {"email": isolated_mailbox.address})
    assert response.status_code == 202

    msg = isolated_mailbox.wait_for(subject="Verify your address", timeout=10)
    link = msg.link(domain="app.example.test")
    assert client.get(link).content == f"verified {isolated_mailbox.address}".encode()
    msg.ack()
    assert mail.outbox == []  # it went over SMTP, not to Django's locmem test backend


def test_a_tampered_link_is_refused(client: Client, isolated_mailbox: Mailbox) -> None:
    client.post("/signup/", {"email": isolated_mailbox.address})
    msg = isolated_mailbox.wait_for(subject="Verify your address")
    link = msg.link(domain="app.example.test")
    assert client.get(link.replace("verify/", "verify/x")).status_code == 400
    msg.ack()


@pytest.mark.parametrize("user", range(4))
def test_every_user_gets_their_own_mail(
    client: Client, isolated_mailbox: Mailbox, user: int
) -> None:
    client.post("/signup/", {"email": isolated_mailbox.address})
    msg = isolated_mailbox.wait_for(subject="Verify your address")
    assert msg.to == [isolated_mailbox.address]
    assert client.get(msg.link(domain="app.example.test")).status_code == 200
    msg.ack()
