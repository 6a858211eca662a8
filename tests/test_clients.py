"""Real SMTP clients deliver to the session sink, and each test's mailbox gets its own copy."""

from __future__ import annotations

import asyncio
import copy
import smtplib
from email import policy
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib
import pytest

from pytest_mailbox import ClaimedMessage, EmailContract, Mailbox, MailSink, Store

SUBJECT = "Vérifiez votre adresse \N{WHITE HEAVY CHECK MARK}"
SENDER = "noreply@app.example.test"
CODE = "493817"
LINK = "https://app.example.test/verify?token=Zq8pL2vXc4"
TEXT = f"Bonjour !\n\nOuvrez {LINK} ou saisissez le code {CODE}.\n"
HTML = f'<p>Bonjour !</p><p><a href="{LINK}">Vérifier</a></p><p>Code : <b>{CODE}</b></p>'


def verification_mail(to: str | list[str]) -> EmailMessage:
    """A multipart/alternative mail (text + HTML) with a non-ASCII subject, a link and a code."""
    mail = EmailMessage()
    mail["From"] = f"Exemple <{SENDER}>"
    mail["To"] = to if isinstance(to, str) else ", ".join(to)
    mail["Subject"] = SUBJECT
    mail.set_content(TEXT)
    mail.add_alternative(HTML, subtype="html")
    return mail


def assert_verification_mail(msg: ClaimedMessage) -> None:
    """The mail arrived whole: decoded subject, both bodies, link, code and sender."""
    assert msg.subject == SUBJECT
    assert SUBJECT.encode() not in msg.raw  # it travelled RFC 2047-encoded and was decoded
    assert msg.text.replace("\r\n", "\n") == TEXT
    assert msg.html.strip() == HTML
    assert msg.link(domain="app.example.test") == LINK
    assert msg.code() == CODE
    assert msg.sender == SENDER
    assert msg.envelope_from == SENDER


def test_smtplib_send_message_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(verification_mail(isolated_mailbox.address))

    msg = isolated_mailbox.wait_for(subject=SUBJECT, timeout=10)

    assert_verification_mail(msg)
    assert msg.envelope_to == isolated_mailbox.address


def test_aiosmtplib_send_is_delivered(mailbox_server: MailSink, isolated_mailbox: Mailbox) -> None:
    async def send() -> None:
        await aiosmtplib.send(
            verification_mail(isolated_mailbox.address),
            hostname=mailbox_server.host,
            port=mailbox_server.port,
        )

    asyncio.run(send())

    msg = isolated_mailbox.wait_for(subject_contains="Vérifiez", timeout=10)
    assert_verification_mail(msg)


def test_django_smtp_backend_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """Django's own SMTP backend, set up by ``settings["django"]`` as it is for the Django
    installed: ``MAILERS`` from 6.1 (the newest-versions run), ``EMAIL_*`` before."""
    import django  # noqa: PLC0415 - configured below, only for this test
    from django.conf import settings  # noqa: PLC0415
    from django.core.mail import EmailMultiAlternatives  # noqa: PLC0415
    from django.test.utils import override_settings  # noqa: PLC0415

    django_settings = mailbox_server.settings["django"]
    if django.VERSION >= (6, 1):
        assert list(django_settings) == ["MAILERS"]
    else:
        assert "MAILERS" not in django_settings
    if not settings.configured:
        settings.configure()
    with override_settings(**django_settings):  # -W error: no deprecated setting is used
        mail = EmailMultiAlternatives(
            subject=SUBJECT,
            body=TEXT,
            from_email=f"Exemple <{SENDER}>",
            to=[isolated_mailbox.address],
        )
        mail.attach_alternative(HTML, "text/html")
        assert mail.send() == 1

    msg = isolated_mailbox.wait_for(sender=SENDER, timeout=10)
    assert_verification_mail(msg)


