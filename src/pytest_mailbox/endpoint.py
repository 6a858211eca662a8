"""Where mail goes, without the server: what the plugin needs before any sink starts.

The pytest plugin reads its options and warns about an exposed host at start-up, and the
xdist controller never runs a sink: none of that should import asyncio and aiosmtpd, which
``pytest_mailbox.sink`` does. The sink module re-exports the names a sink's user needs.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib.metadata
import ipaddress
import re
import socket
import sys
import threading
import unicodedata
from collections.abc import Iterator
from typing import Any

__all__ = [
    "DATA_POLICIES",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_RECIPIENTS",
    "Signal",
    "SinkError",
    "SmtpEndpoint",
    "address",
    "check_host",
    "host_name",
    "is_loopback",
    "listen",
    "normalize_domain",
    "split_address",
]

#: Recipients one message may have; RCPT past it gets ``452 4.5.3``.
DEFAULT_MAX_RECIPIENTS = 100
#: Seconds a client may stay silent (or spend on one command, DATA included).
DEFAULT_IDLE_TIMEOUT = 300.0
#: What DATA with a bare CR, a bare LF or a NUL gets: stored and flagged, or refused.
DATA_POLICIES = ("flag", "refuse")


class SinkError(RuntimeError):
    """The sink could not start; the message names the option to change."""


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, or ``SinkError`` naming the option
    to change."""
    sock = _tcp_socket(host)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise _cannot_listen(host, port, exc) from exc
    return sock


def check_host(host: str) -> None:
    """``SinkError`` if ``host`` is no address this machine can listen on: the plugin tries
    it once at start-up (bound to a free port, never listening, then closed), so that such
    a host is a usage error, not an error in every test that asks for a sink."""
    with _tcp_socket(host) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            raise _cannot_listen(host, 0, exc) from exc


def _tcp_socket(host: str) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when
    # the listener says TCP (proto 0 does not), and without it every client that opens a
    # connection per mail waits ~40 ms on Nagle's algorithm.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return _Listener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)


def _socket_class() -> type[socket.socket]:
    """``socket.socket`` as the socket module defines it, under any subclass put in its
    place: pytest-socket's ``--disable-socket`` puts one that refuses to make a socket."""
    for cls in socket.socket.__mro__:
        if cls.__module__ == "socket" and cls.__name__ == "socket":
            return cls
    return socket.socket  # pragma: no cover - no guard of that kind


#: The sink's own sockets are its plumbing, not a test's use of the network: what
#: pytest-socket governs is the connection the app under test opens to the sink
#: (``--allow-hosts=127.0.0.1``).
_SOCKET = _socket_class()


