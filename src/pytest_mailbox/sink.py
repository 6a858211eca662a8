"""The SMTP sink: aiosmtpd on its own thread and event loop, writing to the shared store."""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import concurrent.futures
import contextlib
import functools
import logging
import os
import re
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, AnyStr, ClassVar, TypeVar

import aiosmtpd
import aiosmtpd.smtp
from aiosmtpd.smtp import MISSING, SMTP, AuthResult, Envelope, Session, syntax

from pytest_mailbox._clock import monotonic
from pytest_mailbox.endpoint import (
    DATA_POLICIES,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_RECIPIENTS,
    Signal,
    SinkError,
    SmtpEndpoint,
    address,
    host_name,
    is_loopback,
    listen,
    normalize_domain,
    split_address,
    unguarded_sockets,
)
from pytest_mailbox.errors import StoreError
from pytest_mailbox.message import _visible, index, mask_tag
from pytest_mailbox.settings import argument
from pytest_mailbox.store import Delivery, Incoming, Store, StoreBusy

__all__ = [
    "DATA_POLICIES",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_RECIPIENTS",
    "MailSink",
    "Signal",
    "SinkError",
    "SmtpEndpoint",
    "is_loopback",
    "normalize_domain",
    "split_address",
    "transport_defects",
]

log = logging.getLogger("pytest_mailbox.sink")

#: aiosmtpd's logger; it writes DATA lines (message content) at DEBUG.
_AIOSMTPD_LOGGER = "mail.log"
_CONTENT_LOGS = ("DATA readline", "_handle_client readline", "%r << %r", "%r >> %r")
#: aiosmtpd logs the first word of an unknown command, which may be a line of a message.
_UNKNOWN_COMMAND_LOG = "%r unrecognised: %s"
#: aiosmtpd warns of its own deprecated attribute, which it sets itself, on every AUTH.
_LOGIN_DATA_WARNING = "Session.login_data is deprecated"
_DROPPED_LOGS = (*_CONTENT_LOGS, _LOGIN_DATA_WARNING)

_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
#: ``<local@domain>`` in its plain form: dot-atoms on both sides, ASCII only.
_PLAIN_PATH = re.compile(rf"<({_ATOM}(?:\.{_ATOM})*@{_ATOM}(?:\.{_ATOM})*)>")
_BARE_LF = re.compile(rb"(?<!\r)\n")
_BARE_CR = re.compile(rb"\r(?!\n)")
_LINE_END = re.compile(rb"\r?\n")
_T = TypeVar("_T")
_TRANSPORT_DEFECTS = {"bare_lf": "bare LF", "bare_cr": "bare CR", "nul": "NUL byte"}
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_HTTP_VERBS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "CONNECT", "PATCH", "TRACE")
#: aiosmtpd replies that quote what the client sent; the sink answers without the quote.
_ECHOING_REPLIES = (
    ('500 Error: command "', "500 5.5.1 Error: command not recognized"),
    ("502 Could not VRFY", "502 5.5.1 Could not VRFY that address"),
)
#: RFC 5321 4.5.3.1.6: a line of DATA is at most 998 octets before its CRLF, not counting a
#: dot doubled for transparency. aiosmtpd refuses lines over 1001 octets with their CRLF and
#: that dot, so a plain line of 999 got through; the sink refuses it with aiosmtpd's reply.
_MAX_DATA_LINE = 998
_LINE_TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
#: The longest header section the sink takes, in bytes (Postfix cuts at 100 KB). The sink
#: parses it on its event loop before the ``250``, and a long one that is not plain ASCII
#: took about a second a MiB, every other client waiting meanwhile.
HEADER_LIMIT = 256 * 1024
_HEADER_END = re.compile(rb"\r?\n\r?\n")
#: aiosmtpd's reply to a message over the limit, which the sink gives for one it finds over.
_TOO_MUCH = "552 Error: Too much mail data"
_HEADER_TOO_BIG = (
    f"552 5.3.4 Message header section too big (over {HEADER_LIMIT // 1024} KiB); "
    "nothing was stored"
)


class _NoContent(logging.Filter):
    """Drop aiosmtpd records that carry message data or raw protocol lines (and its
    warning, on every AUTH, about an attribute it sets itself), and spell out the bytes of
    an address that was not UTF-8.

    aiosmtpd decodes an address with ``surrogateescape`` and logs it as it is (``recip:
    a@mailbox.test\\udcff``). pytest keeps that record in the report, and pytest-xdist
    cannot send a lone surrogate to the controller: the worker died with an internal error.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str):
            return True
        if record.msg == _UNKNOWN_COMMAND_LOG:
            peer = record.args[:1] if isinstance(record.args, tuple) else ("?",)
            record.msg, record.args = "%r sent an unrecognised command", peer
        if record.msg.startswith(_DROPPED_LOGS):
            return False
        if isinstance(record.args, tuple) and any(
            isinstance(arg, str) and _SURROGATE.search(arg) for arg in record.args
        ):
            record.args = tuple(
                arg.encode("utf-8", "backslashreplace").decode("utf-8")
                if isinstance(arg, str)
                else arg
                for arg in record.args
            )
        return True


def transport_defects(raw: bytes) -> list[str]:
    """What RFC 5321 forbids in DATA but sloppy clients send: ``bare_lf``, ``bare_cr``, ``nul``."""
    found = []
    if _BARE_LF.search(raw):
        found.append("bare_lf")
    if _BARE_CR.search(raw):
        found.append("bare_cr")
    if b"\0" in raw:
        found.append("nul")
    return found


def _line_too_long(raw: bytes) -> bool:
    """True if a line of DATA (``raw``: as received, dot-stuffing removed) is longer than RFC
    5321 allows. A line ends at CRLF, or at a bare LF (as sendmail and Postfix read it):
    ``flag`` takes mail with bare LF line ends, and their lines are what is measured. A bare
    CR does not end a line."""
    return len(raw) > _MAX_DATA_LINE and max(map(len, _LINE_END.split(raw))) > _MAX_DATA_LINE


def _stuffed_limit(size: int) -> int:
    """The most a message of ``size`` bytes may take on the wire, its dots doubled.

    RFC 1870 counts a message's size without the dots doubled for transparency, but aiosmtpd
    counts them: a message of exactly the ``SIZE`` the sink offers, with lines that start
    with a dot, got ``552``. aiosmtpd is given this bound instead, and ``handle_DATA``
    checks the message as received. A doubled dot starts a line of at least three octets
    as received (``.`` and its CRLF): at most a third more.
    """
    return size + (size + 2) // 3


#: ``RCPT TO:<postmaster>``, as ``_recipient`` splits it: an alias of no domain.
_POSTMASTER = ("postmaster", None, "")


def _recipient(address: str) -> tuple[str, str | None, str] | None:
    """``split_address``, and ``postmaster`` with no domain, which RFC 5321 4.5.1 says a
    server must take: ``("postmaster", None, "")``, mail for no test domain's alias, so it
    is kept as unrouted mail and reaches no test's mailbox."""
    if address.strip().lower() == "postmaster":
        return _POSTMASTER
    return split_address(address)


