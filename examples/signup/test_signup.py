"""The example sign-up suite: `make demo` runs it under `pytest -n auto` and prints its receipts."""

from __future__ import annotations

import pytest

from pytest_mailbox import Mailbox

from .app import SignupApp


@pytest.mark.email_contract(purpose="signup", ttl=120, lease=30)
def test_verify_with_link(app: SignupApp, isolated_mailbox: Mailbox) -> None:
    isolated_mailbox.checkpoint()
    app.signup(isolated_mailbox.address, run_id=isolated_mailbox.run_id)
    msg = isolated_mailbox.wait_for(subject_contains="Verify", timeout=10)
    # the footer's unsubscribe link is on the same host: say which link
    assert app.verify_link(msg.link(domain="app.example.test", path="/verify"))
    msg.ack()
    assert isolated_mailbox.address in app.verified


@pytest.mark.email_contract(purpose="signup")
def test_verify_with_code(app: SignupApp, isolated_mailbox: Mailbox) -> None:
    app.signup(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(sender="noreply@app.example.test")
    # the link token may hold digits too: say which number is the code
    assert app.verify_code(isolated_mailbox.address, msg.code(pattern=r"the code (\d{6})"))


@pytest.mark.email_contract(purpose="resend")
def test_resend_reads_only_the_new_mail(app: SignupApp, isolated_mailbox: Mailbox) -> None:
    app.signup(isolated_mailbox.address)
    first = isolated_mailbox.wait_for(subject_contains="Verify")
    first.ack()
    isolated_mailbox.checkpoint()
    app.signup(isolated_mailbox.address)  # "resend": a new token replaces the old one
    second = isolated_mailbox.wait_for(subject_contains="Verify")
    assert second.message_id != first.message_id
    assert not app.verify_link(first.link(path="/verify"))
    assert app.verify_link(second.link(path="/verify"))


def test_no_mail_without_signup(app: SignupApp, isolated_mailbox: Mailbox) -> None:
    isolated_mailbox.expect_none(within=0.2)
    assert isolated_mailbox.address not in app.verified


@pytest.mark.parametrize("user", range(6))
def test_many_users_in_parallel(app: SignupApp, isolated_mailbox: Mailbox, user: int) -> None:
    app.signup(isolated_mailbox.address, run_id=isolated_mailbox.run_id)
    msg = isolated_mailbox.wait_for(header=("X-Run-Id", isolated_mailbox.run_id))
    # the link token may hold digits too: say which number is the code
    assert app.verify_code(isolated_mailbox.address, msg.code(pattern=r"the code (\d{6})"))
