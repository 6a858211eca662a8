"""Hostile SMTP input against a real sink: raw bytes where smtplib would refuse to send them.

Every case ends with the right reply (or a hang-up), nothing partial stored, nothing echoed.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import gc
import inspect
import logging
import smtplib
import socket
import sqlite3
import struct
import sys
import tracemalloc
import weakref
from collections.abc import Callable, Coroutine, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aiosmtpd
import pytest
from aiosmtpd.smtp import SMTP, _AuthMechAttr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_mailbox.sink as sink_module
from pytest_mailbox import ContractError, EmailContract, Mailbox, Message
from pytest_mailbox.sink import (
    MailSink,
    SmtpEndpoint,
    _Handler,
    _Protocol,
    is_loopback,
    normalize_domain,
)
from pytest_mailbox.store import Delivery, MessageRow, Store

DOMAIN = "mailbox.test"
IDN_DOMAIN = "bücher.test"
SAFETY = 10.0  # seconds: a bound on every socket read, never a synchronisation


class Client:
    """A raw SMTP client: sends bytes as given, reads replies line by line."""

    #: Every client not yet closed: the ``clients_closed`` fixture closes what a failed
    #: test left open, which would fail a later test on the worker with a ResourceWarning.
    opened: ClassVar[list[Client]] = []

    def __init__(self, sink: MailSink, *, greet: bool = True) -> None:
        self.sock = socket.create_connection((sink.host, sink.port), timeout=SAFETY)
        self.opened.append(self)
        self.file = self.sock.makefile("rb")
        self.banner = self.reply() if greet else b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> bytes:
        """One complete reply (every line of a multi-line one); b"" once the server hung up."""
        lines = []
        while True:
            line = self.file.readline()
            lines.append(line)
            if not line or line[3:4] != b"-":
                return b"".join(lines)

    def cmd(self, line: bytes) -> bytes:
        self.send(line + b"\r\n")
        return self.reply()

    def rest(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        return self.file.read()

    def envelope(self, *rcpts: bytes, sender: bytes = b"<app@example.test>") -> None:
        """EHLO, MAIL, RCPT…, each answered with 2xx; then DATA answered with 354."""
        assert self.cmd(b"EHLO client.test").startswith(b"250")
        assert self.cmd(b"MAIL FROM:" + sender).startswith(b"250")
        for rcpt in rcpts:
            assert self.cmd(b"RCPT TO:" + rcpt).startswith(b"250"), rcpt
        assert self.cmd(b"DATA").startswith(b"354")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(autouse=True)
def clients_closed() -> Iterator[None]:
    yield
    while Client.opened:
        Client.opened.pop().close()


@pytest.fixture
def make_sink(tmp_path: Path) -> Iterator[Callable[..., MailSink]]:
    """Start a sink of our own (loopback, fresh store) with the given limits."""
    sinks: list[MailSink] = []

    def make(**options: Any) -> MailSink:
        store = Store(tmp_path / f"store-{len(sinks)}.sqlite3")
        sink = MailSink(store, domains=[DOMAIN, IDN_DOMAIN], **options).start()
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.stop()
        sink.store.close()


@pytest.fixture
def sink(make_sink: Callable[..., MailSink]) -> MailSink:
    return make_sink()


@pytest.fixture
def client(sink: MailSink) -> Iterator[Client]:
    connection = Client(sink)
    yield connection
    connection.close()


def reserve(sink: MailSink, domain: str = DOMAIN) -> Mailbox:
    return Mailbox.reserve(
        sink.store,
        contract=EmailContract(purpose="hostile", ttl=120, lease=60),
        domain=domain,
        signal=sink.signal,
    )


def _with_peak_memory(action: Callable[[], bytes]) -> tuple[bytes, int]:
    """What ``action`` returns, and the most memory this process (the sink's thread
    included) held beyond what it held before, while it ran."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


def _sent_in_pieces(
    client: Client, head: bytes, piece: bytes, times: int, tail: bytes
) -> tuple[bytes, int]:
    """Send ``head``, ``piece`` ``times`` times and ``tail``: the reply, and the most memory
    the process held meanwhile beyond what it held before (``_with_peak_memory``)."""

    def send() -> bytes:
        client.send(head)
        for _ in range(times):
            client.send(piece)
        client.send(tail)
        return client.reply()

    return _with_peak_memory(send)


def angle(mailbox: Mailbox) -> bytes:
    return f"<{mailbox.address}>".encode()


def stored(sink: MailSink) -> int:
    """Every recipient copy the sink ever stored, routed or not."""
    counts = sink.store.stats()
    return counts["received"] + counts["unrouted"]


def rows(sink: MailSink, mailbox: Mailbox) -> list[MessageRow]:
    return sink.store.messages(mailbox.mailbox_id)


# -- SMTP smuggling -------------------------------------------------------------------------

SMUGGLED = (
    b"MAIL FROM:<attacker@evil.test>\r\n"
    b"RCPT TO:<victim@mailbox.test>\r\n"
    b"DATA\r\n"
    b"Subject: smuggled\r\n"
    b"\r\n"
    b"a second message\r\n"
    b"\r\n.\r\n"
)
SMTPSMUG_ENDINGS = {
    "lf-dot-lf": b"\n.\n",
    "cr-dot-cr": b"\r.\r",
    "cr-dot-lf": b"\r.\n",
    "lf-dot-cr": b"\n.\r",
    "lf-dot-crlf": b"\n.\r\n",
    "crlf-dot-lf": b"\r\n.\n",
    "cr-dot-crlf": b"\r.\r\n",
    "crlf-dot-cr": b"\r\n.\r",
    "nul-before-dot": b"\r\n\x00.\r\n",
    "nul-after-dot": b"\r\n.\x00\r\n",
}


def _smuggle(client: Client, mailbox: Mailbox, ending: bytes) -> bytes:
    client.envelope(angle(mailbox))
    client.send(b"Subject: first\r\n\r\nthe real message" + ending + SMUGGLED)
    return client.reply()


def test_smuggled_transaction_after_lf_dot_crlf_stays_inside_one_message(
    sink: MailSink, client: Client
) -> None:
    mailbox = reserve(sink)

    assert _smuggle(client, mailbox, b"\n.\r\n") == b"250 2.0.0 Message accepted\r\n"
    # Had the sink ended DATA at "\n.\r\n", the smuggled commands would answer here.
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    (row,) = rows(sink, mailbox)
    assert stored(sink) == 1
    assert b"MAIL FROM:<attacker@evil.test>" in sink.store.raw(row.body_id)
    assert row.subject == "first"
    assert "bare_lf" in row.defects.split(",")


@pytest.mark.parametrize("ending", SMTPSMUG_ENDINGS.values(), ids=SMTPSMUG_ENDINGS.keys())
def test_smtpsmug_ending_never_stores_two_messages(
    sink: MailSink, client: Client, ending: bytes
) -> None:
    mailbox = reserve(sink)

    assert _smuggle(client, mailbox, ending) == b"250 2.0.0 Message accepted\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    (row,) = rows(sink, mailbox)
    assert stored(sink) == 1
    assert b"attacker@evil.test" in sink.store.raw(row.body_id)
    assert set(row.defects.split(",")) & {"bare_lf", "bare_cr", "nul"}


@pytest.mark.parametrize("ending", SMTPSMUG_ENDINGS.values(), ids=SMTPSMUG_ENDINGS.keys())
def test_smtpsmug_ending_is_refused_under_refuse_policy(
    make_sink: Callable[..., MailSink], ending: bytes
) -> None:
    sink = make_sink(data_policy="refuse")
    client = Client(sink)
    mailbox = reserve(sink)

    reply = _smuggle(client, mailbox, ending)

    assert reply.startswith(b"554 5.6.0 Message refused: ")
    assert reply.endswith(b"nothing was stored\r\n")
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert stored(sink) == 0
    client.close()


DATA_PIECES = st.sampled_from(
    [
        b"\r\n", b"\n", b"\r", b".", b"\x00", b"\xff", b" ", b"x", b"Subject: s", b"\r\n.\r\n",
        b"MAIL FROM:<attacker@evil.test>", b"RCPT TO:<victim@mailbox.test>", b"DATA", b"RSET",
        b"\r\n.\r\n" + SMUGGLED[: SMUGGLED.index(b"DATA\r\n") + 6],
        *SMTPSMUG_ENDINGS.values(),
    ]
)  # fmt: skip


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pieces=st.lists(st.one_of(DATA_PIECES, st.binary(max_size=8)), max_size=40))
def test_whatever_a_client_sends_in_data_one_transaction_stores_at_most_one_message(
    sink: MailSink, pieces: list[bytes]
) -> None:
    mailbox = reserve(sink)
    before = stored(sink)
    client = Client(sink)
    try:
        client.envelope(angle(mailbox))
        client.send(b"".join(pieces) + b"\r\n.\r\nNOOP\r\n")
        replies = []
        while not replies or replies[-1] not in (b"", b"250 OK\r\n"):
            replies.append(client.reply())
    finally:
        client.close()

    assert stored(sink) - before <= 1
    assert sum(r.startswith(b"250 2.0.0") for r in replies) <= 1
    assert all(b"attacker" not in r and b"victim" not in r for r in replies)
    with Client(sink) as fresh:  # and the sink still serves
        assert fresh.cmd(b"NOOP") == b"250 OK\r\n"


