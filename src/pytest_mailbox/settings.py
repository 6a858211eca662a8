"""Every setting in one table: ``--mailbox-*`` option, ini key and environment variable.

Precedence: command line (``--mailbox-*``, then pytest's ``-o mailbox_*``), then environment
(``PYTEST_MAILBOX_*``), then ini, then default. Values are validated once; a bad one is refused
with the setting's name, where it came from and what it allows.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_mailbox.endpoint import (
    DATA_POLICIES,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_RECIPIENTS,
    host_name,
)
from pytest_mailbox.vocabulary import (
    CONTRACT_FIELDS,
    DEFAULT_LEASE,
    DEFAULT_TTL,
    DEFAULT_TTL_MAX,
    shown,
)

if TYPE_CHECKING:
    from pytest_mailbox.contract import EmailContract

__all__ = ["OPTIONS", "Option", "Settings", "argument", "options_table"]


def _plain(text: str) -> str:
    """``text`` if it is written as a number is in a config file: ASCII digits, no ``_``
    (Python's ``int`` and ``float`` also take ``１２`` and ``1_000``)."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return text


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        text = _plain(text)
        try:
            value = int(text)
        except ValueError:  # "120.0": a whole number, as a TOML float or JSON gives it
            number = float(text)
            if not number.is_integer():
                raise
            value = int(number)
        if not low <= value <= high:
            raise ValueError(text)
        return value

    return parse


def _number(text: str) -> float:
    value = float(_plain(text))
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def _seconds(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(_plain(text))
        if not low <= value <= high:  # also refuses nan
            raise ValueError(text)
        return value

    return parse


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(text)
        return text

    return parse


def _host(text: str) -> str:
    if text.lower() != "localhost":
        ipaddress.ip_address(text)  # ValueError if not an address
    return text


def _path(text: str) -> str:
    """A file to write: new, or a regular file. A directory, a device (``/dev/null``
    cannot be emptied) or a named pipe (opening one waits for a reader) is refused."""
    if text and Path(text).exists() and not Path(text).is_file():
        raise ValueError(text)
    return text


def _domains(text: str) -> tuple[str, ...]:
    domains = []
    for name in text.replace(",", " ").split():
        domain = host_name(name)
        if domain is None:
            raise ValueError(name)
        domains.append(domain)
    return tuple(domains)


def _domain(text: str) -> str:
    (domain,) = _domains(text) or ("",)
    if not domain:
        raise ValueError(text)
    return domain


@dataclass(frozen=True)
class Option:
    """One setting: ``--mailbox-<name>``, ini ``mailbox_<name>``, env ``PYTEST_MAILBOX_<NAME>``."""

    name: str
    help: str
    default: str
    allowed: str
    parse: Callable[[str], Any]
    #: Takes several values: separated by commas or spaces, or a TOML list of strings.
    many: bool = False

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
        "domain names separated by commas or spaces, or a TOML list of them",
        _domains,
        many=True,
    ),
    Option(
        "host",
        "Address the sink binds; anything but loopback is reachable by others (and warns)",
        "127.0.0.1",
        "an IP address, or localhost",
        _host,
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
        "max_recipients",
        "Recipients one message may have; RCPT past it gets 452",
        str(DEFAULT_MAX_RECIPIENTS),
        "an integer 1..10000",
        _int(1, 10000),
    ),
    Option(
        "idle_timeout",
        "Seconds a client may stay silent (or spend on one command) before it is cut off",
        f"{DEFAULT_IDLE_TIMEOUT:g}",
        "seconds 0.1..3600",
        _seconds(0.1, 3600),
    ),
    Option(
        "data_policy",
        "DATA with a bare CR, bare LF or NUL: store it and flag it, or refuse it (554)",
        DATA_POLICIES[0],
        " or ".join(repr(p) for p in DATA_POLICIES),
        _choice(*DATA_POLICIES),
    ),
    Option(
        "ttl_max",
        "Longest mailbox ttl a test may ask for, in seconds",
        str(DEFAULT_TTL_MAX),
        "an integer 1..86400",
        _int(1, 86400),
    ),
    Option(
        "receipts",
        "Write every run's receipt to this JSON Lines file (default: none; its folder is made "
        "if missing)",
        "",
        "a path to a new file, or to a receipts file to overwrite (not a directory, device, pipe "
        "or other file)",
        _path,
    ),
    Option(
        "purpose",
        "Default purpose of a test's mailbox (alias prefix)",
        "mail",
        CONTRACT_FIELDS["purpose"],
        str,
    ),
    Option(
        "ttl",
        "Default mailbox ttl in seconds; unless given, at most mailbox_ttl_max",
        str(DEFAULT_TTL),
        CONTRACT_FIELDS["ttl"],
        _int(1, 86400),
    ),
    Option(
        "lease",
        "Default claim lease in seconds; unless given, at most the ttl",
        f"{DEFAULT_LEASE:g}",
        CONTRACT_FIELDS["lease"],
        _number,
    ),
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
    Option(
        "mode",
        "Default agent tool mode",
        "live",
        CONTRACT_FIELDS["mode"],
        _choice("live", "dry-run"),
    ),
    Option(
        "link_domains",
        "Hosts that link() may return (default: any)",
        "",
        "host names separated by commas or spaces, or a TOML list of them",
        _domains,
        many=True,
    ),
)

