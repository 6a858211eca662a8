"""docs/recipes.md, FastAPI: fastapi-mail sends asynchronously, over real SMTP, to the mailbox."""

from __future__ import annotations

from collections.abc import Iterator

import email_validator
import pytest
from fastapi.testclient import TestClient
from fastapi_app import app, mail_config
from fastapi_mail import ConnectionConfig

from pytest_mailbox import Mailbox, MailSink


@pytest.fixture
def client(mailbox_server: MailSink, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    # fastapi-mail validates addresses with email-validator, which refuses the reserved
    # .test domain (mailbox.test, app.example.test) unless told it runs in a test.
    monkeypatch.setattr(email_validator, "TEST_ENVIRONMENT", True)
    app.dependency_overrides[mail_config] = lambda: ConnectionConfig(
        MAIL_SERVER=mailbox_server.host,
        MAIL_PORT=mailbox_server.port,
        MAIL_STARTTLS=False,
        MAIL_SSL_TLS=False,
        USE_CREDENTIALS=False,
        MAIL_USERNAME="",
        MAIL_PASSWORD="",
        MAIL_FROM="noreply@app.example.test",
    )
    with TestClient(app) as client:
        yield client
    app.dependency_overrides.clear()


@pytest.mark.email_contract(purpose="signup")
def test_signup_sends_a_working_link(client: TestClient, isolated_mailbox: Mailbox) -> None:
    isolated_mailbox.checkpoint()
    response = client.post("/signup", json={"email": isolated_mailbox.address})
    assert response.status_code == 202

    msg = isolated_mailbox.wait_for(subject="Verify your address", timeout=10)
    link = msg.link(domain="app.example.test")
    assert link in msg.text  # both parts of the multipart/alternative carry it
    assert client.get(link).json() == {"verified": isolated_mailbox.address}
    assert client.get(link).status_code == 400  # once only
    msg.ack()