# -- bare line endings: the policy ------------------------------------------------------------


def bare(mailbox: Mailbox) -> bytes:
    """A message with a bare LF in its headers and a bare LF and CR in its body."""
    return (
        b"Subject: Bare endings\nX-Run-Id: %s\r\n\r\nline one\nline two\rstill two\r\n"
    ) % mailbox.run_id.encode()


def test_bare_lf_and_cr_are_stored_raw_flagged_and_parsed_as_line_breaks(
    sink: MailSink, client: Client
) -> None:
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))

    client.send(bare(mailbox) + b".\r\n")

    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    (row,) = rows(sink, mailbox)
    raw = sink.store.raw(row.body_id)
    assert raw == bare(mailbox)  # byte for byte: nothing normalised on the way in
    assert {"bare_lf", "bare_cr"} <= set(row.defects.split(","))
    # The store's index (used to route and match) and the test's view read the same bytes.
    view = mailbox.wait_for(subject="Bare endings", timeout=SAFETY)
    assert (
        (row.subject, row.run_header)
        == (view.subject, view.run_header())
        == (
            "Bare endings",
            mailbox.run_id,
        )
    )
    assert view.text.splitlines() == ["line one", "line two", "still two"]
    assert view.text.splitlines() == raw.split(b"\r\n\r\n", 1)[1].decode().splitlines()


def test_bare_lf_is_refused_under_refuse_policy_and_the_session_goes_on(
    make_sink: Callable[..., MailSink],
) -> None:
    sink = make_sink(data_policy="refuse")
    client = Client(sink)
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))

    client.send(bare(mailbox) + b".\r\n")

    assert client.reply() == (
        b"554 5.6.0 Message refused: bare LF, bare CR in DATA; lines must end with CRLF "
        b"(mailbox_data_policy=refuse); nothing was stored\r\n"
    )
    assert stored(sink) == 0
    client.envelope(angle(mailbox))
    client.send(b"Subject: clean\r\n\r\nbody\r\n.\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert [r.subject for r in rows(sink, mailbox)] == ["clean"]
    client.close()


def test_sink_refuses_an_unknown_data_policy(tmp_path: Path) -> None:
    with (
        contextlib.closing(Store(tmp_path / "s.sqlite3")) as store,
        pytest.raises(ValueError, match="data_policy='strict' is invalid; allowed: flag, refuse"),
    ):
        MailSink(store, domains=[DOMAIN], data_policy="strict")


@pytest.mark.parametrize("size", [0, -1, None, True, 1.5])
def test_sink_refuses_a_max_message_size_that_is_no_bound(tmp_path: Path, size: object) -> None:
    with (
        contextlib.closing(Store(tmp_path / "s.sqlite3")) as store,
        pytest.raises(ValueError, match=r"^max_message_size=") as refused,
    ):
        MailSink(store, domains=[DOMAIN], max_message_size=size)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"max_message_size={size!r} is invalid; allowed: a positive number of bytes "
        "(the plugin's mailbox_max_message_size: 1024..1073741824)"
    )


# -- line and size limits -------------------------------------------------------------------


LINE_TOO_LONG = b"500 Line too long (see RFC5321 4.5.3.1.6)\r\n"


def test_data_line_over_998_octets_is_refused_and_nothing_stored(
    sink: MailSink, client: Client
) -> None:
    mailbox = reserve(sink)
    # 999 octets is one over RFC 5321's 998 (aiosmtpd alone lets it through); 1000 is
    # refused by aiosmtpd's own check. Either way the session goes on.
    for length in (999, 1000):
        client.envelope(angle(mailbox))
        client.send(b"Subject: long\r\n\r\n" + b"x" * length + b"\r\n.\r\n")
        assert client.reply() == LINE_TOO_LONG, length
        assert stored(sink) == 0

    # The longest lines RFC 5321 allows (998 octets and CRLF) still go through, a line
    # that starts with a dot too: the dot the client doubles for transparency is not counted.
    longest = b"y" * 998 + b"\r\n" + b"." + b"z" * 997 + b"\r\n"
    client.envelope(angle(mailbox))
    client.send(b"Subject: longest\r\n\r\n" + longest.replace(b"\n.", b"\n..") + b".\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    [row] = rows(sink, mailbox)
    assert row.subject == "longest"
    assert sink.store.raw(row.body_id).endswith(b"\r\n\r\n" + longest)


def test_smtplib_sendmail_of_as_bytes_is_stored_and_flagged_at_any_length(
    sink: MailSink,
) -> None:
    mailbox = reserve(sink)
    mail = EmailMessage()
    mail["Subject"] = "Welcome"
    mail["From"] = "app@example.test"
    mail["To"] = mailbox.address
    mail.set_content("\n".join(f"line {i} of the welcome mail" for i in range(100)))
    raw = mail.as_bytes()
    assert b"\r" not in raw  # the default policy's line ends: bare LF
    assert len(raw) > 1001  # longer than aiosmtpd's one line

    with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
        assert smtp.sendmail("app@example.test", [mailbox.address], raw) == {}

    (row,) = rows(sink, mailbox)
    assert row.defects.split(",") == ["bare_lf"]
    assert sink.store.raw(row.body_id) == raw + b"\r\n"  # smtplib ends the data with CRLF
    view = mailbox.wait_for(subject="Welcome", timeout=SAFETY)
    assert view.text.splitlines()[:100] == [f"line {i} of the welcome mail" for i in range(100)]


def test_lines_that_end_at_a_bare_lf_are_measured_one_by_one(
    sink: MailSink, client: Client
) -> None:
    mailbox = reserve(sink)
    lines = b"\n".join(b"short line %d" % i for i in range(200))  # 2,689 octets, no CRLF

    client.envelope(angle(mailbox))
    client.send(b"Subject: many\n\n" + lines + b"\n" + b"y" * 998 + b"\r\n.\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert stored(sink) == 1

    # A line over 998 octets is too long whether a bare LF or CRLF ends it ...
    client.envelope(angle(mailbox))
    client.send(b"Subject: long\n\n" + lines + b"\n" + b"x" * 999 + b"\n" + lines + b"\r\n.\r\n")
    assert client.reply() == LINE_TOO_LONG
    # ... and a bare CR does not end a line (nor does it for sendmail or Postfix).
    client.envelope(angle(mailbox))
    client.send(b"Subject: cr\r\r" + lines.replace(b"\n", b"\r") + b"\r\n.\r\n")
    assert client.reply() == LINE_TOO_LONG
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert stored(sink) == 1
    [row] = rows(sink, mailbox)
    assert row.subject == "many"
    assert row.defects.split(",") == ["bare_lf"]


def test_long_bare_lf_mail_under_refuse_policy_gets_554_not_line_too_long(
    make_sink: Callable[..., MailSink],
) -> None:
    sink = make_sink(data_policy="refuse")
    client = Client(sink)
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))

    client.send(b"Subject: lf\n\n" + b"a short line\n" * 200 + b"\r\n.\r\n")

    assert client.reply().startswith(b"554 5.6.0 Message refused: bare LF in DATA")
    assert stored(sink) == 0
    client.close()


def test_bare_lf_mail_over_max_size_gets_552_in_bounded_memory(
    make_sink: Callable[..., MailSink],
) -> None:
    sink = make_sink(max_message_size=4096)
    client = Client(sink)
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))
    lines = (b"z" * 900 + b"\n") * 1165  # 1 MiB with no CRLF: one line to aiosmtpd

    reply, peak = _sent_in_pieces(client, b"Subject: big\n\n", lines, 4, b"\r\n.\r\n")

    assert reply == b"552 Error: Too much mail data\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert stored(sink) == 0
    assert peak < 1024 * 1024  # the sink kept about max_message_size of it
    client.close()


def test_a_data_line_with_no_line_break_at_all_gets_552_in_bounded_memory(
    make_sink: Callable[..., MailSink],
) -> None:
    """No LF at all (an app's unwrapped base64, or a hostile client): aiosmtpd's own read
    kept every byte until a CRLF came, 40 MiB for a 40 MiB line, whatever the limit."""
    sink = make_sink(max_message_size=4096)
    client = Client(sink)
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))
    chunk = b"x" * 65536 + b"\r"  # a CR at a piece's end: never read as a line's end

    # 16 MiB, one line
    reply, peak = _sent_in_pieces(client, b"Subject: big\r\n\r\n", chunk, 256, b"\r\n.\r\n")

    assert reply == b"552 Error: Too much mail data\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert stored(sink) == 0
    # a few of the socket's reads at a time (each up to 256 KiB), not the line
    assert peak < 4 * 1024 * 1024
    client.close()