_BY_NAME = {option.name: option for option in OPTIONS}


def argument(
    name: str,
    value: object,
    kind: type | tuple[type, ...],
    parse: Callable[[str], Any] | None = None,
    allowed: str = "",
) -> Any:
    """An argument of the API (``MailSink(port=)``, ``Store(busy_timeout=)``), parsed: of
    type ``kind`` (never a bool), held to ``parse``, by default that of the setting of the
    same name, so the API refuses what the options refuse. ``ValueError`` names the argument
    and what it allows."""
    if parse is None:
        parse, allowed = _BY_NAME[name].parse, _BY_NAME[name].allowed
    if isinstance(value, kind) and not isinstance(value, bool):
        try:
            return parse(str(value))
        except ValueError:
            pass
    msg = f"{name}={shown(value)} is invalid; allowed: {allowed}"
    raise ValueError(msg)


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
    max_recipients: int
    idle_timeout: float
    data_policy: str
    ttl_max: int
    receipts: Path | None
    #: The contract's settings that were given (validated), by field: what a marker overlays.
    contract_given: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: Where each setting came from: ``default``, ``ini mailbox_ttl``, ``-o mailbox_ttl``, …
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)

    @functools.cached_property
    def contract(self) -> EmailContract:
        """The contract a test gets without a marker, built on first use: a run none of
        whose tests needs one (and the xdist controller) never imports pydantic."""
        from pytest_mailbox.contract import EmailContract  # noqa: PLC0415 - see above

        return EmailContract(**self.contract_given)

    @classmethod
    def resolve(
        cls,
        cli: Mapping[str, str | None],
        ini: Mapping[str, object],
        env: Mapping[str, str] | None = None,
        ini_keys: Iterable[str] = (),
        ini_dir: Path | None = None,
        override_ini: Iterable[str] = (),
    ) -> Settings:
        """Overlay the sources and validate; ``ValueError`` names the setting, where its
        value came from (``--mailbox-ttl``, ``-o mailbox_ttl``, ``PYTEST_MAILBOX_TTL``,
        ``ini mailbox_ttl``) and what it allows.

        ``ini_keys`` are every key of the ini file: a ``mailbox_*`` key or ``PYTEST_MAILBOX_*``
        variable that is no setting (a typo) is refused rather than silently ignored.
        ``ini_dir`` is the ini file's directory: a relative receipts path given there, or
        with ``-o``, is taken from it, as pytest takes its own ``paths`` settings.
        ``override_ini`` is pytest's ``-o``/``--override-ini`` list (``key=value``): pytest
        counts it as ini, but it is typed on the command line, so it ranks with the
        command line, below ``--mailbox-*`` only.
        """
        env = os.environ if env is None else env
        _refuse_unknown(ini_keys, env)
        overridden = _overrides(override_ini)
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for option in OPTIONS:
            value: object = option.default
            source = "default"
            for candidate, where in (
                (ini.get(option.name), f"ini {option.ini}"),
                (env.get(option.env), option.env),
                (overridden.get(option.ini), f"-o {option.ini}"),
                (cli.get(option.name), option.flag),
            ):
                if candidate not in (None, "", []):
                    value, source = candidate, where
            values[option.name] = _parse(option, value, source)
            sources[option.name] = source
        # Only what was given: the contract fills in its own defaults, and a default never
        # collides with a smaller value given for another setting.
        given = {k: values.pop(k) for k in _CONTRACT_KEYS}
        given = {k: v for k, v in given.items() if sources[k] != "default"}
        if "ttl" not in given and values["ttl_max"] < DEFAULT_TTL:
            given["ttl"] = values["ttl_max"]
            sources["ttl"] = "default, capped at mailbox_ttl_max"
        if given:  # the defaults alone are valid: nothing to check, no pydantic to import
            given = _checked_contract(given, values["ttl_max"], sources)
        receipts = Path(values["receipts"]) if values["receipts"] else None
        # From the ini file or -o: taken from the ini file's directory, as pytest's paths are.
        if (
            receipts is not None
            and ini_dir is not None
            and sources["receipts"].startswith(("ini ", "-o "))
        ):
            receipts = ini_dir / receipts  # an absolute path stays as it is
        return cls(
            domain=values["domain"],
            allowed_domains=tuple(dict.fromkeys((values["domain"], *values["allowed_domains"]))),
            host=values["host"],
            port=values["port"],
            max_message_size=values["max_message_size"],
            max_recipients=values["max_recipients"],
            idle_timeout=values["idle_timeout"],
            data_policy=values["data_policy"],
            ttl_max=values["ttl_max"],
            receipts=receipts,
            contract_given=given,
            sources=sources,
        )