def _shown(text: str) -> str:
    """Client text fit to quote in a reply: printable ASCII only, at most 100 characters."""
    kept = "".join(c for c in text if " " < c <= "~")[:100]
    return kept or "(unprintable)"


def _address_problem(address: str, smtputf8: bool) -> str | None:
    """The refusal for an envelope address that is not plain text, or None."""
    if _SURROGATE.search(address):
        return "553 5.6.7 The address is not valid UTF-8"
    if _CONTROL.search(address):
        return "553 5.1.3 The address contains control characters"
    if not address.isascii() and not smtputf8:
        return _NEEDS_SMTPUTF8
    return None


_NEEDS_SMTPUTF8 = (
    "553 5.6.7 A non-ASCII address needs SMTPUTF8: "
    "send MAIL FROM:<...> SMTPUTF8 (the sink offers it in EHLO)"
)


def _refused_step(address: str, stage: str, reply: str) -> tuple[str, str] | None:
    """``(alias, detail)`` of the ``refused`` step for mail to ``address`` that the sink
    answered ``reply`` at ``stage``; None if it is no address. The detail names the
    recipient with its tag masked (a reply-by-mail token) and a character that shows
    nothing escaped (a direction override, taken with SMTPUTF8), as a timeout's near
    misses do."""
    parts = split_address(address)
    if parts is None:
        return None
    alias, tag, domain = parts
    shown = f"{alias}+{mask_tag(tag)}" if tag else alias
    return alias, f"{stage} to {_visible(f'{shown}@{domain}')}: {_shown_reply(reply)}"


def _shown_reply(reply: str) -> str:
    """The sink's own reply, for a timeline: one line of at most 200 characters."""
    line = " ".join(reply.split())
    return line if len(line) <= 200 else line[:199] + "…"


#: RFC 4954's replies to an AUTH exchange the sink cannot take (it takes any credentials).
_AUTH_LINE_TOO_LONG = "500 5.5.6 Authentication exchange line is too long"
_AUTH_CANCELLED = "501 5.7.0 Authentication cancelled"
_AUTH_NOT_BASE64 = "501 5.5.2 Cannot decode the response: it is not base64"
_AUTH_IN_TRANSACTION = "503 5.5.1 AUTH is not allowed during a mail transaction"
#: ``MAIL FROM``'s ``AUTH=`` parameter (RFC 4954 5): ``<>`` or an xtext (RFC 3461 4).
_MAIL_AUTH_PARAM = re.compile(r"AUTH=(?:[!-*,-<>-~]|\+[0-9A-F]{2})+", re.IGNORECASE)


def _any_login(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: object
) -> AuthResult:
    """aiosmtpd's authenticator: any user name and password are taken, and neither is kept.

    A test sink has no accounts: an app configured with its relay's login sends here
    unchanged. The user name is dropped with the password, since some relays take a token
    as user name (Postmark's server token, an AWS access key id for SES).
    """
    return AuthResult(success=True, auth_data=None)