def test_a_header_section_past_its_limit_gets_552_and_nothing_stored(
    sink: MailSink, client: Client
) -> None:
    """The sink parses the header section on its event loop before the 250: a long one of
    non-ASCII folded lines took about a second a MiB, and every client waited for it."""
    mailbox = reserve(sink)
    pad = b"X-Pad: " + "\u00e9".encode() * 400 + b"\r\n"  # 807 octets, 8-bit
    over = pad * (sink_module.HEADER_LIMIT // len(pad) + 1)
    client.envelope(angle(mailbox))
    client.send(b"Subject: big\r\n" + over + b"\r\nbody\r\n.\r\n")
    assert client.reply() == (
        b"552 5.3.4 Message header section too big (over 256 KiB); nothing was stored\r\n"
    )
    assert stored(sink) == 0
    under = pad * (sink_module.HEADER_LIMIT // len(pad) - 1)  # a large body is no matter
    client.envelope(angle(mailbox))
    client.send(b"Subject: big\r\n" + under + b"\r\n" + b"body\r\n" * 50_000 + b".\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert stored(sink) == 1


def test_message_over_max_size_gets_552_and_nothing_stored(
    make_sink: Callable[..., MailSink],
) -> None:
    sink = make_sink(max_message_size=4096)
    client = Client(sink)
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))

    client.send(b"Subject: big\r\n\r\n" + b"0123456789abcdef\r\n" * 300 + b".\r\n")

    assert client.reply() == b"552 Error: Too much mail data\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert stored(sink) == 0
    client.close()


def test_mail_from_size_over_max_gets_552(make_sink: Callable[..., MailSink]) -> None:
    sink = make_sink(max_message_size=4096)
    client = Client(sink)
    assert b"250-SIZE 4096\r\n" in client.cmd(b"EHLO client.test")

    reply = client.cmd(b"MAIL FROM:<app@example.test> SIZE=4097")

    assert reply == b"552 Error: message size exceeds fixed maximum message size\r\n"
    assert client.cmd(b"MAIL FROM:<app@example.test> SIZE=4096") == b"250 2.1.0 OK\r\n"
    client.close()


def _dotted(size: int) -> bytes:
    """A message of exactly ``size`` bytes whose every body line starts with a dot."""
    head = b"Subject: dots\r\n\r\n"
    line = b".0123456789abcdef\r\n"  # 19 bytes; 20 on the wire, its dot doubled
    body = line * ((size - len(head)) // len(line))
    return head + body + b"x" * (size - len(head) - len(body) - 2) + b"\r\n"


def test_a_message_of_the_size_offered_is_taken_though_its_dots_are_doubled(
    make_sink: Callable[..., MailSink],
) -> None:
    """RFC 1870 counts a message without the dots doubled for transparency, as smtplib's
    ``SIZE=`` does; aiosmtpd counted them, and refused such a message with ``552``."""
    sink = make_sink(max_message_size=4096)
    mailbox = reserve(sink)
    exact, over = _dotted(4096), _dotted(4097)
    assert len(exact) == 4096
    assert exact.count(b"\r\n.") > 200

    with smtplib.SMTP(sink.host, sink.port) as smtp:
        assert smtp.sendmail("app@example.test", [mailbox.address], exact) == {}
        # one byte over: SIZE= gets 552 at once; without it, 552 after the data
        with pytest.raises(smtplib.SMTPSenderRefused):
            smtp.sendmail("app@example.test", [mailbox.address], over)
        assert smtp.mail("app@example.test")[0] == smtp.rcpt(mailbox.address)[0] == 250
        refused = smtp.data(over)
        assert smtp.noop()[0] == 250

    assert refused == (552, b"Error: Too much mail data")
    assert [sink.store.raw(r.body_id) for r in rows(sink, mailbox)] == [exact]
    assert stored(sink) == 1


def test_command_line_over_the_limit_gets_500_and_the_session_goes_on(client: Client) -> None:
    assert client.cmd(b"NOOP " + b"x" * 600) == b"500 Command line too long\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"


def test_repeated_ehlo_does_not_raise_the_command_limit(client: Client) -> None:
    for _ in range(40):
        assert client.cmd(b"EHLO client.test").startswith(b"250-")
    # aiosmtpd alone adds 36 bytes to the MAIL limit on every EHLO, for every session.
    long_sender = b"<" + b"a" * 580 + b"@example.test>"

    assert client.cmd(b"MAIL FROM:" + long_sender) == b"500 Command line too long\r\n"
    assert client.cmd(b"MAIL FROM:<app@example.test>") == b"250 2.1.0 OK\r\n"


def test_megabytes_without_a_newline_get_500_in_bounded_memory(client: Client) -> None:
    reply, peak = _sent_in_pieces(client, b"", b"A" * 65536, 64, b"\r\n")  # 4 MiB, one line

    assert reply == b"500 Command line too long\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert peak < 1024 * 1024  # the sink kept at most a few lines of it


# -- envelope addresses -----------------------------------------------------------------------

ADDRESS_PIECES = st.sampled_from(
    ["<", ">", "@", ".", " ", "\t", "(", ")", "\\", '"', "[", "]", ":", ",", "=", "\r\n",
     "user", "a+tag", "mailbox.test", "x-y", "é", "SIZE=10", "BODY=8BITMIME", "!#$%&'*/?^`{|}~",
     "\f", "\v", "\u2003"]
)  # fmt: skip


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],  # from_regex, on a busy CI machine
)
@given(
    arg=st.one_of(
        st.lists(ADDRESS_PIECES, max_size=12).map("".join),
        st.text(max_size=30),
        st.from_regex(
            r"<[a-z0-9.+-]{1,8}@[a-z0-9.-]{1,8}>([ \t]{0,2}[A-Z=0-9( ]{0,8})?", fullmatch=True
        ),
    ),
    limit=st.sampled_from([0, 0, 3]),
)
def test_the_sinks_address_fast_path_agrees_with_aiosmtpd(arg: str, limit: int) -> None:
    protocol = object.__new__(_Protocol)  # _getaddr reads only local_part_limit
    protocol.local_part_limit = limit

    def outcome(parse: Callable[[str], object]) -> object:
        try:
            return parse(arg)
        except Exception as exc:  # aiosmtpd's parser raises IndexError on "<", for one
            return type(exc)

    assert outcome(protocol._getaddr) == outcome(lambda a: SMTP._getaddr(protocol, a))


def _state(protocol: _Protocol) -> dict[str, object]:
    """A protocol's attributes, comparable across two instances: bound methods by function
    and by whom they are bound to, per-connection objects (reader, futures) by type."""
    handler = protocol.event_handler

    def shown(value: object) -> object:
        if inspect.ismethod(value):
            owner = {id(protocol): "protocol", id(handler): "handler"}.get(id(value.__self__))
            return ("method", value.__func__, owner or value.__self__)
        if isinstance(value, _AuthMechAttr):
            return ("auth", shown(value.method), value.is_builtin)
        if isinstance(value, dict):
            return [(key, shown(item)) for key, item in value.items()]  # order too
        if isinstance(value, (asyncio.StreamReader, asyncio.Future, weakref.ref, _Handler)):
            return type(value)
        return value

    state = {name: shown(value) for name, value in vars(protocol).items()}
    limits = protocol.command_size_limits
    state["command_size_limits"] = (dict(limits), limits.default_factory is not None)
    return state


@pytest.mark.parametrize(
    ("hostname", "ident"), [("sink.test", "pytest-mailbox"), ("", "")], ids=["given", "empty"]
)
def test_the_sinks_protocol_is_set_up_as_aiosmtpd_would(
    tmp_path: Path, hostname: str, ident: str
) -> None:
    """``_Protocol._setup`` skips aiosmtpd's per-connection introspection; it must leave
    every attribute as ``SMTP.__init__`` would, or the versions it claims to match are wrong.
    An empty hostname or ident falls back to aiosmtpd's (the FQDN, "Python SMTP …")."""
    loop = asyncio.new_event_loop()
    store = Store(tmp_path / "s.sqlite3")
    try:
        sink = MailSink(store, domains=[DOMAIN])  # never started: its protocols are built here
        options: dict[str, Any] = {
            "hostname": hostname,
            "ident": ident,
            "data_size_limit": 1000,
            "enable_SMTPUTF8": True,
            "timeout": 30.0,
            "loop": loop,
        }
        assert aiosmtpd.__version__ in sink_module._SETUP_CHECKED
        fast = _Protocol(sink, **options)
        slow = _Protocol(sink, fast=False, **options)

        assert _state(fast) == _state(slow)
        assert fast.hostname
        assert fast.__ident__
        assert fast._smtp_methods.keys() >= {"EHLO", "MAIL", "RCPT", "DATA", "GET"}
        assert fast._handle_hooks.keys() == {"MAIL", "RCPT", "DATA", "exception"}
    finally:
        loop.close()
        store.close()


