"""A corpus of transactional mails as real senders' templates write them (``data/corpus``:
multipart/alternative with table layouts, quoted-printable soft line breaks, base64,
preheaders, click-tracking redirects, footers with addresses, phone, order and card
numbers), delivered over SMTP: ``code()`` and ``link()`` find what a reader of the mail
would, or say clearly that there is none."""

from __future__ import annotations

import re
import smtplib
from email.parser import BytesParser
from email.policy import default
from pathlib import Path

import pytest

from pytest_mailbox import ClaimedMessage, ExtractionError, Mailbox, MailSink

CORPUS = Path(__file__).parent / "data" / "corpus"

NO_CODE = "no code matching"
SEVERAL = "distinct codes match"


def deliver(server: MailSink, mailbox: Mailbox, name: str) -> ClaimedMessage:
    """The corpus mail ``name`` as its sender's mailer wrote it, over SMTP, claimed; with
    CRLF line ends, as on the wire, whatever a checkout or ``git am`` made of the file's."""
    raw = re.sub(rb"\r?\n", b"\r\n", (CORPUS / f"{name}.eml").read_bytes())
    subject = str(BytesParser(policy=default).parsebytes(raw)["Subject"])
    with smtplib.SMTP(server.host, server.port) as smtp:
        assert smtp.sendmail("bounce@sender.example.test", [mailbox.address], raw) == {}
    msg = mailbox.wait_for(subject=subject, timeout=10)
    assert msg.raw == raw
    return msg


# The one code a test wants of each mail, or the start of the error that says there is none
# (or several: numbers no rule can tell from a code, which pattern= picks among).
CODES = {
    # A code beside a footer's postal address (street number, suite, ZIP code), a date in
    # words ("December 3, 2026 4:30 PM"), a postal code ("75001 Paris").
    "auth0_passwordless_code": "731604",
    "clerk_code_in_subject_and_body": "582036",
    "code_in_subject_only": "660381",
    "github_device_verification": "351792",
    "google_verification_code": "907351",
    "microsoft_account_security_code": "8052417",
    # A code in groups or one digit a cell, beside a ZIP code standing alone.
    "stripe_link_code": "274615",
    "shopify_customer_login_code": "519284",
    "code_one_digit_per_cell": "372950",
    # A code drawn as a picture, its alt text saying it.
    "code_in_image_alt": "843027",
    "cognito_default_code": "284719",
    "okta_email_challenge": "406215",
    "supabase_magic_link_and_otp": "639104",
    "base64_magic_link": "194627",
    # Letters: pattern= (the error gives one that takes it), not the footer's ZIP code.
    "slack_confirmation_code": NO_CODE,
    "letters_code_dashed": NO_CODE,
    # No code: a date in words, a ZIP code, a card's last four, an order's number.
    "ses_magic_link_tracked_and_raw": NO_CODE,
    "sendgrid_tracked_reset_text_raw": NO_CODE,
    "password_changed_notice": NO_CODE,
    "invoice_stripe": NO_CODE,
    "order_confirmation": NO_CODE,
    "firebase_password_reset": NO_CODE,
    "devise_confirm_long_link_qp": NO_CODE,
    "mailgun_tracked_verify": NO_CODE,
    "postmark_tracked_confirm": NO_CODE,
    "sendgrid_tracked_reset_both_tracked": NO_CODE,
    "two_buttons_verify_and_secure": NO_CODE,
    # A member's number, a phone number, an amount in groups (``100 000 points``).
    "newsletter_points": NO_CODE,
    # Numbers a reader cannot tell from codes either: several, never one made up.
    "shipping_tracking": SEVERAL,
}


def test_the_corpus_is_what_the_table_covers() -> None:
    assert sorted(path.stem for path in CORPUS.glob("*.eml")) == sorted(CODES)


@pytest.mark.parametrize(("name", "expected"), sorted(CODES.items()), ids=sorted(CODES))
def test_code_of_a_real_template(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, name: str, expected: str
) -> None:
    """Footers' addresses (``1600 Amphitheatre Parkway``, ``Mountain View, CA 94043``), a
    date in words, a card's last four digits were codes beside the mail's own: code()
    refused most code mails as ambiguous, and returned a ZIP code (``94105``) for a mail
    whose code has letters or groups, a year (``2026``) or a ZIP code for a mail with no
    code. A code one digit a cell or in an image's alt text was not found."""
    msg = deliver(mailbox_server, isolated_mailbox, name)

    if expected in (NO_CODE, SEVERAL):
        with pytest.raises(ExtractionError, match=expected):
            msg.code()
    else:
        assert msg.code() == expected


@pytest.mark.parametrize("name", ["slack_confirmation_code", "letters_code_dashed"])
def test_a_code_of_capitals_is_named_masked_with_the_pattern_that_takes_it(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, name: str
) -> None:
    """code() found no code in Slack's ``K7Q-9PX`` and told the test to pass a pattern of
    six capitals, which does not take it: the error gives the pattern of the code shown."""
    msg = deliver(mailbox_server, isolated_mailbox, name)

    with pytest.raises(ExtractionError) as refused:
        msg.code()

    said = str(refused.value)
    assert "K7Q" not in said
    shown = "capitals and digits that may be the code are shown (••••PX): if they are, pass "
    shown += "pattern="
    assert f'{shown}r"\\b([A-Z0-9]{{3}}-[A-Z0-9]{{3}})\\b"' in said
    pattern = re.search(r'pattern=r"(.+)"$', said)
    assert pattern is not None
    assert msg.code(pattern=pattern.group(1)) == "K7Q-9PX"


