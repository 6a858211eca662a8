"""Message parsing, extraction and redaction: right on good mail, never raising on bad mail."""

from __future__ import annotations

import hashlib
import hmac
import importlib
import pkgutil
import re
from collections.abc import Callable
from datetime import datetime, timezone
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_mailbox
from pytest_mailbox import message as message_module
from pytest_mailbox.contract import Selector, _regex_problem
from pytest_mailbox.errors import ExtractionError
from pytest_mailbox.message import (
    MAX_PARSED_HEADER,
    Index,
    Masker,
    Message,
    Recorded,
    digest,
    index,
    mask_address,
    mask_copied,
    mask_recorded,
    mask_secrets,
    mask_subject,
    redact_url,
    remember_extracted,
    shown_host,
)

TOKEN = "8f3a9c77d1e24b6a"
OTHER_TOKEN = "b71c0e5529aa4f13"
VERIFY = f"https://app.example.test/verify/{TOKEN}?token={TOKEN}&next=home"

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def build(
    *,
    text: str | None = None,
    html: str | None = None,
    subject: str | None = "Verify your account",
    sender: str = "App <noreply@app.example.test>",
    to: str = "user@mail.test",
    charset: str = "utf-8",
    cte: str | None = None,
    extra: dict[str, str] | None = None,
) -> bytes:
    """A well-formed message as the email package would send it."""
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    if subject is not None:
        msg["Subject"] = subject
    for name, value in (extra or {}).items():
        msg[name] = value
    if text is not None:
        msg.set_content(text, charset=charset, cte=cte)
        if html is not None:
            msg.add_alternative(html, subtype="html")
    elif html is not None:
        msg.set_content(html, subtype="html", cte=cte)
    return msg.as_bytes()


def plain(body: str, subject: str = "Hello") -> Message:
    """A text/plain message with ``body``, identified as m-1."""
    return Message(build(text=body, subject=subject), message_id="m-1")


def touch_everything(message: Message) -> None:
    """Read every property and call every never-raising method, checking the types."""
    assert isinstance(message.subject, str)
    assert isinstance(message.sender, str)
    assert all(isinstance(a, str) for a in message.to)
    assert all(isinstance(n, str) and isinstance(v, str) for n, v in message.headers)
    assert message.header("From") is None or isinstance(message.header("From"), str)
    assert message.run_header() is None or isinstance(message.run_header(), str)
    assert isinstance(message.text, str)
    assert isinstance(message.html, str)
    assert isinstance(message.body_text, str)
    assert all(isinstance(d, str) for d in message.defects)
    assert all(link.lower().startswith(("http://", "https://")) for link in message.links())
    assert repr(message).startswith("<Message ")


# -- well-formed mail ------------------------------------------------------------------------


def test_multipart_alternative_exposes_both_bodies_and_headers() -> None:
    raw = build(
        text="Hello,\nconfirm here.\n",
        html="<p>Hello,</p><p>confirm <b>here</b>.</p>",
        to="User <user@mail.test>, other@mail.test",
        extra={"X-Run-Id": "run-42 "},
    )
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    message = Message(
        raw,
        message_id="m-1",
        envelope_from="bounce@app.example.test",
        envelope_to="user@mail.test",
        received_at=when,
        seq=7,
    )

    assert message.raw == raw
    assert (message.message_id, message.seq, message.received_at) == ("m-1", 7, when)
    assert (message.envelope_from, message.envelope_to) == (
        "bounce@app.example.test",
        "user@mail.test",
    )
    assert message.subject == "Verify your account"
    assert message.sender == "noreply@app.example.test"
    assert message.to == ["user@mail.test", "other@mail.test"]
    assert message.text == "Hello,\nconfirm here.\n"
    assert message.html.startswith("<p>Hello,</p>")
    assert message.body_text == message.text
    assert message.header("subject") == "Verify your account"
    assert message.header("FROM") == "App <noreply@app.example.test>"
    assert message.header("X-Missing") is None
    assert message.run_header() == "run-42"
    assert ("To", "User <user@mail.test>, other@mail.test") in message.headers
    assert message.defects == []


def test_quoted_printable_body_is_decoded() -> None:
    body = "Total = 100 €, " + "long line " * 20 + "\n"
    raw = build(text=body, cte="quoted-printable")

    assert b"quoted-printable" in raw
    assert b"=3D" in raw
    assert Message(raw).text == body


def test_base64_body_is_decoded() -> None:
    body = "Grüße aus Köln, your code is 482913\n"
    raw = build(text=body, cte="base64")

    assert b"Content-Transfer-Encoding: base64" in raw
    assert "Grüße".encode() not in raw
    assert Message(raw).text == body


def test_rfc2047_subject_and_utf8_body() -> None:
    raw = build(text="Bienvenue, élève naïve ✓\n", subject="Vérifiez votre compte — ✓")

    assert b"=?utf-8?" in raw
    message = Message(raw)
    assert message.subject == "Vérifiez votre compte — ✓"
    assert message.text == "Bienvenue, élève naïve ✓\n"


def test_latin1_body_is_decoded_by_charset() -> None:
    raw = build(text="Café crème à la française\n", charset="latin-1")

    assert b"iso-8859-1" in raw
    assert "Café".encode("latin-1") in raw
    assert Message(raw).text == "Café crème à la française\n"


def test_raw_8bit_latin1_body_with_declared_charset() -> None:
    raw = b"Subject: hi\r\nContent-Type: text/plain; charset=iso-8859-1\r\n\r\nna\xefve caf\xe9\r\n"

    message = Message(raw)
    assert message.text == "naïve café\n"
    assert message.defects == []


def test_folded_subject_whitespace_is_normalized() -> None:
    raw = b"Subject: Verify\r\n\tyour\r\n    account\r\nFrom: a@b.test\r\n\r\nbody\r\n"

    assert Message(raw).subject == "Verify your account"


def test_encoded_words_across_folds_join() -> None:
    raw = b"Subject: =?utf-8?q?V=C3=A9rifiez?=\r\n =?utf-8?q?_votre_compte?=\r\n\r\nx\r\n"

    assert Message(raw).subject == "Vérifiez votre compte"


def test_missing_headers_give_empty_values() -> None:
    message = Message(b"\r\njust a body\r\n")

    assert message.subject == ""
    assert message.sender == ""
    assert message.to == []
    assert message.headers == []
    assert message.header("From") is None
    assert message.run_header() is None
    assert message.text == "just a body\n"
    assert message.html == ""


def test_sender_is_the_addr_spec_even_from_a_sloppy_header() -> None:
    assert Message(b"From: noreply@app.example.test\r\n\r\n").sender == "noreply@app.example.test"
    assert Message(b'From: "Team, App" <team@app.example.test>\r\n\r\n').sender == (
        "team@app.example.test"
    )
    assert Message(b"From: broken <foo@bar.test\r\n\r\n").sender == "foo@bar.test"
    assert Message(b"From: <<<>>>\r\n\r\n").sender == ""


def test_html_only_mail_derives_body_text() -> None:
    html = (
        "<html><head><title>Ignored title</title><style>p {color: red}</style></head>"
        "<body><h1>Welcome&nbsp;aboard</h1>\n\n<p>Fish &amp; chips &lt;3</p>"
        "<script>var code = 999999;</script><div>Your code:   <b>482913</b></div></body></html>"
    )
    message = Message(build(html=html))

    assert message.text == ""
    assert message.html.startswith("<html>")
    assert message.body_text == "Welcome aboard Fish & chips <3 Your code: 482913"
    assert message.code() == "482913"


def test_html_body_text_survives_stray_end_tags_templates_and_a_blank_text_part() -> None:
    html = "<p>Hi</p></script><template><p>Code 111111</p></template><p>Your code: 482913</p>"
    for message in (Message(build(html=html)), Message(build(text=" \n", html=html))):
        assert message.body_text == "Hi Your code: 482913"
        assert message.code() == "482913"


def test_text_part_that_is_an_attachment_is_not_the_body() -> None:
    msg = EmailMessage()
    msg["Subject"] = "report"
    msg.set_content("see attached")
    msg.add_attachment("secret,1234\n", filename="data.csv")
    message = Message(msg.as_bytes())

    assert message.text == "see attached\n"


def test_repr_shows_id_sender_and_subject_but_no_body() -> None:
    message = Message(build(text=f"token {TOKEN}"), message_id="m-1")

    assert repr(message) == (
        "<Message m-1 from=noreply@app.example.test subject='Verify your account'>"
    )
    assert TOKEN not in repr(message)


# -- links -----------------------------------------------------------------------------------


def test_links_from_text_strip_trailing_punctuation_and_dedupe() -> None:
    body = (
        "Open https://app.example.test/a. Or (see https://help.example.test/faq), "
        "then https://app.example.test/a again!\n"
        "Wiki: https://wiki.example.test/Page_(x)) and [docs](https://docs.example.test/x)?\n"
        "Plain http://old.example.test/p;"
    )
    message = plain(body)

    assert message.links() == [
        "https://app.example.test/a",
        "https://help.example.test/faq",
        "https://wiki.example.test/Page_(x)",
        "https://docs.example.test/x",
        "http://old.example.test/p",
    ]


def test_links_from_html_unescape_entities_and_follow_text_links() -> None:
    html = (
        '<a href="https://app.example.test/v?a=1&amp;b=2">verify</a>'
        '<a href="https://app.example.test/first">again</a>'
        '<a href="mailto:help@example.test">mail</a><a href="/relative">rel</a>'
        "<a href='\n https://cdn.example.test/img \n'>cdn</a><a>no href</a>"
    )
    message = Message(build(text="First https://app.example.test/first\n", html=html))

    assert message.links() == [
        "https://app.example.test/first",
        "https://app.example.test/v?a=1&b=2",
        "https://cdn.example.test/img",
    ]


def test_links_end_before_an_exclamation_mark_and_skip_other_schemes_and_line_breaks() -> None:
    html = (
        '<a href="ftp://files.example.test/x">file</a>'
        '<a href="https://app.example.test/ver&#10;ify?t=&#9;1">verify</a>'
    )
    message = Message(build(text="Done? Go to https://app.example.test/a!\n", html=html))

    assert message.links() == ["https://app.example.test/a", "https://app.example.test/verify?t=1"]


def test_link_by_domain_returns_the_one_link_and_reports_the_secret() -> None:
    seen: list[tuple[str, str, str | None]] = []
    body = f"Verify: {VERIFY}\nHelp: https://help.example.test/faq\n"
    message = Message(build(text=body), message_id="m-1", on_secret=lambda *a: seen.append(a))

    assert message.link("app.example.test") == VERIFY
    assert message.link("APP.Example.TEST.") == VERIFY
    assert message.link("app.example.test:443") == VERIFY
    assert message.link("https://app.example.test/") == VERIFY
    assert seen[0] == ("link", VERIFY, "app.example.test")
    assert len(seen) == 4


def test_a_messages_repr_escapes_a_direction_override_in_its_sender() -> None:
    """pytest shows a Message's repr in a traceback (a local, an assertion): a sender
    with a right-to-left override (a UTF-8 header, sent with SMTPUTF8) reordered the line."""
    raw = "From: no\u202ereply@app.example.test\r\nSubject: Hi\r\n\r\nhello\r\n"
    message = Message(raw.encode(), message_id="m-1")

    assert repr(message) == "<Message m-1 from=no\\u202ereply@app.example.test subject='Hi'>"


@pytest.mark.parametrize(
    ("host", "shown"),
    [
        ("app.\u202eexample.test", "app.\\u202eexample.test"),  # a right-to-left override
        ("app.\u2066tset\u2069.test", "app.\\u2066tset\\u2069.test"),  # an isolate
        ("app.exam\u200bple.test", "app.exam\\u200bple.test"),  # a zero-width space
        ("app.example.test\ufeff", "app.example.test\\ufeff"),  # a byte order mark
    ],
    ids=["rlo", "isolate", "zero-width", "bom"],
)
def test_a_host_with_characters_that_show_nothing_is_shown_with_them_escaped(
    host: str, shown: str
) -> None:
    """The hosts that a link asked for on another host lists (in the test's terminal) and
    the host a receipt records showed a direction override as it is, which reorders the
    line it is printed on, and a zero-width space unseen: ``hosts found:
    app.exam\u200bple.test`` read as the host that was asked for."""
    seen: list[tuple[str, str, str | None]] = []
    url = f"https://{host}/welcome"
    message = Message(
        build(text=f"Open {url} now\n"), message_id="m-1", on_secret=lambda *a: seen.append(a)
    )

    with pytest.raises(ExtractionError) as info:
        message.link(domain="other.example.test")
    assert str(info.value).endswith(f"hosts found: {shown}")
    assert str(info.value).isprintable()
    assert message.link() == url  # the link itself as the mail wrote it
    assert seen == [("link", url, shown)]
    assert message_module.redact_url(url) == f"https://{shown}/…"


def test_an_ipv6_hosts_zone_with_a_character_that_shows_nothing_is_shown_escaped() -> None:
    """An IPv6 address's zone is any text (``[fe80::1%eth0]``): a direction override there
    was shown as it is in link()'s error, a receipt's host and a redacted link, where every
    other host has it escaped."""
    seen: list[tuple[str, str, str | None]] = []
    url = "https://[fe80::1%\u202eeth0]/welcome"
    message = Message(
        build(text=f"Open {url} now\n"), message_id="m-1", on_secret=lambda *a: seen.append(a)
    )

    with pytest.raises(ExtractionError) as info:
        message.link(domain="other.example.test")
    assert str(info.value).endswith("hosts found: fe80::1%\\u202eeth0")
    assert message.link() == url
    assert seen == [("link", url, "fe80::1%\\u202eeth0")]
    assert message_module.redact_url(url) == "https://[fe80::1%\\u202eeth0]/…"