def _checked_contract(
    given: Mapping[str, Any], ttl_max: int, sources: Mapping[str, str]
) -> dict[str, Any]:
    """The contract's given settings as the contract holds them; ``ValueError`` names the
    setting, where it came from and what it allows."""
    from pydantic import ValidationError  # noqa: PLC0415 - imported when settings are given

    from pytest_mailbox.contract import EmailContract, describe_validation_error  # noqa: PLC0415

    try:
        contract = EmailContract(**given)
    except ValidationError as exc:
        raise ValueError(
            describe_validation_error("settings", exc, CONTRACT_FIELDS, sources=sources)
        ) from None
    contract.check_limits(ttl_max=ttl_max, source="settings", sources=sources)
    return contract.model_dump(exclude_unset=True)


def _overrides(override_ini: Iterable[str]) -> dict[str, str]:
    """``-o key=value`` entries by key; the last of a key counts, as in pytest."""
    found = {}
    for entry in override_ini:
        key, equals, value = entry.partition("=")
        if equals:  # pytest itself refuses an entry without one
            found[key] = value
    return found


def _toml(value: object) -> str:
    """A native TOML value (pytest 9's ``[tool.pytest]``) as TOML spells it: the user wrote
    ``true`` and ``["a", 3]``, not Python's ``True`` and ``['a', 3]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{_toml_key(key)} = {_toml(item)}" for key, item in value.items())
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, date | time):
        return value.isoformat()
    return repr(value)


def _toml_key(key: object) -> str:
    """A table's key as TOML spells it: bare if it may be, quoted otherwise."""
    text = str(key)
    bare = bool(text) and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)
    return text if bare else _toml(text)


def _parse(option: Option, value: object, source: str) -> Any:
    """One setting's value, validated; a TOML list for a setting that takes several."""
    if isinstance(value, list) and option.many:
        for index, item in enumerate(value):
            if not isinstance(item, str):
                msg = (
                    f"{source}={_toml(value)} is invalid: item {index} is {_toml(item)}, not a "
                    f"string; allowed: {option.allowed}"
                )
                raise ValueError(msg)
        text = " ".join(value)
    elif isinstance(value, str):
        text = value.strip()
        _refuse_toml_written(option, source, text)
        _refuse_switch(option, source, text)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)
        _refuse_switch(option, source, text, toml=True)  # [tool.pytest]'s mailbox_receipts = 1
    else:  # a TOML boolean, date, table, or a list for a setting of one value
        msg = f"{source}={_toml(value)} is invalid; allowed: {option.allowed}"
        raise ValueError(msg)
    try:
        return option.parse(text)
    except (ValueError, TypeError):
        shown = repr(text) if isinstance(value, str) else _toml(value)  # 0, 1.5, inf, a list
        msg = f"{source}={shown} is invalid; allowed: {option.allowed}"
        raise ValueError(msg) from None


