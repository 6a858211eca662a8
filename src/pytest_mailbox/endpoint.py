"""Where mail goes, without the server: what the plugin needs before any sink starts.

The pytest plugin reads its options and warns about an exposed host at start-up, and the
xdist controller never runs a sink: none of that should import asyncio and aiosmtpd, which
``pytest_mailbox.sink`` does. The sink module re-exports every name here.
"""

from __future__ import annotations

import ipaddress
import re
import threading
from typing import Any

__all__ = [
    "DATA_POLICIES",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_RECIPIENTS",
    "Signal",
    "SinkError",
    "SmtpEndpoint",
    "host_name",
    "is_loopback",
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
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


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
    """``alias+tag@domain`` → (alias, tag, domain), lower-cased; None if not an address."""
    local, at, domain = address.strip().rpartition("@")
    if not at or not local or not domain:
        return None
    alias, plus, tag = local.lower().partition("+")
    return alias, (tag if plus else None), normalize_domain(domain)


class SmtpEndpoint:
    """Where the app under test sends mail: host, port and ready-made framework settings."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.smtp_url}>"

    @property
    def smtp_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"smtp://{host}:{self.port}"

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
                # Flask-Mail suppresses sending when app.testing is on, unless told not to.
                "MAIL_SUPPRESS_SEND": False,
                "MAIL_USE_TLS": False,
                "MAIL_USE_SSL": False,
            },
            "env": {
                "SMTP_HOST": self.host,
                "SMTP_PORT": str(self.port),
                "SMTP_URL": self.smtp_url,
            },
        }