@pytest.mark.parametrize(
    ("host", "shown"),
    [
        ("483920.app.example.test", "….app.example.test"),  # a code in a label
        ("Zq8Xk2LmN4pR7tVw.login.example.test", "….login.example.test"),  # judged as written
        ("App.Example.test.", "app.example.test"),  # a trailing dot, as the link matches
    ],
)
def test_a_host_that_holds_a_code_or_token_is_shown_redacted(host: str, shown: str) -> None:
    """The host recorded with an extracted link (a receipt's ``host``), and the hosts that
    a link asked for on another host lists, showed a code or a token in a label."""
    seen: list[tuple[str, str, str | None]] = []
    url = f"https://{host}/welcome"
    message = Message(
        build(text=f"Open {url} now\n"), message_id="m-1", on_secret=lambda *a: seen.append(a)
    )

    assert message.link() == url
    assert seen == [("link", url, shown)]
    with pytest.raises(ExtractionError) as info:
        message.link(domain="other.example.test")
    assert str(info.value).endswith(f"hosts found: {shown}")
    assert info.value.result["hosts"] == [shown]
    with pytest.raises(ExtractionError) as asked:
        message.link(domain=f"{host}:8443")  # what it was looked for on, shown alike
    assert str(asked.value).startswith(f"no link on {shown}:8443 in message m-1; ")


def test_a_selector_masks_a_code_joined_by_a_tab_as_written_not_as_quoted() -> None:
    """repr() writes a tab as the two characters \\t, which joined no groups any more."""
    selector = Selector(body_contains="Code:\t482\t913")

    assert selector.describe(mask_copied) == "body_contains='Code:\\t•••\\t•13'"


def test_shown_host_of_an_address_or_of_no_url() -> None:
    assert shown_host("http://[::1]:8000/v") == "::1"  # an address has no labels to judge
    assert shown_host("http://[::1/v") == ""  # not a URL at all


def test_link_matches_hosts_ignoring_port_and_trailing_dot() -> None:
    message = plain("Go to https://App.Example.Test.:8443/x/y now")

    assert message.link("app.example.test") == "https://App.Example.Test.:8443/x/y"


def test_link_none_on_domain_lists_hosts_found() -> None:
    message = plain("cdn https://cdn.example.test/a.png help https://help.example.test/q")

    with pytest.raises(ExtractionError) as info:
        message.link("app.example.test")

    assert str(info.value) == (
        "no link on app.example.test in message m-1; "
        "hosts found: cdn.example.test, help.example.test"
    )
    assert info.value.result["status"] == "ambiguous"
    assert info.value.result["hosts"] == ["cdn.example.test", "help.example.test"]


def test_link_in_message_without_links() -> None:
    with pytest.raises(ExtractionError, match=r"no link on app\.example\.test .*hosts found: none"):
        plain("nothing to click").link("app.example.test")


def test_link_several_on_domain_redacts_candidates() -> None:
    other = f"https://app.example.test/reset/{OTHER_TOKEN}?token={OTHER_TOKEN}"
    message = plain(f"Verify {VERIFY}\nReset {other}\n")

    with pytest.raises(ExtractionError) as info:
        message.link("app.example.test")

    text = str(info.value)
    assert text.startswith("2 distinct links on app.example.test in message m-1")
    assert "https://app.example.test/…/…?token=…&next=…" in text
    assert "https://app.example.test/…/…?token=…" in text
    assert TOKEN not in text
    assert OTHER_TOKEN not in text
    assert info.value.result["candidates"] == 2


def test_link_without_domain_needs_exactly_one_link() -> None:
    assert plain(f"only {VERIFY} here, twice: {VERIFY}").link() == VERIFY

    with pytest.raises(ExtractionError, match=r"^2 distinct links in message m-1") as info:
        plain(f"{VERIFY} and https://help.example.test/faq").link()
    assert TOKEN not in str(info.value)


def test_link_by_path_picks_one_of_several_links_on_a_host() -> None:
    """A verification mail with an unsubscribe link on the same host: the host alone is
    ambiguous; the path's start picks one, at a segment's end."""
    unsubscribe = "https://app.example.test/unsubscribe?list=news"
    message = plain(f"Verify {VERIFY}\nStop: {unsubscribe}\nAlso https://app.example.test/verifyx")

    with pytest.raises(ExtractionError) as several:
        message.link("app.example.test")
    assert "pass path= with the start of the one you want (path='/verify')" in str(several.value)
    assert message.link("app.example.test", path="/verify") == VERIFY
    assert message.link("app.example.test", path="/verify/") == VERIFY
    assert message.link(path="/unsubscribe") == unsubscribe
    assert message.link(path="/verifyx") == "https://app.example.test/verifyx"
    with pytest.raises(ExtractionError) as none:
        message.link("app.example.test", path="/reset")
    assert str(none.value).startswith(
        "no link on app.example.test under '/reset' (from the path's start: '/en/verify' is "
        "not) in message m-1"
    )


@pytest.mark.parametrize(
    "link",
    [
        "https://app.example.test/%76erify?t=1",
        "https://app.example.test/verify;jsessionid=AB12?t=1",
        "https://app.example.test/verify/%41bc",
    ],
)
def test_link_path_is_compared_decoded_and_without_parameters(link: str) -> None:
    message = plain(f"Open {link}\nStop: https://app.example.test/unsubscribe")
    assert message.link(path="/verify") == link
    assert message.link(path="/%76erify") == link


def test_link_path_keeps_an_encoded_slash_apart_and_reads_any_script() -> None:
    message = plain("https://app.example.test/a%2Fb/x https://app.example.test/caf%C3%A9/x")
    assert message.link(path="/café") == "https://app.example.test/caf%C3%A9/x"
    with pytest.raises(ExtractionError, match=r"^no link under '/a/b'"):
        message.link(path="/a/b")


@pytest.mark.parametrize("path", ["verify", "/verify?token=x", "/v#top", ""])
def test_link_path_must_be_the_start_of_a_path(path: str) -> None:
    with pytest.raises(ExtractionError, match=r"give the start of a URL path, such as '/verify'"):
        plain(VERIFY).link(path=path)


@pytest.mark.parametrize(
    ("domain", "shown", "host"),
    [
        ("app.example.test/verify", "'app.example.test/verify'", "app.example.test"),
        (
            "https://app.example.test/verify?token=Zq8xK2pLmN4vB7cR9tYw",
            "'https://app.example.test/…?token=…'",
            "app.example.test",
        ),
        ("App.Example.test:8000/verify", "'App.Example.test:••00/verify'", "app.example.test:8000"),
        ("482913.example.test/verify", "'••••13.example.test/verify'", "••••13.example.test"),
    ],
)
def test_a_domain_with_a_path_is_refused_rather_than_its_path_ignored(
    domain: str, shown: str, host: str
) -> None:
    """The refusal names the host to give (a code in it masked), and path=."""
    with pytest.raises(ExtractionError) as refused:
        plain(VERIFY).link(domain=domain)
    assert str(refused.value) == (
        f"link(domain={shown}): give the host alone (domain='{host}') and the start of the "
        "path as path=, such as path='/verify'"
    )
    assert plain(VERIFY).link(domain="https://app.example.test/") == VERIFY  # a host, as a URL


@pytest.mark.parametrize("domain", ["app.example.test:444", "https://app.example.test:444/"])
def test_a_domain_with_a_port_takes_only_links_on_that_port(domain: str) -> None:
    """A port given was dropped, and a link on another port (here the default one) handed
    back as if it were on the one asked for."""
    with pytest.raises(ExtractionError) as refused:
        plain(VERIFY).link(domain=domain)
    assert str(refused.value).startswith("no link on app.example.test:444 in message")
    on_444 = "http://app.example.test:444/verify?token=Zk3Pq9Wm2Lx"
    assert plain(f"{VERIFY}\n{on_444}\n").link(domain=domain) == on_444
    assert plain(on_444).link(domain="app.example.test") == on_444  # no port: any port
    for bad in ("app.example.test:https", "localhost:99999"):
        with pytest.raises(ExtractionError) as refused:
            plain(VERIFY).link(domain=bad)
        assert str(refused.value).startswith(
            f"link(domain={bad!r}): its port is not a port (a number 0..65535)"
        )


@pytest.mark.parametrize(
    ("domain", "said"),
    [
        ("[::1]:8000/verify", "give the host alone (domain='[::1]:8000')"),
        ("http://[::1]/verify", "give the host alone (domain='[::1]')"),
        ("[::1]:9000", "no link on [::1]:9000 in message m-1"),
    ],
)
def test_an_ipv6_link_host_is_said_in_brackets_as_link_takes_it(domain: str, said: str) -> None:
    """The host to give was written '::1:8000' (and '::1'), which link(domain=) refuses as
    no host name: which colon began the port? It is written as a URL writes it."""
    message = plain("Open http://[::1]:8000/verify?token=Zk3Pq9Wm2LxR7vN4 now")
    with pytest.raises(ExtractionError) as refused:
        message.link(domain=domain)
    assert said in str(refused.value)
    suggested = re.findall(r"alone \(domain='(.*?)'\)", str(refused.value))
    for host in suggested:  # what the error says to give is taken
        assert message.link(domain=host).startswith("http://[::1]")


def test_link_with_empty_domain_is_an_extraction_error() -> None:
    with pytest.raises(ExtractionError, match="give a host name"):
        plain(VERIFY).link("  ")
    with pytest.raises(ExtractionError) as hostless:  # a query pasted as the domain
        plain(VERIFY).link("?token=Zk3Pq9Wm2LxR7vN4")
    assert "Zk3Pq9Wm2LxR7vN4" not in str(hostless.value)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda m: m.link(domain=5), "link(domain=5): give a host name such as 'app.example.test'"),
        (
            lambda m: m.link(path=5),
            "link(path=5): give the start of a URL path, such as '/verify' (no query or fragment)",
        ),
        (
            lambda m: m.code(pattern=rb"(\d{6})"),
            "code(pattern=b'(\\\\d{6})') is refused: a pattern is a str, a regular expression "
            'such as r"code: (\\d{6})"',
        ),
    ],
    ids=["link-domain", "link-path", "code-pattern"],
)
def test_an_argument_of_the_wrong_type_is_an_extraction_error_not_a_type_error(
    call: Callable[[Message], object], expected: str
) -> None:
    with pytest.raises(ExtractionError) as refused:
        call(plain(VERIFY))
    assert str(refused.value) == expected


# -- codes -----------------------------------------------------------------------------------


def test_code_default_pattern_finds_four_to_eight_digits() -> None:
    seen: list[tuple[str, str, str | None]] = []
    message = Message(
        build(text="Your verification code is 482913.\nPhone 12 or 123456789 ignored.\n"),
        on_secret=lambda *a: seen.append(a),
    )

    assert message.code() == "482913"
    assert seen == [("code", "482913", None)]


def test_the_default_code_is_not_a_digit_run_of_a_link_or_a_token() -> None:
    """A link's random token holds four to eight digits now and then: the default pattern
    looked there too, so code() failed at random ("2 distinct codes") in a mail with a
    code and a link (344 times in 400 with a hex token)."""
    body = (
        "Your reset code is 583927.\n"
        "Or open https://app.example.test/reset/58203917?token=9f3a1234b5c6d7e8\n"
        "Reference a8f31234c.\n"
    )
    assert plain(body, subject="Reset 4417a").code() == "583927"
    assert plain("認証コードは482913です", subject="コード").code() == "482913"  # CJK around it
    # Digits glued to a word count when nothing else does: an HTML body's inline tags
    # leave them so (Code<b>482913</b> reads Code482913).
    glued = Message(build(html="<p>Code<strong>482913</strong></p><p>lautet:482913Bitte</p>"))
    assert glued.code() == "482913"
    # A pattern of the test's own still looks inside links.
    assert plain(body).code(pattern=r"reset/(\d+)") == "58203917"


def test_a_pattern_of_the_tests_own_looks_inside_an_html_bodys_links() -> None:
    """An HTML mail's links are its hrefs, which its text leaves out: a pattern aimed at a
    link finds the code there, as in a text mail. The default still looks outside links."""
    html = '<p>Welcome!</p><p><a href="https://app.example.test/verify?code=482913">Verify</a></p>'
    message = Message(build(html=html), message_id="m-1")

    assert message.code(pattern=r"code=(\d+)") == "482913"
    with pytest.raises(ExtractionError, match="no code matching"):
        message.code()
    # With a text part, the text is what is searched, as the docs say: not the HTML's links.
    both = Message(build(text="Verify: https://app.example.test/verify?code=111111", html=html))
    assert both.code(pattern=r"code=(\d+)") == "111111"


def test_an_html_bodys_links_are_looked_in_when_its_text_has_no_match_only() -> None:
    """A pattern that found the one code of an HTML mail's text finds it still: the number
    of an unsubscribe link beside it is no second candidate (ExtractionError, "2 distinct
    codes", once hrefs were searched with the text); one aimed at a link finds it there."""
    html = (
        "<p>Your code is 482913.</p>"
        '<p><a href="https://app.example.test/unsubscribe?user=771234">Unsubscribe</a></p>'
    )
    message = Message(build(html=html), message_id="m-1")

    assert message.code(pattern=r"\b(\d{6})\b") == "482913"
    assert message.code(pattern=r"user=(\d+)") == "771234"