#: A relay's login as an app's config keeps it (SendGrid's user name is "apikey").
LOGIN_USER = "apikey"
LOGIN_PASSWORD = "SG.pw-Zq8vT4nW2xKp9LmR"


@pytest.mark.parametrize(
    ("mechanism", "initial_response"),
    [("PLAIN", True), ("PLAIN", False), ("LOGIN", True), ("LOGIN", False)],
)
def test_smtplib_logged_in_with_either_mechanism_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, mechanism: str, initial_response: bool
) -> None:
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.ehlo()
        smtp.user, smtp.password = LOGIN_USER, LOGIN_PASSWORD  # what login() sets
        auth = smtp.auth_plain if mechanism == "PLAIN" else smtp.auth_login
        code, _ = smtp.auth(mechanism, auth, initial_response_ok=initial_response)
        assert code == 235
        smtp.send_message(verification_mail(isolated_mailbox.address))

    assert_verification_mail(isolated_mailbox.wait_for(subject=SUBJECT, timeout=10))


def test_smtplib_login_is_delivered(mailbox_server: MailSink, isolated_mailbox: Mailbox) -> None:
    """``login()``, as an app calls it: before, ``SMTPNotSupportedError``."""
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        assert smtp.login(LOGIN_USER, LOGIN_PASSWORD)[0] == 235
        smtp.send_message(verification_mail(isolated_mailbox.address))

    assert_verification_mail(isolated_mailbox.wait_for(subject=SUBJECT, timeout=10))


@pytest.mark.parametrize("mechanism", ["login()", "PLAIN", "LOGIN"])
def test_aiosmtplib_logged_in_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, mechanism: str
) -> None:
    async def send() -> None:
        if mechanism == "login()":  # aiosmtplib.send(username=, password=) calls it
            await aiosmtplib.send(
                verification_mail(isolated_mailbox.address),
                hostname=mailbox_server.host,
                port=mailbox_server.port,
                username=LOGIN_USER,
                password=LOGIN_PASSWORD,
                start_tls=False,
            )
            return
        smtp = aiosmtplib.SMTP(hostname=mailbox_server.host, port=mailbox_server.port)
        async with smtp:
            auth = smtp.auth_plain if mechanism == "PLAIN" else smtp.auth_login
            assert (await auth(LOGIN_USER, LOGIN_PASSWORD)).code == 235
            await smtp.send_message(verification_mail(isolated_mailbox.address))

    asyncio.run(send())

    assert_verification_mail(isolated_mailbox.wait_for(subject=SUBJECT, timeout=10))


def test_django_smtp_backend_with_a_login_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """A project whose settings keep its relay's login: Django logs in, as in production."""
    import django  # noqa: PLC0415 - configured below, only for this test
    from django.conf import settings  # noqa: PLC0415
    from django.core.mail import EmailMessage as DjangoMessage  # noqa: PLC0415
    from django.test.utils import override_settings  # noqa: PLC0415

    django_settings = copy.deepcopy(mailbox_server.settings["django"])
    if django.VERSION >= (6, 1):
        for mailer in django_settings["MAILERS"].values():
            mailer["OPTIONS"].update(username=LOGIN_USER, password=LOGIN_PASSWORD)
    else:
        django_settings.update(EMAIL_HOST_USER=LOGIN_USER, EMAIL_HOST_PASSWORD=LOGIN_PASSWORD)
    if not settings.configured:
        settings.configure()
    with override_settings(**django_settings):
        mail = DjangoMessage(SUBJECT, TEXT, SENDER, [isolated_mailbox.address])
        assert mail.send() == 1

    assert isolated_mailbox.wait_for(sender=SENDER, timeout=10).subject == SUBJECT