def _written(option: Option, source: str, text: str) -> str:
    """How ``source`` gives ``option`` the value ``text``: the fix an error shows."""
    if source == option.flag:
        written = f"{option.flag}={text}"
    elif source == option.env:
        written = f"{option.env}={text}"
    elif source.startswith("-o "):
        written = f"-o {option.ini}={text}"
    else:
        written = f"{option.ini} = {text}"
    return written if text else f"{written.rstrip()} (empty: none given)"


def _refuse_toml_written(option: Option, source: str, text: str) -> None:
    """A value written as TOML writes it, where it is taken as written: an ini file
    (``pytest.ini``, ``tox.ini``, ``setup.cfg``), ``-o``, an option or a variable keeps the
    quotes of ``mailbox_receipts = "r.jsonl"`` (a file named ``"r.jsonl"``, quotes and all)
    and the brackets of ``["a.test"]``. ``ValueError`` says how to write it there."""
    listed = text.startswith("[") and text.endswith("]")
    words = (text[1:-1] if listed else text).replace(",", " ").split()
    # A quote inside a name (o'brien.test) is no quoting: the name's own check refuses it.
    if option.many and (listed or any(w[0] in "'\"" or w[-1] in "'\"" for w in words)):
        # Each name without its quotes: "a.test", "b.test" is two quoted names, not one.
        names = [name for name in (word.strip("'\"") for word in words) if name]
        # One word on a command line or in a variable (a shell splits "a.test, b.test").
        taken_as_one = source in (option.flag, option.env) or source.startswith("-o ")
        fix = _written(option, source, ("," if taken_as_one else ", ").join(names))
    elif len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        fix = _written(option, source, text[1:-1].strip())
    else:
        return
    why = (
        "a list in brackets is TOML, which only pyproject.toml reads"
        if listed
        else "its quotes would be part of the value (only pyproject.toml reads quotes; an ini "
        "file, -o, an option and a variable keep them)"
    )
    msg = f"{source}={text!r} is invalid: {why}; write {fix}"
    raise ValueError(msg)


#: What a switch is written as: a file path given as one is a switch mistaken for a path.
_SWITCHES = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


def _refuse_switch(option: Option, source: str, text: str, *, toml: bool = False) -> None:
    """``mailbox_receipts = true`` (``[tool.pytest.ini_options]`` hands pytest's ``True``)
    is a switch, not the file it would have named ``True``: ``ValueError`` says to give a
    path. A ``toml`` value (a number, from ``[tool.pytest]``) is shown and fixed as TOML
    writes it: the path in quotes, where ``mailbox_receipts = receipts.jsonl`` is no TOML."""
    if option.name == "receipts" and text.lower() in _SWITCHES:
        shown = text if toml else repr(text)
        fix = (
            f'{option.ini} = "receipts.jsonl"'
            if toml
            else _written(option, source, "receipts.jsonl")
        )
        msg = (
            f"{source}={shown} is invalid: {option.ini} is the file to write the receipts "
            f"to, not a switch; write {fix}, or give none to write no file"
        )
        raise ValueError(msg)


def _refuse_unknown(ini_keys: Iterable[str], env: Mapping[str, str]) -> None:
    for given, prefix, known in (
        (ini_keys, "mailbox_", [o.ini for o in OPTIONS]),
        (env, "PYTEST_MAILBOX_", [o.env for o in OPTIONS]),
    ):
        unknown = sorted(k for k in given if k.startswith(prefix) and k not in known)
        if unknown:
            where = "ini key" if prefix == "mailbox_" else "environment variable"
            msg = (
                f"unknown {where} {unknown[0]!r}; pytest-mailbox knows: {', '.join(sorted(known))}"
            )
            raise ValueError(msg)


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