class _Handler:
    """aiosmtpd hooks: accept test domains only, store complete messages, never echo."""

    def __init__(self, sink: MailSink) -> None:
        self.sink = sink

    async def handle_MAIL(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        problem = _address_problem(address, envelope.smtp_utf8)
        if problem is not None:
            return problem
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 2.1.0 OK"

    async def handle_RCPT(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        limit = self.sink.max_recipients
        if len(envelope.rcpt_tos) >= limit:
            reply = (
                f"452 4.5.3 Too many recipients: at most {limit} per message "
                "(mailbox_max_recipients); send the rest in another message"
            )
            await self.sink.note_refused([address], "RCPT", reply, taken=envelope.rcpt_tos)
            return reply
        problem = _address_problem(address, envelope.smtp_utf8)
        if problem is not None:
            if problem == _NEEDS_SMTPUTF8:  # a test's alias, with a tag in another script
                await self.sink.note_refused([address], "RCPT", problem)
            return problem
        parts = _recipient(address)
        if parts is None:
            return "553 5.1.3 Recipient address is not of the form local@domain"
        domain = parts[2]
        if domain not in self.sink.domains and parts != _POSTMASTER:
            reply = f"550 5.7.1 Relaying denied: {_shown(domain)} is not a test domain of this sink"
            await self.sink.note_refused([address], "RCPT", reply)  # a test's alias, mistyped
            return reply
        store = self.sink.store
        owed = store.faults_pending(parts[0], domain)  # one read for both stages
        if "RCPT" in owed:  # rare: go and take it
            fault = await self.sink.in_writer(self.sink._take_fault, parts[0], domain, "RCPT")
            if fault is not None:
                return fault
        if "DATA" in owed and isinstance(envelope, _Envelope):
            envelope.data_faults = True
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 OK"

    async def handle_DATA(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        raw = envelope.original_content or b""
        if len(raw) > self.sink.max_message_size:  # under aiosmtpd's bound, its dots doubled
            return _TOO_MUCH
        if _line_too_long(raw):
            return _LINE_TOO_LONG
        if len(raw) > HEADER_LIMIT:
            blank = _HEADER_END.search(raw, 0, HEADER_LIMIT + 4)
            if blank is None or blank.start() > HEADER_LIMIT:
                return _HEADER_TOO_BIG
        flags = transport_defects(raw)
        if flags and self.sink.data_policy == "refuse":
            found = ", ".join(_TRANSPORT_DEFECTS[f] for f in flags)
            return (
                f"554 5.6.0 Message refused: {found} in DATA; lines must end with CRLF "
                "(mailbox_data_policy=refuse); nothing was stored"
            )
        deliveries: dict[tuple[str, str | None, str], Delivery] = {}
        for rcpt in envelope.rcpt_tos:
            parts = _recipient(rcpt)
            # A recipient named twice (To and Bcc, say) gets one copy, as from a real server.
            if parts is not None and parts not in deliveries:
                deliveries[parts] = Delivery(
                    rcpt=rcpt, alias=parts[0], tag=parts[1], domain=parts[2]
                )
        faults = not isinstance(envelope, _Envelope) or envelope.data_faults
        try:
            fault = await self.sink.store_message(
                envelope.mail_from, list(deliveries.values()), raw, flags, faults=faults
            )
        except Exception as exc:
            # The type only: an exception's text may quote the message or the store's internals.
            kind = type(exc).__name__
            if isinstance(exc, StoreError) and exc.__cause__ is not None:
                kind = f"{kind} ({type(exc.__cause__).__name__})"  # SQLite's own, by type
            log.error("pytest-mailbox sink could not store a message: %s", kind)
            return "451 4.3.0 Internal error in the test mail sink; the message was not stored"
        if fault is not None:  # a scripted failure: the whole message is refused, not stored
            if isinstance(envelope, _Envelope):
                envelope.fault_answered = True
            return fault
        return "250 2.0.0 Message accepted"

    async def handle_exception(self, error: Exception) -> str:
        log.error("pytest-mailbox sink error: %s", type(error).__name__)
        return "451 4.3.0 Internal error in the test mail sink"


#: aiosmtpd versions whose ``SMTP.__init__`` ``_Protocol._setup`` is checked to reproduce
#: (tests/test_hostile.py compares the two attribute by attribute); any other version
#: gets aiosmtpd's own. ``_setup`` is the only copy of aiosmtpd's internals; the overrides
#: of ``_getaddr``, ``_timeout_cb`` and ``_create_envelope`` apply to every version.
_SETUP_CHECKED = ("1.4.6",)


class _Envelope(Envelope):
    """aiosmtpd's envelope, whether a recipient had a ``DATA`` fault owed when accepted, and
    whether one answered."""

    def __init__(self) -> None:
        super().__init__()
        self.data_faults = False
        #: The DATA reply is a scripted fault's, which the fault's own step records.
        self.fault_answered = False


class _Loop(asyncio.SelectorEventLoop):
    """The sink's event loop, on the machine's monotonic clock: asyncio reads
    ``time.monotonic()``, which a test's ``freeze_time`` freezes (the idle timeout would
    never come) or, with ``auto_tick_seconds``, moves on each read (every turn of the
    sink's loop would move the test's clock)."""

    def time(self) -> float:
        return monotonic()


class _ClientGone(asyncio.CancelledError):
    """The client sent EOF before what the session reads next: the session ends there, the
    way aiosmtpd ends one whose task it cancels (the connection is closed, nothing stored)."""


class _Reader(asyncio.StreamReader):
    """aiosmtpd's stream reader, with two changes.

    A read the client's EOF leaves incomplete ends the session (``_ClientGone``) instead of
    raising ``IncompleteReadError``, which aiosmtpd would answer with ``451`` and read
    again, for ever.

    A line of DATA (``readuntil(b"\r\n")``) is read in pieces that end at any LF, and the
    stream limit applies to each piece: a message with bare LF line ends (``flag``) is not
    one long line, which aiosmtpd refused with ``500 Line too long`` past 1,001 bytes. The
    sink checks the lines' length itself (``_line_too_long``). Past ``data_limit`` the
    pieces are dropped until the line's CRLF, so the line read is still longer than the
    limit and aiosmtpd answers ``552``, without keeping more than that in memory.
    """

    def __init__(self, *, loop: asyncio.AbstractEventLoop, limit: int, data_limit: int) -> None:
        super().__init__(limit=limit, loop=loop)
        self._data_limit = data_limit

    async def readuntil(self, separator: Any = b"\n") -> bytes:  # typeshed's type is private
        try:
            if separator == b"\r\n":
                return await self._data_line()
            return await super().readuntil(separator)
        except asyncio.IncompleteReadError:
            raise _ClientGone from None

    async def _data_line(self) -> bytes:
        piece = await self._piece()
        if piece.endswith(b"\r\n"):
            return piece
        # One bytearray, not a list of pieces: a line of 2-byte pieces would cost about
        # 35 bytes of object for each.
        line = bytearray(piece)
        while not piece.endswith(b"\r\n"):
            piece = await self._piece()
            if len(line) <= self._data_limit or piece.endswith(b"\r\n"):
                line += piece
        return bytes(line)

    async def _piece(self) -> bytes:
        """Up to the next LF, or, with none within the stream limit, what is there: a line
        with no line break at all is read in pieces too, which ``_data_line`` drops past
        ``data_limit`` (aiosmtpd's own read kept all of it, a 200 MB line in memory). A
        piece never ends between the CR and the LF of a CRLF: the CR is left for the next
        one, so ``.`` and its CRLF on the next line are never read as this one's end."""
        try:
            return await super().readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            # All that is buffered, with no LF in it: StreamReader's buffer, as in every
            # Python this runs on, only looked at for its last byte (no copy).
            last = self._buffer[exc.consumed - 1]  # type: ignore[attr-defined]
            return await self.readexactly(exc.consumed - (last == ord("\r")))


class _Protocol(SMTP):
    """aiosmtpd's SMTP protocol with the sink's limits, tracked so ``stop()`` can close it.

    On top of aiosmtpd: AUTH PLAIN and LOGIN without TLS, any login taken and none kept
    (``_any_login``), replies never quote the client, an idle client gets ``421`` before
    the hang-up, an HTTP request or a client that talks before its reply (the sink offers
    no PIPELINING: early talkers, blind senders) is answered and disconnected, and a client
    that half-closes still gets the reply to everything it sent in full.
    """

    #: Per class: the names ``SMTP.__init__`` finds with ``inspect.getmembers`` and ``dir``.
    _names: ClassVar[dict[tuple[type, str], tuple[str, ...]]] = {}

    def __init__(self, sink: MailSink, *, fast: bool = True, **kwargs: Any) -> None:
        # aiosmtpd keeps these limits on the class and every EHLO adds to them: keep our own.
        self.command_size_limits = collections.defaultdict(lambda: SMTP.command_size_limit)
        if fast and aiosmtpd.__version__ in _SETUP_CHECKED:
            self._setup(_Handler(sink), **kwargs)
        else:
            super().__init__(
                _Handler(sink), auth_require_tls=False, authenticator=_any_login, **kwargs
            )
            # The sink's reader for aiosmtpd's, before any connection (see eof_received).
            asyncio.StreamReaderProtocol.__init__(
                self,
                _Reader(
                    loop=self.loop,
                    limit=SMTP.line_length_limit,
                    data_limit=_stuffed_limit(kwargs["data_size_limit"]),
                ),
                client_connected_cb=self._cb_client_connected,
                loop=self.loop,
            )
        # aiosmtpd checks a line of DATA against this after the reader: the reader and
        # handle_DATA (``_line_too_long``) do, where a bare LF ends a line too.
        self.line_length_limit = _stuffed_limit(kwargs["data_size_limit"])
        self._sink = sink
        #: The envelope of the message in DATA, until its reply: a refusal is recorded.
        self._refusable: Envelope | None = None

    def _setup(
        self,
        handler: _Handler,
        *,
        hostname: str,
        ident: str,
        data_size_limit: int,
        enable_SMTPUTF8: bool,  # noqa: N803 - aiosmtpd's name
        timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """What ``SMTP.__init__`` does for the sink's settings, without its introspection.

        aiosmtpd looks up the protocol's and the handler's ``auth_`` methods with
        ``inspect.getmembers``, and their ``handle_`` and ``smtp_`` ones with ``dir``, for
        every connection: about 150 µs of the 210 µs a connection's protocol costs here,
        paid by every app that opens a connection per mail. The names depend only on the
        classes, so they are found once per class; the methods are bound per connection as
        aiosmtpd binds them. AUTH is offered without TLS and takes any login
        (``_any_login``); settings the sink never uses (TLS, call limits, PROXY) take
        aiosmtpd's defaults; aiosmtpd's one INFO line per connection listing the AUTH
        mechanisms is not written.
        """
        smtp = aiosmtpd.smtp  # read here, not imported: other versions never get this far
        self.__ident__ = ident or smtp.__ident__
        self.loop = loop
        asyncio.StreamReaderProtocol.__init__(
            self,
            _Reader(
                loop=loop,
                limit=SMTP.line_length_limit,
                data_limit=_stuffed_limit(data_size_limit),
            ),
            client_connected_cb=self._cb_client_connected,
            loop=loop,
        )
        self.event_handler = handler
        self.data_size_limit = data_size_limit
        self.enable_SMTPUTF8 = enable_SMTPUTF8
        self._decode_data = False
        self.command_size_limits.clear()
        self.hostname = hostname or socket.getfqdn()
        self.tls_context = None
        self.require_starttls = None
        self._timeout_duration = timeout
        self._timeout_handle = None
        self._tls_handshake_okay = True
        self._tls_protocol = None
        self._original_transport = None
        self.session = None
        self.envelope = None
        self.transport = None
        self._handler_coroutine = None
        self._auth_require_tls = False
        self._proxy_timeout = None
        self._authenticator = _any_login
        self._auth_callback = None
        self._auth_required = False
        self._auth_methods = {}
        for owner in (self, handler):
            for name in self._named(type(owner), "auth_"):
                method = getattr(owner, name)
                mechanism = name.replace("auth_", "").replace("__", "-")
                mechanism = getattr(method, "__auth_mechanism_name__", mechanism)
                self._auth_methods[mechanism] = smtp._AuthMechAttr(method, owner is self)
        self._handle_hooks = {
            name.replace("handle_", ""): getattr(handler, name)
            for name in self._named(type(handler), "handle_")
        }
        # aiosmtpd inspects a handle_EHLO's signature; the sink's handler has none.
        self._ehlo_hook_ver = None
        self._smtp_methods = {
            name.replace("smtp_", ""): getattr(self, name)
            for name in self._named(type(self), "smtp_")
        }
        self._enforce_call_limit = False

    @classmethod
    def _named(cls, owner: type, prefix: str) -> tuple[str, ...]:
        """The attributes of ``owner``'s instances whose names start with ``prefix``, sorted."""
        key = (owner, prefix)
        names = cls._names.get(key)
        if names is None:
            names = cls._names[key] = tuple(n for n in sorted(dir(owner)) if n.startswith(prefix))
        return names

    def _create_envelope(self) -> Envelope:
        return _Envelope()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            self._sink._transports.add(transport)
        super().connection_made(transport)

    def eof_received(self) -> bool | None:
        """The client will send nothing more, but may still read: a half-close
        (``shutdown(SHUT_WR)``), or the FIN of a ``close()``.

        aiosmtpd cancels the session here, whatever it is doing. A message read up to its
        final dot is then being stored: it was stored all the same, but its ``250`` was never
        sent, and a client that retried delivered it twice. Here only the reader learns of
        the EOF: every command the client sent in full is carried out and answered (the
        transport stays open for writing), and the session ends at the first read the EOF
        leaves incomplete (``_Reader``), with nothing of an unfinished message stored.
        """
        return asyncio.StreamReaderProtocol.eof_received(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(self.transport, asyncio.Transport):
            self._sink._transports.discard(self.transport)
        super().connection_lost(exc)

    async def push(self, status: AnyStr) -> None:
        if isinstance(status, str):
            for quoting, replacement in _ECHOING_REPLIES:
                if status.startswith(quoting):
                    status = replacement
            if self._refusable is not None and status[:1] in ("4", "5"):
                await self._refused(self._refusable, status)
        await super().push(status)

    async def _refused(self, envelope: Envelope, reply: str) -> None:
        """A message refused at DATA, by the sink (too big, a line too long, bare LF under
        ``refuse``) or aiosmtpd (past its bound): each test's mailbox among its recipients
        records it (``MailSink.note_refused``); a scripted fault records its own step."""
        self._refusable = None
        if not (isinstance(envelope, _Envelope) and envelope.fault_answered):
            await self._sink.note_refused(envelope.rcpt_tos, "DATA", reply)

    def _timeout_cb(self) -> None:
        """Answer ``421`` and close; abort if replies sent before are still undelivered.

        A client that sends commands and never reads (a flood of ``NOOP``) fills its
        receive window: aiosmtpd's ``push`` then waits in ``drain()``, reading nothing, and
        a close would wait for the replies to be delivered. The abort ends the session
        (``connection_lost``) as any other: no write outlives the idle timeout.
        """
        transport = self.transport
        if isinstance(transport, asyncio.Transport):
            if not transport.is_closing():
                transport.write(f"421 4.4.2 {self.hostname} Error: timeout exceeded\r\n".encode())
            if transport.get_write_buffer_size():
                log.warning(
                    "pytest-mailbox sink: a client left its replies unread; cut off at idle timeout"
                )
                transport.abort()
        super()._timeout_cb()  # type: ignore[no-untyped-call]

    async def _hang_up(self, reply: str) -> None:
        """Answer, forget whatever else the client sent, and close the connection."""
        await self.push(reply)
        buffered = getattr(self._reader, "_buffer", None)
        if isinstance(buffered, bytearray):
            buffered.clear()
        if self._handler_coroutine is not None:
            self._handler_coroutine.cancel()
        if self.transport is not None:
            self.transport.close()

    async def _out_of_sync(self, command: str) -> bool:
        """True (and hung up) if the client sent more before the reply to ``command``."""
        if not getattr(self._reader, "_buffer", b""):
            return False
        log.warning("pytest-mailbox sink: a client sent data before the reply to %s", command)
        await self._hang_up(
            f"554 5.5.0 Error: SMTP protocol synchronization: data arrived before the reply "
            f"to {command}, and this server does not offer PIPELINING"
        )
        return True

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        """aiosmtpd's address parser, with a fast path for the plain ``<local@domain>``.

        aiosmtpd's own version builds a class on every call (about 70 µs, twice per mail);
        anything but the plain form still goes through it.
        """
        plain = _PLAIN_PATH.match(arg)
        if plain is not None and not self.local_part_limit:
            rest = arg[plain.end() :]
            # What get_angle_addr skips after the ">": from a blank on, all whitespace (and
            # comments, which go to aiosmtpd's parser).
            after = rest.lstrip() if rest[:1] in (" ", "\t") else rest
            if (not rest or after != rest) and not after.startswith("("):
                return plain[1], after
        address: tuple[str | None, str | None] = super()._getaddr(arg)
        return address

    @syntax("HELO hostname")
    async def smtp_HELO(self, hostname: str) -> None:  # noqa: N802 - aiosmtpd command name
        if not await self._out_of_sync("HELO"):
            await super().smtp_HELO(hostname)

    @syntax("EHLO hostname")
    async def smtp_EHLO(self, hostname: str) -> None:  # noqa: N802 - aiosmtpd command name
        if not await self._out_of_sync("EHLO"):
            self.command_size_limits.clear()
            await super().smtp_EHLO(hostname)

    @syntax("MAIL FROM: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_MAIL(self, arg: str | None) -> None:  # noqa: N802 - aiosmtpd command name
        """aiosmtpd's MAIL, with RFC 4954 5's ``AUTH=`` parameter parsed and dropped, as a
        server that trusts no client's identity does: it is neither kept nor logged (it names
        the login, often the user name). aiosmtpd refused it with ``555``, and the sink
        offers AUTH: sendmail sends it to a server that does, Exim once logged in."""
        extended = self.session is not None and self.session.extended_smtp  # AUTH offered
        if extended and arg is not None and "AUTH=" in arg.upper():
            arg = self._without_auth_param(arg)
        await super().smtp_MAIL(arg)

    def _without_auth_param(self, arg: str) -> str:
        """``arg`` of MAIL without its well-formed ``AUTH=`` parameters, found after the
        address as aiosmtpd finds the others (an address may hold ``AUTH=`` when quoted)."""
        address = self._strip_command_keyword("FROM:", arg)
        if not address:
            return arg
        path, params = self._getaddr(address)
        if not path or not params:
            return arg
        kept = [p for p in params.split() if not _MAIL_AUTH_PARAM.fullmatch(p)]
        return arg[: len(arg) - len(params)].rstrip() + "".join(" " + p for p in kept)

    @syntax("AUTH <mechanism>")
    async def smtp_AUTH(self, arg: str) -> None:  # noqa: N802 - aiosmtpd command name
        """aiosmtpd's AUTH (PLAIN, LOGIN; any login taken), refused during a mail transaction
        as RFC 4954 4 requires (aiosmtpd took it between MAIL and DATA), and its mechanism
        taken in any case, as RFC 4954 7 requires (aiosmtpd answered ``504`` to ``plain``)."""
        if self.envelope is not None and self.envelope.mail_from is not None:
            await self.push(_AUTH_IN_TRANSACTION)
            return
        if arg:
            mechanism = arg.split(None, 1)[0]  # as aiosmtpd splits it; the rest as it came
            if mechanism.isascii():  # not "plaın", which str.upper() makes "PLAIN"
                arg = mechanism.upper() + arg[len(mechanism) :]
        await super().smtp_AUTH(arg)

    async def challenge_auth(
        self,
        challenge: str | bytes,
        encode_to_b64: bool = True,
        log_client_response: bool = False,
    ) -> Any:  # aiosmtpd's ``_Missing | bytes``; _Missing is private
        """aiosmtpd's ``334`` challenge and the client's answer, decoded; ``MISSING`` once
        answered with RFC 4954's reply to an answer the sink cannot take: ``*`` (cancel),
        not base64, or a line over the reader's limit. Nothing of the answer is logged
        (aiosmtpd logged one that was not base64: a password typed in clear)."""
        raw = challenge.encode() if isinstance(challenge, str) else challenge
        await self.push(b"334 " + (base64.b64encode(raw) if encode_to_b64 else raw))
        line = await self._auth_line()
        if line is None:
            await self.push(_AUTH_LINE_TOO_LONG)
            return MISSING
        blob = line.strip()
        if blob == b"*":
            await self.push(_AUTH_CANCELLED)
            return MISSING
        try:
            return base64.b64decode(blob, validate=True)
        except binascii.Error:
            await self.push(_AUTH_NOT_BASE64)
            return MISSING

    async def _auth_line(self) -> bytes | None:
        """The client's next line, or None (and the line read to its end, dropped) if it is
        longer than the reader's limit: what follows it is read as the next command, as
        aiosmtpd does for a command line too long."""
        too_long = False
        while True:
            try:
                line: bytes = await self._reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                await self._reader.readexactly(exc.consumed)
                too_long = True
            else:
                return None if too_long else line

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802 - aiosmtpd command name
        if await self._out_of_sync("DATA"):
            return
        # aiosmtpd counts the dots doubled for transparency, which RFC 1870's size does
        # not: it reads up to their bound (``_stuffed_limit``), and handle_DATA checks
        # the message as received against the SIZE offered (EHLO, MAIL FROM SIZE=).
        size = self.data_size_limit
        self.data_size_limit = _stuffed_limit(size) if size else size
        self._refusable = None if arg else self.envelope  # a refusal is pushed once, at most
        try:
            await super().smtp_DATA(arg)
        finally:
            self.data_size_limit = size
            self._refusable = None

    async def _http_request(self, arg: str) -> None:
        log.warning("pytest-mailbox sink: an HTTP request reached the SMTP port")
        await self._hang_up("554 5.5.0 Error: this is an SMTP server; HTTP requests are refused")


for _verb in _HTTP_VERBS:  # methods named smtp_<VERB> are how aiosmtpd finds commands
    setattr(_Protocol, f"smtp_{_verb}", _Protocol._http_request)


def _domain_names(domains: object) -> frozenset[str]:
    """``MailSink(domains=)`` as host names (``ValueError`` otherwise): a bare string is
    an iterable too, of its characters, and no domain at all would refuse every RCPT."""
    names: set[str | None] = {None}
    if isinstance(domains, Iterable) and not isinstance(domains, str):
        names = {host_name(d) if isinstance(d, str) else None for d in domains}
    if None in names or not names:
        msg = (
            f"domains={domains!r} is invalid; allowed: a non-empty list of domain names, "
            "such as ['mailbox.test']"
        )
        raise ValueError(msg)
    return frozenset(name for name in names if name is not None)


class MailSink(SmtpEndpoint):
    """A real SMTP server in a thread; every accepted message is committed to ``store``."""

    def __init__(
        self,
        store: Store,
        *,
        domains: Iterable[str],
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_size: int = 10 * 1024 * 1024,
        hostname: str = "pytest-mailbox.test",
        signal: Signal | None = None,
        name: str = "main",
        max_recipients: int = DEFAULT_MAX_RECIPIENTS,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        data_policy: str = "flag",
    ) -> None:
        # What the plugin's options take (mailbox_host, mailbox_port, …), checked by their
        # parsers: an empty host would bind every interface, a limit of 0 refuse every RCPT.
        for option, value, kind in (
            ("host", host, str),
            ("port", port, int),
            ("max_recipients", max_recipients, int),
            ("idle_timeout", idle_timeout, (int, float)),
        ):
            argument(option, value, kind)
        super().__init__(host, port)
        if data_policy not in DATA_POLICIES:
            msg = f"data_policy={data_policy!r} is invalid; allowed: {', '.join(DATA_POLICIES)}"
            raise ValueError(msg)
        # aiosmtpd reads 0 or None as "no limit"; the sink's DATA reader needs a bound.
        if isinstance(max_message_size, bool) or not (
            isinstance(max_message_size, int) and max_message_size > 0
        ):
            msg = (
                f"max_message_size={max_message_size!r} is invalid; allowed: a positive "
                "number of bytes (the plugin's mailbox_max_message_size: 1024..1073741824)"
            )
            raise ValueError(msg)
        self.store = store
        self.name = name
        self.domains = _domain_names(domains)
        self.max_message_size = max_message_size
        self.max_recipients = max_recipients
        self.idle_timeout = idle_timeout
        self.data_policy = data_policy
        self.hostname = hostname
        self.signal = signal or Signal()
        self._transports: set[asyncio.Transport] = set()
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mailbox-store")
        self._batch: list[tuple[Incoming, asyncio.Future[None]]] = []
        self._log_filter = _NoContent()
        #: Set by ``stop()``: the writer thread stops waiting for a write lock held elsewhere.
        self._stopping = threading.Event()

    async def in_writer(self, call: Callable[..., _T], *args: Any) -> _T:
        """Run a store call on the writer thread: the event loop never waits on SQLite's lock."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, call, *args)

    async def store_message(
        self,
        mail_from: str | None,
        deliveries: list[Delivery],
        raw: bytes,
        transport: Sequence[str] = (),
        *,
        faults: bool = True,
    ) -> str | None:
        """Store one message before its ``250``; a scripted fault's reply instead, if owed.

        ``faults=False`` says no recipient had a ``DATA`` fault owed when it was accepted
        (``handle_RCPT`` looked): the store is not asked again.

        Messages that finish DATA in the same turn of the event loop are committed together,
        in one transaction, on the loop itself while the write lock is free (the common case:
        no thread hop); a busy lock sends the batch to the writer thread, which may wait.
        """
        store = self.store
        if faults and any(store.fault_pending(d.alias, d.domain, "DATA") for d in deliveries):
            return await self.in_writer(self.receive, mail_from, deliveries, raw, transport)
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[None] = loop.create_future()
        self._batch.append((self._incoming(mail_from, deliveries, raw, transport), stored))
        if len(self._batch) == 1:
            loop.call_soon(self._commit_batch)
        await stored
        return None

    def _commit_batch(self) -> None:
        """On the event loop: commit what ``store_message`` gathered, then answer each one."""
        batch, self._batch = self._batch, []
        messages = [incoming for incoming, _ in batch]

        def settle(result: BaseException | None) -> None:
            for _, stored in batch:
                if stored.done():  # its client went away; the message is stored all the same
                    continue
                if result is None:
                    stored.set_result(None)
                else:
                    stored.set_exception(result)

        try:
            self.commit(messages, wait=False)
        except StoreBusy:  # a Future, not a Task: stop() lets it finish
            try:
                loop = asyncio.get_running_loop()
                waited = loop.run_in_executor(self._writer, self.commit, messages)
            except Exception as exc:  # the writer is shut down: the sink is stopping
                settle(exc)
            else:
                waited.add_done_callback(lambda done: settle(done.exception()))
        except Exception as exc:
            settle(exc)
        else:
            settle(None)

    async def note_refused(
        self, recipients: Iterable[str], stage: str, reply: str, *, taken: Sequence[str] = ()
    ) -> None:
        """Before the sink answers ``reply`` to mail for ``recipients``: a ``refused`` step in
        the open mailbox of each whose alias is a test's (at any domain), so that its
        timeline and a wait's timeout say what the sink refused, where nothing was stored.
        Once per mailbox and reply (a message to the alias in To and Cc), and none for a
        recipient among ``taken``, the message's recipients accepted already: refused again
        past the cap, it still gets the message. The reply goes out whatever happens here:
        a store error is logged, by type."""
        steps = [(rcpt, step) for rcpt in recipients if (step := _refused_step(rcpt, stage, reply))]
        try:
            mailboxes = self.store.open_aliases([alias for _, (alias, _) in steps])
            if mailboxes:  # rare: a test's own mail; else no write at all
                kept = {split_address(rcpt) for rcpt in taken}
                found = [
                    (mailboxes[alias], detail)
                    for rcpt, (alias, detail) in steps
                    if alias in mailboxes and split_address(rcpt) not in kept
                ]
                if found:
                    await self.in_writer(
                        functools.partial(
                            self.store.note_refused,
                            list(dict.fromkeys(found)),
                            give_up=self._stopping,
                        )
                    )
        except Exception as exc:
            log.warning("pytest-mailbox sink could not record a refusal: %s", type(exc).__name__)

    def receive(
        self,
        mail_from: str | None,
        deliveries: list[Delivery],
        raw: bytes,
        transport: Sequence[str] = (),
    ) -> str | None:
        """On the writer thread: a scripted fault's reply for one of the recipients, or store."""
        for delivery in deliveries:
            fault = self._take_fault(delivery.alias, delivery.domain, "DATA")
            if fault is not None:
                return fault
        self.accept(mail_from, deliveries, raw, transport)
        return None

    def _take_fault(self, alias: str, domain: str, stage: str) -> str | None:
        """On the writer thread: the store's scripted reply for ``alias@domain``, or None."""
        return self.store.take_fault(alias, domain, stage, give_up=self._stopping)

    def accept(
        self,
        mail_from: str | None,
        deliveries: list[Delivery],
        raw: bytes,
        transport: Sequence[str] = (),
    ) -> list[str]:
        """Index, commit, then wake waiters: a message is visible only once it is stored."""
        return self.commit([self._incoming(mail_from, deliveries, raw, transport)])[0]

    def commit(self, messages: list[Incoming], *, wait: bool = True) -> list[list[str]]:
        """Commit in one transaction, then wake waiters; ``StoreBusy`` if ``wait`` is False
        and another connection holds the write lock or the log is past ``wal_limit``, or if
        ``stop()`` is called while it waits."""
        ids = self.store.deliver_all(messages, sink=self.name, wait=wait, give_up=self._stopping)
        self.signal.notify()
        return ids

    @staticmethod
    def _incoming(
        mail_from: str | None, deliveries: list[Delivery], raw: bytes, transport: Sequence[str]
    ) -> Incoming:
        """The message and its index. Only the header section is parsed (``message.index``);
        ``transport`` lists what the SMTP session noticed (``bare_lf`` …)."""
        found = index(raw)
        defects = sorted({*found.defects, *transport})
        return Incoming(mail_from or "", deliveries, raw, found.subject, found.run_header, defects)

    def _bind(self) -> socket.socket:
        sock = listen(self.host, self.port)
        sock.setblocking(False)
        return sock

    def start(self, timeout: float = 10.0) -> MailSink:
        """Bind (reading the real port back), then serve on a daemon thread."""
        if self._thread is not None:
            return self
        sock = self._bind()
        self.port = int(sock.getsockname()[1])
        self._listener = sock
        _SERVING.add(self)
        try:
            with unguarded_sockets():  # pytest-socket's guard: see unguarded_sockets
                loop = _Loop()
        except BaseException:  # its self-pipe refused (EMFILE): the listener is not left open
            _SERVING.discard(self)
            sock.close()
            raise
        self._loop = loop
        logging.getLogger(_AIOSMTPD_LOGGER).addFilter(self._log_filter)
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(
                        lambda: _Protocol(
                            self,
                            hostname=self.hostname,
                            ident="pytest-mailbox",
                            data_size_limit=self.max_message_size,
                            enable_SMTPUTF8=True,
                            timeout=self.idle_timeout,
                            loop=loop,
                        ),
                        sock=sock,
                    )
                )
            except BaseException as exc:  # pragma: no cover - create_server on a bound socket
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=serve, name="pytest-mailbox-sink", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure:  # pragma: no cover - see above
            self.stop()
            msg = f"pytest-mailbox sink did not start on {address(self.host, self.port)}"
            raise SinkError(msg) from (failure[0] if failure else None)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and open connections; idempotent and bounded by ``timeout``.

        A message still waiting for a write lock another process holds is given up, not
        stored: its client, disconnected, got no ``250`` and still owns it.
        """
        thread, loop = self._thread, self._loop
        self._thread = None
        _SERVING.discard(self)
        if thread is None or loop is None:
            return
        self._stopping.set()

        async def shutdown() -> None:
            # Accept no one new, but let connections already accepted finish their setup:
            # closing the server first makes asyncio drop (and leak) those sockets.
            server = self._server
            for listener in server.sockets if server is not None else ():
                loop.remove_reader(listener.fileno())
            # Hang up on every client and let each connection wind down on its own: a task
            # cancelled before its first step would leak its socket too. Cancel only what
            # outlives the deadline.
            deadline = loop.time() + timeout / 2
            while True:
                for transport in list(self._transports):
                    transport.abort()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if not tasks and not self._transports:
                    break
                if loop.time() >= deadline:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    break
                await asyncio.sleep(0.001)
            if server is not None:
                server.close()
            await asyncio.sleep(0)  # the callbacks of the last aborts
            loop.stop()

        with contextlib.suppress(RuntimeError):  # the loop may already be closed
            asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout)
        self._writer.shutdown(wait=True)
        logging.getLogger(_AIOSMTPD_LOGGER).removeFilter(self._log_filter)

    def _let_go(self) -> None:
        """In a child forked from this process: point the listener's descriptor at
        ``/dev/null``. The child serves nothing (the sink's thread is not forked), and one
        that outlived the sink (an app server, a ``multiprocessing`` worker) held its port,
        listening with no one to accept: a client's connection was queued and never got a
        banner, and fixed-port mode's next session could not bind the port. Its clients'
        connections too: one the sink hung up on stayed open while the child lived, and its
        client waited for the end of it. Closing them would leave the socket objects' own
        close to fail."""
        sockets: list[Any] = [self._listener]
        sockets.extend(transport.get_extra_info("socket") for transport in self._transports)
        fds = [fd for sock in sockets if sock is not None and (fd := sock.fileno()) >= 0]
        if not fds:
            return
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in fds:
                os.dup2(devnull, fd)
        finally:
            os.close(devnull)

    def __enter__(self) -> MailSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: The sinks serving in this process, whose sockets a forked child lets go of.
_SERVING: weakref.WeakSet[MailSink] = weakref.WeakSet()


def _let_go_in_child() -> None:
    for sink in list(_SERVING):
        sink._let_go()
    _SERVING.clear()


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_let_go_in_child)