def test_code_found_in_subject_and_body_counts_once() -> None:
    message = plain("Use 482913 to sign in.", subject="482913 is your code")

    assert message.code() == "482913"


def test_code_found_only_in_subject() -> None:
    assert plain("See the subject.", subject="Your code: 7311").code() == "7311"


def test_code_with_capture_group_pattern() -> None:
    message = plain("Order 55501 shipped. Your code: 482913. Ref 2026.")

    assert message.code(pattern=r"code: (\d{6})") == "482913"


def test_code_several_distinct_values_are_masked() -> None:
    message = plain("Order 55501 shipped. Your code: 482913. Ref 2026.")

    with pytest.raises(ExtractionError) as info:
        message.code()

    text = str(info.value)
    assert text.startswith(
        "3 distinct codes match the default pattern (4 to 8 digits outside links, standing "
        "alone, or glued to a word where none stand alone, or in groups such as 483 920 or "
        "483-920 where neither is) in message"
    )
    assert "••••01, ••••13, ••••26" in text
    assert 'pattern=r"code: (\\d{6})"' in text
    for raw in ("55501", "482913", "2026"):
        assert raw not in text
    assert info.value.result["candidates"] == 3


def test_code_glued_to_a_word_is_not_a_piece_of_a_longer_number() -> None:
    with pytest.raises(ExtractionError, match="no code matching"):
        plain("Call 123456789 now").code()


@pytest.mark.parametrize(
    "written",
    [
        "1234\u200b56",  # a zero-width space: 1234 alone was the code
        "12\u200c3456",  # a zero-width non-joiner, as some senders break phone detection
        "1234\u200d56",
        "1234\u206056",  # a word joiner
        "1234\ufeff56",  # a byte order mark
        "1234\u00ad56",  # a soft hyphen
        "12\u202e3456",  # a right-to-left override ("Trojan Source"): 3456 was the code
        "\u2066123\u20694\u200e56",  # isolates and a direction mark
    ],
)
def test_code_reads_digits_an_invisible_character_splits_as_one_code_not_a_part(
    written: str,
) -> None:
    """An invisible format character between digits hid them from each other: code()
    returned the four digits on one side of it, silently, as the mail's code."""
    html = f"<p>Your code is <b>{written}</b>.</p>"

    assert plain(f"Your code is {written}.\n").code() == "123456"
    assert Message(build(html=html)).code() == "123456"


def test_code_split_into_too_many_digits_by_an_invisible_character_is_no_code() -> None:
    with pytest.raises(ExtractionError, match="no code matching"):
        plain("Your code is 12345\u200b6789.\n").code()  # nine digits as a reader sees them


def test_code_ignores_an_empty_capture() -> None:
    assert plain("code: 4829, and later code: none").code(pattern=r"code: (\d*)") == "4829"


def test_code_with_a_pattern_does_not_fall_back_to_digits_glued_to_a_word() -> None:
    with pytest.raises(ExtractionError, match="no code matching"):
        plain("Your Code482913 is here").code(pattern=r"code: (\d{6})")


def test_code_lists_values_of_three_characters_as_bullets_only() -> None:
    with pytest.raises(ExtractionError) as info:
        plain("Codes ab1 and cd2").code(pattern=r"\b[a-z]{2}\d\b")
    assert "m-1: ••••, ••••; pass pattern=" in str(info.value)


def test_code_none_names_the_pattern() -> None:
    with pytest.raises(ExtractionError, match=re.escape(r'no code matching r"code: (\d{6})"')):
        plain("Your code is 12-34.").code(pattern=r"code: (\d{6})")


def test_code_none_by_default_says_what_it_looked_for_in_words() -> None:
    with pytest.raises(ExtractionError) as info:
        plain("Your code is ab-12-cd.").code()

    assert str(info.value) == (
        "no code matching the default pattern (4 to 8 digits outside links, standing alone, or "
        "glued to a word where none stand alone, or in groups such as 483 920 or 483-920 where "
        "neither is) in the subject or body of message m-1; for a "
        "code of another shape pass "
        'pattern=, e.g. r"code: ([A-Z0-9]{6})"'
    )


def test_code_none_by_default_gives_the_pattern_of_a_code_of_capitals_it_saw() -> None:
    """A mail whose code has letters (``AB-12-CD``) was told to pass a pattern of six
    capitals, which does not take it: the pattern given takes the code shown, masked."""
    message = plain("Your code is AB-12-CD.")
    with pytest.raises(ExtractionError) as info:
        message.code()

    assert str(info.value) == (
        "no code matching the default pattern (4 to 8 digits outside links, standing alone, or "
        "glued to a word where none stand alone, or in groups such as 483 920 or 483-920 where "
        "neither is) in the subject or body of message m-1; capitals and digits that may be the "
        "code are shown (••••CD): if they are, pass "
        'pattern=r"\\b([A-Z0-9]{2}-[A-Z0-9]{2}-[A-Z0-9]{2})\\b"'
    )
    assert message.code(pattern=r"\b([A-Z0-9]{2}-[A-Z0-9]{2}-[A-Z0-9]{2})\b") == "AB-12-CD"


def test_code_none_by_default_names_a_number_after_a_hash_that_may_be_the_code() -> None:
    """The default reads ``#482913`` as an order's number, not a code: a mail that gives
    its code so was told only to pass a pattern of six capitals. The error names the
    number, masked, and the pattern that takes it."""
    message = plain("Your verification code is #482913.")
    with pytest.raises(ExtractionError) as info:
        message.code()

    assert str(info.value).endswith(
        "; a number after # is read as an order's, not a code (#••••13): if it is the "
        'code, pass pattern=r"#(\\d{6})"'
    )
    assert "482913" not in str(info.value)
    assert message.code(pattern=r"#(\d{6})") == "482913"


def test_code_invalid_pattern_is_an_extraction_error() -> None:
    with pytest.raises(ExtractionError, match=re.escape('code(pattern=r"code: (\\d+")')):
        plain("code: 123456").code(pattern=r"code: (\d+")


@pytest.mark.parametrize("pattern", [r"code: ((\w+\s?)*)!", r"(?:\s|\s\s){8}" * 4 + "x"])
def test_code_pattern_that_may_backtrack_for_hours_is_refused(pattern: str) -> None:
    """As a selector's pattern is: the body is the app's, its length is not the test's."""
    with pytest.raises(ExtractionError, match=r"is refused: the pattern (repeats|has parts)"):
        plain("code: " + " " * 40).code(pattern=pattern)


def test_code_from_html_only_mail() -> None:
    message = Message(build(html="<p>Your code is <strong>0042</strong></p>"))

    assert message.code() == "0042"