@pytest.mark.parametrize("checked", [True, False], ids=["checked-version", "other-version"])
def test_the_sink_takes_aiosmtpds_own_setup_on_a_version_not_checked(
    make_sink: Callable[..., MailSink],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    checked: bool,
) -> None:
    if not checked:
        monkeypatch.setattr(sink_module, "_SETUP_CHECKED", ())
    sink = make_sink()
    box = reserve(sink)
    with (
        caplog.at_level(logging.INFO, logger="mail.log"),
        smtplib.SMTP(sink.host, sink.port, local_hostname="client.test") as smtp,
    ):
        smtp.sendmail("app@example.test", [box.address], b"Subject: setup\r\n\r\nhi\r\n")

    assert box.wait_for(subject="setup", timeout=SAFETY).text.strip() == "hi"
    # aiosmtpd's own __init__ logs the AUTH mechanisms of every connection; _setup does not.
    listed = [r for r in caplog.records if r.getMessage().startswith("Available AUTH")]
    assert bool(listed) is not checked


# -- recipients -------------------------------------------------------------------------------


def test_rcpt_flood_is_refused_past_the_default_cap_of_100(sink: MailSink, client: Client) -> None:
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")
    replies = [client.cmd(b"RCPT TO:<user%d@mailbox.test>" % i) for i in range(150)]

    assert replies[:100] == [b"250 2.1.5 OK\r\n"] * 100
    assert (
        replies[100:]
        == [
            b"452 4.5.3 Too many recipients: at most 100 per message (mailbox_max_recipients); "
            b"send the rest in another message\r\n"
        ]
        * 50
    )
    assert client.cmd(b"DATA").startswith(b"354")
    client.send(b"Subject: flood\r\n\r\nhi\r\n.\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert stored(sink) == 100


def test_rcpt_cap_is_configurable(make_sink: Callable[..., MailSink]) -> None:
    sink = make_sink(max_recipients=2)
    client = Client(sink)
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")

    replies = [client.cmd(b"RCPT TO:<user%d@mailbox.test>" % i)[:9] for i in range(3)]

    assert replies == [b"250 2.1.5", b"250 2.1.5", b"452 4.5.3"]
    client.close()


# -- recipient domains ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rcpt", "reply"),
    [
        (b"<a@evil.test>", b"550 5.7.1 Relaying denied: evil.test is not a test domain"),
        (b"<a@EVIL.TEST>", b"550 5.7.1 Relaying denied: evil.test is not a test domain"),
        (b"<a@mailbox.test.evil.test>", b"550 5.7.1 Relaying denied: mailbox.test.evil.test"),
        (b"<a@evil.mailbox.test>", b"550 5.7.1 Relaying denied: evil.mailbox.test"),
        (b"<a@evil.test.>", b"553 5.1.3 Error: malformed address"),
        (b"<a@mailbox.test.>", b"553 5.1.3 Error: malformed address"),
        (b"<a@mailbox.test@evil.test>", b"553 5.1.3 Error: malformed address"),
        (b'<"a@mailbox.test"@evil.test>', b"550 5.7.1 Relaying denied: evil.test"),
        (b"<@mailbox.test:victim@evil.test>", b"550 5.7.1 Relaying denied: evil.test"),
        (b"<@mailbox.test,@mailbox.test:v@evil.test>", b"550 5.7.1 Relaying denied: evil.test"),
        (b"<a@[127.0.0.1]>", b"550 5.7.1 Relaying denied: [127.0.0.1]"),
        (b"<a@mailbox.test\x00>", b"553 5.1.3 The address contains control characters"),
        (b"<a@xn--bcher-kva.evil>", b"550 5.7.1 Relaying denied: xn--bcher-kva.evil"),
        ("<a@bücher.test>".encode(), b"553 5.6.7 A non-ASCII address needs SMTPUTF8"),
        ("<ü@mailbox.test>".encode(), b"553 5.6.7 A non-ASCII address needs SMTPUTF8"),
        (b"<a@mailbox.test\xff>", b"553 5.6.7 The address is not valid UTF-8"),
    ],
    ids=[
        "foreign",
        "foreign-upper-case",
        "ours-as-prefix",
        "ours-as-suffix",
        "foreign-trailing-dot",
        "ours-trailing-dot",
        "two-at-signs",
        "quoted-local-part-with-at",
        "source-route-to-foreign",
        "two-source-routes-to-foreign",
        "address-literal",
        "nul-in-domain",
        "foreign-punycode",
        "idn-without-smtputf8",
        "utf8-local-part-without-smtputf8",
        "invalid-utf8",
    ],
)
def test_recipient_domain_checks_cannot_be_bypassed(
    sink: MailSink, client: Client, rcpt: bytes, reply: bytes
) -> None:
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")

    answer = client.cmd(b"RCPT TO:" + rcpt)

    assert answer.startswith(reply), answer
    assert b"\x00" not in answer
    assert client.cmd(b"DATA") == b"503 Error: need RCPT command\r\n"


@pytest.mark.parametrize(
    ("rcpt", "smtputf8"),
    [
        ("<{alias}@MAILBOX.TEST>", False),
        ("<{ALIAS}@mailbox.test>", False),
        ("<@relay.example.test:{alias}@mailbox.test>", False),
        ("<{alias}+tag@mailbox.test>", False),
    ],
    ids=["upper-case-domain", "upper-case-alias", "source-route-ignored", "plus-tag"],
)
def test_recipient_variants_of_our_domain_route_to_the_alias(
    sink: MailSink, client: Client, rcpt: str, smtputf8: bool
) -> None:
    mailbox = reserve(sink)
    address = rcpt.format(alias=mailbox.alias, ALIAS=mailbox.alias.upper())
    client.envelope(address.encode())
    client.send(b"Subject: variant\r\n\r\nhi\r\n.\r\n")

    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert [r.subject for r in rows(sink, mailbox)] == ["variant"]


def test_idn_domain_routes_the_same_in_utf8_and_punycode(sink: MailSink, client: Client) -> None:
    mailbox = reserve(sink, domain=IDN_DOMAIN)
    assert mailbox.domain == normalize_domain(IDN_DOMAIN) == "xn--bcher-kva.test"
    assert b"250-SMTPUTF8" in client.cmd(b"EHLO client.test")
    assert client.cmd(b"MAIL FROM:<app@example.test> SMTPUTF8") == b"250 2.1.0 OK\r\n"
    utf8 = f"<{mailbox.alias}@BÜCHER.test>".encode()
    puny = f"<{mailbox.alias}@XN--BCHER-KVA.TEST>".encode()

    for rcpt, subject in ((utf8, b"utf8"), (puny, b"puny")):
        assert client.cmd(b"RCPT TO:" + rcpt) == b"250 2.1.5 OK\r\n"
        assert client.cmd(b"DATA").startswith(b"354")
        client.send(b"Subject: " + subject + b"\r\n\r\nhi\r\n.\r\n")
        assert client.reply() == b"250 2.0.0 Message accepted\r\n"
        if subject == b"utf8":
            assert client.cmd(b"MAIL FROM:<app@example.test> SMTPUTF8") == b"250 2.1.0 OK\r\n"
    assert [(r.rcpt, r.subject) for r in rows(sink, mailbox)] == [
        (utf8[1:-1].decode(), "utf8"),
        (puny[1:-1].decode(), "puny"),
    ]


def test_a_recipient_named_twice_gets_one_copy(sink: MailSink, client: Client) -> None:
    mailbox = reserve(sink)
    other = reserve(sink)
    same = mailbox.address.upper().encode()  # another spelling of the same recipient
    # To and Bcc naming one person: a real server delivers once, so a wait is not ambiguous.
    client.envelope(
        f"<{mailbox.address}>".encode(), b"<" + same + b">", f"<{other.address}>".encode()
    )
    client.send(b"Subject: twice\r\n\r\nhi\r\n.\r\n")

    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert [r.rcpt for r in rows(sink, mailbox)] == [mailbox.address]
    assert [r.rcpt for r in rows(sink, other)] == [other.address]
    assert mailbox.wait_for(subject="twice", timeout=10).subject == "twice"


