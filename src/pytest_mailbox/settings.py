"""Every setting in one table: ``--mailbox-*`` option, ini key and environment variable.

Precedence: command line, then environment (``PYTEST_MAILBOX_*``), then ini, then default.
Values are validated once; a bad one is refused with the setting's name and what it allows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_mailbox.contract import CONTRACT_FIELDS, EmailContract, describe_validation_error
from pytest_mailbox.sink import normalize_domain

__all__ = ["OPTIONS", "Option", "Settings", "options_table"]


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value

    return parse


def _number(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def _domains(text: str) -> tuple[str, ...]:
    domains = tuple(normalize_domain(d) for d in text.replace(",", " ").split())
    for domain in domains:
        labels = domain.split(".")
        if not all(label and len(label) <= 63 for label in labels):
            raise ValueError(domain)
    return domains


def _domain(text: str) -> str:
    (domain,) = _domains(text) or ("",)
    if not domain:
        raise ValueError(text)
    return domain


def _mode(text: str) -> str:
    if text not in ("live", "dry-run"):
        raise ValueError(text)
    return text


@dataclass(frozen=True)
class Option:
    """One setting: ``--mailbox-<name>``, ini ``mailbox_<name>``, env ``PYTEST_MAILBOX_<NAME>``."""

    name: str
    help: str
    default: str
    allowed: str
    parse: Callable[[str], Any]

    @property
    def flag(self) -> str:
        return "--mailbox-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "mailbox_" + self.name

    @property
    def env(self) -> str:
        return "PYTEST_MAILBOX_" + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "domain",
        "Domain of the addresses handed to tests",
        "mailbox.test",
        "a domain name",
        _domain,
    ),
    Option(
        "allowed_domains",
        "Recipient domains the sink accepts (default: the domain)",
        "",
        "domain names separated by commas or spaces",
        _domains,
    ),
    Option(
        "host",
        "Address the sink binds; anything but loopback is reachable by others",
        "127.0.0.1",
        "an IP address",
        str,
    ),
    Option(
        "port",
        "Port the sink binds; 0 picks a free port per worker",
        "0",
        "an integer 0..65535",
        _int(0, 65535),
    ),
    Option(
        "max_message_size",
        "Largest message the sink accepts, in bytes",
        str(10 * 1024 * 1024),
        "an integer 1024..1073741824",
        _int(1024, 1 << 30),
    ),
    Option(
        "ttl_max",
        "Longest mailbox ttl a test may ask for, in seconds",
        "3600",
        "an integer 1..86400",
        _int(1, 86400),
    ),
    Option("receipts", "Write every run's receipt to this JSON Lines file", "", "a file path", str),
    Option(
        "purpose",
        "Default purpose of a test's mailbox (alias prefix)",
        "mail",
        CONTRACT_FIELDS["purpose"],
        str,
    ),
    Option("ttl", "Default mailbox ttl in seconds", "300", CONTRACT_FIELDS["ttl"], _int(1, 86400)),
    Option("lease", "Default claim lease in seconds", "60", CONTRACT_FIELDS["lease"], _number),
    Option(
        "timeout", "Default wait_for timeout in seconds", "10", CONTRACT_FIELDS["timeout"], _number
    ),
    Option(
        "max_reads",
        "Default read budget of the agent tools per run",
        "3",
        CONTRACT_FIELDS["max_reads"],
        _int(1, 1000),
    ),
    Option(
        "max_resends",
        "Default resend budget of the agent tools per run",
        "1",
        CONTRACT_FIELDS["max_resends"],
        _int(0, 1000),
    ),
    Option("mode", "Default agent tool mode", "live", CONTRACT_FIELDS["mode"], _mode),
    Option(
        "link_domains",
        "Hosts that link() may return (default: any)",
        "",
        CONTRACT_FIELDS["link_domains"],
        _domains,
    ),
)

_CONTRACT_KEYS = (
    "purpose",
    "ttl",
    "lease",
    "timeout",
    "max_reads",
    "max_resends",
    "mode",
    "link_domains",
)


@dataclass(frozen=True)
class Settings:
    """The validated settings of one pytest run."""

    domain: str
    allowed_domains: tuple[str, ...]
    host: str
    port: int
    max_message_size: int
    ttl_max: int
    receipts: Path | None
    contract: EmailContract

    @classmethod
    def resolve(
        cls,
        cli: Mapping[str, str | None],
        ini: Mapping[str, str | None],
        env: Mapping[str, str] | None = None,
    ) -> Settings:
        """Overlay the sources and validate; ``ValueError`` names the setting and its values."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for option in OPTIONS:
            text, source = option.default, option.ini
            for candidate, where in (
                (ini.get(option.name), f"ini {option.ini}"),
                (env.get(option.env), option.env),
                (cli.get(option.name), option.flag),
            ):
                if candidate not in (None, ""):
                    text, source = str(candidate).strip(), where
            try:
                values[option.name] = option.parse(text)
            except (ValueError, TypeError):
                msg = f"{source}={text!r} is invalid; allowed: {option.allowed}"
                raise ValueError(msg) from None
        contract_values = {k: values.pop(k) for k in _CONTRACT_KEYS}
        try:
            contract = EmailContract(**contract_values)
        except ValidationError as exc:
            raise ValueError(describe_validation_error("ini", exc, CONTRACT_FIELDS)) from None
        contract.check_limits(ttl_max=values["ttl_max"], source="ini")
        return cls(
            domain=values["domain"],
            allowed_domains=tuple(dict.fromkeys((values["domain"], *values["allowed_domains"]))),
            host=values["host"],
            port=values["port"],
            max_message_size=values["max_message_size"],
            ttl_max=values["ttl_max"],
            receipts=Path(values["receipts"]) if values["receipts"] else None,
            contract=contract,
        )


def options_table() -> str:
    """The configuration reference as a Markdown table (docs/configuration.md embeds it)."""
    rows = [
        "| option | ini key | environment | default | allowed | what it does |",
        "|---|---|---|---|---|---|",
    ]
    rows.extend(
        f"| `{o.flag}` | `{o.ini}` | `{o.env}` | `{o.default or '-'}` | {o.allowed} | {o.help} |"
        for o in OPTIONS
    )
    return "\n".join(rows)