# -- redaction and digests -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://app.example.test/verify/8f3a9c?token=abc&next=home",
            "https://app.example.test/…/…?token=…&next=…",
        ),
        ("https://app.example.test:8443/a/b-c_d/", "https://app.example.test:8443/…/…/"),
        ("https://app.example.test/v2/users/42", "https://app.example.test/…/…/…"),
        ("https://app.example.test/reset#section", "https://app.example.test/…"),
        # Tokens that look like words: a path segment is never shown, whatever it looks like.
        ("https://app.example.test/magic/plum-tiger-cloud-river", "https://app.example.test/…/…"),
        ("https://app.example.test/qzxwvkjhgfdsamnb", "https://app.example.test/…"),
        ("https://app.example.test/reset?QwErTyUiOpAsDfGh", "https://app.example.test/…?…"),
        ("https://app.example.test/?Token-Key=x&next=y", "https://app.example.test/?…=…&next=…"),
        # a key of letters alone longer than any word (17) is no word either
        ("https://app.example.test/?qzxwvkjhgfdsamnbv=1", "https://app.example.test/?…=…"),
        ("https://app.example.test/#sEcReTtOkEnAbCdEf_x-y", "https://app.example.test/"),
        ("https://user:pw@app.example.test/login", "https://app.example.test/…"),
        ("https://app.example.test/?8f3a9c", "https://app.example.test/?…"),
        ("https://app.example.test", "https://app.example.test"),
        ("https://[::1]:8080/x1", "https://[::1]:8080/…"),
        ("http://[broken/abc", "…"),
        # A browser reads a backslash as a slash: the host is evil.example, as shown.
        ("https://evil.example\\@app.example.test/verify", "https://evil.example/…/…"),
        # A host label that looks like a token, as written (case included), is redacted.
        ("https://Zq8Xk2LmN4pR7tVw.login.example.test/", "https://….login.example.test/"),
        ("https://u:p@3f2a9c1e8b7d6a5f.example.test:8443/x", "https://….example.test:8443/…"),
        (
            "https://SpringPromo2026Launch.example.test/",
            "https://springpromo2026launch.example.test/",
        ),
        ("https://xn--bcher-kva.example.test/", "https://xn--bcher-kva.example.test/"),
        # A label that holds a code is redacted; a name's number stays.
        ("https://483920.app.example.test/welcome", "https://….app.example.test/…"),
        ("https://tenant-48291.app.example.test/", "https://….app.example.test/"),
        ("https://k7q9x2.app.example.test/", "https://….app.example.test/"),
        ("https://k7q9x2m4p8z3w6r1.example.test/", "https://….example.test/"),
        ("https://k7q92.app.example.test/", "https://….app.example.test/"),  # five, the fewest
        ("https://shop123a.example.test/", "https://shop123a.example.test/"),  # four letters
        ("https://web01.cdn77.example.test/", "https://web01.cdn77.example.test/"),
        ("https://web001.lb1234.py311.example.test/", "https://web001.lb1234.py311.example.test/"),
        ("https://pr-1234.promo-2026.example.test/", "https://pr-1234.promo-2026.example.test/"),
        (
            "https://pr-1234-preview-app3.example.test/",
            "https://pr-1234-preview-app3.example.test/",
        ),
        # past DNS's 63 characters a label is no name (and is not searched for a code)
        (f"https://{'a' * 64}.example.test/", "https://….example.test/"),
        ("https://node-0001.2026.example.test/", "https://node-0001.2026.example.test/"),
        ("https://ip-10-0-0-1.ec2.internal/", "https://ip-10-0-0-1.ec2.internal/"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_digest_is_a_keyed_sha256_hex_and_last_two_characters() -> None:
    key = b"k" * 32
    assert digest("482913", key) == (hmac.new(key, b"482913", "sha256").hexdigest(), "13")
    assert digest("é", key) == (hmac.new(key, "é".encode(), "sha256").hexdigest(), "é")
    assert digest("", key) == (hmac.new(key, b"", "sha256").hexdigest(), "")
    assert digest("482913", b"j" * 32)[0] != digest("482913", key)[0]
    assert digest("482913", key)[0] != hashlib.sha256(b"482913").hexdigest()


# -- malformed mail is flagged, never raised -------------------------------------------------


def test_broken_boundary_is_flagged() -> None:
    raw = (
        b"Subject: broken\r\nContent-Type: multipart/mixed; boundary=zzz\r\n\r\n"
        b"--yyy\r\nContent-Type: text/plain\r\n\r\nhttps://app.example.test/x\r\n--yyy--\r\n"
    )
    message = Message(raw)

    touch_everything(message)
    assert "StartBoundaryNotFoundDefect" in message.defects
    assert message.subject == "broken"
    assert message.text == ""


def test_missing_close_boundary_is_flagged_and_body_kept() -> None:
    raw = (
        b"Content-Type: multipart/alternative; boundary=x\r\n\r\n"
        b"--x\r\nContent-Type: text/plain\r\n\r\ncode 482913\r\n"
    )
    message = Message(raw)

    assert "CloseBoundaryNotFoundDefect" in message.defects
    assert message.code() == "482913"


def test_unknown_charset_is_flagged_and_replaced() -> None:
    raw = (
        b"Subject: =?x-klingon?q?qapla?=\r\n"
        b"Content-Type: text/plain; charset=x-klingon\r\n\r\nhello \xff https://app.example.test/k\r\n"
    )
    message = Message(raw)

    touch_everything(message)
    assert "unknown_charset" in message.defects
    assert message.text == "hello \ufffd https://app.example.test/k\n"
    assert message.links() == ["https://app.example.test/k"]
    assert message.subject == "qapla"


def test_non_text_codec_charset_is_treated_as_unknown() -> None:
    raw = b"Content-Type: text/plain; charset=base64\r\n\r\nhello\r\n"
    message = Message(raw)

    assert message.text == "hello\n"
    assert "unknown_charset" in message.defects


def test_8bit_header_bytes_are_flagged_and_decoded() -> None:
    raw = (
        b"From: J\xc3\xa9r\xc3\xb4me <jerome@app.example.test>\r\n"
        b"Subject: Caf\xc3\xa9 cr\xe8me\r\nTo: \xff\xfe@\r\n\r\nbody\r\n"
    )
    message = Message(raw)

    touch_everything(message)
    assert "8bit_header" in message.defects
    assert message.subject == "Café crème"
    assert message.sender == "jerome@app.example.test"
    assert message.header("From") == "Jérôme <jerome@app.example.test>"


def test_index_reads_the_header_section_only() -> None:
    raw = (
        b"Subject: =?utf-8?q?Caf=C3=A9?= \xff\r\n X-Run-Id:  r-42 \r\n"
        b"X-Run-Id: r-42 \r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=XYZ\r\n\r\n--XYZ\r\nbroken"
    )

    found = index(raw)

    assert found == Index(subject=Message(raw).subject, run_header="r-42", defects=["8bit_header"])
    assert "CloseBoundaryNotFoundDefect" in Message(raw).defects  # found when read
    assert index(b"no headers at all") == Index(subject="", run_header=None, defects=[])


def test_index_hands_the_parser_the_header_section_only(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []

    class Recording(BytesParser):
        def parsebytes(self, text: bytes | bytearray, headersonly: bool = False) -> Any:
            parsed.append(bytes(text))
            return super().parsebytes(text, headersonly=headersonly)

    header = b"Subject: caf\xc3\xa9\r\nX-Run-Id: r-1\r\n\r\n"  # not plain: parsed
    raw = header + b"body line\r\n" * 10_000
    monkeypatch.setattr(message_module, "BytesParser", Recording)

    found = index(raw)

    assert parsed == [header]
    assert (found.subject, found.run_header) == ("café", "r-1")


def test_index_of_what_the_parser_cannot_read_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    class FailingParser(BytesParser):
        def parsebytes(self, text: bytes | bytearray, headersonly: bool = False) -> Any:
            msg = "maximum recursion depth exceeded"
            raise RecursionError(msg)

    monkeypatch.setattr(message_module, "BytesParser", FailingParser)

    assert index(build(text="hi")) == Index(subject="", run_header=None, defects=["parse_error"])


def test_bad_base64_is_flagged_and_decoded_as_far_as_possible() -> None:
    raw = b"Content-Transfer-Encoding: base64\r\n\r\naGVsbG8"
    message = Message(raw)

    assert message.text == "hello"
    assert "InvalidBase64PaddingDefect" in message.defects


def test_garbage_bytes_do_not_raise() -> None:
    raw = b"\x00\xff\r\n:::\r\n\r\n<a href='http://[::1'>x</a><!d [x]>\xfe"
    message = Message(raw)

    touch_everything(message)
    assert message.links() == []


def test_broken_html_keeps_the_text_read_so_far() -> None:
    html = "<p>code 482913</p><![if !supportLists]><!DOCTYPE [ <p>after"
    message = Message(build(html=html))

    touch_everything(message)
    assert "code 482913" in message.body_text


def test_parse_error_is_flagged_and_headers_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    class FailingParser(BytesParser):
        def parsebytes(self, text: bytes | bytearray, headersonly: bool = False) -> Any:
            if not headersonly:
                msg = "maximum recursion depth exceeded"
                raise RecursionError(msg)
            return super().parsebytes(text, headersonly=True)

    monkeypatch.setattr(message_module, "BytesParser", FailingParser)
    message = Message(build(text="code 482913", subject="Still here"))

    touch_everything(message)
    assert message.defects == ["parse_error"]
    assert message.subject == "Still here"
    assert message.sender == "noreply@app.example.test"


def test_values_returned_are_copies() -> None:
    message = plain(VERIFY)
    message.to.append("intruder@evil.test")
    message.links().clear()
    message.defects.append("x")
    message.headers.clear()

    assert message.to == ["user@mail.test"]
    assert message.links() == [VERIFY]
    assert message.defects == []
    assert message.header("Subject") == "Hello"


def test_two_thousand_parts() -> None:
    parts = [b"Subject: many\r\nContent-Type: multipart/mixed; boundary=BB\r\n\r\n"]
    parts += [b"--BB\r\nContent-Type: text/plain\r\n\r\npart %d\r\n" % i for i in range(2000)]
    parts.append(b"--BB--\r\n")
    message = Message(b"".join(parts))

    touch_everything(message)
    assert message.text == "part 0"
    assert message.defects == []


def test_two_hundred_levels_of_nesting() -> None:
    depth = 200
    head = b"".join(
        b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (i, i)
        for i in range(depth)
    )
    tail = b"".join(b"--b%d--\r\n" % i for i in reversed(range(depth)))
    raw = b"Subject: deep\r\n" + head + b"Content-Type: text/plain\r\n\r\ndeep 482913\r\n" + tail
    message = Message(raw)

    touch_everything(message)
    assert message.text == "deep 482913"
    assert message.code() == "482913"


# -- fuzzing ---------------------------------------------------------------------------------

MAIL_FRAGMENTS = [
    b"Subject: ",
    b"From: ",
    b"To: ",
    b"X-Run-Id: ",
    b"Content-Type: multipart/mixed; boundary=x\r\n",
    b'Content-Type: multipart/alternative; boundary="x"\r\n',
    b"Content-Type: text/html; charset=utf-8\r\n",
    b"Content-Type: text/plain; charset=x-bogus\r\n",
    b"Content-Type: message/rfc822\r\n",
    b"Content-Transfer-Encoding: base64\r\n",
    b"Content-Transfer-Encoding: quoted-printable\r\n",
    b"Content-Disposition: attachment; filename*=utf-8''%ff\r\n",
    b"--x\r\n",
    b"--x--\r\n",
    b"\r\n",
    b" \r\n\t",
    b"=?utf-8?q?=C3=A9?=",
    b"=?bogus?b?!!?=",
    b"<a href='https://app.example.test/v?t=1&amp;x'>",
    b"https://app.example.test/x).",
    b"http://[::1",
    b"<!DOCTYPE [",
    b"\xff\xfe\xc3",
    b"482913",
    b"a@b.test",
    b"<",
    b">",
]

mail_bytes = st.one_of(
    st.binary(max_size=600),
    st.lists(st.one_of(st.sampled_from(MAIL_FRAGMENTS), st.binary(max_size=8)), max_size=60).map(
        b"".join
    ),
)


@FUZZ
@given(raw=mail_bytes)
def test_fuzz_any_bytes_never_raise(raw: bytes) -> None:
    message = Message(raw, message_id="fuzz")

    touch_everything(message)
    assert message.raw == raw
    assert message.defects == sorted(set(message.defects))


HEADER_PIECES = st.sampled_from(
    ["Subject", "subject", "SUBJECT", "X-Run-Id", "x-run-id", "To", ":", ": ", " ", "\t", "  ",
     "\r\n", "\r\n ", "\r\n\t", "\n", "\r", "r-1", "Verify", "=?utf-8?q?=C3=A9?=", "(x)",
     '"q"', "é", "From ", "\x00", "a:b"]
)  # fmt: skip
header_lines = st.one_of(
    st.lists(HEADER_PIECES, max_size=6).map("".join),  # anything
    st.tuples(
        st.sampled_from(["Subject", "X-Run-Id", "To"]), st.lists(HEADER_PIECES, max_size=6)
    ).map(lambda field: f"{field[0]}:{''.join(field[1])}"),  # mostly well-formed fields
)
header_sections = st.lists(header_lines.map(str.encode), max_size=6).map(
    lambda fields: b"\r\n".join(fields) + b"\r\n\r\nbody\r\n"
)


@FUZZ
@given(raw=st.one_of(mail_bytes, header_sections))
def test_fuzz_the_sinks_index_agrees_with_the_message(raw: bytes) -> None:
    found = index(raw)
    message = Message(raw)

    assert found.subject == message.subject
    assert found.run_header == message.run_header()
    assert set(found.defects) <= {"8bit_header", *message.defects}


TEXT_FRAGMENTS = [
    "https://app.example.test/verify/abc?token=XYZ",
    "https://help.example.test/",
    "http://[::1",
    "https://",
    '<a href="https://app.example.test/h">',
    "code: 482913",
    "123456",
    "0000",
    ")",
    ".",
    "&amp;",
    "\n",
]

bodies = st.lists(
    st.one_of(st.sampled_from(TEXT_FRAGMENTS), st.text(max_size=12)), max_size=20
).map("".join)


@FUZZ
@given(body=bodies, html=st.booleans(), domain=st.one_of(st.none(), st.text(max_size=20)))
def test_fuzz_extraction_raises_only_extraction_error(
    body: str, html: bool, domain: str | None
) -> None:
    content_type = b"text/html" if html else b"text/plain"
    raw = (
        b"Subject: fuzz\r\nContent-Type: " + content_type + b"; charset=utf-8\r\n\r\n"
    ) + body.encode("utf-8", "surrogatepass")
    message = Message(raw, message_id="fuzz")

    outcomes: list[str | ExtractionError] = []
    extractors: list[Callable[[], str]] = [
        message.code,
        lambda: message.code(r"code: (\d+)"),
        message.link,
        lambda: message.link("app.example.test"),
        lambda: message.link(domain),
    ]
    for extract in extractors:
        try:
            outcomes.append(extract())
        except ExtractionError as exc:
            outcomes.append(exc)

    assert len(outcomes) == 5
    for outcome in outcomes:
        if isinstance(outcome, ExtractionError):
            assert str(outcome)
        else:
            assert outcome in message.links() or outcome in message.body_text + message.subject


def test_a_backslash_in_a_link_is_read_as_a_browser_reads_it() -> None:
    # urlsplit alone would say app.example.test; a browser goes to evil.example.
    message = plain("Verify https://evil.example\\@app.example.test/verify?token=x\n")

    with pytest.raises(ExtractionError, match=r"hosts found: evil\.example$"):
        message.link("app.example.test")
    assert message.link("evil.example") == "https://evil.example\\@app.example.test/verify?token=x"


LINK = "https://app.example.test/verify?token=Zq8vT4nW2xKp9LmR"


@pytest.mark.parametrize(
    "after",
    [
        "，有效期10分钟。",
        "。",
        "\u201d and",
        "\u00bb.",
        "\uff09",
        "\u2026",
        "\u3000next",
        "\u00a0x",
    ],
)
def test_a_link_in_text_ends_at_the_punctuation_of_any_script(after: str) -> None:
    assert plain(f"Open \u201c{LINK}{after}\n").link("app.example.test") == LINK


def test_a_link_keeps_letters_of_any_script_in_its_path() -> None:
    iri = "https://app.example.test/bücher/café"
    assert plain(f"Open {iri} now").link() == iri


def test_a_secret_is_masked_with_the_punctuation_that_follows_it() -> None:
    key = b"k" * 32
    digests = Recorded(
        frozenset({digest("QXKZTR", key)[0], digest("ab.cd", key)[0], digest("x7K", key)[0]}),
        lambda v: digest(v, key),
    )

    assert mask_secrets("Your code is QXKZTR.", digests) == "Your code is ••••TR."
    assert mask_secrets("Codes: -QXKZTR- ab.cd", digests) == "Codes: -••••TR- •••cd"
    assert mask_secrets("PIN x7K", digests) == "PIN ••7K"  # two bullets at least: not "•7K"


def test_a_recorded_secret_is_masked_inside_a_word_with_its_digest_alone() -> None:
    # What xdist's controller has for a crashed worker's receipt: digests, no values.
    key = b"k" * 32
    long_value = "Zq8xK2pLmN4vB7cR9tYwQ2sHj5Fd" * 3  # longer than any code: 84 characters
    values = ("QXKZTR", "4821", "5QXKZTR", long_value)
    found = [digest(v, key) for v in values]
    digests = Recorded(
        frozenset(sha for sha, _ in found),
        lambda v: digest(v, key),
        frozenset(tail for _, tail in found),
        frozenset(len(v) for v in values),
    )

    assert mask_subject("認証コードはQXKZTRです", digests) == "認証コードは••••TRです"
    assert mask_subject("code_QXKZTR and xQXKZTRy", digests) == "code_••••TR and x••••TRy"
    assert mask_recorded("PIN_4821 job 148213", digests) == "PIN_••21 job 148213"  # digits touch
    assert mask_recorded("x48215QXKZTRy", digests) == "x4821•••••TRy"  # 4821 touches the 5
    assert mask_recorded("nothing here: QXKZTX", digests) == "nothing here: QXKZTX"
    assert mask_recorded(f"token_{long_value}", digests) == "token_" + "\u2022" * 82 + "Fd"
    # A word where a secret could end in too many places to try them all: masked whole.
    many = "TR".join("a" * 3 for _ in range(200))
    assert mask_recorded(many, digests) == "\u2022" * (len(many) - 2) + "aa"


def test_the_stores_secret_rows_mask_a_secret_inside_a_word() -> None:
    key = b"k" * 32
    sha, last2 = digest("QXKZTR", key)
    recorded = Recorded.of([{"sha256": sha, "last2": last2, "size": 6}], lambda v: digest(v, key))

    assert mask_recorded("code_QXKZTR", recorded) == "code_••••TR"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Your code is 415926", "Your code is ••••26"),
        ("code:415926.", "code:••••26."),
        ("Order #20261203 shipped", "Order #••••••03 shipped"),
        ("PIN 1234, valid 10 min", "PIN ••34, valid 10 min"),
        ("r-44b17272f90f98a3", "r-44b17272f90f98a3"),  # an id: its digits stay
        ("m-4417272f90f9", "m-4417272f90f9"),
        ("run r-7a250cc8c22b78a8 ok", "run r-7a250cc8c22b78a8 ok"),
        ("認証コードは482913です", "認証コードは••••13です"),  # no spaces in the sentence
        ("Your code123456 for login", "Your code••••56 for login"),
        ("ＰＩＮ１２３４５６", "ＰＩＮ••••５６"),
        ("Invoice 2026", "Invoice ••26"),  # a year alone may be a PIN
    ],
)
def test_digit_runs_are_masked_but_not_the_digits_of_ids(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "Your order of 2026-12-03",
        "sent 2026-12-03T16:30:00.123456+00:00 by run r-2026-12-03-1",
        "Date: Thu, 3 Dec 2026 16:30:00 +0000",
        "Meeting on 03/12/2026 at 9:05, or 2026/12/03 16:30",
        "waited until 16:30:12.123456",
    ],
)
def test_dates_and_times_keep_their_digits(text: str) -> None:
    assert mask_secrets(text) == text


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("body_contains='HTOnEmKT6XHqx8eV6XLjCg'", "body_contains='••••••••••••••••••••Cg'"),
        ("body_contains='ZqXyTkMpWvRsLnBcQd_-Ab'", "body_contains='••••••••••••••••••••Ab'"),
        ("'550e8400-e29b-41d4-a716-446655440000'", "'••••••••••••••••••••••••••••••••••00'"),
        ("'3f9a1c07be52d8e46a0b7c19'", "'••••••••••••••••••••••19'"),  # token_hex(12)
        # a class change at every fourth character is random enough (4 in 16)
        ("'QWERtyuiOPASdfg5'", "'••••••••••••••g5'"),
        # standard base64, whose + and / split a token into pieces too short to look random
        (
            "body_contains='JkqtbLbdIQ+vlKzTz5LBkCN8sR9dEIzyWTAmOTizcKG1dp+g8Ug/lakNnfLxMNYP'",
            "body_contains='" + "•" * 62 + "YP'",
        ),
        ("'q8Zk+Lm3/Xp9Rt2+Wv7N=' 'x/y' 'a+b=c'", "'•••••••••••••••••••N=' 'x/y' 'a+b=c'"),
        # a path of words is no token, nor an ordinary sum
        ("'/static/js/App2Main/vendor.js'", "'/static/js/App2Main/vendor.js'"),
        # one case and digits, as base 36 is; not words with a number between them
        ("'k7q9x2m4p8z3w6r1' 'K7Q9X2M4P8Z3W6R1'", "'••••••••••••••r1' '••••••••••••••R1'"),
        ("'springpromo26launch' 'ORDER24INVOICE99X'", "'springpromo26launch' 'ORDER24INVOICE99X'"),
        (  # a link escaped for a pattern is read, and redacted, as the link
            "body_regex='https://app\\\\.example\\\\.test/verify/3f9a1c07be52d8e46a0b7c19$'",
            "body_regex='https://app.example.test/…/…'",
        ),
        ("'https://app.example.test/verify?token=abc&x'", "'https://app.example.test/…?token=…&…'"),
        ("subject_contains='Your code A7K9Q2'", "subject_contains='Your code ••••Q2'"),
        # names, not tokens: capitalised words run together, an address, the plugin's ids
        ("'SpringPromo2026Launch'", "'SpringPromo••26Launch'"),
        ("sender='Billing-Notices2025@shop.example'", "sender='Billing-Notices••25@shop.example'"),
        ("'VerifyYourAccountNow'", "'VerifyYourAccountNow'"),
        ("header=('X-Run-Id', 'r-44b17272f90f98a3')", "header=('X-Run-Id', 'r-44b17272f90f98a3')"),
    ],
)
def test_selector_values_mask_tokens_and_links_but_not_names(text: str, masked: str) -> None:
    assert mask_copied(text) == masked