def test_a_recipient_named_with_an_empty_tag_too_gets_one_copy(
    sink: MailSink, client: Client
) -> None:
    mailbox = reserve(sink)
    empty = f"{mailbox.alias}+@{mailbox.domain}"  # an empty tag: the alias alone
    client.envelope(f"<{mailbox.address}>".encode(), f"<{empty}>".encode())
    client.send(b"Subject: twice\r\n\r\nhi\r\n.\r\n")

    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert [r.rcpt for r in rows(sink, mailbox)] == [mailbox.address]
    assert mailbox.wait_for(subject="twice", tag="", timeout=10).subject == "twice"


def test_percent_hack_is_kept_as_unrouted_mail_of_our_domain(
    sink: MailSink, client: Client
) -> None:
    client.envelope(b"<victim%evil.test@mailbox.test>")
    client.send(b"Subject: percent\r\n\r\nhi\r\n.\r\n")

    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    (row,) = sink.store.unrouted(DOMAIN)
    assert (row.alias, row.domain) == ("victim%evil.test", DOMAIN)


@pytest.mark.parametrize("postmaster", ["postmaster", "Postmaster", "POSTMASTER"])
def test_postmaster_without_a_domain_is_taken_and_reaches_no_tests_mailbox(
    sink: MailSink, postmaster: str
) -> None:
    """RFC 5321 4.5.1: a server MUST take ``RCPT TO:<Postmaster>``, in any case; it was
    ``553``, and smtplib's ``sendmail`` refused the whole message for that one recipient."""
    mailbox = reserve(sink)
    raw = b"Subject: to the postmaster\r\n\r\nhi\r\n"
    with smtplib.SMTP(sink.host, sink.port) as smtp:
        refused = smtp.sendmail("app@example.test", [postmaster, mailbox.address], raw)
        assert smtp.docmd("MAIL FROM:<app@example.test>")[0] == 250
        reply = smtp.docmd(f"RCPT TO:<{postmaster}>")
        assert smtp.docmd("RSET")[0] == 250

    assert refused == {}
    assert reply == (250, b"2.1.5 OK")
    (kept,) = sink.store.unrouted(None)  # mail for no test's alias, shown to none
    assert (kept.rcpt, kept.alias, kept.domain, kept.mailbox_id) == (
        postmaster,
        "postmaster",
        "",
        None,
    )
    assert sink.store.raw(kept.body_id) == raw
    assert [r.rcpt for r in rows(sink, mailbox)] == [mailbox.address]  # its copy, one


def test_a_local_part_alone_other_than_postmaster_is_still_refused(client: Client) -> None:
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")

    assert client.cmd(b"RCPT TO:<alice>") == (
        b"553 5.1.3 Recipient address is not of the form local@domain\r\n"
    )
    assert client.cmd(b"RCPT TO:<postmaster@evil.test>").startswith(b"550 5.7.1")


def test_non_ascii_sender_needs_smtputf8(client: Client) -> None:
    assert client.cmd(b"EHLO client.test").startswith(b"250")

    assert client.cmd("MAIL FROM:<ü@example.test>".encode()).startswith(
        b"553 5.6.7 A non-ASCII address needs SMTPUTF8"
    )
    assert client.cmd("MAIL FROM:<ü@example.test> SMTPUTF8".encode()) == b"250 2.1.0 OK\r\n"


# -- protocol abuse ---------------------------------------------------------------------------


def test_unknown_verb_gets_500_without_echo_and_the_session_goes_on(client: Client) -> None:
    reply = client.cmd(b"X482913 Zq8vT4nW2xKp9LmR")

    assert reply == b"500 5.5.1 Error: command not recognized\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"


def test_vrfy_does_not_echo_the_argument(client: Client) -> None:
    reply = client.cmd(b"VRFY <482913@@Zq8vT4nW2xKp9LmR>")

    assert reply == b"502 5.5.1 Could not VRFY that address\r\n"


def test_five_unknown_verbs_end_the_session(client: Client) -> None:
    replies = [client.cmd(b"XBOGUS") for _ in range(5)]

    assert replies[:4] == [b"500 5.5.1 Error: command not recognized\r\n"] * 4
    assert replies[4] == b"502 5.5.1 Too many unrecognized commands, goodbye.\r\n"
    assert client.rest() == b""


HTTP_REFUSAL = b"554 5.5.0 Error: this is an SMTP server; HTTP requests are refused\r\n"


def test_http_request_is_refused_and_disconnected(sink: MailSink) -> None:
    client = Client(sink)
    client.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n")

    assert client.rest() == HTTP_REFUSAL
    client.close()


def test_http_post_carrying_smtp_commands_stores_nothing(sink: MailSink) -> None:
    mailbox = reserve(sink)
    smtp = (
        f"EHLO x\r\nMAIL FROM:<a@example.test>\r\nRCPT TO:<{mailbox.address}>\r\nDATA\r\n"
        "Subject: cross-protocol\r\n\r\nhi\r\n.\r\nQUIT\r\n"
    ).encode()
    client = Client(sink)
    client.send(
        b"POST /form HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(smtp) + smtp
    )

    assert client.rest() == HTTP_REFUSAL
    assert stored(sink) == 0
    client.close()


SYNC_ERROR = (
    b"554 5.5.0 Error: SMTP protocol synchronization: data arrived before the reply to %s, "
    b"and this server does not offer PIPELINING\r\n"
)


def test_early_talker_is_refused_and_nothing_stored(sink: MailSink) -> None:
    mailbox = reserve(sink)
    client = Client(sink, greet=False)  # speaks at once, before the banner

    client.send(
        f"EHLO x\r\nMAIL FROM:<a@example.test>\r\nRCPT TO:<{mailbox.address}>\r\nDATA\r\n"
        "Subject: early\r\n\r\nhi\r\n.\r\nQUIT\r\n".encode()
    )

    banner, rest = client.reply(), client.rest()
    assert banner.startswith(b"220 ")
    assert rest == SYNC_ERROR % b"EHLO"
    assert stored(sink) == 0
    client.close()


def test_message_sent_before_the_354_is_refused(sink: MailSink, client: Client) -> None:
    mailbox = reserve(sink)
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")
    assert client.cmd(f"RCPT TO:<{mailbox.address}>".encode()).startswith(b"250")

    client.send(b"DATA\r\nSubject: blind\r\n\r\nhi\r\n.\r\n")

    assert client.rest() == SYNC_ERROR % b"DATA"
    assert stored(sink) == 0


def test_idle_client_gets_421_and_is_disconnected(make_sink: Callable[..., MailSink]) -> None:
    sink = make_sink(idle_timeout=0.2)
    client = Client(sink)

    assert client.rest() == b"421 4.4.2 pytest-mailbox.test Error: timeout exceeded\r\n"
    client.close()


def sessions(sink: MailSink) -> tuple[int, int]:
    """The sink's open connections and session tasks, once its loop has run what is queued."""

    async def count() -> tuple[int, int]:
        return len(sink._transports), len(asyncio.all_tasks() - {asyncio.current_task()})

    let_sink_loop_turn(sink)
    result: tuple[int, int] = on_sink_loop(sink, count()).result(SAFETY)
    return result


def test_client_that_floods_and_never_reads_is_cut_off_at_the_idle_timeout(
    make_sink: Callable[..., MailSink],
) -> None:
    """A client that sends commands and never reads fills its receive window: the sink
    waited in drain() for ever, and the close at the idle timeout waited for the replies
    too, so the session lasted until stop()."""
    # Room on a busy machine for the test to reach into the sink before it is cut off.
    sink = make_sink(idle_timeout=3.0)
    mailbox = reserve(sink)
    with socket.socket() as flooder:
        flooder.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before the handshake
        flooder.settimeout(SAFETY)
        flooder.connect((sink.host, sink.port))
        with flooder.makefile("rb") as replies:
            assert replies.readline().startswith(b"220")

        async def shrink_its_send_buffer() -> None:
            # On loopback the kernel grows the sink's send buffer to tcp_wmem's maximum
            # (4 MiB): half a million unread replies. A small one keeps the flood short.
            (transport,) = sink._transports
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        on_sink_loop(sink, shrink_its_send_buffer()).result(SAFETY)

        def flood() -> None:
            # Each send waits at most SAFETY: the sink stops reading once stuck, and only its
            # hang-up ends the flood.
            while True:
                flooder.sendall(b"NOOP\r\n" * 1000)

        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            flood()
        with contextlib.suppress(ConnectionResetError):
            while flooder.recv(65536):  # what the sink sent before: then EOF
                pass

    assert sessions(sink) == (0, 0)  # ended as any other session, the sink still running
    with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
        smtp.sendmail("app@example.test", [mailbox.address], b"Subject: after\r\n\r\nhi\r\n")
    assert [r.subject for r in rows(sink, mailbox)] == ["after"]


