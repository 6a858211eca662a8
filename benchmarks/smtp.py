"""The SMTP pieces every benchmark shares: one mail, two small clients, the bare list sink.

The clients speak just enough SMTP (EHLO, MAIL, RCPT, DATA, QUIT) and no more, so the
client side costs as little as possible and the server is what gets measured.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

DOMAIN = "mailbox.test"
SENDER = "noreply@app.example.test"

_MAIL = (
    "From: Example App <noreply@app.example.test>\r\n"
    "To: {rcpt}\r\n"
    "Subject: {subject}\r\n"
    "Date: Tue, 02 Dec 2025 15:00:00 +0000\r\n"
    "Message-ID: <{subject_id}@app.example.test>\r\n"
    "MIME-Version: 1.0\r\n"
    'Content-Type: text/plain; charset="utf-8"\r\n'
    "Content-Transfer-Encoding: 7bit\r\n"
    "\r\n"
    "Welcome!\r\n"
    "\r\n"
    "Open https://app.example.test/verify?token=Jx4c2VmZ3Rva2VuLXZhbHVlLWZvci1iZW5jaA\r\n"
    "or enter the code 482913 to verify your e-mail address.\r\n"
    "\r\n"
    "If you did not sign up, ignore this mail.\r\n"
    "-- \r\n"
    "Example App, 1 Example Street, Example Town\r\n"
)


def mail(rcpt: str, subject: str) -> bytes:
    """A small, realistic verification mail (about 600 bytes), CRLF line endings."""
    subject_id = subject.replace(" ", "-")
    return _MAIL.format(rcpt=rcpt, subject=subject, subject_id=subject_id).encode()


# -- clients ---------------------------------------------------------------------------


class SmtpReplyError(RuntimeError):
    """The server answered with something other than the expected code."""


def _reply_done(line: bytes, expected: bytes) -> bool:
    """True once ``line`` is the last line of a reply, which must start with ``expected``."""
    if not line:
        msg = "connection closed by the server"
        raise SmtpReplyError(msg)
    if line[3:4] == b"-":
        return False
    if not line.startswith(expected):
        msg = f"expected {expected.decode()}, got {line.decode(errors='replace').strip()}"
        raise SmtpReplyError(msg)
    return True


async def _reply(reader: asyncio.StreamReader, expected: bytes) -> None:
    while not _reply_done(await reader.readline(), expected):
        pass


class AsyncClient:
    """One SMTP connection; ``send`` returns when the server answered 250 to DATA."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, host: str, port: int) -> AsyncClient:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        await _reply(reader, b"220")
        writer.write(b"EHLO client.test\r\n")
        await _reply(reader, b"250")
        return client

    async def send(self, rcpt: str, data: bytes) -> None:
        w, r = self.writer, self.reader
        w.write(f"MAIL FROM:<{SENDER}>\r\n".encode())
        await _reply(r, b"250")
        w.write(f"RCPT TO:<{rcpt}>\r\n".encode())
        await _reply(r, b"250")
        w.write(b"DATA\r\n")
        await _reply(r, b"354")
        w.write(data + b".\r\n")
        await _reply(r, b"250")

    async def close(self) -> None:
        self.writer.write(b"QUIT\r\n")
        await _reply(self.reader, b"221")
        self.writer.close()
        await self.writer.wait_closed()


async def blast(
    host: str, port: int, rcpts: Sequence[str], count: int, warmup: int
) -> dict[str, Any]:
    """Send ``count`` mails over ``len(rcpts)`` concurrent connections (one rcpt each).

    Each connection first sends ``warmup`` untimed mails. Returns the elapsed time from the
    first timed mail to the last 250, and every mail's DATA-to-250 round trip.
    """
    clients = [await AsyncClient.connect(host, port) for _ in rcpts]
    for client, rcpt in zip(clients, rcpts, strict=True):
        for i in range(warmup):
            await client.send(rcpt, mail(rcpt, f"warmup {i}"))
    remaining = count
    rtts: list[float] = []

    async def pump(client: AsyncClient, rcpt: str) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            data = mail(rcpt, f"ingest {remaining}")
            t0 = time.perf_counter()
            await client.send(rcpt, data)
            rtts.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(pump(c, r) for c, r in zip(clients, rcpts, strict=True)))
    elapsed = time.perf_counter() - start
    for client in clients:
        await client.close()
    return {"elapsed": elapsed, "count": count, "rtts": rtts}


class BlockingClient:
    """One SMTP connection on a plain socket, for a feeder that sends one mail at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")
        self._reply(b"220")
        self._command(b"EHLO client.test\r\n", b"250")

    def _reply(self, expected: bytes) -> None:
        while not _reply_done(self.file.readline(), expected):
            pass

    def _command(self, line: bytes, expected: bytes) -> None:
        self.sock.sendall(line)
        self._reply(expected)

    def send(self, rcpt: str, data: bytes) -> tuple[float, float]:
        """Send one mail; returns ``time.monotonic()`` just before the end of DATA was
        sent, and the moment its 250 arrived."""
        self._command(f"MAIL FROM:<{SENDER}>\r\n".encode(), b"250")
        self._command(f"RCPT TO:<{rcpt}>\r\n".encode(), b"250")
        self._command(b"DATA\r\n", b"354")
        payload = data + b".\r\n"
        sent = time.monotonic()
        self.sock.sendall(payload)
        self._reply(b"250")
        return sent, time.monotonic()

    def close(self) -> None:
        self._command(b"QUIT\r\n", b"221")
        self.file.close()
        self.sock.close()


# -- the bare sink: the ceiling --------------------------------------------------------


class ListHandler:
    """The least a sink can do: append the message to a list (and wake a waiter)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.cond = threading.Condition()

    async def handle_DATA(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        raw = envelope.original_content or b""
        with self.cond:
            self.messages.append((envelope.rcpt_tos[0], raw))
            self.cond.notify_all()
        return "250 2.0.0 Message accepted"

    def wait_for(self, subject: str, timeout: float, waiting: threading.Event) -> bytes:
        """Block until a message with this exact subject line is in the list."""
        needle = f"\r\nSubject: {subject}\r\n".encode()
        deadline = time.monotonic() + timeout
        with self.cond:
            seen = 0
            while True:
                for _, raw in self.messages[seen:]:
                    if needle in raw:
                        return raw
                seen = len(self.messages)
                left = deadline - time.monotonic()
                if left <= 0:
                    msg = f"no message with subject {subject!r}"
                    raise TimeoutError(msg)
                waiting.set()
                self.cond.wait(left)


class ListSink:
    """A bare aiosmtpd server with ``ListHandler``, run the way ``MailSink`` runs its own:
    a socket bound first, then ``create_server(sock=...)`` on a loop in a daemon thread."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.handler = ListHandler()
        self.host = host
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    def start(self) -> ListSink:
        # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on accepted connections
        # only when their proto says TCP, as it does for create_server(host, port).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        sock.listen(128)
        sock.setblocking(False)
        self.port = int(sock.getsockname()[1])
        ready = threading.Event()
        loop = self._loop

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(
                loop.create_server(
                    lambda: SMTP(self.handler, hostname="bare.test", ident="bare", loop=loop),
                    sock=sock,
                )
            )
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="bare-sink", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