@pytest.mark.parametrize(
    ("subject", "masked"),
    [
        (
            "Sign in: https://app.example.test/v?token=Zq8xK2",
            "Sign in: https://app.example.test/…?token=…",
        ),
        ("Your token Zq8xK2pLmN4vB7cR9tYw", "Your token ••••••••••••••••••Yw"),
        ("Code A7K9Q2 inside", "Code ••••Q2 inside"),
        ("認証コードはA7K9Q2です", "認証コードは••••Q2です"),  # another script touches it
        ("Order 415926 shipped 2026-12-03", "Order ••••26 shipped 2026-12-03"),
        # words, names and versions: capitals alone, one digit, lower case, too short
        ("URGENT: verify your account", "URGENT: verify your account"),
        ("MP3, H2O, B2B and Win10X", "MP3, H2O, B2B and Win10X"),
        ("Upgrade to PRO2 or iPhone15", "Upgrade to PRO2 or iPhone15"),
        ("Code K7QXZT, ref 123ABC", "Code ••••ZT, ref ••••BC"),  # one digit is enough
        ("Code 7K9Q2, key A7K9Q2B4C6D8E1F", "Code •••Q2, key •••••••••••••1F"),  # 5 and 15
        # letters then digits is a name: its long digit runs are masked as any are
        ("COVID19 news, flight LH400, ISO8601", "COVID19 news, flight LH400, ISO••01"),
        ("From AB12CD@example.test", "From AB12CD@example.test"),  # an address is no code
        # digits in groups of one length, as codes are shown to be read
        ("Your code: 483 920", "Your code: ••• •20"),
        ("Code 5 1 8 2 7 9, or 713-604", "Code • • • • 7 9, or •••-•04"),
        ("code:483 920, コード483-920です", "code:••• •20, コード•••-•20です"),
        ("483\u00a0920 or 48\u201339\u201320", "•••\u00a0•20 or ••\u2013••\u201320"),
        # any space (French number formatting's narrow no-break one), zero-width, a dot
        (
            "483\u202f920, 483\u2009920, 483\u200b920, 483.920",
            "•••\u202f•20, •••\u2009•20, •••\u200b•20, •••.•20",
        ),
        # a dot joins two groups of three only: not an address, a date, a version, a phone
        (
            "Login from 192.168.1.1 or 10.20.30.40 on 12.03.26, v10.20.30, 555.123.4567",
            "Login from 192.168.1.1 or 10.20.30.40 on 12.03.26, v10.20.30, 555.123.••67",
        ),
        ("Your code is 483 920 175, or 123-456-789", "Your code is ••• ••• •75, or •••-•••-•89"),
        ("Code 123 456 789 012", "Code ••• ••• ••• •12"),  # twelve digits, the most
        # aligned by a tab or by spaces, as a table or a template may
        ("Code:\t482\t913, or 482  913", "Code:\t•••\t•13, or •••  •13"),
        ("Code 2024 5678", "Code •••• ••78"),  # a code, though one of its groups reads a year
        # not a number with a ratio's colon or a decimal comma around it
        ("Scale 1:250 000, total 483 920,50 EUR", "Scale 1:250 000, total 483 920,50 EUR"),
        # the leading groups of one length, whatever number or date follows them
        ("Code 483 920 2026-12-03, 483 920 10 min", "Code ••• •20 2026-12-03, ••• •20 10 min"),
        (
            "4 8 3 9 2 0 2026-12-03 or 2026-12-03 48-39-20",
            "• • • • 2 0 2026-12-03 or 2026-12-03 ••-••-20",
        ),
        # not dates, times, years, or numbers of several lengths or many digits
        (
            "Sent 2026-12-03 16:30, 3 Dec 2026 16:30 +0000",
            "Sent 2026-12-03 16:30, 3 Dec 2026 16:30 +0000",
        ),
        (
            "At 2026-12-03T16:30:05Z or 2026-12-03T16:30:05+00:00",
            "At 2026-12-03T16:30:05Z or 2026-12-03T16:30:05+00:00",
        ),
        ("Meeting on 03-12-2026 or 03.12.2026", "Meeting on 03-12-2026 or 03.12.2026"),
        ("Season 2024-2025, 12 345 678 visitors", "Season ••24-••25, 12 345 678 visitors"),
        ("Pages 10-20, error 404, v1.2.3", "Pages 10-20, error 404, v1.2.3"),
        ("Call +1 555 123 4567", "Call +1 555 123 ••67"),  # its four-digit run only
        # a code of capitals and digits in groups joined by dashes; not a name's number
        ("Slack confirmation code: 4F2-7TB", "Slack confirmation code: •••••TB"),
        ("Key AB12-CD34-EF56-GH78", "Key •••••••••••••••••78"),
        ("Key AB12CD-EF34GH-IJ56KL-MN78OP", "Key •••••••••••••••••••••••••OP"),  # 24, the most
        ("Token q8Zk+Lm3/Xp9Rt2+Wv7N= inside", "Token •••••••••••••••••••N= inside"),  # base64
        # twelve bytes: 16 characters with the + (15 letters and digits without it)
        ("Your token is k61Y760z+crzM9pv.", "Your token is ••••••••••••••pv."),
        ("Code ٤٨٣ ٩٢٠ now", "Code ••• •٢٠ now"),  # another script's digits, grouped
        (
            "token=q8Zk+Lm3/Xp9Rt2+Wv7N= key_q8Zk+Lm3/Xp9Rt2+Wv7N",
            "token=•••••••••••••••••••N= key_••••••••••••••••••7N",
        ),
        # paths and names of words with numbers, dashes and ranges are no tokens or codes
        (
            "s3://bucket1/key2/file3 a1/b2/c3/d4/e5/f6/g7/h8",
            "s3://bucket1/key2/file3 a1/b2/c3/d4/e5/f6/g7/h8",
        ),
        (
            "python3-11-slim-bookworm, gpt4o-mini, hello-world-foo1",
            "python3-11-slim-bookworm, gpt4o-mini, hello-world-foo1",
        ),
        ("Pages 120 - 245, flights 100 – 250 EUR", "Pages 120 - 245, flights 100 – 250 EUR"),
        # a link's trailing punctuation stays after the redacted link
        ("Open https://app.example.test/v?t=abc.", "Open https://app.example.test/…?t=…."),
        (
            "COVID-19 news, UTF-8, X-RAY, region EU-WEST-1",
            "COVID-19 news, UTF-8, X-RAY, region EU-WEST-1",
        ),
        ("CVE-2024-12345", "CVE-••24-•••45"),  # a name: its long digit runs only
    ],
)
def test_a_subject_shows_no_link_token_or_code(subject: str, masked: str) -> None:
    assert mask_subject(subject) == masked


def test_a_selector_masks_a_code_of_capitals_once_this_process_extracted_it() -> None:
    assert mask_copied("body_contains='QXKZTR'") == "body_contains='QXKZTR'"  # a word, maybe
    remember_extracted("code", "QXKZTR")
    assert mask_copied("body_contains='QXKZTR'") == "body_contains='••••TR'"


def test_a_subject_masks_what_its_mailbox_extracted_even_inside_a_word() -> None:
    values = {"QXKZTR", "415926", "PIN"}  # a value of three: a whole word only, if recorded
    assert mask_subject("コードはQXKZTRです, code_QXKZTR", values=values) == (
        "コードは••••TRです, code_••••TR"
    )
    # In an id (several digit runs, which keep their digits), where no digit touches it
    assert mask_subject("ref x415926y2, ref x4159267y2", values=values) == (
        "ref x••••26y2, ref x4159267y2"
    )
    assert mask_subject("A PINE tree", values=values) == "A PINE tree"


def test_a_subject_masks_extracted_values_of_four_longest_first_and_a_link_as_a_link() -> None:
    assert mask_subject("コードはQX7Kです", values={"QX7K"}) == "コードは••7Kです"
    # a shorter value inside a longer one would leave the longer one's start in clear
    assert mask_subject("コードはQXKZTRです", values={"QXKZTR", "KZTR"}) == "コードは••••TRです"
    link = "https://app.example.test/v?token=Zq8xK2"
    assert mask_subject(f"Sign in: {link}", values={link}) == (
        "Sign in: https://app.example.test/…?token=…"
    )


def test_a_messages_repr_masks_its_subject_before_cutting_it() -> None:
    token = "Zq8xK2pLmN4vB7cR9tYw"
    prefix = "Please confirm your new e-mail address with: "  # the cut falls in the token
    raw = f"Subject: {prefix}{token}\r\n\r\nHi\r\n".encode()
    shown = repr(Message(raw))
    assert "..." in shown
    assert token[:8] not in shown


def test_a_code_beside_a_date_is_still_masked() -> None:
    assert mask_secrets("code 482913 sent 2026-12-03 12:30") == "code ••••13 sent 2026-12-03 12:30"
    assert mask_secrets("code 1234:56, code 12:345678") == "code ••34:56, code 12:••••78"