def test_client_silent_mid_data_is_cut_off_and_nothing_stored(
    make_sink: Callable[..., MailSink],
) -> None:
    sink = make_sink(idle_timeout=3.0)  # room for the envelope's four commands on a busy machine
    mailbox = reserve(sink)
    client = Client(sink)
    client.envelope(angle(mailbox))

    client.send(b"Subject: half\r\n\r\nthe first half, and then nothing")

    assert client.rest() == b"421 4.4.2 pytest-mailbox.test Error: timeout exceeded\r\n"
    assert stored(sink) == 0
    client.close()


def test_client_reset_mid_data_stores_no_partial_message(sink: MailSink) -> None:
    mailbox = reserve(sink)
    client = Client(sink)
    client.envelope(angle(mailbox))
    client.send(b"Subject: partial\r\n\r\nthe first half")
    # SO_LINGER 0: close() sends a TCP reset instead of a clean FIN.
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()

    with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
        smtp.sendmail("app@example.test", [mailbox.address], b"Subject: whole\r\n\r\nhi\r\n")

    assert [r.subject for r in rows(sink, mailbox)] == ["whole"]
    assert stored(sink) == 1


@pytest.mark.parametrize("checked", [True, False], ids=["checked-version", "other-version"])
def test_client_that_half_closes_after_the_dot_gets_its_reply_and_one_copy_is_stored(
    make_sink: Callable[..., MailSink], monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    """A client may shut down its sending side right after the final dot and read on.
    aiosmtpd cancelled the session at the EOF while the message was being stored: stored,
    but never answered, so a client that retried delivered it twice."""
    if not checked:  # aiosmtpd's own SMTP.__init__ builds the protocol
        monkeypatch.setattr(sink_module, "_SETUP_CHECKED", ())
    sink = make_sink()
    mailbox = reserve(sink)
    with Client(sink) as client:
        client.envelope(angle(mailbox))
        client.send(b"Subject: half-closed\r\n\r\nhi\r\n.\r\n")

        client.sock.shutdown(socket.SHUT_WR)

        # Read to EOF, at most 4 KiB: a sink that answered an EOF with 451s for ever fails.
        assert client.file.read(4096) == b"250 2.0.0 Message accepted\r\n"  # then EOF
    assert [r.subject for r in rows(sink, mailbox)] == ["half-closed"]
    assert stored(sink) == 1
    # A message cut off by the EOF is still not stored, and the connection is closed.
    with Client(sink) as cut:
        cut.envelope(angle(mailbox))
        cut.send(b"Subject: cut\r\n\r\nthe first half\r\n")
        cut.sock.shutdown(socket.SHUT_WR)
        assert cut.file.read(4096) == b""
    assert stored(sink) == 1


def test_store_failure_reply_never_echoes_internals_or_content(
    sink: MailSink, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mailbox = reserve(sink)
    with contextlib.closing(sqlite3.connect(sink.store.path, isolation_level=None)) as conn:
        # another process breaks the store
        conn.execute("ALTER TABLE messages RENAME TO messages_gone")
    client.envelope(angle(mailbox))

    client.send(b"Subject: Your code is 482913\r\n\r\nToken Zq8vT4nW2xKp9LmR\r\n.\r\n")

    reply = client.reply()
    assert reply == (
        b"451 4.3.0 Internal error in the test mail sink; the message was not stored\r\n"
    )
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "pytest-mailbox sink could not store a message: StoreError (OperationalError)" in logged
    for secret in ("482913", "Zq8vT4nW2xKp9LmR", "messages", "no such table"):
        assert secret.encode() not in reply
        assert secret not in logged.replace("could not store a message", "")


# -- AUTH -------------------------------------------------------------------------------------

#: A login as an app's production config holds it: a user name that is a token, a password.
AUTH_USER = "tok-Vq3Nw8Rz"
AUTH_PASSWORD = "pw-Zq8vT4nW2xKp9LmR"


def b64(text: str) -> bytes:
    return base64.b64encode(text.encode())


def test_auth_plain_and_login_are_offered_in_clear_and_any_login_is_taken(
    sink: MailSink, client: Client
) -> None:
    ehlo = client.cmd(b"EHLO client.test")
    assert b"250-AUTH LOGIN PLAIN\r\n" in ehlo
    mailbox = reserve(sink)

    assert client.cmd(b"AUTH PLAIN " + b64(f"\0{AUTH_USER}\0{AUTH_PASSWORD}")) == (
        b"235 2.7.0 Authentication successful\r\n"
    )
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")
    assert client.cmd(b"RCPT TO:" + angle(mailbox)).startswith(b"250")
    assert client.cmd(b"DATA").startswith(b"354")
    assert client.cmd(b"Subject: logged in\r\n\r\nhi\r\n.").startswith(b"250")
    assert mailbox.wait_for(subject="logged in", timeout=SAFETY).text.strip() == "hi"
    # The LOGIN exchange, one challenge at a time, on a second connection.
    with Client(sink) as other:
        assert other.cmd(b"EHLO client.test").startswith(b"250")
        assert other.cmd(b"AUTH LOGIN") == b"334 " + b64("User Name\0") + b"\r\n"
        assert other.cmd(b64(AUTH_USER)) == b"334 " + b64("Password\0") + b"\r\n"
        assert other.cmd(b64(AUTH_PASSWORD)) == b"235 2.7.0 Authentication successful\r\n"


@pytest.mark.parametrize(
    ("exchange", "reply"),
    [
        pytest.param([b"AUTH PLAIN", b"*"], b"501 5.7.0 Authentication cancelled", id="plain-*"),
        pytest.param(
            [b"AUTH LOGIN", b64(AUTH_USER), b"*"],
            b"501 5.7.0 Authentication cancelled",
            id="login-*",
        ),
        pytest.param(
            [b"AUTH LOGIN", b64(AUTH_USER), AUTH_PASSWORD.encode() + b"!"],
            b"501 5.5.2 Cannot decode the response: it is not base64",
            id="password-in-clear",
        ),
        pytest.param(
            [b"AUTH PLAIN", b"QUFB" * 2**18],  # 1 MiB: more than one read
            b"500 5.5.6 Authentication exchange line is too long",
            id="response-too-long",
        ),
        pytest.param(
            [b"AUTH PLAIN " + b"QUFB" * 200], b"500 Command line too long", id="command-too-long"
        ),
        pytest.param(
            [b"AUTH PLAIN " + AUTH_PASSWORD.encode() + b"!"],
            b"501 5.5.2 Can't decode base64",
            id="initial-not-base64",
        ),
        pytest.param(
            [b"AUTH PLAIN " + b64(AUTH_PASSWORD)], b"501 5.5.2 Can't split auth value", id="no-nul"
        ),
        pytest.param(
            [b"AUTH CRAM-MD5"], b"504 5.5.4 Unrecognized authentication type", id="cram-md5"
        ),
        pytest.param(
            [b"MAIL FROM:<app@example.test>", b"AUTH PLAIN " + b64(f"\0u\0{AUTH_PASSWORD}")],
            b"503 5.5.1 AUTH is not allowed during a mail transaction",
            id="in-transaction",
        ),
        pytest.param(
            [b"AUTH PLAIN " + b64("\0u\0p"), b"AUTH PLAIN " + b64("\0u\0p")],
            b"503 Already authenticated",
            id="twice",
        ),
    ],
)
def test_an_auth_exchange_the_sink_cannot_take_gets_one_reply_and_the_session_goes_on(
    sink: MailSink, client: Client, exchange: list[bytes], reply: bytes
) -> None:
    """RFC 4954's reply, and the session goes on in step: a response longer than a line
    got ``451 Internal error`` (aiosmtpd's ``ValueError``) and its tail could be read as a
    command; AUTH between MAIL and DATA was taken."""
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    replies = [client.cmd(line) for line in exchange]

    assert replies[-1] == reply + b"\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"
    assert client.cmd(b"RSET") == b"250 OK\r\n"
    mailbox = reserve(sink)
    assert client.cmd(b"MAIL FROM:<app@example.test>").startswith(b"250")
    assert client.cmd(b"RCPT TO:" + angle(mailbox)).startswith(b"250")
    assert client.cmd(b"DATA").startswith(b"354")
    assert client.cmd(b"Subject: after\r\n\r\nhi\r\n.").startswith(b"250")
    assert mailbox.wait_for(subject="after", timeout=SAFETY).text.strip() == "hi"


@pytest.mark.parametrize(
    "param",
    [b"AUTH=<>", b"auth=<>", b"AUTH=" + AUTH_USER.encode(), b"AUTH=app+2Bx@example.test"],
)
def test_the_mail_auth_parameter_is_taken_and_dropped(
    sink: MailSink, client: Client, caplog: pytest.LogCaptureFixture, param: bytes
) -> None:
    """RFC 4954 5: a server that offers AUTH and trusts no client parses and discards
    ``MAIL FROM``'s ``AUTH=`` (sendmail sends it to a server that offers AUTH, Exim once
    logged in); aiosmtpd refused it with ``555``. The identity, a
    user name as often as not, is kept nowhere."""
    caplog.set_level(logging.DEBUG)
    mailbox = reserve(sink)
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    assert client.cmd(b"AUTH PLAIN " + b64(f"\0{AUTH_USER}\0{AUTH_PASSWORD}")).startswith(b"235")

    assert client.cmd(b"MAIL FROM:<app@example.test> SIZE=40 " + param) == b"250 2.1.0 OK\r\n"
    assert client.cmd(b"RCPT TO:" + angle(mailbox)).startswith(b"250")
    assert client.cmd(b"DATA").startswith(b"354")
    assert client.cmd(b"Subject: auth param\r\n\r\nhi\r\n.").startswith(b"250")
    assert mailbox.wait_for(subject="auth param", timeout=SAFETY).text.strip() == "hi"
    assert AUTH_USER not in "\n".join(r.getMessage() for r in caplog.records)
    # Not an xtext (a bare "+"), and no value: still refused.
    for bad in (b"AUTH=a+b@example.test", b"AUTH"):
        assert client.cmd(b"MAIL FROM:<app@example.test> " + bad).startswith(b"5"), bad
    # After HELO, AUTH is not offered, and MAIL takes no parameter.
    assert client.cmd(b"HELO client.test").startswith(b"250")
    assert client.cmd(b"MAIL FROM:<app@example.test> AUTH=<>").startswith(b"501")


@pytest.mark.parametrize(
    "exchange",
    [
        [b"AUTH plain\t" + b64(f"\0{AUTH_USER}\0{AUTH_PASSWORD}")],
        [b"auth Plain", b64(f"\0{AUTH_USER}\0{AUTH_PASSWORD}")],
        [b"AUTH login", b64(AUTH_USER), b64(AUTH_PASSWORD)],
        [b"AUTH login " + b64(AUTH_USER), b64(AUTH_PASSWORD)],  # .NET's SmtpClient
    ],
    ids=["plain-initial", "plain", "login", "login-initial"],
)
def test_an_auth_mechanism_is_taken_in_any_case(
    sink: MailSink, client: Client, exchange: list[bytes]
) -> None:
    """RFC 4954 7: mechanism names are case-insensitive, and implementations MUST take
    them so; aiosmtpd answered ``504`` to ``AUTH plain``. .NET's ``System.Net.Mail``
    ``SmtpClient`` sends ``AUTH login <user>`` (aio-libs/aiosmtpd#542)."""
    assert client.cmd(b"EHLO client.test").startswith(b"250")
    replies = [client.cmd(line) for line in exchange]

    assert replies[-1] == b"235 2.7.0 Authentication successful\r\n"
    assert all(reply.startswith(b"334 ") for reply in replies[:-1])


def test_auth_after_helo_is_not_offered(client: Client) -> None:
    assert client.cmd(b"HELO client.test").startswith(b"250")
    assert client.cmd(b"AUTH PLAIN") == b"500 Error: command 'AUTH' not recognized\r\n"
    assert client.cmd(b"NOOP") == b"250 OK\r\n"


def test_no_login_reaches_the_log_in_any_form(
    sink: MailSink, caplog: pytest.LogCaptureFixture
) -> None:
    """aiosmtpd logs a response that is not base64 as it came (a password typed in clear),
    and warns of its own deprecated attribute on every AUTH; neither reaches a handler."""
    caplog.set_level(logging.DEBUG)
    plain = b64(f"\0{AUTH_USER}\0{AUTH_PASSWORD}")
    exchanges = [
        [b"AUTH PLAIN " + plain],
        [b"AUTH PLAIN", plain],
        [b"AUTH LOGIN " + b64(AUTH_USER), b64(AUTH_PASSWORD)],
        [b"AUTH LOGIN", b64(AUTH_USER), AUTH_PASSWORD.encode()],
        [b"AUTH LOGIN", AUTH_USER.encode()],
        [b"AUTH PLAIN " + AUTH_PASSWORD.encode()],
    ]
    for exchange in exchanges:
        with Client(sink) as client:
            assert client.cmd(b"EHLO client.test").startswith(b"250")
            replies = b"".join(client.cmd(line) for line in exchange)
            assert client.cmd(b"QUIT").startswith(b"221")
        for secret in (AUTH_USER.encode(), AUTH_PASSWORD.encode()):
            assert secret not in replies

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Using builtin auth_ hook for 'LOGIN'" in logged  # aiosmtpd's DEBUG lines are on
    for secret in (AUTH_USER, AUTH_PASSWORD, b64(AUTH_USER).decode(), plain.decode()):
        assert secret not in logged
    assert b64(AUTH_PASSWORD).decode().rstrip("=") not in logged
    assert "deprecated" not in logged


# -- commits: batched per turn of the sink's loop, and a write lock held elsewhere ------------


def on_sink_loop(sink: MailSink, work: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
    return asyncio.run_coroutine_threadsafe(work, sink._loop)  # type: ignore[arg-type]


def let_sink_loop_turn(sink: MailSink) -> None:
    """Wait until the sink's loop has run what was queued before (its queue is FIFO)."""
    for _ in range(3):
        on_sink_loop(sink, asyncio.sleep(0)).result(SAFETY)


def incoming(mailbox: Mailbox, subject: str) -> tuple[str, list[Delivery], bytes]:
    delivery = Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=DOMAIN)
    return "app@example.test", [delivery], f"Subject: {subject}\r\n\r\nhi\r\n".encode()


def test_messages_that_end_in_the_same_turn_are_committed_together(sink: MailSink) -> None:
    mailbox = reserve(sink)

    async def three_at_once() -> list[str | None]:
        return await asyncio.gather(
            *(sink.store_message(*incoming(mailbox, f"batch {n}")) for n in range(3))
        )

    assert on_sink_loop(sink, three_at_once()).result(SAFETY) == [None, None, None]
    found = rows(sink, mailbox)
    assert [r.subject for r in found] == ["batch 0", "batch 1", "batch 2"]
    assert len({r.received_at for r in found}) == 1  # one transaction reads the clock once


@pytest.mark.parametrize("client_stays", [True, False])
def test_a_message_that_ends_while_another_process_writes_is_stored_when_the_lock_frees(
    sink: MailSink, client_stays: bool
) -> None:
    mailbox = reserve(sink)
    holder = sqlite3.connect(sink.store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock

    pending = on_sink_loop(sink, sink.store_message(*incoming(mailbox, "waited")))
    let_sink_loop_turn(sink)  # the batch met the lock and went to the writer thread

    assert not pending.done()
    assert rows(sink, mailbox) == []
    if not client_stays:  # the client hangs up while the sink waits: stored all the same
        pending.cancel()
    holder.execute("COMMIT")
    holder.close()
    if client_stays:
        assert pending.result(SAFETY) is None
    on_sink_loop(sink, sink.in_writer(int)).result(SAFETY)  # the writer thread is done
    assert [r.subject for r in rows(sink, mailbox)] == ["waited"]


def test_a_batch_that_cannot_reach_the_writer_thread_fails_its_clients(sink: MailSink) -> None:
    mailbox = reserve(sink)
    holder = sqlite3.connect(sink.store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the batch meets the lock…
    sink._writer.shutdown()  # …and the writer thread is gone (the sink is stopping)

    pending = on_sink_loop(sink, sink.store_message(*incoming(mailbox, "lost")))

    with pytest.raises(RuntimeError, match="shutdown"):  # handle_DATA answers 451
        pending.result(SAFETY)
    holder.execute("ROLLBACK")
    holder.close()
    assert rows(sink, mailbox) == []


def test_message_content_never_reaches_the_log_at_debug(
    sink: MailSink, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mailbox = reserve(sink)
    client.envelope(angle(mailbox))
    client.send(b"Subject: Your code is 482913\r\n\r\nToken Zq8vT4nW2xKp9LmR\r\n.\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    client.cmd(b"X482913 Zq8vT4nW2xKp9LmR")

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "sent an unrecognised command" in logged  # the event, not its words
    assert "482913" not in logged
    assert "Zq8vT4nW2xKp9LmR" not in logged


# -- MIME that parses badly, delivered over SMTP ------------------------------------------------


def _nested(depth: int) -> bytes:
    head = b"Subject: nested\r\nMIME-Version: 1.0\r\n"
    parts = [head]
    for level in range(depth):
        parts.append(
            b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (level, level)
        )
    parts.append(b"Content-Type: text/plain\r\n\r\ndeep https://app.example.test/deep\r\n")
    parts.extend(b"--b%d--\r\n" % level for level in reversed(range(depth)))
    return b"".join(parts)


BAD_MIME = {
    "broken-boundary": (
        b"Subject: broken-boundary\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/alternative; boundary=XYZ\r\n\r\n"
        b"--XYZ\r\nContent-Type: text/plain\r\n\r\nopen https://app.example.test/a\r\n"
        b"--XYZ\r\nContent-Type: text/html\r\n\r\n<a href='https://app.example.test/b'>b",
        "CloseBoundaryNotFoundDefect",
    ),
    "wrong-charset": (
        b"Subject: wrong-charset\r\nContent-Type: text/plain; charset=x-no-such-charset\r\n"
        b"\r\ncaf\xe9 https://app.example.test/c\r\n",
        "unknown_charset",
    ),
    "8bit-headers": (
        b"Subject: 8bit-headers \xff\xfe caf\xe9\r\nFrom: J\xf6rg <app@example.test>\r\n"
        b"\r\nhello\r\n",
        "8bit_header",
    ),
    "huge-header-count": (
        b"Subject: huge-header-count\r\n"
        + b"".join(b"X-Filler-%d: %d\r\n" % (i, i) for i in range(5000))
        + b"Content-Type: text/plain; charset=utf-8\r\nContent-Type: text/html\r\n\r\nhi\r\n",
        None,
    ),
    "deep-nesting": (_nested(300), None),
    "thousands-of-parts": (
        b"Subject: thousands-of-parts\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=P\r\n\r\n"
        + b"".join(b"--P\r\nContent-Type: text/plain\r\n\r\npart %d\r\n" % i for i in range(3000))
        + b"--P--\r\n",
        None,
    ),
    "bad-base64": (
        b"Subject: bad-base64\r\nContent-Type: text/plain\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\naGVsbG8gd29ybGQ===x\r\n",
        "InvalidBase64",
    ),
}


@pytest.mark.parametrize(("raw", "defect"), BAD_MIME.values(), ids=BAD_MIME.keys())
def test_badly_formed_mime_is_stored_flagged_and_waiters_still_work(
    sink: MailSink, raw: bytes, defect: str | None
) -> None:
    mailbox = reserve(sink)
    subject = Message(raw).subject

    with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
        smtp.sendmail("app@example.test", [mailbox.address], raw)

    message = mailbox.wait_for(subject=subject, timeout=SAFETY)
    (row,) = rows(sink, mailbox)
    assert sink.store.raw(row.body_id).removesuffix(b"\r\n") == raw.removesuffix(b"\r\n")
    assert isinstance(message.text, str)
    assert isinstance(message.html, str)
    assert isinstance(message.links(), list)
    assert isinstance(message.body_text, str)
    if defect is not None:
        assert any(d.startswith(defect) for d in message.defects), message.defects
    message.ack()


def test_deep_nesting_and_many_parts_still_yield_their_text(sink: MailSink) -> None:
    mailbox = reserve(sink)
    with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
        smtp.sendmail("app@example.test", [mailbox.address], BAD_MIME["deep-nesting"][0])

    message = mailbox.wait_for(subject="nested", timeout=SAFETY)

    assert message.links() == ["https://app.example.test/deep"]


# -- selectors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (
            {"body_regex": r"(a+)+$"},
            "selector: body_regex='(a+)+$' is invalid: the pattern repeats a group "
            "that itself repeats a variable number of times",
        ),
        ({"subject_regex": r"^(\w+\s?)*$"}, "selector: subject_regex="),
        (  # Python 3.11 syntax: on 3.10, refused as no regular expression at all
            {"body_regex": r"(?>(a+)+)$"},
            "itself repeats a variable number of times"
            if sys.version_info >= (3, 11)
            else "not a valid regular expression",
        ),
        ({"body_regex": r"(a*)*b"}, "can backtrack for hours on a long message"),
        ({"body_regex": r"(?:x|y{1,9})+z"}, "rewrite it without the nesting"),
        ({"subject_regex": "a{99999999999}"}, "not a valid regular expression"),
        ({"subject_regex": "(unclosed"}, "not a valid regular expression"),
        # re reads a set here, and the regex package the searches run on refuses it
        ({"body_regex": "[^[:alpha:]"}, "[:alpha:] inside a set is read apart"),
        # re reads "[", ":", "d"…; regex the POSIX class of digits
        ({"body_regex": "[[:digit:]]{6}"}, "[:digit:] inside a set is read apart"),
        ({"body_regex": "[_[:alpha:]]+"}, "[:alpha:] inside a set is read apart"),
        ({"subject": "Verify\r\nBcc: x"}, "a subject has no line breaks"),
        ({"subject_contains": "Verify\n"}, "a subject has no line breaks"),
        ({"subject": "Verify\rBcc: x"}, "a subject has no line breaks"),
        ({"header": ("X-Run-Id", "r-1\r\nBcc: x")}, "a header value has no line breaks"),
        ({"header": ("X-Run-Id\n", "r-1")}, "a header name is printable ASCII"),
        # the address is compared: a display name could never match
        ({"sender": "Example App <noreply@app.example.test>"}, "an address alone, such as"),
        ({"sender": "app.example.test"}, "an address alone, such as"),
        ({"sender": "noreply@app@example.test"}, "an address alone, such as"),
    ],
    ids=[
        "nested-plus",
        "nested-word-space",
        "nested-inside-atomic",
        "nested-star",
        "nested-alternation",
        "huge-repeat",
        "unclosed-group",
        "valid-for-re-only",
        "posix-class",
        "posix-class-not-first",
        "subject-crlf",
        "subject-contains-lf",
        "subject-bare-cr",
        "header-value-crlf",
        "header-name-lf",
        "sender-display-name",
        "sender-domain",
        "sender-two-at-signs",
    ],
)
def test_bad_selector_is_refused_before_any_matching(
    sink: MailSink, selector: dict[str, Any], expected: str
) -> None:
    mailbox = reserve(sink)

    with pytest.raises(ContractError) as refused:
        mailbox.wait_for(timeout=0.01, **selector)

    assert expected in str(refused.value)


def test_nested_groups_with_a_required_part_are_allowed(sink: MailSink) -> None:
    mailbox = reserve(sink)
    with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
        smtp.sendmail(
            "app@example.test",
            [mailbox.address],
            b"Subject: Welcome to a.b.example.test\r\n\r\nhi\r\n",
        )

    message = mailbox.wait_for(subject_regex=r"to (\w+\.)+test$", timeout=SAFETY)

    assert message.subject == "Welcome to a.b.example.test"


def test_sink_binds_loopback_by_default(tmp_path: Path) -> None:
    sink = MailSink(Store(tmp_path / "s.sqlite3"), domains=[DOMAIN])

    assert sink.host == "127.0.0.1"
    assert is_loopback(sink.host)
    assert is_loopback("localhost")
    assert is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("192.168.1.10")
    assert not is_loopback("mail.example.test")
    sink.store.close()


def test_stop_right_after_a_connection_leaks_no_socket(tmp_path: Path) -> None:
    """-W error turns a leaked socket into a failure of this test (ResourceWarning)."""
    store = Store(tmp_path / "s.sqlite3")
    for _ in range(20):
        sink = MailSink(store, domains=[DOMAIN]).start()
        with socket.create_connection((sink.host, sink.port), timeout=SAFETY):
            pass
        sink.stop()
        gc.collect()
    store.close()


def test_an_ipv6_endpoint_gives_a_url_that_parses() -> None:
    endpoint = SmtpEndpoint("::1", 2525)

    assert endpoint.smtp_url == "smtp://[::1]:2525"
    assert urlsplit(endpoint.smtp_url).hostname == "::1"
    assert endpoint.settings["env"]["SMTP_HOST"] == "::1"


def test_a_header_section_of_exactly_its_limit_is_stored_and_one_byte_more_is_not(
    sink: MailSink, client: Client
) -> None:
    """HEADER_LIMIT counts the header section's bytes up to its blank line (the last
    header's CRLF not counted): at the limit the mail is stored, one byte over it is 552."""
    mailbox = reserve(sink)
    limit = sink_module.HEADER_LIMIT
    pad = b"X-Pad: " + b"p" * 500 + b"\r\n"
    head = b"Subject: big\r\n" + pad * (limit // len(pad) - 1)
    fill = limit - len(head) - len(b"X-Fill: ")  # the last header line, to the limit
    client.envelope(angle(mailbox))
    client.send(head + b"X-Fill: " + b"f" * fill + b"\r\n\r\nbody\r\n.\r\n")
    assert client.reply() == b"250 2.0.0 Message accepted\r\n"
    assert stored(sink) == 1
    client.envelope(angle(mailbox))
    client.send(head + b"X-Fill: " + b"f" * (fill + 1) + b"\r\n\r\nbody\r\n.\r\n")
    assert client.reply() == (
        b"552 5.3.4 Message header section too big (over 256 KiB); nothing was stored\r\n"
    )
    assert stored(sink) == 1
