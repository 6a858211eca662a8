"""docs/recipes.md, Flask: Flask-Mail sends over real SMTP to the test's own mailbox."""

from __future__ import annotations

import pytest
from flask import Flask
from flask_app import create_app

from pytest_mailbox import Mailbox, MailSink


@pytest.fixture
def app(mailbox_server: MailSink) -> Flask:
    return create_app(
        {
            "TESTING": True,
            # MAIL_SERVER, MAIL_PORT, MAIL_USE_TLS, ... and MAIL_SUPPRESS_SEND=False, without
            # which Flask-Mail sends nothing from a TESTING app
            **mailbox_server.settings["flask"],
        }
    )


@pytest.mark.email_contract(purpose="signup")
def test_signup_sends_a_working_link(app: Flask, isolated_mailbox: Mailbox) -> None:
    client = app.test_client()
    isolated_mailbox.checkpoint()
    assert client.post("/signup", data={"email": isolated_mailbox.address}).status_code == 202

    msg = isolated_mailbox.wait_for(subject="Verify your address", timeout=10)
    assert msg.sender == "noreply@app.example.test"
    response = client.get(msg.link(domain="app.example.test"))
    assert response.text == f"verified {isolated_mailbox.address}"
    msg.ack()