def test_a_header_too_long_to_decode_is_shown_as_sent_by_index_and_message() -> None:
    words = " ".join(["=?utf-8?q?caf=C3=A9?="] * (MAX_PARSED_HEADER // 20))
    raw = f"Subject: {words}\r\nX-Run-Id: r-1\r\n\r\nbody\r\n".encode()
    short = b"Subject: =?utf-8?q?caf=C3=A9?=\r\n\r\nbody\r\n"

    assert index(raw).subject == Message(raw).subject == words  # not decoded: its cost
    assert index(raw).run_header == "r-1"
    assert index(short).subject == Message(short).subject == "café"  # decoded as before


def test_the_plugins_own_patterns_pass_its_backtracking_check() -> None:
    """The check selectors get, on every pattern the plugin runs over mail and error texts:
    a nested repeat (_CAMEL's ``(?:…|\\d+)+`` once) let a long digit run hang ``link()``."""
    modules = [
        importlib.import_module(f"pytest_mailbox.{module.name}")
        for module in pkgutil.iter_modules(pytest_mailbox.__path__)
        if module.name not in ("__main__", "mcp_server")  # mcp_server needs the mcp extra
    ]
    patterns = {
        f"{module.__name__}.{name}": value.pattern
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, re.Pattern)
    }

    assert len(patterns) > 20
    assert {name: _regex_problem(p) for name, p in patterns.items() if _regex_problem(p)} == {}
    assert _regex_problem(r"[a-z]*(?:[A-Z][a-z]{2,}|\d+|[-_])+") is not None  # the old one


LINK_WITH_IDS = (
    "https://app.example.test/users/12345678/confirm/v2beta1"
    "?t=Zq8xYtK2mPw9RvLsAb3dEf7h&next=%2Fhome&utm_campaign=spring2026"
)


def test_a_link_is_remembered_with_its_secret_parts_only() -> None:
    parts = remember_extracted("link", LINK_WITH_IDS)

    assert "Zq8xYtK2mPw9RvLsAb3dEf7h" in parts
    assert "/users/12345678/confirm/v2beta1?t=Zq8xYtK2mPw9RvLsAb3dEf7h&next=%2Fhome" in "".join(
        parts
    )  # the path and query, as an HTTP client's error quotes them
    assert quote(LINK_WITH_IDS, safe="") in parts  # as a redirect's parameter
    for word in ("12345678", "v2beta1", "spring2026", "%2Fhome", "/home", "users"):
        assert word not in parts


def test_the_process_remembers_the_latest_extracted_values_only() -> None:
    """A long session extracts thousands of codes: masking with every one of them would
    slow each error and report down, so the process keeps the latest 256."""
    codes = [
        hashlib.sha256(b"%d" % n).hexdigest()[:10]
        for n in range(message_module._EXTRACTED_KEPT + 1)
    ]
    for code in codes:
        remember_extracted("code", code)

    shown = message_module.mask_extracted(f"{codes[0]} {codes[1]} {codes[-1]}")
    assert (codes[0] in shown, codes[1] in shown, codes[-1] in shown) == (True, False, False)
    assert list(message_module._EXTRACTED) == codes[1:]


def test_a_value_extracted_again_is_the_latest_and_a_link_keeps_the_memory_to_its_size() -> None:
    kept = message_module._EXTRACTED_KEPT
    remember_extracted("code", "482913")  # six characters: the shortest remembered
    assert "482913" in message_module._EXTRACTED
    for n in range(kept - 1):
        remember_extracted("code", f"c{n:09d}")
    remember_extracted("code", "482913")  # extracted again: now the latest, not the oldest
    remember_extracted("code", "x123456789")

    assert "482913" in message_module._EXTRACTED
    assert "c000000000" not in message_module._EXTRACTED
    remember_extracted("link", LINK_WITH_IDS)  # several parts at once
    assert len(message_module._EXTRACTED) == kept


def test_what_the_process_extracted_is_masked_longest_first() -> None:
    token = "Zq8xYtK2mPw9RvLs"
    shown = message_module.mask_extracted(f"t={token}", also={token, "K2mPw9"})
    assert shown == "t=" + "\u2022" * 14 + "Ls"


def test_a_masker_leaves_what_unrelated_output_shows() -> None:
    remembered = remember_extracted("link", LINK_WITH_IDS) | {"482913"}
    mask = Masker(remembered, words={"2026"})

    for line in (
        "Connecting to https://app.example.test...",
        "GET /users/12345678/confirm... 503",
        "Loading...home page, redirect to %2Fhome",
        "{'id': 12345678, 'api': 'v2beta1', 'campaign': 'spring2026'}",
        "sent 2026-12-03 16:30",
    ):
        assert mask(line) == line
    assert mask("assert '2026' == '0000'") == "assert '••26' == '0000'"  # a PIN alone
    assert mask("code 4829...") == "code ••••..."  # half of a six-digit code, cut short
    assert mask("token=Zq8x...") == "token=Zq8x..."  # four of 24 characters tell nothing
    assert mask("token=Zq8xYtK2m...") == "token=•••••••••..."
    assert mask("'...RvLsAb3dEf7h', the end") == "'...••••••••••••', the end"  # its end
    assert mask("x...y") == "x...y"
    # a raw message's soft line break, as a repr shows it
    assert mask("token=3DZq8xY=\\r\\ntK2mPw9RvLsAb3dEf7h") == "token=3D" + "•" * 29


def test_a_masker_hides_half_of_a_six_digit_code_next_to_a_cut() -> None:
    mask = Masker({"815274"})

    # unittest's assertEqual shortens both strings; its diff line masks all but the last two
    shortened = "AssertionError: 'Hello! Your code for the example.[47 chars]274.' != 'x'"
    assert mask(shortened) == shortened.replace("274.", "•••.")
    assert mask("code 815...") == "code •••..."
    # pytest's diff after "Skipping N identical leading characters": the line's edge
    diff = "Skipping 80 identical leading characters in diff, use -v to show\n- 274. Bye\n+ x"
    assert mask(diff).splitlines()[1] == "- •••. Bye"
    # three characters that are not the value's own start (end) there stay
    for line in ("id 274...", "'...815 more'", "'...2745 more'"):
        assert mask(line) == line


def test_a_masker_finds_a_six_digit_code_across_a_soft_line_break() -> None:
    assert Masker({"482913"})("code 482=\n913 ok") == "code ••••\n••• ok"


def test_a_masker_finds_a_value_across_a_soft_line_break_padded_with_white_space() -> None:
    """RFC 2045 6.7: a transport may add white space after a soft break's ``=``; the
    body is read through it (link() finds the whole link), so a printed raw message
    must be masked through it too."""
    mask = Masker({"482913", "Zq8xYtK2mP4rT7wQ9sL1"})

    assert mask("code 482= \n913 ok") == "code •••••\n••• ok"
    assert mask("t=3DZq8xYtK2m=\t\r\nP4rT7wQ9sL1.") == "t=3D" + "•" * 11 + "\r\n" + "•" * 11 + "."
    assert "P4rT7wQ9sL1" not in mask(repr(b"t=3DZq8xYtK2m= \r\nP4rT7wQ9sL1\r\n"))


def test_a_masker_finds_a_value_quoted_printable_escaped_in_a_raw_body() -> None:
    link = "https://app.example.test/verify?token=Zq8xK2pLmN4vB7cR9tYwQ2s=="
    mask = Masker(remember_extracted("link", link) | {"コードQX7K"})

    raw = "Click https://app.example.test/verify?token=3DZq8xK2pLmN4vB7cR9tYwQ2s=3D=3D now"
    broken = "Click https://app.example.test/verify?token=3DZq8xK2pLmN4vB7cR9t=\nYwQ2s=3D=3D"
    glyphs = "=E3=82=B3=E3=83=BC=E3=83=89QX7K"

    for text in (raw, broken, glyphs):
        assert "Zq8xK2pLmN4vB7cR9t" not in mask(text)
        assert "QX7K" not in mask(text)
    assert mask(glyphs) == "•" * 29 + "7K"
    # pytest's cut of a repr is matched on the values as they are: eight characters of
    # an escape are one character, which unrelated text shows as well
    for cut in ("E   b'Subject: =E3=82=B3...'", "E   'Hello team...=E3=82=B3 and more'"):
        assert mask(cut) == cut
    # but an ASCII value's escaped end, after a cut, is as long as the value's own
    tail = "E   b'...N4vB7cR9tYwQ2s=3D=3D\\r\\n'"
    assert mask(tail) == "E   b'..." + "•" * 20 + "\\r\\n'"


def _headers_of(subject: str) -> bytes:
    """A raw message whose subject the email package folded into encoded words."""
    mail = EmailMessage()
    mail["Subject"] = subject
    mail["To"] = "a@mailbox.test"
    mail.set_content("hi")
    raw = mail.as_bytes()
    assert b"=?utf-8?" in raw
    return raw


def test_a_masker_finds_a_value_the_encoded_words_of_a_folded_header_split() -> None:
    """A long subject with a link in it is folded into RFC 2047 Q-encoded words, which cut
    the token where a line must end and escape its ``_`` (``=5F``): a test that printed
    ``msg.raw`` showed the token in clear."""
    token = "XjunxHf4YdBn5xS_EWg-BeLwh6rGtydGIbI9ZdKxHdc"
    link = f"https://app.example.test/verify?token={token}"
    mask = Masker(remember_extracted("link", link))
    for subject in (f"Verify your account: {link}", f"Vérifiez votre compte : {link}"):
        raw = _headers_of(subject)
        assert token[:20].replace("_", "=5F").encode() in raw  # as the header carries it

        for shown in (mask(raw.decode()), mask(repr(raw))):
            for piece in ("XjunxHf4Yd", "BeLwh6rGty", "dGIbI9ZdKx", "5xS=5FEWg"):
                assert piece not in shown
            assert "Subject: " in shown
            assert "?=\n =?utf-8?q?" in shown or "?=\\n =?utf-8?q?" in shown  # framing kept
        assert mask(raw.decode()).count("\n") == raw.decode().count("\n")


def test_a_masker_finds_a_code_in_base64_encoded_words_and_leaves_others_alone() -> None:
    mask = Masker({"482913"})
    raw = _headers_of("認証コード 482913 です。よろしくお願いします。")
    assert b"482913" not in raw  # base64: no digit of it in clear
    shown = mask(raw.decode())
    assert shown != raw.decode()
    assert "\u2022" in shown.split("\n")[0]
    # other encoded words, a number beside the code's digits, unknown or odd charsets and
    # broken padding are shown as they are
    for line in (
        "Subject: =?utf-8?q?Hello_team?=",
        "Subject: =?utf-8?q?job_4829130?=",
        "Subject: =?x-unknown?q?hello?= =?base64?b?aGk=?= =?utf-8?b?aGk?= =?utf-8?b?@@?=",
    ):
        assert mask(line) == line
    assert (
        mask("Subject: =?x-unknown?q?code_482913?=")
        == "Subject: =?x-unknown?q?code_" + "•" * 6 + "?="
    )
    assert mask("S: =?utf-8?b?Y29kZSA0ODI5MTM?=") == "S: =?utf-8?b?Y29k" + "•" * 11 + "?="


def test_a_masker_leaves_a_number_holding_a_code_alone_in_text_of_several_lines() -> None:
    """A code is masked where no digit touches it (``job 8279071`` stays), also in a report
    of several lines, every line break of which may be one that link() reads a link
    through: the numbers of a failing test's list showed as ``[1••••••7, 2••••••1]``. A code
    cut by such a break is still masked."""
    mask = Masker({"482913"})
    for text in (
        "E       assert [14829137, 24829131] == [14829137, 99]\nE         At index 1 diff",
        "order 4829130\nshipped",
        "4829130=\r\nnext",
        "job 1482913\n",
    ):
        assert mask(text) == text
    assert mask("code 482 \r\n913 now\n") == "code ••••\r\n••• now\n"
    assert mask("code 4829=\r\n13 now\n") == "code •••••\r\n•• now\n"


class _NoWholeTextSub:
    """``_WRAP_BREAK`` that refuses to be run over a whole text (``sub``), which tries a
    match at each of its characters: ten times the mask's time on a long captured log."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern.pattern
        self._compiled = pattern

    def search(self, text: str) -> re.Match[str] | None:
        return self._compiled.search(text)

    def sub(self, repl: str, text: str) -> str:
        problem = "_WRAP_BREAK.sub over the whole text"
        raise AssertionError(problem)


_WRAPS = [" \n", "  \r\n", "=20\r\n", "=\r\n", "\nE     + ", "\\r\\n", "', '", "\r\n    "]


@settings(max_examples=200, deadline=None)
@given(
    value=st.text(alphabet="abcXYZ0123456789-_.?/:&%~", min_size=6, max_size=40),
    cuts=st.lists(st.tuples(st.integers(1, 39), st.sampled_from(_WRAPS)), max_size=4),
    before=st.sampled_from(["", "x ", "Sign in: ", "E   + "]),
    after=st.sampled_from(["", " y", "\nz", "'"]),
)
def test_a_masker_finds_a_value_cut_by_line_breaks_without_a_regex_over_the_text(
    value: str, cuts: list[tuple[int, str]], before: str, after: str
) -> None:
    """The values a text holds across the line breaks link() reads a link through are found
    by string operations on the text, not by ``_WRAP_BREAK`` tried at each character, and
    masked as where they are found so (a value with a character those operations take out,
    ``gappy``)."""
    pieces, at = [], 0
    for end, wrap in sorted(cuts):
        if at < end < len(value):
            pieces += [value[at:end], wrap]
            at = end
    text = before + "".join(pieces) + value[at:] + after + "\nend of the report\n" * 50
    exactly = Masker({value})
    exactly.gappy = True
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(message_module, "_WRAP_BREAK", _NoWholeTextSub(message_module._WRAP_BREAK))
        shown = Masker({value})(text)
    assert shown == exactly(text)
    assert "\u2022" in shown


def test_a_masker_hides_a_values_start_after_an_escape_and_a_cut() -> None:
    """pytest cuts a long repr of ``msg.raw``: a token's start after ``token=3D``, as a
    quoted-printable body or a Q-encoded subject shows it, is as much the token's."""
    link = "https://app.example.test/verify?token=Zq8xYtK2mP4_rT7wQ9sL1AbCdEfGh"
    mask = Masker(remember_extracted("link", link))

    assert mask("b'token=3DZq8xYtK2m...'") == "b'token=3D•••••••••...'"
    assert mask("=?utf-8?q?y=3Ftoken=3DZq8xYtK2mP4=5FrT...") == (
        "=?utf-8?q?y=3Ftoken=3D" + "•" * 16 + "..."
    )
    assert mask("b'...P4=5FrT7wQ9sL1AbCdEfGh?='") == "b'..." + "•" * 22 + "?='"


def test_a_masker_hides_a_values_pieces_in_encoded_words_pytest_cut_short() -> None:
    """pytest cuts a long repr of ``msg.raw`` anywhere: inside the second of the encoded
    words a token is split across, or in the middle of its first."""
    token = "XjunxHf4YdBn5xS_EWg-BeLwh6rGtydGIbI9ZdKxHdc"
    mask = Masker(remember_extracted("link", f"https://app.example.test/verify?token={token}"))

    start = "b'Subject: =?utf-8?q?y=3Ftoken=3DXjunxHf4YdBn5xS=5FEW?=\\r\\n =?utf-8?q?g-BeLw...'"
    end = "b'...Lwh6rGtydG?=\\r\\n =?utf-8?q?IbI9ZdKxHdc?=\\r\\nTo: a'"
    rest = "b'...5xS=5FEWg-BeLwh6rGtydGIbI9ZdKxHdc?=\\r\\nTo: a'"

    assert mask(start) == (
        "b'Subject: =?utf-8?q?y=3Ftoken=3D" + "•" * 20 + "?=\\r\\n =?utf-8?q?" + "•" * 6 + "...'"
    )
    assert mask(end) == "b'..." + "•" * 10 + "?=\\r\\n =?utf-8?q?" + "•" * 11 + "?=\\r\\nTo: a'"
    assert mask(rest) == "b'..." + "•" * 33 + "?=\\r\\nTo: a'"
    # dots in a word's text are no cut, and words with no value stay as they are
    assert mask("=?utf-8?q?wait...?= =?utf-8?q?ok?=") == "=?utf-8?q?wait...?= =?utf-8?q?ok?="


def test_a_bare_host_is_remembered_for_its_own_test_only() -> None:
    shared = remember_extracted("link", "https://bare-host.example.test/")

    assert shared == set()  # nothing another test, or an open mailbox, masks: every link
    assert "https://bare-host.example.test/" in message_module.TEST_EXTRACTED
    assert "https://bare-host.example.test/" not in message_module._EXTRACTED


@pytest.mark.parametrize(
    ("link", "own_only"),
    [
        ("https://app.example.test/reset/48291375", ["48291375", "/reset/48291375"]),
        ("https://app.example.test/reset/482913", ["482913"]),  # six digits, the fewest
        ("https://app.example.test/v?t=kq7pxzmw", ["kq7pxzmw", "/v?t=kq7pxzmw"]),
        ("https://app.example.test/v?token=qwerty12345;lang=en", ["qwerty12345"]),
    ],
)
def test_every_part_of_a_link_but_words_is_masked_in_its_own_test(
    link: str, own_only: list[str]
) -> None:
    """Short, numeric or plain tokens: its own test masks them; others keep such words."""
    message_module.TEST_EXTRACTED.clear()
    shared = remember_extracted("link", link)

    for part in own_only:
        assert part in message_module.TEST_EXTRACTED
        assert part not in shared
    assert "reset" not in message_module.TEST_EXTRACTED  # a word
    assert "en" not in message_module.TEST_EXTRACTED


def test_a_token_in_a_links_fragment_is_remembered() -> None:
    link = "https://app.example.test/cb#access_token=Zq8xYtK2mPw9RvLsAb3dEf7h&state=s1"

    assert "Zq8xYtK2mPw9RvLsAb3dEf7h" in remember_extracted("link", link)


def test_a_links_token_is_remembered_decoded_too() -> None:
    parts = remember_extracted("link", "https://app.example.test/v?t=k3J%2B9aQzXy7LmN4pR8sT")

    assert {"k3J%2B9aQzXy7LmN4pR8sT", "k3J+9aQzXy7LmN4pR8sT"} <= parts


def test_a_token_that_is_a_bare_query_key_is_remembered() -> None:
    link = "https://app.example.test/reset?Zq8xYtK2mPw9RvLsAb3dEf7h"

    assert "Zq8xYtK2mPw9RvLsAb3dEf7h" in remember_extracted("link", link)


def test_other_tests_mask_a_links_part_that_goes_from_letters_to_digits_three_times() -> None:
    assert "ab12cd34" in remember_extracted("link", "https://app.example.test/v?t=ab12cd34")


def test_its_own_test_keeps_a_links_words_and_numbered_names() -> None:
    message_module.TEST_EXTRACTED.clear()
    remember_extracted("link", "https://app.example.test/newsletter/ConfirmEmail2?t=abc12345")

    assert "abc12345" in message_module.TEST_EXTRACTED
    assert "newsletter" not in message_module.TEST_EXTRACTED  # letters alone: a word
    assert "ConfirmEmail2" not in message_module.TEST_EXTRACTED  # capitalised words: a name


def test_what_other_tests_extracted_is_masked_wherever_it_shows_but_inside_numbers() -> None:
    link = "https://app.example.test/reset/48291375"
    mask = Masker(set(), words={"2026"}, shared={"739154", "Zq8xYtK2mPw9RvLsAb3dEf7h", link})

    assert mask("logged in with 739154") == "logged in with ••••54"
    assert mask("code739154, +739154") == "code••••54, +••••54"
    assert mask("url: /cb?t=Zq8xYtK2mPw9RvLsAb3dEf7h") == "url: /cb?t=••••••••••••••••••••••7h"
    assert mask(f"'code:\\n739154\\nor {link}\\n'") == (  # as a repr escapes a line break
        "'code:\\n••••54\\nor " + "•" * (len(link) - 2) + "75\\n'"
    )
    for line in ("job 7391541 done", "job 318279... done", "Date: 03 Dec 2026 17:50:42"):
        assert mask(line) == line
    assert Masker({"827907"})("job 318279...") == "job 318279..."  # not mid-number
    assert Masker({"827907"})("code 8279...") == "code ••••..."


def test_its_own_test_masks_a_links_numbers_and_tokens_but_not_its_names() -> None:
    message_module.TEST_EXTRACTED.clear()
    remember_extracted(
        "link",
        "https://app.example.test/Account/ConfirmEmail"
        "?userId=1234567&email=alice%40example.test&redirect=%2Fdashboard&lang=en-US",
    )

    assert "1234567" in message_module.TEST_EXTRACTED  # a reset link's token may be a number
    for name in ("alice%40example.test", "alice@example.test", "%2Fdashboard", "ConfirmEmail"):
        assert name not in message_module.TEST_EXTRACTED
    assert "en-US" not in message_module.TEST_EXTRACTED


def test_a_link_with_raw_bytes_is_remembered_without_raising() -> None:
    assert remember_extracted("link", "https://a.test/x?t=\udcffabcdefgh12")


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        ("reply+Kx7pQ2mZr9TbW4nYv8Ls@app.test", "reply+••••••••••••••••••Ls@app.test"),
        ("Kx7pQ2mZr9TbW4nYv8Ls@app.test", "••••••••••••••••••Ls@app.test"),
        ("user+A7K9Q2@app.test", "user+••••Q2@app.test"),
        ("bounce+aB3dE5fG7h2k@app.test", "bounce+••••••••••2k@app.test"),
        ("noreply@app.example.test", "noreply@app.example.test"),
        ("alice+newsletter@app.test", "alice+newsletter@app.test"),
        ("user+48291375@app.test", "user+••••••75@app.test"),  # digit runs, as anywhere
        ("AB12CD@app.test", "AB12CD@app.test"),  # a local part that reads as a code is a name
        # the plugin's own aliases: a purpose and hex, not one word of one case with digits
        ("signup-22092e91ab@mailbox.test", "signup-22092e91ab@mailbox.test"),
    ],
)
def test_an_address_shows_no_token_in_its_local_part(address: str, shown: str) -> None:
    assert mask_address(address) == shown


