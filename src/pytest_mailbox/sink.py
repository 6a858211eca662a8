"""The SMTP sink: aiosmtpd on its own thread and event loop, writing to the shared store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import socket
import threading
from collections.abc import Iterable
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from pytest_mailbox.message import Message
from pytest_mailbox.store import Delivery, Store

__all__ = [
    "MailSink",
    "Signal",
    "SinkError",
    "SmtpEndpoint",
    "normalize_domain",
    "split_address",
]

log = logging.getLogger("pytest_mailbox.sink")

#: aiosmtpd's logger; it writes DATA lines (message content) at DEBUG.
_AIOSMTPD_LOGGER = "mail.log"
_CONTENT_LOGS = ("DATA readline", "_handle_client readline", "%r << %r", "%r >> %r")


class SinkError(RuntimeError):
    """The sink could not start; the message names the option to change."""


class Signal:
    """An in-process wake-up: waiters sleep until the generation moves on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0

    def notify(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the generation differs from ``seen`` or ``timeout`` passes."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != seen, timeout=timeout)
            return self.generation


class _NoContent(logging.Filter):
    """Drop aiosmtpd records that carry message data or raw protocol lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(_CONTENT_LOGS))


def normalize_domain(domain: str) -> str:
    """Lower case, no trailing dot, IDNA (punycode) form: the form domains are compared in."""
    domain = domain.strip().rstrip(".").lower()
    try:
        return domain.encode("idna").decode("ascii")
    except UnicodeError:
        return domain


def split_address(address: str) -> tuple[str, str | None, str] | None:
    """``alias+tag@domain`` → (alias, tag, domain), lower-cased; None if not an address."""
    local, at, domain = address.strip().rpartition("@")
    if not at or not local or not domain:
        return None
    alias, plus, tag = local.lower().partition("+")
    return alias, (tag if plus else None), normalize_domain(domain)


class _Handler:
    """aiosmtpd hooks: accept test domains only, store complete messages, never echo."""

    def __init__(self, sink: MailSink) -> None:
        self.sink = sink

    async def handle_RCPT(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        parts = split_address(address)
        if parts is None:
            return "553 5.1.3 Recipient address is not of the form local@domain"
        domain = parts[2]
        if domain not in self.sink.domains:
            return f"550 5.7.1 Relaying denied: {domain} is not a test domain of this sink"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 OK"

    async def handle_DATA(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        raw = envelope.original_content or b""
        deliveries = []
        for rcpt in envelope.rcpt_tos:
            parts = split_address(rcpt)
            if parts is not None:
                deliveries.append(
                    Delivery(rcpt=rcpt, alias=parts[0], tag=parts[1], domain=parts[2])
                )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            self.sink._writer, self.sink.accept, envelope.mail_from, deliveries, raw
        )
        return "250 2.0.0 Message accepted"

    async def handle_exception(self, error: Exception) -> str:
        log.error("pytest-mailbox sink error: %s", type(error).__name__)
        return "451 4.3.0 Internal error in the test mail sink; the message was not stored"


class _Protocol(SMTP):
    """aiosmtpd's SMTP protocol, tracked so ``stop()`` can close open connections."""

    def __init__(self, sink: MailSink, **kwargs: Any) -> None:
        super().__init__(_Handler(sink), **kwargs)
        self._sink = sink

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            self._sink._transports.add(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(self.transport, asyncio.Transport):
            self._sink._transports.discard(self.transport)
        super().connection_lost(exc)


class SmtpEndpoint:
    """Where the app under test sends mail: host, port and ready-made framework settings."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.smtp_url}>"

    @property
    def smtp_url(self) -> str:
        return f"smtp://{self.host}:{self.port}"

    @property
    def settings(self) -> dict[str, dict[str, Any]]:
        """Ready-made mail settings: Django, Flask-Mail, and environment for a subprocess."""
        return {
            "django": {
                "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "EMAIL_HOST": self.host,
                "EMAIL_PORT": self.port,
                "EMAIL_HOST_USER": "",
                "EMAIL_HOST_PASSWORD": "",
                "EMAIL_USE_TLS": False,
                "EMAIL_USE_SSL": False,
            },
            "flask": {
                "MAIL_SERVER": self.host,
                "MAIL_PORT": self.port,
                "MAIL_USE_TLS": False,
                "MAIL_USE_SSL": False,
            },
            "env": {
                "SMTP_HOST": self.host,
                "SMTP_PORT": str(self.port),
                "SMTP_URL": self.smtp_url,
            },
        }


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
    ) -> None:
        super().__init__(host, port)
        self.store = store
        self.name = name
        self.domains = frozenset(normalize_domain(d) for d in domains)
        self.max_message_size = max_message_size
        self.hostname = hostname
        self.signal = signal or Signal()
        self._transports: set[asyncio.Transport] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mailbox-store")
        self._log_filter = _NoContent()

    def accept(self, mail_from: str | None, deliveries: list[Delivery], raw: bytes) -> list[str]:
        """Parse, commit, then wake waiters: a message is visible only once it is stored."""
        parsed = Message(raw)
        ids = self.store.deliver(
            mail_from=mail_from or "",
            deliveries=deliveries,
            raw=raw,
            subject=parsed.subject,
            run_header=parsed.run_header(),
            defects=parsed.defects,
            sink=self.name,
        )
        self.signal.notify()
        return ids

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                msg = (
                    f"pytest-mailbox cannot listen on {self.host}:{self.port}: the port is "
                    "already in use by another program; free it, or choose another port "
                    "with --mailbox-port / mailbox_port (0 picks a free one)"
                )
            else:
                msg = f"pytest-mailbox cannot listen on {self.host}:{self.port}: {exc.strerror}"
            raise SinkError(msg) from exc
        sock.setblocking(False)
        return sock

    def start(self, timeout: float = 10.0) -> MailSink:
        """Bind (reading the real port back), then serve on a daemon thread."""
        if self._thread is not None:
            return self
        sock = self._bind()
        self.port = int(sock.getsockname()[1])
        logging.getLogger(_AIOSMTPD_LOGGER).addFilter(self._log_filter)
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(
                        lambda: _Protocol(
                            self,
                            hostname=self.hostname,
                            ident="pytest-mailbox",
                            data_size_limit=self.max_message_size,
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
            msg = f"pytest-mailbox sink did not start on {self.host}:{self.port}"
            raise SinkError(msg) from (failure[0] if failure else None)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and open connections; idempotent and bounded by ``timeout``."""
        thread, loop = self._thread, self._loop
        self._thread = None
        if thread is None or loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for transport in list(self._transports):
                transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*tasks, return_exceptions=True), timeout=timeout / 2
                )
            loop.stop()

        with contextlib.suppress(RuntimeError):  # the loop may already be closed
            asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout)
        self._writer.shutdown(wait=True)
        logging.getLogger(_AIOSMTPD_LOGGER).removeFilter(self._log_filter)

    def __enter__(self) -> MailSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