def test_flask_mail_with_a_login_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    from flask import Flask  # noqa: PLC0415 - only this test needs Flask
    from flask_mail import Mail, Message  # noqa: PLC0415

    app = Flask(__name__)
    app.config.update(
        MAIL_SERVER=mailbox_server.host,
        MAIL_PORT=mailbox_server.port,
        MAIL_USERNAME=LOGIN_USER,
        MAIL_PASSWORD=LOGIN_PASSWORD,
        MAIL_SUPPRESS_SEND=False,
        MAIL_DEFAULT_SENDER=SENDER,
    )
    mail = Mail(app)
    with app.app_context():
        mail.send(Message(SUBJECT, recipients=[isolated_mailbox.address], body=TEXT))

    assert isolated_mailbox.wait_for(sender=SENDER, timeout=10).subject == SUBJECT


def test_fastapi_mail_with_credentials_is_delivered(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    import email_validator  # noqa: PLC0415 - fastapi-mail's validator
    from fastapi_mail import ConnectionConfig, FastMail, MessageSchema  # noqa: PLC0415

    monkeypatch.setattr(email_validator, "TEST_ENVIRONMENT", True)  # takes .test addresses
    config = ConnectionConfig(
        MAIL_SERVER=mailbox_server.host,
        MAIL_PORT=mailbox_server.port,
        MAIL_STARTTLS=False,
        MAIL_SSL_TLS=False,
        USE_CREDENTIALS=True,
        MAIL_USERNAME=LOGIN_USER,
        MAIL_PASSWORD=LOGIN_PASSWORD,
        MAIL_FROM=SENDER,
    )
    message = MessageSchema(
        subject=SUBJECT, recipients=[isolated_mailbox.address], body=TEXT, subtype="plain"
    )
    asyncio.run(FastMail(config).send_message(message))

    assert isolated_mailbox.wait_for(sender=SENDER, timeout=10).subject == SUBJECT


def test_two_envelope_recipients_get_one_copy_each(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    second_mailbox: Mailbox,
) -> None:
    recipients = [isolated_mailbox.address, second_mailbox.address]
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        refused = smtp.send_message(verification_mail(recipients))
    assert refused == {}

    first = isolated_mailbox.wait_for(subject=SUBJECT, timeout=10)
    second = second_mailbox.wait_for(subject=SUBJECT, timeout=10)

    assert [m.message_id for m in mailbox_store.messages(isolated_mailbox.mailbox_id)] == [
        first.message_id
    ]
    assert [m.message_id for m in mailbox_store.messages(second_mailbox.mailbox_id)] == [
        second.message_id
    ]
    assert first.message_id != second.message_id
    assert (first.envelope_to, second.envelope_to) == tuple(recipients)
    assert first.raw == second.raw
    assert_verification_mail(first)
    assert_verification_mail(second)


@pytest.mark.parametrize(
    ("local_suffix", "upper_domain", "tag"),
    [
        pytest.param("+welcome", False, "welcome", id="plus-tag"),
        pytest.param("", True, None, id="upper-case-domain"),
        pytest.param("+Reset-2", True, "reset-2", id="plus-tag-and-upper-case-domain"),
    ],
)
def test_address_variants_route_to_the_alias(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    local_suffix: str,
    upper_domain: bool,
    tag: str | None,
) -> None:
    domain = isolated_mailbox.domain.upper() if upper_domain else isolated_mailbox.domain
    address = f"{isolated_mailbox.alias}{local_suffix}@{domain}"
    assert address != isolated_mailbox.address
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.send_message(verification_mail(address))

    msg = isolated_mailbox.wait_for(subject=SUBJECT, timeout=10)

    assert msg.envelope_to == address
    (row,) = mailbox_store.messages(isolated_mailbox.mailbox_id)
    assert (row.message_id, row.alias, row.tag) == (msg.message_id, isolated_mailbox.alias, tag)
    assert_verification_mail(msg)


@pytest.mark.parametrize("client", ["smtplib", "aiosmtplib"])
def test_a_plus_tag_in_any_script_at_a_utf8_domain_is_routed_and_selected(
    tmp_path: Path, client: str
) -> None:
    """SMTPUTF8 (RFC 6531): the sink took ``alias+тег@bücher.test`` and routed it to the
    alias, but ``wait_for(tag="тег")`` and ``tagged("тег")`` refused the tag as no tag."""
    with (
        Store(tmp_path / "store.sqlite3") as store,
        MailSink(store, domains=["bücher.test"]) as sink,
    ):
        mailbox = Mailbox.reserve(
            store,
            contract=EmailContract(purpose="utf8", ttl=60),
            domain="bücher.test",
            signal=sink.signal,
        )
        address = mailbox.tagged("ТЕГ")
        assert address == f"{mailbox.alias}+тег@xn--bcher-kva.test"
        sent = f"{mailbox.alias}+Тег@BÜCHER.test"  # another spelling of the same address
        mail = verification_mail(sent)
        mail.policy = policy.SMTPUTF8
        raw = mail.as_bytes()  # once: each flattening draws a new MIME boundary
        options = ["SMTPUTF8", "BODY=8BITMIME"]
        if client == "smtplib":
            with smtplib.SMTP(sink.host, sink.port) as smtp:
                assert smtp.sendmail(SENDER, [sent], raw, mail_options=options) == {}
        else:
            asyncio.run(
                aiosmtplib.send(
                    raw,
                    sender=SENDER,
                    recipients=[sent],
                    mail_options=options,
                    hostname=sink.host,
                    port=sink.port,
                )
            )

        msg = mailbox.wait_for(tag="тег", timeout=10)

        assert msg.envelope_to == sent
        assert msg.raw == raw
        assert msg.link() == LINK
        assert msg.code() == CODE


_HTML_PART = (
    f'<p>Bonjour <img src="cid:logo"></p><a href="{LINK}">Vérifier</a><p>Code <b>{CODE}</b></p>'
)
_RELATED = (
    'Content-Type: multipart/related; boundary="R"\r\n\r\n--R\r\n'
    f"Content-Type: text/html; charset=utf-8\r\n\r\n{_HTML_PART}\r\n--R\r\n"
    "Content-Type: image/png\r\nContent-ID: <logo>\r\nContent-Transfer-Encoding: base64\r\n"
    "\r\niVBORw0KGgo=\r\n--R--\r\n"
)
_TEXT_PART = f"Content-Type: text/plain; charset=utf-8\r\n\r\nOuvrez {LINK}, code {CODE}.\r\n"
_BODIES = {
    # charsets beyond UTF-8, each body 8-bit (BODY=8BITMIME)
    **{
        charset: f"Content-Type: text/plain; charset={charset}\r\n"
        f"Content-Transfer-Encoding: 8bit\r\n\r\n".encode()
        + f"{greeting} {LINK}\r\n{CODE}\r\n".encode(codec)
        for charset, codec, greeting in (
            ("iso-2022-jp", "iso-2022-jp", "こんにちは"),
            ("windows-1252", "cp1252", "Café – voilà"),
            ("koi8-r", "koi8-r", "Привет"),
            ("x-no-such-charset", "utf-8", "Grüße"),
        )
    },
    "alternative-related": (
        f'Content-Type: multipart/alternative; boundary="A"\r\n\r\n--A\r\n{_TEXT_PART}'
        f"--A\r\n{_RELATED}--A--\r\n"
    ).encode(),
    "mixed-alternative-related-html-only": (
        f'Content-Type: multipart/mixed; boundary="M"\r\n\r\n--M\r\n'
        f'Content-Type: multipart/alternative; boundary="A"\r\n\r\n--A\r\n{_RELATED}--A--\r\n'
        "--M\r\nContent-Type: application/pdf\r\n"
        'Content-Disposition: attachment; filename="https://evil.example.test/?t=999999"'
        "\r\n\r\nxx\r\n--M--\r\n"
    ).encode(),
    "related-alternative": (
        f'Content-Type: multipart/related; boundary="R"\r\n\r\n--R\r\n'
        f'Content-Type: multipart/alternative; boundary="A"\r\n\r\n--A\r\n{_TEXT_PART}'
        f"--A\r\nContent-Type: text/html; charset=utf-8\r\n\r\n{_HTML_PART}\r\n--A--\r\n"
        "--R\r\nContent-Type: image/png\r\nContent-ID: <logo>\r\n\r\nxx\r\n--R--\r\n"
    ).encode(),
}


@pytest.mark.parametrize("client", ["smtplib", "aiosmtplib"])
@pytest.mark.parametrize("kind", list(_BODIES))
def test_charsets_and_nested_multiparts_are_stored_intact_and_read(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, client: str, kind: str
) -> None:
    """Every byte as sent; the one link and code found, in another charset too, in HTML
    inside multipart/related, and never in an attachment named like a link."""
    raw = (
        f"From: {SENDER}\r\nTo: {isolated_mailbox.address}\r\nSubject: Code check\r\n"
        "MIME-Version: 1.0\r\n"
    ).encode() + _BODIES[kind]
    to, options = [isolated_mailbox.address], ["BODY=8BITMIME"]
    if client == "smtplib":
        with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
            assert smtp.sendmail(SENDER, to, raw, mail_options=options) == {}
    else:
        asyncio.run(
            aiosmtplib.send(
                raw,
                sender=SENDER,
                recipients=to,
                mail_options=options,
                hostname=mailbox_server.host,
                port=mailbox_server.port,
            )
        )

    msg = isolated_mailbox.wait_for(subject="Code check", timeout=10)

    assert msg.raw == raw
    assert msg.link() == LINK
    assert msg.code() == CODE


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("caf\N{LATIN SMALL LETTER E WITH ACUTE}", "cafe\N{COMBINING ACUTE ACCENT}"),
        ("cafe\N{COMBINING ACUTE ACCENT}", "CAF\N{LATIN CAPITAL LETTER E WITH ACUTE}"),
    ],
)
def test_a_utf8_plus_tag_is_one_tag_in_either_normal_form(
    tmp_path: Path, given: str, sent: str
) -> None:
    """``café`` may be sent with its accent composed (NFC) or as ``e`` and U+0301 (NFD, as
    macOS and some JavaScript hand text over): one tag to a reader of the address, and to
    RFC 6532, which asks for NFC. The sink kept the form sent, and ``wait_for(tag=…)`` in
    the other form timed out; a mail to both forms was stored twice."""
    with (
        Store(tmp_path / "store.sqlite3") as store,
        MailSink(store, domains=["mail.test"]) as sink,
    ):
        mailbox = Mailbox.reserve(
            store, contract=EmailContract(purpose="nfc", ttl=60), domain="mail.test",
            signal=sink.signal,
        )  # fmt: skip
        composed = f"{mailbox.alias}+caf\N{LATIN SMALL LETTER E WITH ACUTE}@mail.test"
        decomposed = f"{mailbox.alias}+{sent}@mail.test"
        mail = verification_mail(decomposed)
        mail.policy = policy.SMTPUTF8
        options = ["SMTPUTF8", "BODY=8BITMIME"]
        with smtplib.SMTP(sink.host, sink.port) as smtp:
            assert smtp.sendmail(SENDER, [decomposed], mail.as_bytes(), mail_options=options) == {}
            mail.replace_header("Subject", "twice")
            both = [decomposed, composed]  # one address, twice: one copy
            assert smtp.sendmail(SENDER, both, mail.as_bytes(), mail_options=options) == {}

        msg = mailbox.wait_for(tag=given, subject=SUBJECT, timeout=10)

        assert msg.envelope_to == decomposed
        assert mailbox.tagged(given) == mailbox.tagged(sent) == composed
        assert [row.tag for row in store.messages(mailbox.mailbox_id)] == ["caf\xe9", "caf\xe9"]