def test_a_messages_repr_masks_a_token_in_its_sender() -> None:
    raw = build(text="Reply to this mail", sender="reply+Kx7pQ2mZr9TbW4nYv8Ls@app.test")
    shown = repr(Message(raw, message_id="m-1"))
    assert "Kx7pQ2mZr9TbW4nYv8Ls" not in shown
    assert "from=reply+••••••••••••••••••Ls@app.test" in shown


def test_a_link_pasted_as_domain_with_a_bad_port_is_refused_with_its_token_masked() -> None:
    """A host and a port as typed are shown as given; anything else (a whole link pasted
    as domain=) is masked as free text is, whatever made it unreadable."""
    pasted = "https://app.example.test:80x/verify?token=Zk3Pq9Wm2LxR7vN4"
    with pytest.raises(ExtractionError) as refused:
        plain(VERIFY).link(domain=pasted)
    assert "its port is not a port (a number 0..65535)" in str(refused.value)
    assert "Zk3Pq9Wm2LxR7vN4" not in str(refused.value)


@pytest.mark.parametrize(
    "hostile",
    [
        "=?" + "." * 20_000,  # a line of dots (a progress bar) with ``=?`` somewhere
        "=?" + "...a" * 5_000,
        "=?" + "....ab" * 3_000 + "?=",
        "b'=?utf-8?q?x...'" + "...=5F" * 3_000,
    ],
)
def test_the_rest_of_a_cut_encoded_word_is_scanned_once_whatever_the_dots(hostile: str) -> None:
    """The mask reads the rest of an encoded word pytest cut (``...5xS=5FEWg?=``) from
    each ``...``: it scanned a line of dots from each dot to the line's end, quadratic
    (100 kB of dots with ``=?`` in them took 40 s to mask). Every start together scans no
    more characters than the text has."""
    rest = re.compile(message_module._CUT_REST)
    scanned = 0
    for at in range(3, len(hostile)):
        if hostile.startswith("...", at - 3):
            found = rest.match(hostile, at)
            scanned += found.end() - at if found else 0
    assert scanned <= len(hostile)
    mask = Masker(remember_extracted("link", "https://app.example.test/v?token=5xS_EWg-BeLwh6r"))
    assert mask(hostile) == hostile
    assert mask(hostile + " ...5xS=5FEWg-BeLwh6r?=") == hostile + " ..." + "•" * 17 + "?="


@pytest.mark.parametrize(
    ("text", "html"),
    [
        (
            "Your order has shipped. Track it in the app.",
            "<p>Your order has shipped.</p><p>Questions? Call us on 555 0100.</p>",
        ),
        (
            "We sent your sign-in code by SMS to the phone ending in 42.",
            "<p>We sent your sign-in code by SMS to the phone ending in 42.</p>"
            "<footer>Acme Inc, 1600 Amphitheatre Pkwy, Mountain View CA 94043</footer>",
        ),
        (
            "Hi Ana, your password was changed. If this was not you, reply to this mail.",
            "<p>Hi Ana, your password was changed.</p><p>Ref 20261207</p>",
        ),
    ],
)
def test_a_text_part_of_its_own_words_is_not_read_past_to_the_htmls_numbers(
    text: str, html: str
) -> None:
    """A text part with no code, beside an HTML part that adds a phone number, an address
    or a reference: code() read the HTML part whenever the text had no code, and returned
    ``0100``, ``94043`` or ``20261207`` as the mail's code where it said "no code"."""
    msg = Message(build(text=text, html=html, subject="Your order"), message_id="m-1")

    with pytest.raises(ExtractionError, match="no code matching"):
        msg.code()
    with pytest.raises(ExtractionError, match="no code matching"):
        msg.code(pattern=r"(\d{4,5})")


@pytest.mark.parametrize(
    "stub",
    [
        "View this email in your browser: https://app.example.test/view/8f3a9c77d1e2",
        "This message needs a mail client that shows HTML.",
    ],
)
def test_a_stub_text_part_is_read_past_to_the_htmls_code(stub: str) -> None:
    html = "<p>Your sign-in code is <b>482913</b>.</p><p>Call us on 555 0100.</p>"
    msg = Message(build(text=stub, html=html, subject="Your code"), message_id="m-1")

    with pytest.raises(ExtractionError, match="2 distinct codes"):
        msg.code()  # the HTML's phone number is a candidate: the error says so
    assert msg.code(pattern=r"code is (\d{6})") == "482913"


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"token=3DZq8xYtK2mP4rT7\r\n", "token=Zq8xYtK2mP4rT7\n"),
        (b"token=3DZq8xYtK2m= \r\nP4rT7\r\n", "token=Zq8xYtK2mP4rT7\n"),  # padded soft break
    ],
)
def test_a_quoted_printable_body_with_8bit_text_in_it_is_read(line: bytes, text: str) -> None:
    """A mailer that labels its body quoted-printable but leaves ``Café`` unescaped (8-bit
    UTF-8, as sloppy mailers send): the body read as none (``msg.text == ""``, "no link"),
    once it held an ``=``: the email package hands such a payload back as text its charset
    decoded, which did not encode to ASCII to be read for padded soft line breaks."""
    raw = (
        b"From: a@app.example.test\r\nSubject: Caf\xc3\xa9\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        b"Caf\xc3\xa9: https://app.example.test/v?" + line + b"code 482913\r\n"
    )
    msg = Message(raw, message_id="m-1")

    assert msg.text == f"Café: https://app.example.test/v?{text}code 482913\n"
    assert msg.link() == "https://app.example.test/v?token=Zq8xYtK2mP4rT7"
    assert msg.code() == "482913"


@pytest.mark.parametrize(
    ("text", "html"),
    [
        # A code glued to a word by an HTML body's inline tags, a number in groups beside it.
        (None, "<p>Your code<b>482913</b></p><p>Order no. 123-456</p>"),
        (None, "<p>Code<b>482913</b></p><p>Save 100 000 points</p>"),
        (None, "<p>Code<b>482913</b></p><p>Questions? Call 13 22 11</p>"),
        # A stub text part with a number in groups, the code in the HTML beside it.
        (
            "Order 123-456: view this email in your browser https://shop.example.test/v",
            "<p>Your code is 482913</p>",
        ),
    ],
)
def test_a_number_in_groups_does_not_shadow_a_code_found_before(
    text: str | None, html: str
) -> None:
    """code() found the code glued to a word (``Code<b>482913</b>``), or in the HTML beside
    a stub text part; looking for codes in groups first made a footer's ``Order 123-456``
    or ``100 000 points`` the code instead."""
    msg = Message(build(text=text, html=html), message_id="m-1")

    assert msg.code() == "482913"