SUPABASE = (
    "https://xyzcompanyabcdefgh.supabase.co/auth/v1/verify?token=pkce_3f1c9a7be2d54c0f8a6b1e3d"
    "&type=magiclink&redirect_to=https://app.example.test/auth/callback"
)
MAGIC = "https://app.example.test/magic/login?token=Zq8xYtK2mP4rT7wQ9sL1"
RESET = (
    "https://app.example.test/password/reset/8f3b2c1d9e?token=Zq8xYtK2mP4rT7wQ9sL1"
    "&email=mail-3f9a1c2b7e%40mailbox.test"
)
VERIFY = "https://app.example.test/verify-email?token=Zq8xYtK2mP4rT7wQ9sL1&uid=48213"
CONFIRM = (
    "https://app.example.test/auth/confirm?confirmation_token=3f1c9a7be2d54c0f8a6b1e3d7c9f2a4b6d"
    "8e0f1a3c5e7b9d&redirect=%2Fdashboard%3Fwelcome%3D1&utm_source=transactional&utm_medium="
    "email&utm_campaign=signup_confirmation"
)
SENDGRID = (
    "https://u4815162.ct.sendgrid.net/ls/click?upn=u001.Zk9WbXJ3Nnh4QkZlRm5QbVZ6Q3d5T0h2dUZrU2pYb"
    "m9mR0JqS2hYd2c-3D-3DaB1c_Xy7zQ9kLm2Np4Rs6Tv8Wx0Yz"
)


def TRACKED_AT(host: str) -> str:  # noqa: N802 - read as a constant of the table
    """The error of a link() that found only links through click tracking on ``host``."""
    return (
        rf"no link on app\.example\.test in message m-[0-9a-f]+; hosts found: {re.escape(host)}"
        r"\S*; \S+ is click tracking, whose links lead to the app's only when followed: turn "
        r"click tracking off for the mail the tests send, or pass its host as domain=$"
    )


# What link() gives: (mail, domain, path) -> the link, or the start of its error.
LINKS = [
    ("supabase_magic_link_and_otp", None, None, SUPABASE),  # &amp; in its href
    ("base64_magic_link", "app.example.test", None, MAGIC),
    ("devise_confirm_long_link_qp", "app.example.test", None, CONFIRM),  # soft line breaks
    # The tracking redirect and its target: the target, by its host.
    ("ses_magic_link_tracked_and_raw", "app.example.test", None, MAGIC),
    ("ses_magic_link_tracked_and_raw", None, None, "2 distinct links in message"),
    ("sendgrid_tracked_reset_text_raw", "app.example.test", "/password/reset", RESET),
    ("sendgrid_tracked_reset_text_raw", "app.example.test", None, "2 distinct links on"),
    ("sendgrid_tracked_reset_both_tracked", None, None, SENDGRID),
    # Only through click tracking: the error says so, and what to do.
    ("sendgrid_tracked_reset_both_tracked", "app.example.test", None, TRACKED_AT("u4815162")),
    ("mailgun_tracked_verify", "app.example.test", None, TRACKED_AT("email.mg")),
    ("postmark_tracked_confirm", "app.example.test", None, TRACKED_AT("click.pstmrk")),
    # Two buttons on one host; mailto:, tel:, a relative link and an anchor are no links.
    ("two_buttons_verify_and_secure", "app.example.test", "/verify-email", VERIFY),
    ("two_buttons_verify_and_secure", "app.example.test", None, "2 distinct links on"),
    # Links elsewhere only, no tracking: no word of it.
    ("github_device_verification", "app.example.test", None, r"docs\.github\.com$"),
]


@pytest.mark.parametrize(("name", "domain", "path", "expected"), LINKS)
def test_link_of_a_real_template(
    mailbox_server: MailSink,
    isolated_mailbox: Mailbox,
    name: str,
    domain: str | None,
    path: str | None,
    expected: str,
) -> None:
    msg = deliver(mailbox_server, isolated_mailbox, name)

    if expected.startswith("https://"):
        assert msg.link(domain, path=path) == expected
    else:
        with pytest.raises(ExtractionError, match=expected):
            msg.link(domain, path=path)


def test_mailto_tel_relative_and_anchor_links_are_not_links(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """A footer's ``mailto:``, ``tel:``, ``/help`` and ``#top`` are no http(s) links: the
    two buttons are the mail's links, each once though its text part repeats them."""
    msg = deliver(mailbox_server, isolated_mailbox, "two_buttons_verify_and_secure")

    assert msg.links() == [
        VERIFY,
        "https://app.example.test/account/secure?token=Wr5tYu7iOp9aSd2fGh4jKl",
    ]