class _Listener(_SOCKET):  # type: ignore[misc,valid-type]
    """A listening socket whose accepted connections are sockets whatever class the socket
    module hands out at the time: the stdlib's ``accept`` makes them with
    ``socket.socket``, so a guard put there after the sink started (pytest-socket's, in
    every test's setup) refused each one and left its client waiting for a banner."""

    def accept(self) -> tuple[socket.socket, Any]:
        fd, peer = self._accept()
        conn = _SOCKET(self.family, self.type, self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            conn.setblocking(True)  # as the stdlib's accept does
        return conn, peer


@contextlib.contextmanager
def unguarded_sockets() -> Iterator[None]:
    """``socket.socket`` as the socket module defines it, for the sink's start: asyncio
    makes its event loop's self-pipe with ``socket.socketpair()``, which a guard in its
    place (pytest-socket's) refuses. Any other thread sees the real class for that time:
    it only loosens a guard, as pytest-socket's own ``enable_socket`` does. Sinks starting
    in several threads at once share the one swap: the guard is put back when the last
    of them has its loop, not under another that still makes its own."""
    global _unguarded, _guard  # noqa: PLW0603 - one swap for the process
    with _UNGUARD_LOCK:
        if _unguarded == 0:
            _guard = socket.socket
            socket.socket = _SOCKET  # type: ignore[misc]
        _unguarded += 1
    try:
        yield
    finally:
        with _UNGUARD_LOCK:
            _unguarded -= 1
            if _unguarded == 0:
                socket.socket = _guard  # type: ignore[misc]
                _guard = None


_UNGUARD_LOCK = threading.Lock()
#: How many sinks are making their loop, and what ``socket.socket`` was before the first.
_unguarded = 0
_guard: Any = None


def address(host: str, port: int | str) -> str:
    """``host:port`` as a URL writes it: an IPv6 host in brackets (``[::1]:2525``), so the
    port's colon is told from the address's."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cannot_listen(host: str, port: int, exc: OSError) -> SinkError:
    where = f"pytest-mailbox cannot listen on {address(host, port)}"
    if exc.errno == errno.EADDRINUSE:
        return SinkError(
            f"{where}: the port is already in use by another program; free it, or choose "
            "another port with --mailbox-port / mailbox_port (0 picks a free one)"
        )
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
        return SinkError(
            f"{where}: {exc.strerror}; --mailbox-host / mailbox_host must be an address of "
            "this machine (the default, 127.0.0.1, always is)"
        )
    if exc.errno == errno.EACCES:
        return SinkError(
            f"{where}: {exc.strerror}; ports below 1024 need privileges: choose another with "
            "--mailbox-port / mailbox_port (0 picks a free one)"
        )
    return SinkError(f"{where}: {exc.strerror}")


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


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses: reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    address = ip_of(host)
    return address is not None and address.is_loopback


def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` writes (in brackets or not), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return None


def normalize_domain(domain: str) -> str:
    """Lower case, no trailing dot, IDNA (punycode) form: the form domains are compared in."""
    domain = domain.strip().rstrip(".").lower()
    try:
        return domain.encode("idna").decode("ascii")
    except UnicodeError:
        return domain


#: One label of a host name, once in IDNA form (underscores allowed: test hosts use them).
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


def host_name(name: str) -> str | None:
    """``name`` in the form domains are compared in (``normalize_domain``), or None if it
    is not a host name (a URL, a port, an empty label)."""
    domain = normalize_domain(name)
    return domain if all(_LABEL.fullmatch(label) for label in domain.split(".")) else None


def split_address(address: str) -> tuple[str, str | None, str] | None:
    """``alias+tag@domain`` → (alias, tag, domain), lower-cased; None if not an address.
    An empty tag (``alias+@domain``) is none: that is mail to the alias alone."""
    local, at, domain = address.strip().rpartition("@")
    if not at or not local or not domain:
        return None
    alias, _, tag = local.lower().partition("+")
    return alias, fold_tag(tag) or None, normalize_domain(domain)


def fold_tag(tag: str) -> str:
    """A plus-tag as it is kept and compared: lower case, and NFC (RFC 6532 3.1), so that
    ``café`` sent with its accent composed or as ``e`` and U+0301 is one tag, as a reader
    of the address sees one."""
    return unicodedata.normalize("NFC", tag.lower())


class SmtpEndpoint:
    """Where the app under test sends mail: host, port and ready-made framework settings."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.smtp_url}>"

    @property
    def smtp_url(self) -> str:
        return f"smtp://{address(self.host, self.port)}"

    @property
    def settings(self) -> dict[str, dict[str, Any]]:
        """Ready-made mail settings: Django, Flask-Mail, and environment for a subprocess.

        ``"django"`` holds the settings the Django in use reads. Django 6.1 deprecates the
        ``EMAIL_*`` settings for ``MAILERS``, and refuses them beside one: from 6.1 it is a
        ``MAILERS`` whose every mailer (those the project's ``MAILERS`` names, else
        ``default``) sends here, unless the project still sets ``EMAIL_HOST`` or another
        ``EMAIL_*`` setting and no ``MAILERS`` (its own code may read them, which Django
        refuses once a ``MAILERS`` is set); then, as before 6.1, the ``EMAIL_*`` settings.
        The project's settings are read once Django has loaded them, as pytest-django does
        before any fixture.
        """
        return {
            "django": self._django(),
            "flask": {
                "MAIL_SERVER": self.host,
                "MAIL_PORT": self.port,
                # Flask-Mail suppresses sending when app.testing is on, unless told not to.
                "MAIL_SUPPRESS_SEND": False,
                "MAIL_USE_TLS": False,
                "MAIL_USE_SSL": False,
                # No login: the sink takes any, but an app's production password is not
                # sent in clear to it (Flask-Mail logs in when both are set).
                "MAIL_USERNAME": None,
                "MAIL_PASSWORD": None,
            },
            "env": {
                "SMTP_HOST": self.host,
                "SMTP_PORT": str(self.port),
                "SMTP_URL": self.smtp_url,
            },
        }

    def _django(self) -> dict[str, Any]:
        project = _django_settings()
        mailers = getattr(project, "MAILERS", None)
        # A project still on the EMAIL_* settings may read them, which 6.1 refuses once a
        # MAILERS is set. (Not EMAIL_BACKEND: Django's test environment sets that itself.)
        on_email = (
            project is not None
            and mailers is None
            and any(map(project.is_overridden, _DJANGO_EMAIL_SET_BY_PROJECTS))
        )
        if django_version() < (6, 1) or on_email:
            return {
                "EMAIL_BACKEND": _DJANGO_SMTP,
                "EMAIL_HOST": self.host,
                "EMAIL_PORT": self.port,
                "EMAIL_HOST_USER": "",
                "EMAIL_HOST_PASSWORD": "",
                "EMAIL_USE_TLS": False,
                "EMAIL_USE_SSL": False,
            }
        return {
            "MAILERS": {
                alias: {"BACKEND": _DJANGO_SMTP, "OPTIONS": self._django_options()}
                for alias in (mailers or ["default"])  # its mailers, no more
            }
        }

    def _django_options(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "username": "",
            "password": "",
            "use_tls": False,
            "use_ssl": False,
        }


_DJANGO_SMTP = "django.core.mail.backends.smtp.EmailBackend"


#: The mail settings Django 6.1 deprecates for MAILERS, but EMAIL_BACKEND, which Django's
#: test environment sets (to its locmem backend) in a project without MAILERS.
_DJANGO_EMAIL_SET_BY_PROJECTS = (
    "EMAIL_FILE_PATH",
    "EMAIL_HOST",
    "EMAIL_HOST_PASSWORD",
    "EMAIL_HOST_USER",
    "EMAIL_PORT",
    "EMAIL_SSL_CERTFILE",
    "EMAIL_SSL_KEYFILE",
    "EMAIL_TIMEOUT",
    "EMAIL_USE_SSL",
    "EMAIL_USE_TLS",
)


def _django_settings() -> Any:
    """The project's configured ``django.conf.settings``, or None (not imported, or not
    configured yet: nothing to read)."""
    settings = getattr(sys.modules.get("django.conf"), "settings", None)
    return settings if settings is not None and settings.configured else None


def django_version() -> tuple[int, int]:
    """(major, minor) of the Django in use: the imported one, else the installed one;
    (0, 0) without Django."""
    imported = getattr(sys.modules.get("django"), "VERSION", None)
    if imported is not None:
        return int(imported[0]), int(imported[1])
    return _installed_django()


@functools.cache
def _installed_django() -> tuple[int, int]:
    try:
        text = importlib.metadata.version("django")
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)
    numbers = re.match(r"(\d+)\.(\d+)", text)
    return (int(numbers[1]), int(numbers[2])) if numbers else (0, 0)