@pytest.mark.parametrize(
    "footer",
    [
        "Google LLC, 1600 Amphitheatre Parkway, Mountain View, CA 94043, USA",
        "Acme, Inc. \N{MIDDLE DOT} 10800 NE 8th Street, Suite 700 \N{MIDDLE DOT} Bellevue, "
        "WA 98004",
        "GitHub, Inc. \N{KATAKANA MIDDLE DOT}88 Colin P Kelly Jr Street, San Francisco, CA 94107",
        "Acme, P.O. Box 1234, Springfield, IL 62701-1234",
        "Acme, 12 rue de Rivoli, 75001 Paris",
        "Acme GmbH, Hauptstra\N{LATIN SMALL LETTER SHARP S}e 5, 10115 Berlin",
        "Requested on December 3, 2026 at 4:30 PM UTC.",
        "Your password was changed on 3 Dec 2026 at 16:30.",
        "Sent Dec. 3rd, 2026.",
        "Your statement for December 2026 is ready.",
        "Paid with Visa \N{EN DASH} 4242",
        "Charged to the card ending in 4242.",
        "Card: \N{BULLET}\N{BULLET}\N{BULLET}\N{BULLET} 4242",
        "Your order #10482 has shipped.",
    ],
)
def test_a_footers_address_a_date_in_words_a_card_or_an_order_number_is_no_code(
    footer: str,
) -> None:
    """Senders' footers give their postal address, notices the date in words, receipts a
    card's last four digits and an order's number: each was a second code beside the mail's
    (code() refused it as ambiguous), or the one code of a mail that has none, or of one
    whose code has letters (Slack's mail returned its ZIP code, ``94105``)."""
    assert plain(f"Your code is 482913. It expires in 10 minutes.\n\n{footer}\n").code() == (
        "482913"
    )
    assert plain(f"Your code is 483 920.\n\n{footer}\n").code() == "483920"
    with pytest.raises(ExtractionError, match="no code matching"):
        plain(f"Thanks for your order.\n\n{footer}\n").code()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Your code: 482913 Main Street", "482913"),  # six digits: never a street's number
        ("Code 48291. Acme Way", "48291"),
        ("Hi Jane, 48291 is your code.", "48291"),
        ("Your code for May: 4829", "4829"),
        ("Visa verification code 4829", "4829"),
    ],
)
def test_a_code_beside_words_an_address_or_a_date_uses_is_still_the_code(
    text: str, code: str
) -> None:
    assert plain(text).code() == code


def test_a_code_one_digit_a_cell_is_found_and_masked_as_the_html_writes_it() -> None:
    """A template that puts each digit of its code in a table cell of its own reads
    ``7 3 1 6 0 4``: code() found no code. Once taken, the HTML's cells are masked in the
    test's report, as a code in groups is."""
    cells = "".join(f'<td style="font-size:28px;text-align:center">{d}</td>\n' for d in "731604")
    html = f"<p>Enter this code:</p><table><tr>\n{cells}</tr></table><p>Room 1 2 3</p>"
    message = Message(build(html=html), on_secret=lambda kind, value, _: None)

    assert message.code() == "731604"
    # As every masked value shows its last two characters (``••••04``): here ``>4``.
    assert re.findall(r">\d</td>", message_module.mask_extracted(message.html)) == [">4</td>"]
    with pytest.raises(ExtractionError, match="no code matching"):
        Message(build(html="<p>Rooms 1 2 3 4 5</p><p>Seats 1 2 3 4 5 6 7 8 9</p>")).code()


def test_a_code_in_an_images_alt_text_is_found_when_nothing_else_is() -> None:
    """A code drawn as a picture is written in its ``alt`` text, for those who do not see
    it: code() said the mail had no code."""
    html = '<p>Enter this code:</p><img src="https://cdn.example.test/otp.png" alt="843027">'
    assert Message(build(html=html)).code() == "843027"
    # Only where nothing else is: a logo's alt text is no second code.
    logo = '<img alt="Acme 2026" src="logo.png"><p>Your code is 482913</p>'
    assert Message(build(html=logo)).code() == "482913"
    # Not beside a text part of its own words, which says the mail has no code.
    text = "Thanks for your order. We will write again when it ships, with its tracking link."
    with pytest.raises(ExtractionError, match="no code matching"):
        Message(build(text=text, html=html)).code()


@pytest.mark.parametrize(
    "footer",
    [
        "Call us on 0345 300 0000.",
        "Tel.: +49 30 12345678",
        "Tel +49 (0)30 12345678",
        "Telefon: 030 12345678",
        "Phone: +44 20 7946 0958",
        "Call 1 800 555 0199",
        "Fax (030) 1234567",
        "Hotline 0800 1234567",
        "Need help? Call (555) 010 4477",
        "Registered in England No. 2366661",
        "Company no. 01234567",
        "Amtsgericht Berlin HRB 123456",
        "Order no. 10482",
        "Invoice INV-0042",
        "Sort code 20-00-00, account 12345678",
        "IBAN DE89 3704 0044 0532 0130 00",
        "Member since 2019",
        "You have 100 000 points, worth $2 500.",
    ],
)
def test_a_footers_phone_register_or_account_number_or_an_amount_is_no_code(footer: str) -> None:
    """A European sender's footer gives its phone number in groups, its register's number,
    a bank account: each was a second code beside the mail's, or the one code of a mail
    that has none (``12345678`` of ``Tel.: +49 30 12345678``); an amount in groups was
    taken for a code in groups (``100 000 points``)."""
    assert plain(f"Your code is 482913.\n\n{footer}\n").code() == "482913"
    assert plain(f"Your code is 048 291.\n\n{footer}\n").code() == "048291"
    with pytest.raises(ExtractionError, match="no code matching"):
        plain(f"Thanks for your order.\n\n{footer}\n").code()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Your code is 048 291", "048291"),  # from 0, as a national phone number: two groups
        ("Your code is 04 82 91", "048291"),
        ("Your code: 0482", "0482"),
        ("No. of attempts left: 3. Code 482913", "482913"),
        ("Your code is 483 920, valid for 10 minutes", "483920"),
        ("Phone verification code: 482913", "482913"),
    ],
)
def test_a_code_beside_words_a_phone_or_a_register_uses_is_still_the_code(
    text: str, code: str
) -> None:
    assert plain(text).code() == code


def test_the_runs_the_no_code_rules_read_are_bounded() -> None:
    """A card's masked digits and the gap after ``No`` are read a few characters long:
    unbounded, each ``x`` of a long run (a text of ``xxxx…``) started a scan to the run's
    end, and the gap's spaces were split three ways, so a long text took time that grew
    with its square or cube in ``code()``."""
    not_codes = message_module._NOT_CODES
    assert not_codes.fullmatch("No" + " " * 3 + "2366661")
    assert not_codes.fullmatch("No" + " " * 4 + "2366661") is None
    assert not_codes.fullmatch("x" * 16 + " 4242")
    assert not_codes.fullmatch("x" * 17 + " 4242") is None


@pytest.mark.parametrize(
    "when",
    [
        "am 3. Dezember 2026 um 16:30 Uhr",
        "le 1er mars 2026 \N{LATIN SMALL LETTER A WITH GRAVE} 16h30",
        "el 3 de diciembre de 2026",
        "em 3 de dezembro de 2026",
        "il 3 dicembre 2026",
        "op 3 december 2026",
        "2026\u5e7412\u67083\u65e5 16:30",
        "2026\ub144 12\uc6d4 3\uc77c",
    ],
)
def test_a_date_in_another_language_is_no_code(when: str) -> None:
    """A sign-in notice from a German, French, Spanish, Japanese or Korean sender says when
    the code was asked for in its own words: the year was a second code, or the one code of
    a mail that has none."""
    assert plain(f"Ihr Code lautet 482913.\nAngefordert {when}.\n").code() == "482913"
    assert (
        plain(f"\u8a8d\u8a3c\u30b3\u30fc\u30c9\u306f4829\u3067\u3059\u3002\n{when}\n").code()
        == "4829"
    )
    with pytest.raises(ExtractionError, match="no code matching"):
        plain(f"Danke f\u00fcr Ihre Bestellung.\n{when}\n").code()


@pytest.mark.parametrize(
    ("html", "code"),
    [
        ("<table><tr><td>Account</td><td>482913</td></tr></table>", "482913"),
        ("<h1>Confirm Account</h1><p><b>482913</b></p>", "482913"),
        ("<p>Hello Ann,</p><p>4829</p><p>Cheers,</p><p>The team</p>", "4829"),
        ("<p>Your code</p><p>4829</p><p>Sign In The Easy Way</p>", "4829"),
    ],
)
def test_what_is_no_code_is_read_in_an_html_block_alone(html: str, code: str) -> None:
    """An HTML body's text is read with its blocks joined by spaces: a heading's or a
    cell's last word and the next block's number read as one (``Account 482913``, an
    account's number; ``, 4829 Cheers,``, a postal code before its city), and the mail's
    one code was taken out as no code: "no code"."""
    message = Message(build(html=html))

    assert message.code() == code
    stub = "View this email in your browser: https://app.example.test/view/1"
    assert Message(build(text=stub, html=html)).code() == code
    assert " ".join(message._html_blocks) == message._html_text


@pytest.mark.parametrize(
    "text",
    [
        "Use this code to verify your account: 482913",
        "Sign in to your account 482913",
        "Enter this code to confirm the account: 482913",
        "Code f\u00fcr Ihr Konto: 482913",
    ],
)
def test_a_code_after_the_account_a_sentence_names_is_the_code(text: str) -> None:
    """``account 12345678`` in a footer is an account's number, no code; the account a
    sign-in mail's sentence names is no label of the number after it: its one code was
    taken out, and code() said "no code"."""
    assert plain(f"{text}\n").code() == "482913"
    assert plain("Your code is 482913.\n\nSort code 20-00-00, account 12345678\n").code() == (
        "482913"
    )


@pytest.mark.parametrize(
    "text",
    [
        "Your code is **4829**",
        "Your PIN: ** 4829 **. Don't share it.",
        "Foxx 4829 is your code",
    ],
)
def test_a_pin_in_markdowns_bold_is_no_cards_last_four(text: str) -> None:
    """A mailer that writes its text part in Markdown sets the PIN in bold (``**4829**``):
    its stars were read as a card's masked digits, the PIN as its last four, and code()
    said "no code". A card's masked digits still are (``**** 4242``)."""
    assert plain(f"{text}\n").code() == "4829"
    assert plain("Your code is 4829.\n\nPaid with card **** 4242\n").code() == "4829"
    assert plain("Your code is 4829.\n\nCard: XXXX-XXXX-XXXX-4242\n").code() == "4829"


@pytest.mark.parametrize(
    "text",
    ["We sent code 4829 via SMS.", "Il tuo codice \u00e8 4829 via email.", "Use 4829, via the app"],
)
def test_a_code_sent_via_something_is_the_code(text: str) -> None:
    """``12 rue de Rivoli`` is a street's number; ``4829 via SMS`` is a code: the word
    ``via`` after it was read as a street's, and code() said "no code"."""
    assert plain(f"{text}\n").code() == "4829"
    assert plain("Your code is 4829.\n\nAcme, 1200 Via Verde, San Dimas\n").code() == "4829"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("<p>Your code</p>", "<p>1 use only. It expires in 10 minutes.</p>"),
        ("<p>Step 2</p>", "<p>It expires in 10 minutes.</p>"),
        ("<p>Your code</p>", "<p>5 items are waiting in your cart.</p>"),
    ],
)
def test_a_code_one_digit_a_cell_takes_no_digit_of_the_blocks_beside_it(
    before: str, after: str
) -> None:
    """The cells of a code written a digit a cell read ``4 8 2 9 1 3``, and so did a
    paragraph's first or last digit beside them: code() returned ``4829131`` for
    ``1 use only`` after the code, ``2482913`` for ``Step 2`` before it, the wrong
    code, or "no code" (``4 8 2 9 1 3 5 items``, an amount)."""
    cells = "".join(f"<td>{digit}</td>" for digit in "482913")
    html = f"{before}<table><tr>{cells}</tr></table>{after}"

    assert Message(build(html=html)).code() == "482913"
    stub = "View this email in your browser: https://app.example.test/view/1"
    assert Message(build(text=stub, html=html)).code() == "482913"


@pytest.mark.parametrize("points", ["1234567", "123456", "0123456", "23456789"])
def test_a_surveys_scale_a_cell_a_point_is_no_code(points: str) -> None:
    """A survey's mail asks a rating on a scale, a link in a cell for each point: its
    cells read ``1 2 3 4 5 6 7``, six to eight single digits, and code() returned
    ``1234567`` for a mail with no code. A code written a digit a cell still is one."""
    cells = "".join(
        f'<td><a href="https://survey.example.test/r?s={point}">{point}</a></td>'
        for point in points
    )
    html = f"<p>How likely are you to recommend us?</p><table><tr>{cells}</tr></table>"
    with pytest.raises(ExtractionError, match="no code matching"):
        Message(build(html=html)).code()
    code = "".join(f"<td>{digit}</td>" for digit in "731604")
    assert Message(build(html=f"<table><tr>{code}</tr></table>")).code() == "731604"
