"""Mail as real senders' templates write it, delivered over SMTP: its one link and one code
are found, as a reader of the mail would find them."""

from __future__ import annotations

import base64
import re
import smtplib
from email.message import EmailMessage

import pytest

from pytest_mailbox import ExtractionError, Mailbox, MailSink
from pytest_mailbox.message import _DATE_OR_TIME, mask_subject

SIGNED = (
    "https://app.example.test/email/verify/1/0a9f3e7c"
    "?expires=1765120000&signature=4b1c2d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c"
)


def send(server: MailSink, to: str, subject: str, text: str, html: str | None = None) -> None:
    """A mail as a framework's mailer builds it (quoted-printable, text then HTML), over SMTP."""
    mail = EmailMessage()
    mail["From"] = "Laravel <hello@app.example.test>"
    mail["To"] = to
    mail["Subject"] = subject
    mail.set_content(text, cte="quoted-printable")
    if html is not None:
        mail.add_alternative(html, subtype="html", cte="quoted-printable")
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.send_message(mail)


def test_a_markdown_link_whose_text_is_its_url_is_one_link(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """Laravel's verify-email text part ends with ``[url](url)``, markdown its text views
    keep: read as one link running from the first URL into the second, it made a second,
    garbled link, and link() refused the mail's one link as ambiguous."""
    text = (
        "Please click the button below to verify your email address.\n\n"
        f"Verify Email Address: {SIGNED}\n\n"
        'If you\'re having trouble clicking the "Verify Email Address" button, copy and '
        f"paste the URL below\ninto your web browser: [{SIGNED}]({SIGNED})\n\n"
        "\N{COPYRIGHT SIGN} 2026 Laravel. All rights reserved.\n"
    )
    href = SIGNED.replace("&", "&amp;")
    html = (
        f'<a href="{href}" class="button button-primary">Verify Email Address</a>'
        '<p>If you\'re having trouble clicking the "Verify Email Address" button, copy and '
        "paste the URL below into your web browser: "
        f'<span class="break-all"><a href="{href}">{href}</a></span></p>'
    )
    send(mailbox_server, isolated_mailbox.address, "Verify Email Address", text, html)

    msg = isolated_mailbox.wait_for(subject="Verify Email Address", timeout=10)

    assert msg.links() == [SIGNED]
    assert msg.link(domain="app.example.test") == SIGNED


@pytest.mark.parametrize(
    "when",
    [
        "2026-12-03 16:30 UTC",  # ISO 8601, as a security notice states it
        "2026-12-03T16:30:05Z",
        "03/12/2026 16:30",
        "03.12.2026 um 16:30 Uhr",
        "Thu, 3 Dec 2026 16:30:05 +0000",  # RFC 5322, as a forwarded mail's header shows it
    ],
)
def test_the_date_a_code_mail_states_is_no_second_code(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, when: str
) -> None:
    """A sign-in code mail says when it was asked for: the year of that date was a second
    code, and code() refused the mail as ambiguous ("2 distinct codes"). A date's and a
    time's digits are no code, as they are not masked as one."""
    text = (
        "Use this code to finish signing in:\n\n    482913\n\n"
        f"Requested: {when} from Firefox on Linux.\n"
        "If this wasn't you, reset your password.\n"
    )
    send(mailbox_server, isolated_mailbox.address, "Your sign-in code", text)

    msg = isolated_mailbox.wait_for(subject="Your sign-in code", timeout=10)

    assert msg.code() == "482913"


@pytest.mark.parametrize(
    ("in_text", "in_html"),
    [
        # The site's domain as configured in the text; a URL builder's IDNA form in the HTML.
        ("https://bücher.example.test/verify", "https://xn--bcher-kva.example.test/verify"),
        ("https://App.Example.Test/verify", "https://app.example.test/verify"),
        ("HTTPS://app.example.test/verify", "https://app.example.test/verify"),
        ("https://app.example.test:443/verify", "https://app.example.test/verify"),
        ("http://localhost:80/verify", "http://LOCALHOST/verify"),
    ],
)
def test_one_link_spelt_two_ways_in_text_and_html_is_one_link(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, in_text: str, in_html: str
) -> None:
    """The text and the HTML part of one mail may spell the host of their one link
    differently (case, IDNA, its scheme's port written out): a browser visits one page, and
    link() looks for hosts so compared, but took them for two links and refused both as
    ambiguous. The text's spelling is the one returned, as the first found."""
    token = "?token=Zq8XkLmN4pR7tVwY2bC9dE"
    html = f'<p><a href="{in_html}{token}">Verify</a></p><a href="mailto:help@app.test">Help</a>'
    send(mailbox_server, isolated_mailbox.address, "Verify", f"Verify: {in_text}{token}\n", html)

    msg = isolated_mailbox.wait_for(subject="Verify", timeout=10)

    assert msg.links() == [in_text + token]
    assert msg.link() == in_text + token
    # A link on another port, or with another path, is another link still.
    other = f'<a href="{in_html.replace("/verify", ":8443/verify")}{token}">v</a>'
    send(mailbox_server, isolated_mailbox.address, "Other", f"{in_text}{token}\n", other)
    assert len(isolated_mailbox.wait_for(subject="Other", timeout=10).links()) == 2


@pytest.mark.parametrize(
    "number",
    ["1-800-555-0199", "+1 (555) 010-4477", "555.010.4477", "+49 30 901820-0", "ref. 2026-000417"],
)
def test_a_phone_or_reference_number_beside_a_code_is_no_second_code(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, number: str
) -> None:
    """A bank's or a telco's code mail gives a number to call in its footer: its last
    group of digits was a second code (``0199``), and code() refused the mail as
    ambiguous. Digits joined to other digits by a dash or a dot are a part of a longer
    number, not a code standing alone."""
    text = (
        "Your one-time passcode is 482913. It expires in 10 minutes.\n\n"
        f"Didn't ask for it? Call us: {number}\n"
    )
    html = f"<p>Your one-time passcode is <b>482913</b>.</p><p>Call us: {number}</p>"
    send(mailbox_server, isolated_mailbox.address, "Your passcode", text, html)

    msg = isolated_mailbox.wait_for(subject="Your passcode", timeout=10)

    assert msg.code() == "482913"
    # An HTML-only mail too, whose code its inline tags glue to words.
    glued = f"<p>Passcode<b>482913</b></p><p>Call us:{number}</p>"
    send(mailbox_server, isolated_mailbox.address, "Glued", "", glued)
    assert isolated_mailbox.wait_for(subject="Glued", timeout=10).code() == "482913"


@pytest.mark.parametrize(
    "footer",
    [
        "\N{COPYRIGHT SIGN} 2026 Laravel. All rights reserved.",  # Laravel's mail layout
        "Copyright \N{COPYRIGHT SIGN} 2026 Acme, Inc.",
        "Copyright (c) 2024-2026 Acme, Inc.",
        "(C) 2026 Acme",
    ],
)
def test_a_copyright_year_in_a_footer_is_no_second_code(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, footer: str
) -> None:
    """Laravel's markdown mails, as most templates, end with a copyright line, in the text
    part and the HTML's: its year was a second code, so code() refused every such code mail
    as ambiguous. A year alone elsewhere (``Invoice 2026``) is a code still."""
    text = f"Your login code is 482913.\n\nThanks,\nLaravel\n\n{footer}\n"
    html = (
        "<p>Your login code is <strong>482913</strong>.</p>"
        f'<table class="footer"><tr><td><p>{footer.replace("©", "&copy;")}</p></td></tr></table>'
    )
    send(mailbox_server, isolated_mailbox.address, "Login code", text, html)

    msg = isolated_mailbox.wait_for(subject="Login code", timeout=10)

    assert msg.code() == "482913"
    send(mailbox_server, isolated_mailbox.address, "Invoice 2026", text, html)
    with pytest.raises(ExtractionError, match="2 distinct codes"):
        isolated_mailbox.wait_for(subject="Invoice 2026", timeout=10).code()


@pytest.mark.parametrize(
    "text",
    [
        "Your code: 4829 12:00 UTC is when it was sent.",  # a code, then a time
        "Code 4829 1:30 pm",
        "Copyright\n4829",  # a code on the line after a footer's word
        "Code\N{COPYRIGHT SIGN}\n4829",
    ],
)
def test_a_four_digit_code_beside_a_time_or_a_footer_word_is_still_the_code(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, text: str
) -> None:
    """A year is taken out of a date only after a month's name (``Dec 2026 16:30``), and out
    of a copyright line only on its own line: a code before a time was blanked as the year
    of an RFC 5322 date, and one on the line after "Copyright" as its year."""
    send(mailbox_server, isolated_mailbox.address, "Your code", text)

    msg = isolated_mailbox.wait_for(subject="Your code", timeout=10)

    assert msg.code() == "4829"


def test_a_copyright_year_is_told_by_a_short_gap_after_its_sign() -> None:
    """The gap between ``©`` and its year is bounded: unbounded, each ``©`` of a long run
    started a scan to the run's end (30,000 of them beside a code: 5 s in ``code()``)."""
    assert _DATE_OR_TIME.fullmatch("\N{COPYRIGHT SIGN}" + " " * 8 + "2026")
    assert _DATE_OR_TIME.fullmatch("\N{COPYRIGHT SIGN}" + " " * 9 + "2026") is None
    assert _DATE_OR_TIME.fullmatch("\N{COPYRIGHT SIGN}\n2026") is None


def test_what_follows_a_markdown_bracket_in_a_link_is_still_masked_and_no_code(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """A text link ends at ``](`` for ``links()``; masking and ``code()`` still take the
    link as far as it may run, so a token after an unencoded ``](`` is not shown, nor a
    relative target's number taken for a second code."""
    shown = mask_subject("https://app.example.test/reset?x=](y)&token=plum-tiger-cloud-river")
    assert "plum-tiger-cloud-river" not in shown
    text = "Your code is 4829.\n[https://app.example.test/unsubscribe](/unsubscribe/58203917)\n"
    send(mailbox_server, isolated_mailbox.address, "Your code", text)

    msg = isolated_mailbox.wait_for(subject="Your code", timeout=10)

    assert msg.code() == "4829"


TOKEN_LINK = "https://app.example.test/verify?token=Zq8xYtK2mP4rT7wQ9sL1"


def send_raw(server: MailSink, to: str, body: bytes) -> bytes:
    """A mail whose MIME part the test writes itself, as a sender's own mailer wrote it,
    over SMTP; the bytes sent."""
    raw = (
        f"From: hello@app.example.test\r\nTo: {to}\r\nSubject: Your sign-in link\r\n"
        "MIME-Version: 1.0\r\n"
    ).encode() + body
    with smtplib.SMTP(server.host, server.port) as smtp:
        assert smtp.sendmail("hello@app.example.test", [to], raw) == {}
    return raw


def test_a_soft_line_break_padded_with_white_space_keeps_the_link_and_code_whole(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """RFC 2045 6.7: a transport may add white space at a line's end, which a decoder must
    drop, so ``= `` then CRLF is a soft line break. The email package keeps it as text:
    link() returned the link cut at its ``=``, a 404 for the test that opened it."""
    body = (
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        b"Sign in: https://app.example.test/verify?token=3DZq8xYtK2m= \r\n"
        b"P4rT7wQ9sL1\r\nor enter 482=\t\r\n913.\r\n"
    )
    raw = send_raw(mailbox_server, isolated_mailbox.address, body)

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.raw == raw
    assert msg.link() == TOKEN_LINK
    assert msg.code() == "482913"
    assert msg.text == f"Sign in: {TOKEN_LINK}\nor enter 482913.\n"


def test_a_body_whose_base64_does_not_decode_is_read_as_none_and_named_in_the_error(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """The email package returns base64 it cannot decode (a character too many: a body cut
    off) undecoded: its text was the base64 itself, and code() could take a run of its
    digits for the code. Decoding what comes before the cut could cut a code short
    (``48291``): the body is read as none, and link() and code() say why they found
    nothing."""
    text = base64.b64encode(f"Sign in: {TOKEN_LINK}\r\nCode 482913\r\n".encode()).decode()
    body = (
        b"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        + text[:-3].encode()  # 4n+1 characters: no base64 decoder can read the last one
        + b"\r\n"
    )
    raw = send_raw(mailbox_server, isolated_mailbox.address, body)

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.raw == raw
    assert msg.text == ""
    assert "InvalidBase64LengthDefect" in msg.defects
    note = "not read: its text/plain body, whose base64 does not decode"
    with pytest.raises(ExtractionError, match=f"hosts found: none; {note}"):
        msg.link()
    with pytest.raises(ExtractionError, match=note):
        msg.code()


def test_format_flowed_with_delsp_joins_a_link_cut_at_its_soft_line_break(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """RFC 3676: in ``format=flowed`` text a line that ends in a space goes on in the next,
    and with ``delsp=yes`` (Apple Mail's) that space is not the text's: a long link is cut
    there with nothing between its halves. link() returned the link cut at the break
    (``…?token=Zq8xYtK2m``), and ``body_contains`` of the whole link never matched."""
    body = (
        b"Content-Type: text/plain; charset=utf-8; format=flowed; delsp=yes\r\n\r\n"
        b"Sign in with this link:  \r\n"
        b"https://app.example.test/verify?token=Zq8xYtK2m \r\n"
        b"P4rT7wQ9sL1  \r\nor enter 482913.\r\n"
        b"\r\n"
        b"-- \r\n"
        b"The App team\r\n"
    )
    send_raw(mailbox_server, isolated_mailbox.address, body)

    msg = isolated_mailbox.wait_for(body_contains=TOKEN_LINK, timeout=10)

    assert msg.text == (
        f"Sign in with this link: {TOKEN_LINK} or enter 482913.\n\n-- \nThe App team\n"
    )
    assert msg.links() == [TOKEN_LINK]
    assert msg.link() == TOKEN_LINK
    assert msg.code() == "482913"


@pytest.mark.parametrize("opening", ["<", "<URL:"])
def test_a_link_in_angle_brackets_cut_by_a_line_break_is_one_link(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, opening: str
) -> None:
    """RFC 3986 appendix C: a link in ``<…>`` may be wrapped, and the white space of the
    wrap is not the link's. link() returned the link cut at the line break
    (``https://app.example.test/verify/``), and code() took the digits that began its
    second line for a second code."""
    link = "https://app.example.test/verify/58203917?token=Zq8xYtK2mP4rT7wQ9sL1"
    body = (
        "Content-Type: text/plain; charset=utf-8\r\n\r\n"
        "Your code is 482913, or open\r\n"
        f"{opening}https://app.example.test/verify/\r\n"
        "   58203917?token=Zq8xYtK2mP4rT7wQ9sL1> to\r\n"
        "sign in.\r\n"
    )
    send_raw(mailbox_server, isolated_mailbox.address, body.encode())

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.links() == [link]
    assert msg.link() == link
    assert msg.code() == "482913"


@pytest.mark.parametrize("blank", ["", " \t"], ids=["empty", "white-space"])
def test_a_cleartext_signed_body_is_read_without_its_signature(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, blank: str
) -> None:
    """An OpenPGP cleartext signature (RFC 4880 7) is base64 in the text body, after the
    text it signs: its digits between ``+`` and ``/`` stood alone as codes, and GPGTools'
    ``Comment:`` link was a second link, so code() and link() refused a mail that shows
    one of each. The text read is the signed text, dash escapes undone. The blank line
    after the armor headers may hold white space (RFC 4880 6.2): the signed text was read
    from its second paragraph on, without the link and code of its first."""
    body = (
        "Content-Type: text/plain; charset=utf-8\r\n\r\n"
        f"-----BEGIN PGP SIGNED MESSAGE-----\r\nHash: SHA256\r\n{blank}\r\n"
        f"Sign in: {TOKEN_LINK}\r\nor enter 482913.\r\n\r\n- -- \r\nThe App team\r\n"
        "-----BEGIN PGP SIGNATURE-----\r\n"
        "Comment: GPGTools - https://gpgtools.example.test\r\n\r\n"
        "iQEzBAEBCAAdFiEE7n+g/1234567+Xr9wsFcBAABCAAQBQJ/654321+bXq0JhAAoJEN\r\n"
        "=7731\r\n-----END PGP SIGNATURE-----\r\n"
    )
    send_raw(mailbox_server, isolated_mailbox.address, body.encode())

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.text == f"Sign in: {TOKEN_LINK}\nor enter 482913.\n\n-- \nThe App team\n"
    assert msg.links() == [TOKEN_LINK]
    assert msg.link() == TOKEN_LINK
    assert msg.code() == "482913"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain; charset=us-ascii",
        "text/plain; charset=utf-8",
        "text/plain; charset=iso-8859-1",
    ],
)
def test_windows_1252_under_another_label_or_none_is_read_as_windows_1252(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, content_type: str
) -> None:
    """A mailer that writes windows-1252 (an em dash is 0x97) under no charset, ``utf-8``
    or ``iso-8859-1``: the body read 0x97 as U+FFFD or the C1 control U+0097, neither of
    which ends a link, and link() returned the link with the next word glued to it
    (``…sL1\ufffdit``), a 404 to open. Bytes that are not UTF-8 are read as
    windows-1252, as the WHATWG Encoding Standard reads those labels."""
    text = (
        f"Open {TOKEN_LINK}\N{EM DASH}it expires soon. Code\N{NO-BREAK SPACE}482913, caf\xe9.\r\n"
    )
    body = (
        f"Content-Type: {content_type}\r\nContent-Transfer-Encoding: 8bit\r\n\r\n".encode()
        + text.encode("cp1252")
    )
    send_raw(mailbox_server, isolated_mailbox.address, body)

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.text == text.replace("\r\n", "\n")
    assert msg.links() == [TOKEN_LINK]
    assert msg.link() == TOKEN_LINK
    assert msg.code() == "482913"


def test_a_byte_its_charset_has_no_character_for_ends_a_link(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """A byte the declared charset cannot read (0x97 in ISO-2022-JP) is U+FFFD, and a C1
    control (U+0080 to U+009F) is no character of a link either: link() glued the word
    after it to the link."""
    body = (
        b"Content-Type: text/plain; charset=iso-2022-jp\r\n\r\n"
        + f"Open {TOKEN_LINK}".encode()
        + b"\x97it expires soon. Code 482913\r\n"
    )
    send_raw(mailbox_server, isolated_mailbox.address, body)

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert f"{TOKEN_LINK}\N{REPLACEMENT CHARACTER}it" in msg.text
    assert msg.links() == [TOKEN_LINK]
    assert msg.code() == "482913"


FORWARDED = (
    "From: it@app.example.test\r\nSubject: Your sign-in link\r\n"
    f"Content-Type: text/plain\r\n\r\nSign in: {TOKEN_LINK}\r\nCode 482913\r\n"
)


@pytest.mark.parametrize(
    ("body", "unread"),
    [
        (
            'Content-Type: multipart/mixed; boundary="M"\r\n\r\n--M\r\n'
            "Content-Type: text/plain; charset=utf-8\r\n\r\nForwarded below.\r\n--M\r\n"
            f"Content-Type: message/rfc822\r\n\r\n{FORWARDED}\r\n--M--\r\n",
            "an attached message (message/rfc822)",
        ),
        (f"Content-Type: message/rfc822\r\n\r\n{FORWARDED}", "an attached message"),
        (
            'Content-Type: multipart/mixed; boundary="M"\r\n\r\n--M\r\n'
            "Content-Type: text/plain\r\n"
            'Content-Disposition: attachment; filename="https://app.example.test/link.txt"'
            f"\r\n\r\nSign in: {TOKEN_LINK}\r\nCode 482913\r\n--M--\r\n",
            "an attached file (text/plain)",
        ),
        (
            "Content-Type: text/calendar; charset=utf-8; method=REQUEST\r\n\r\n"
            "BEGIN:VCALENDAR\r\nMETHOD:REQUEST\r\nBEGIN:VEVENT\r\n"
            f"DESCRIPTION:Join {TOKEN_LINK}\\nPasscode: 482913\r\n"
            "END:VEVENT\r\nEND:VCALENDAR\r\n",
            "its text/calendar part",
        ),
        (
            'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n'
            "\r\n--B\r\nContent-Type: text/plain\r\n\r\nYour message could not be "
            "delivered.\r\n--B\r\nContent-Type: message/delivery-status\r\n\r\n"
            "Reporting-MTA: dns; mx.example.test\r\n\r\nFinal-Recipient: rfc822; "
            "bob@example.test\r\nAction: failed\r\nStatus: 5.1.1\r\n--B\r\n"
            "Content-Type: text/rfc822-headers\r\n\r\nSubject: Your code 482913\r\n--B--\r\n",
            "its report (message/delivery-status), its text/rfc822-headers part",
        ),
        (
            'Content-Type: multipart/report; report-type=global-delivery-status; boundary="B"'
            "\r\n\r\n--B\r\nContent-Type: text/plain\r\n\r\nYour message could not be "
            "delivered.\r\n--B\r\nContent-Type: message/global-delivery-status\r\n\r\n"
            "Reporting-MTA: dns; mx.example.test\r\n\r\nFinal-Recipient: utf-8; "
            "bob@example.test\r\nAction: failed\r\nStatus: 5.1.1\r\n--B\r\n"
            "Content-Type: message/global-headers\r\n\r\nSubject: Your code 482913\r\n--B--\r\n",
            "its report (message/global-delivery-status), its message/global-headers part",
        ),
    ],
    ids=[
        "forwarded",
        "forwarded-alone",
        "attached-text-named-like-a-link",
        "invitation-alone",
        "bounce-with-headers",
        "bounce-of-smtputf8-mail",
    ],
)
def test_a_forwarded_message_or_an_attached_file_is_not_read_and_the_error_says_so(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, body: str, unread: str
) -> None:
    """A link or code in a forwarded message or an attached file is not the mail's own
    (a forwarded mail's link was for someone else): link() and code() said "the message
    has no http(s) links", which sent a reader looking for the sender's bug. So they said
    of an invitation's text/calendar alone, and they called a bounce's report (RFC 3464)
    "an attached message"."""
    raw = send_raw(mailbox_server, isolated_mailbox.address, body.encode())

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.raw == raw
    with pytest.raises(ExtractionError, match=re.escape(f"none; not read: {unread}")) as e:
        msg.link()
    assert "has no http(s) links" not in str(e.value)
    assert "Zq8xYtK2m" not in str(e.value)
    with pytest.raises(ExtractionError, match=re.escape(f"not read: {unread}")):
        msg.code()


@pytest.mark.parametrize(
    ("named", "kind"),
    [
        (
            'Content-Type: text/plain\r\nContent-Disposition: inline; filename="invoice.txt"',
            "plain",
        ),
        ('Content-Type: text/plain; name="invoice.txt"', "plain"),
        (
            "Content-Type: text/plain\r\n"
            "Content-Disposition: inline; filename*=utf-8''r%C3%A9sum%C3%A9.txt",
            "plain",
        ),
        ('Content-Type: text/html; name="statement.html"', "html"),
    ],
    ids=["inline-filename", "content-type-name", "rfc2231-filename", "html-file"],
)
def test_a_file_named_but_not_marked_attachment_is_not_read_as_the_body(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, named: str, kind: str
) -> None:
    """Apple Mail attaches a text file ``inline`` with its ``filename``, older mailers name
    it in ``Content-Type`` alone: the email package's ``get_body`` took such a file, after
    the mail's HTML (or text) body, for the body, and code() and link() answered the file's
    number and link (``123456``, the billing link) with no error."""
    own = (
        f'<p>Your code is <b>482913</b>. <a href="{TOKEN_LINK}">Sign in</a></p>'
        if kind == "plain"
        else f"Your code is 482913. Sign in: {TOKEN_LINK}"
    )
    file = "Statement 2026-000417, total 123456: https://billing.example.test/s?id=Zq8pL2vXc4Nm7RtQ"
    body = (
        'Content-Type: multipart/mixed; boundary="M"\r\n\r\n--M\r\n'
        f"Content-Type: text/{'html' if kind == 'plain' else 'plain'}; charset=utf-8\r\n\r\n"
        f"{own}\r\n--M\r\n{named}\r\n\r\n{file}\r\n--M--\r\n"
    )
    send_raw(mailbox_server, isolated_mailbox.address, body.encode())

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert (msg.text if kind == "plain" else msg.html) == ""
    assert msg.code() == "482913"
    assert msg.links() == [TOKEN_LINK]
    assert msg.link() == TOKEN_LINK
    with pytest.raises(
        ExtractionError, match=re.escape(f"not read: an attached file (text/{kind})")
    ):
        msg.code(pattern=r"total (\d+)")


def test_a_body_whose_every_text_part_is_named_is_read(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """Some mailers name the body's parts (``text/html; name="body.html"``, as a TNEF
    conversion writes Outlook's body), which RFC 2183 leaves the body: with no part
    without a name to be the body, a named part not marked ``attachment`` is read, where
    code() said "no code" and ``msg.text`` was empty."""
    body = (
        'Content-Type: multipart/mixed; boundary="M"\r\n\r\n--M\r\n'
        'Content-Type: multipart/alternative; boundary="A"\r\n\r\n--A\r\n'
        'Content-Type: text/plain; charset=utf-8; name="body.txt"\r\n\r\n'
        f"Your code is 482913. Sign in: {TOKEN_LINK}\r\n--A\r\n"
        'Content-Type: text/html; charset=utf-8; name="body.html"\r\n\r\n'
        f'<p>Your code is <b>482913</b>. <a href="{TOKEN_LINK}">Sign in</a></p>\r\n--A--\r\n'
        '--M\r\nContent-Type: application/pdf; name="terms.pdf"\r\n'
        'Content-Disposition: attachment; filename="terms.pdf"\r\n'
        "Content-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQK\r\n--M--\r\n"
    )
    send_raw(mailbox_server, isolated_mailbox.address, body.encode())

    msg = isolated_mailbox.wait_for(subject="Your sign-in link", timeout=10)

    assert msg.text == f"Your code is 482913. Sign in: {TOKEN_LINK}"
    assert "<b>482913</b>" in msg.html
    assert msg.code() == "482913"
    assert msg.links() == [TOKEN_LINK]
    assert msg.link() == TOKEN_LINK


def test_a_code_in_the_html_beside_a_stub_text_part_is_found(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """Mailers that send HTML mail add a text part that only says where to read it (``View
    this email in your browser``): code() read that part alone, and said "no code" of a
    mail that plainly showed one. The HTML part is read when the text part has none."""
    text = "View this email in your browser: https://app.example.test/view/8f3a9c77d1e2\n"
    html = (
        "<p>Your sign-in code is <b>482913</b>.</p>"
        '<p><a href="https://app.example.test/verify?code=482913">Sign in</a></p>'
        "<p>\N{COPYRIGHT SIGN} 2026 Example</p>"
    )
    send(mailbox_server, isolated_mailbox.address, "Your sign-in code", text, html)

    msg = isolated_mailbox.wait_for(subject="Your sign-in code", timeout=10)

    assert msg.code() == "482913"
    assert msg.code(pattern=r"code=(\d+)") == "482913"  # in the HTML's link
    assert msg.body_text == text  # what selectors search is still the text part


@pytest.mark.parametrize(
    ("shown", "html"),
    [
        ("483 920", "<p>Your code is</p><p style='letter-spacing:4px'>483&nbsp;920</p>"),
        ("483-920", "<p>Your code is <b>483-920</b></p>"),
        ("483\N{NO-BREAK SPACE}920", "<p>Your code is <b>483&nbsp;920</b></p>"),
        ("48 39 20", "<p>Your code is <b>48 39 20</b></p>"),
    ],
)
def test_a_code_written_in_groups_is_the_code_as_its_form_takes_it(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, shown: str, html: str
) -> None:
    """Sign-in mails write a code in groups to be read (``483 920``, ``483-920``): code()
    found no code in them, and a test had to pass pattern= and join the groups itself. Its
    digits are returned, as a six-digit field takes them; a phone number in the footer,
    a date, and the mail's order reference (``#555-210``) are no second code."""
    text = (
        f"Your verification code is {shown}. It expires in 10 minutes.\n\n"
        "Order #555-210 placed on 03-12-26.\n"
        "Questions? Call +1 (555) 010-4477 or 01 23 45 67 89.\n"
    )
    send(mailbox_server, isolated_mailbox.address, "Your code", text, html)

    msg = isolated_mailbox.wait_for(subject="Your code", timeout=10)

    assert msg.code() == "483920"
    send(mailbox_server, isolated_mailbox.address, "Two codes", f"{text}Old code: 112 358\n")
    with pytest.raises(ExtractionError, match="2 distinct codes"):
        isolated_mailbox.wait_for(subject="Two codes", timeout=10).code()
