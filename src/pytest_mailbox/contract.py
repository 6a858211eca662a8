"""The per-test ``EmailContract``, selectors and their pattern checks, and receipts (the
statuses live in ``vocabulary`` and are re-exported here)."""

from __future__ import annotations

import contextlib
import decimal
import functools
import locale
import math
import numbers
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_mailbox.endpoint import fold_tag, host_name
from pytest_mailbox.vocabulary import (
    CONTRACT_FIELDS,
    DEFAULT_LEASE,
    DEFAULT_TTL,
    DEFAULT_TTL_MAX,
    Checkpoint,
    CloseReason,
    Status,
    utc,
)

if sys.version_info >= (3, 11):
    from re import _constants as _sre_constants
    from re import _parser as _sre_parse
    from re._compiler import compile as _sre_compile
else:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse
    from sre_compile import compile as _sre_compile

__all__ = [  # with the vocabulary's names, which this module exported before it existed
    "CONTRACT_FIELDS",
    "DEFAULT_LEASE",
    "DEFAULT_TTL",
    "DEFAULT_TTL_MAX",
    "AgentEvidence",
    "Checkpoint",
    "CloseReason",
    "EmailContract",
    "MessageReceipt",
    "Receipt",
    "ReceiptEvent",
    "SecretDigest",
    "Selector",
    "Status",
    "describe_validation_error",
    "utc",
]


_PURPOSE = r"^[a-z][a-z0-9-]{0,29}$"

#: How a run lifts its ttl limit; ``Mailbox.reserve`` outside pytest takes an argument.
_RAISE_TTL_MAX = "raise mailbox_ttl_max (the ini key, --mailbox-ttl-max or PYTEST_MAILBOX_TTL_MAX)"


class EmailContract(BaseModel):
    """The per-test rules: the mailbox_* settings, overlaid by ``@pytest.mark.email_contract``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    purpose: str = Field(default="mail", pattern=_PURPOSE)
    ttl: int = Field(default=DEFAULT_TTL, gt=0)
    lease: float = Field(default=DEFAULT_LEASE, gt=0, allow_inf_nan=False)
    timeout: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    max_reads: int = Field(default=3, ge=1, le=1000)
    max_resends: int = Field(default=1, ge=0, le=1000)
    mode: Literal["live", "dry-run"] = "live"
    link_domains: tuple[str, ...] = ()
    run_header: str = Field(default="X-Run-Id", pattern=r"^[A-Za-z0-9-]{1,64}$")

    @field_validator("ttl", "lease", "timeout", "max_reads", "max_resends", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # pydantic would read True as 1
            msg = "Input should be a number, not a bool"
            raise ValueError(msg)
        return value

    @field_validator("link_domains", mode="before")
    @classmethod
    def _not_one_string(cls, value: object) -> object:
        if isinstance(value, str | bytes):  # pydantic said "Input should be a valid tuple"
            # Written as mailbox_link_domains takes it ("a.test, b.test"): one item a name.
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            names = text.replace(",", " ").split()
            msg = f"a list of host names, not one string: link_domains={names!r}"
            raise ValueError(msg)
        return value

    @field_validator("link_domains")
    @classmethod
    def _lower_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Host names, in the form links' hosts are compared in, as --mailbox-link-domains.
        domains = []
        for name in (d for d in value if d.strip()):
            domain = host_name(name)
            if domain is None:
                msg = f"{name.strip().lower()!r} is not a host name (no scheme, port or path)"
                raise ValueError(msg)
            domains.append(domain)
        return tuple(domains)

    @model_validator(mode="after")
    def _default_lease_within_ttl(self) -> EmailContract:
        """A lease nobody gave is the default, or the ttl if that is shorter: ``ttl=30``
        alone is valid, while an explicit lease above the ttl is refused by check_limits."""
        if "lease" not in self.model_fields_set and self.lease > self.ttl:
            # Still unset: a contract overlaid with another ttl takes the default again.
            object.__setattr__(self, "lease", float(self.ttl))  # frozen: set while validating
        return self

    def check_limits(
        self,
        *,
        ttl_max: int,
        source: str = "email_contract",
        sources: Mapping[str, str] | None = None,
        raise_max: str = _RAISE_TTL_MAX,
    ) -> None:
        """Refuse values that are valid alone but break the configured limits.

        ``sources`` names where each value came from, where the settings know it;
        ``raise_max`` how the caller lifts ``ttl_max``.
        """

        def came(name: str) -> str:
            return f" ({sources[name]})" if sources and name in sources else ""

        if self.ttl > ttl_max:
            msg = (
                f"{source}: ttl={self.ttl}{came('ttl')} exceeds mailbox_ttl_max={ttl_max}"
                f"{came('ttl_max')}; lower ttl or {raise_max}"
            )
            raise ValueError(msg)
        if self.lease > self.ttl:
            fix = "lower lease or raise ttl"
            if self.lease > ttl_max:  # no ttl up to ttl_max could hold it
                fix = f"lower lease, or {raise_max} and raise ttl"
            msg = (
                f"{source}: lease={self.lease:g}{came('lease')} exceeds ttl={self.ttl}"
                f"{came('ttl')}; a claim cannot outlive its mailbox, {fix}"
            )
            raise ValueError(msg)


def describe_validation_error(
    source: str,
    error: ValidationError,
    allowed: dict[str, str],
    *,
    sources: Mapping[str, str] | None = None,
    own: str = "",
) -> str:
    """Turn a pydantic error into one line per field: name, value given, what is allowed.

    ``sources`` names where each field's value came from: ``purpose='x' (ini mailbox_purpose)``;
    ``own`` is said after the allowed fields of an unknown one (a call's other arguments).
    """
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "?"
        top = str(item["loc"][0]) if item["loc"] else ""
        came = f" ({sources[top]})" if sources and top in sources else ""
        if item["type"] == "extra_forbidden":
            lines.append(
                f"{source}: unknown field {field!r}; allowed fields: {', '.join(allowed)}{own}"
            )
            continue
        hint = allowed.get(top, "")
        lines.append(
            f"{source}: {field}={item.get('input')!r}{came} is invalid: {_reason(item['msg'])}"
            + (f" (allowed: {hint})" if hint else "")
        )
    return "\n".join(lines)


def _reason(message: str) -> str:
    """A pydantic error's message without the "Value error, " it puts before our own."""
    return message.removeprefix("Value error, ")


SELECTOR_FIELDS: dict[str, str] = {
    "subject": "the exact subject",
    "subject_contains": "text the subject contains",
    "subject_regex": "a regular expression searched in the subject",
    "sender": "an address alone, compared case-insensitively with From and the envelope sender",
    "header": "a (name, value) pair; the name without ':' or line breaks",
    "tag": "the envelope recipient's plus-tag (friend for alias+friend@domain; '' for none)",
    "body_contains": "text the plain or HTML body contains",
    "body_regex": "a regular expression searched in the body",
    "received_after": "a checkpoint(), a datetime with a time zone or a finite POSIX timestamp",
}


#: Why a subject selector with a line break is refused (the agent's selector says it too).
ONE_LINE_SUBJECT = "a subject has no line breaks: folded subjects are compared unfolded"


class Selector(BaseModel):
    """What a test expects of its message; every given field must match."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    subject: str | None = None
    subject_contains: str | None = None
    subject_regex: str | None = None
    sender: str | None = None
    header: tuple[str, str] | None = None
    tag: str | None = None
    body_contains: str | None = None
    body_regex: str | None = None
    received_after: Checkpoint | datetime | float | None = None

    @field_validator("received_after", mode="before")
    @classmethod
    def _one_instant(cls, value: object) -> object:
        """A point in time as the sink's clock reads it. Refused: a bool (``True`` read as
        1970), a number that is not finite (NaN let every older message through), a
        datetime without a time zone (``datetime.utcnow()`` read as local time moves it by
        hours) and text."""
        if value is None or isinstance(value, Checkpoint):
            return value
        if isinstance(value, datetime):
            if value.utcoffset() is None:
                msg = (
                    "a datetime without a time zone is ambiguous; pass an aware one, "
                    "such as datetime.now(timezone.utc)"
                )
                raise ValueError(msg)
            return value
        if isinstance(value, numbers.Real | decimal.Decimal) and not isinstance(value, bool):
            try:
                seconds = float(value)
                utc(seconds)
            except (OverflowError, OSError, ValueError):  # NaN, infinities, past year 9999
                msg = "a POSIX timestamp is a finite number of seconds within years 1..9999"
                raise ValueError(msg) from None
            return seconds
        msg = f"a {type(value).__name__} is no point in time"
        raise ValueError(msg)

    @field_validator("subject_regex", "body_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        problem = None if value is None else _regex_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("subject", "subject_contains")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and ("\r" in value or "\n" in value):
            raise ValueError(ONE_LINE_SUBJECT)
        return value

    @field_validator("sender")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        """An address alone: a display name or angle brackets could never match (the
        address is compared), and a wait with one would only ever time out."""
        if value is not None and (
            value.count("@") != 1 or any(c in value for c in '<>"') or value.split() != [value]
        ):
            msg = (
                "an address alone, such as 'noreply@app.example.test': no display name, "
                "angle brackets or spaces (the address is what is compared)"
            )
            raise ValueError(msg)
        return value

    @field_validator("tag")
    @classmethod
    def _a_tag(cls, value: str | None) -> str | None:
        """Lower case and NFC, as the sink keeps a tag; a tag no address could carry is refused,
        since a wait with it could only ever time out."""
        problem = None if value is None else tag_problem(value, empty=True)
        if problem is not None:
            raise ValueError(problem)
        return None if value is None else fold_tag(value)

    @field_validator("header")
    @classmethod
    def _header_name(cls, value: tuple[str, str] | None) -> tuple[str, str] | None:
        if value is not None and not re.fullmatch(r"[!-9;-~]{1,76}", value[0]):
            msg = "a header name is printable ASCII without ':', spaces or line breaks"
            raise ValueError(msg)
        if value is not None and ("\r" in value[1] or "\n" in value[1]):
            msg = "a header value has no line breaks: headers are compared unfolded"
            raise ValueError(msg)
        return value

    def __repr__(self) -> str:
        """Masked as errors show it: a traceback may print the selector a test waited with."""
        from pytest_mailbox.message import mask_copied  # noqa: PLC0415

        return f"Selector({self.describe(mask_copied)})"

    def describe(self, mask: Callable[[str], str] | None = None) -> str:
        """``subject_contains='Verify', sender='a@b'``: the fields that were given.

        ``mask`` hides what a test may have copied from a message (a code it looks for);
        ``received_after`` is a point in time, shown as one and never masked.
        """
        parts = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "received_after":
                parts.append(f"received_after={_instant(value)}")
            elif mask is None:
                parts.append(f"{name}={value!r}")
            else:  # a text masked as written too: repr() writes a tab as "\t", a code's joiner
                shown = mask(value) if isinstance(value, str) else value
                parts.append(mask(f"{name}={shown!r}"))
        return ", ".join(parts) or "any message"


def tag_problem(tag: object, *, empty: bool = False) -> str | None:
    """Why ``tag`` cannot be the plus-tag of an address (``alias+tag@domain``), or None.

    Beyond ASCII, any printable character but a space, as RFC 6531 allows in a local part:
    the sink takes ``alias+тег@domain`` under SMTPUTF8 and routes it to the alias.
    """
    if (
        isinstance(tag, str)
        and (tag or empty)
        and len(tag.encode("utf-8", "surrogatepass")) <= 64
        and all(c in _ATEXT or (c >= "\x80" and c.isprintable() and not c.isspace()) for c in tag)
    ):
        return None
    size = "64" if not isinstance(tag, str) or tag.isascii() else "64 octets of UTF-8:"
    return (
        f"a plus-tag is up to {size} letters, digits or any of !#$%&'*+/=?^_`{{|}}~.- "
        "(no '@', spaces or quotes)" + ("; '' for mail to the alias alone" if empty else "")
    )


def address_tag_problem(tag: object) -> str | None:
    """Why ``tag`` cannot be the plus-tag of a new address (``Mailbox.tagged``), or None:
    as ``tag_problem``, and neither empty nor ending in '.' or holding '..' (no address
    would, before its '@'). The local part's length is the alias's to check."""
    problem = tag_problem(tag)
    if problem is None and isinstance(tag, str) and (tag.endswith(".") or ".." in tag):
        problem = "a plus-tag that does not end in '.' or hold '..' (no address would)"
    return problem


#: What an address's local part may hold in ASCII, beside letters and digits (RFC 5322 atext).
_ATEXT = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+/=?^_`{|}~.-"
)


def _instant(value: Checkpoint | datetime | float) -> str:
    """``received_after`` as a reader compares it: ``2026-12-03T16:30:00.500000+00:00``."""
    if isinstance(value, Checkpoint):
        return f"checkpoint(seq={value.seq}, at={utc(value.at).isoformat()})"
    if isinstance(value, datetime):
        return value.isoformat()
    try:
        return f"{value!r} ({utc(value).isoformat()})"
    except (OverflowError, OSError, ValueError):  # no date: nan, or past year 9999
        return repr(value)


_REPEATS = (_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT)


#: Seconds one search of a pattern on one text may take. The static check below cannot
#: see polynomial backtracking (``<td.*>.*Code.*:.*(\d{6})`` takes two minutes on 29 KB
#: of table cells), and Python's ``re`` cannot be stopped, so patterns run on ``regex``.
SEARCH_LIMIT = 1.0


class SlowSearch(Exception):
    """A pattern's search on one text ran past ``SEARCH_LIMIT`` and was stopped."""


#: What ``locale.getpreferredencoding()`` warns under ``PYTHONWARNDEFAULTENCODING=1``.
_PREFERRED_ENCODING_WARNING = (
    "UTF-8 Mode affects locale.getpreferredencoding(). Consider locale.getencoding() instead."
)
_quiet = threading.local()  # ``on``: this thread is in one of the plugin's searches
_regex_imported = threading.Lock()


def _preferred_encoding(do_setlocale: bool = True) -> str:
    """``locale.getpreferredencoding`` as ``regex`` sees it (it asks for each new pattern,
    one at its import): without its ``EncodingWarning`` in the plugin's own searches, and
    as locale's own (the same warning, from the same frame, and answer) elsewhere."""
    if sys.version_info < (3, 11):  # installed on 3.11 and later only (3.10 never warns)
        return _locale_preferred_encoding(do_setlocale)
    if not getattr(_quiet, "on", False):
        warnings.warn(_PREFERRED_ENCODING_WARNING, EncodingWarning, stacklevel=2)
    if sys.flags.utf8_mode:
        return "utf-8"
    if not do_setlocale:
        return locale.getencoding()
    before = locale.setlocale(locale.LC_CTYPE)  # as locale's: regex 2023 asks with True
    try:
        with contextlib.suppress(locale.Error):
            locale.setlocale(locale.LC_CTYPE, "")
        return locale.getencoding()
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


_locale_preferred_encoding = locale.getpreferredencoding


def _regex() -> Any:
    """The ``regex`` package (27 ms to import: paid by the first search, not every
    start-up). Under ``PYTHONWARNDEFAULTENCODING=1`` it asks the locale's encoding with
    ``locale.getpreferredencoding()``, which then warns: it is given
    ``_preferred_encoding`` instead, which does not warn in the plugin's searches (an
    error under ``-W error`` in the test that searched). The warnings filters, the
    process's and every thread's (the sink's, an agent's call, the test's), are left as
    they are: ``warnings.catch_warnings`` would reset another thread's changes to them."""
    global _regex_module  # noqa: PLW0603 - once per process
    if _regex_module is not None:
        return _regex_module
    with _regex_imported:
        if sys.flags.warn_default_encoding and sys.version_info >= (3, 11):
            if "regex" not in sys.modules:  # it binds locale's function, and asks it once
                locale.getpreferredencoding = _preferred_encoding
                try:
                    import regex  # noqa: PLC0415
                finally:
                    locale.getpreferredencoding = _locale_preferred_encoding
            for name, module in list(sys.modules.items()):  # imported before the plugin
                asks = getattr(module, "_getpreferredencoding", None)
                if name.startswith("regex.") and asks is _locale_preferred_encoding:
                    module._getpreferredencoding = _preferred_encoding
        import regex  # noqa: PLC0415

        _regex_module = regex
        return regex


_regex_module: Any = None


@contextlib.contextmanager
def _regex_quietly() -> Iterator[Any]:
    """The ``regex`` package, in a block whose patterns compile without the
    ``EncodingWarning`` of ``PYTHONWARNDEFAULTENCODING=1`` (see ``_regex``): the warning is
    the dependency's, not the test's. This thread's only; a test's own default encoding
    still warns."""
    before = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield _regex()
    finally:
        _quiet.on = before


def regex_finditer(pattern: str, text: str) -> list[Any]:
    """The matches of ``pattern`` (valid, checked by ``_regex_problem``) in ``text``:
    ``re``'s semantics, stopped after ``SEARCH_LIMIT`` seconds (``SlowSearch``)."""
    try:
        with _regex_quietly() as regex:
            return list(regex.finditer(pattern, text, timeout=SEARCH_LIMIT))
    except TimeoutError:
        raise SlowSearch(pattern) from None


def regex_search(pattern: str, text: str) -> bool:
    """``re.search(pattern, text)`` found something; stopped after ``SEARCH_LIMIT`` s."""
    try:
        with _regex_quietly() as regex:
            return regex.search(pattern, text, timeout=SEARCH_LIMIT) is not None
    except TimeoutError:
        raise SlowSearch(pattern) from None


def slow_search_text(what: str, pattern: str, size: int) -> str:
    """Why a search was stopped, and what to do instead."""
    return (
        f"{what}={pattern} took more than {SEARCH_LIMIT:g}s on a text of {size:,} "
        "characters and was stopped: the pattern backtracks on it, typically through "
        "several .* or \\w+ in a row that can each take the same characters. Make each "
        "part stop where the next begins ([^>]* instead of .*), anchor it, or use "
        "subject_contains / body_contains"
    )


@functools.lru_cache(maxsize=256)
def _regex_problem(value: str) -> str | None:
    """Why a selector pattern is refused, or None; once per pattern (a test may wait with
    the same one many times)."""
    posix = _posix_class_in_set(value)  # first: re warns of it, an error under -W error
    if posix is not None:
        return (
            f"{posix} inside a set is read apart: as a POSIX class by the regex package the "
            "searches run on, as the characters [, :, … by Python's re; write the class out "
            "(\\d, [a-zA-Z]) or escape the bracket (\\[)"
        )
    try:
        re.compile(value)
        with _regex_quietly() as regex:  # the searches run on it
            regex.compile(value)
    except Exception as exc:  # re.error, regex.error, OverflowError, RecursionError
        return f"not a valid regular expression ({exc})"
    parsed = _sre_parse.parse(value)
    try:
        return _backtracking(parsed)
    except RecursionError:
        return "the pattern nests groups too deep to be checked; flatten it"


_POSIX = re.compile(r"\[([:=.])\^?\w+\1\]")


def _posix_class_in_set(value: str) -> str | None:
    """The first ``[:name:]`` (``[=x=]``, ``[.x.]``) inside a character set of ``value``."""
    i, in_set = 0, False
    while i < len(value):
        char = value[i]
        if char == "\\":
            i += 2
            continue
        if not in_set and char == "[":
            in_set = True
            i += 1
            if value[i : i + 1] == "^":
                i += 1
            if value[i : i + 1] == "]":  # a leading ] is a character of the set
                i += 1
            continue
        if in_set and char == "[" and (found := _POSIX.match(value, i)):
            return found.group()
        if in_set and char == "]":
            in_set = False
        i += 1
    return None


def _backtracking(parsed: Any) -> str | None:
    if _nested_repeat(parsed):
        return (
            "the pattern repeats a group that itself repeats a variable number of "
            "times, as in (a+)+ or (\\w+\\s?)*, which can backtrack for hours on a "
            "long message; rewrite it without the nesting, or use subject_contains "
            "/ body_contains"
        )
    rounds = _Rounds(parsed)
    if rounds.ambiguous(parsed):
        return (
            "the pattern repeats a group that can read a text in more than one way, round "
            "after round, as in (a|aa)+, (aa?)+ or (\\s*\\n)+, so a failing search tries "
            "exponentially many ways and can run for hours; make each part end where what "
            "follows cannot begin (as in (\\w+\\.)+), or use subject_contains / body_contains"
        )
    if rounds.ways(parsed) > _FEW_WAYS:
        return (
            "the pattern has parts that can read a text in more than one way, and together "
            "they can read one in more than 65,536 ways, as (?:\\s|\\s\\s){8} four times "
            "in a row or twenty \\s? in a row do, so a failing search tries them all and can "
            "run for hours; make each part end where what follows cannot begin, or use "
            "subject_contains / body_contains"
        )
    return None


def _nested_repeat(pattern: Any) -> bool:
    """True if a repeated group can be matched by a variable repeat inside it alone.

    That is the shape of catastrophic backtracking (``(a+)+``, ``(\\w+\\s?)*``, ``(a*)*``):
    a failing search tries every way to split the text between the two repeats. A group
    with a required part of its own (``(\\w+\\.)+``) splits one way only and is allowed;
    possessive repeats and atomic groups never backtrack and are left alone.
    """
    for op, av in pattern:
        if op in _REPEATS:
            high, body = av[1], av[2]
            if high > 1 and _dominated(body, unbounded=high == _sre_constants.MAXREPEAT):
                return True
            children = [body]
        else:
            children = _children(op, av)
        if any(_nested_repeat(child) for child in children):
            return True
    return False


def _dominated(body: Any, *, unbounded: bool) -> bool:
    """True if one variable repeat in ``body`` can match while everything else is empty."""
    items = list(body)
    required = [
        i for i, item in enumerate(items) if _sre_parse.SubPattern(body.state, [item]).getwidth()[0]
    ]
    for i, (op, av) in enumerate(items):
        if any(j != i for j in required):
            continue
        if op in _REPEATS:
            low, high = av[0], av[1]
            if low != high and (unbounded or high == _sre_constants.MAXREPEAT):
                return True
        elif op is _ATOMIC:
            # Once matched, never given back: a round cannot be split again (``(?>a+)+``);
            # what it holds is checked by _nested_repeat on its own.
            continue
        elif any(_dominated(child, unbounded=unbounded) for child in _children(op, av)):
            return True
    return False


#: Python 3.11+: ``a++`` and ``(?>...)`` never backtrack into what they matched.
_POSSESSIVE = getattr(_sre_constants, "POSSESSIVE_REPEAT", object())
_ATOMIC = getattr(_sre_constants, "ATOMIC_GROUP", object())
_ATOMS = (
    _sre_constants.LITERAL,
    _sre_constants.NOT_LITERAL,
    _sre_constants.ANY,
    _sre_constants.IN,
)
_ZERO_WIDTH = (_sre_constants.AT, _sre_constants.ASSERT, _sre_constants.ASSERT_NOT)
_ENDS = (_sre_constants.AT_END, _sre_constants.AT_END_LINE, _sre_constants.AT_END_STRING)
#: A bounded repeat that can split a text in at most this many ways is left alone: its
#: rounds, all enclosing bounds multiplied, and the places each round may end. So is a
#: pattern whose parts, multiplied, read a text in at most this many ways (``ways``).
_FEW_WAYS = 2**16
#: Past this, ``base ** times`` would overflow a float: counted as no bound.
_LOG_MAX = 700.0
#: Characters sets are tried on, besides ASCII and the pattern's own characters and range
#: ends: one of each kind a category or a negated class may reach outside ASCII.
_SAMPLES = "\u00a0\u00e9\u00df\u0663\u2028\u4e2d\uff11"
#: A fixed repeat is spelled out this far when alternatives are compared.
_SPELLED_OUT = 64


class _Rounds:
    """Can a repeated group read a text in more than one way, round after round?

    Then a failing search tries every reading, exponentially many: ``(a|aa)+``,
    ``(aa?)+``, ``(a?a)+``, ``(\\s*\\n)+``, none of which nests a repeat in another (what
    ``_nested_repeat`` looks for). Within a round, and from one round to the next, each
    part is held against what follows it: if what may continue a part past a point where
    it could stop may also begin what follows (``a?`` then ``a``; a round's end and the
    next round's start), or if two alternatives may take the same text or one may be the
    start of the other with its rest beginning what follows (``(b|ba|a)``), the text
    splits more than one way. Character sets are compared on a sample (ASCII, the
    pattern's own characters, range ends, a few others): an overlap only outside it is
    missed.
    """

    def __init__(self, pattern: Any) -> None:
        self.state = pattern.state
        chars = {chr(c) for c in range(128)} | set(_SAMPLES)
        for code in _codes(pattern):
            char = chr(code)
            chars |= {char, char.lower(), char.upper()}
        self.universe = "".join(sorted(c for c in chars if len(c) == 1))
        self.any = frozenset(self.universe)
        self._sets: dict[tuple[Any, int], frozenset[str]] = {}
        # Per part, by id; the part is kept with its answer so that its id stays its own.
        self._firsts: dict[tuple[int, int], tuple[Any, frozenset[str]]] = {}
        self._tails: dict[tuple[int, int], tuple[Any, frozenset[str]]] = {}
        self._widths: dict[int, tuple[Any, bool]] = {}

    def ambiguous(self, pattern: Any) -> bool:
        return self._scan(pattern, self.state.flags, 1)

    def _scan(self, items: Any, flags: int, rounds: int | None) -> bool:
        """``rounds``: how often the enclosing repeats may run ``items`` (None: unbounded)."""
        for op, av in items:
            if op in _REPEATS:
                high, body = av[1], av[2]
                unbounded = rounds is None or high == _sre_constants.MAXREPEAT
                many = None if unbounded else rounds * high
                # Few rounds, each ending in few places, split a text in few ways, however
                # they overlap: (\d{1,3},?){1,4} at most 6**4. ([\w-]{1,30} ?){1,8} does not.
                if (
                    high > 1
                    and (many is None or _power(self._ends(body), many) > _FEW_WAYS)
                    and self._splits(body, flags)
                ):
                    return True
                if self._scan(body, flags, many):
                    return True
            elif op is _POSSESSIVE or op is _ATOMIC:
                # Its rounds never give back; what it holds backtracks while it is tried.
                if self._scan(av[2] if op is _POSSESSIVE else av, flags, 1):
                    return True
            elif op is _sre_constants.SUBPATTERN:
                if self._scan(av[3], _scoped(flags, av), rounds):
                    return True
            elif any(self._scan(child, flags, rounds) for child in _children(op, av)):
                return True
        return False

    def _ends(self, items: Any) -> float:
        """In how many places a match of ``items`` may end, at most (inf: no bound)."""
        ends = 1.0
        for op, av in items:
            if op in _REPEATS:
                if av[1] == _sre_constants.MAXREPEAT:
                    return math.inf
                ends *= (av[1] - av[0] + 1) * _power(self._ends(av[2]), av[1])
            elif op is _sre_constants.SUBPATTERN:
                ends *= self._ends(av[3])
            elif op is _sre_constants.BRANCH:
                widths = {self._width(list(branch)) for branch in av[1]}
                ends *= len(widths) * max(self._ends(branch) for branch in av[1])
            elif op is _sre_constants.GROUPREF:
                return math.inf
        return min(ends, math.inf)

    def _splits(self, body: Any, flags: int) -> bool:
        """A round of ``body`` may be read two ways, with the next round after it."""
        return self._empty_twice(body) or self._junctions(body, self._first(body, flags), flags)

    def _empty_twice(self, items: Any) -> bool:
        """A repeat or option that may match nothing by taking something that matches
        nothing (``(?:\\d?)?``, ``(?=a)*``): two ways to take no text, in every round."""
        for op, av in items:
            if op in _REPEATS and av[1] and not self._width(list(av[2]))[0]:
                return True
            inner = [av[2]] if op in _REPEATS else []
            if op is _sre_constants.SUBPATTERN or op is _sre_constants.BRANCH:
                inner = _children(op, av)
            if any(self._empty_twice(child) for child in inner):
                return True
        return False

    def _junctions(self, items: Any, after: frozenset[str], flags: int) -> bool:
        """Some part of ``items``, followed by what begins with ``after``, may stop early
        where its continuation could begin what follows it."""
        items = list(items)
        for item, follows in zip(items, self._following(items, after, flags), strict=True):
            if self._tail_of(item, flags) & follows:
                return True
            op, av = item
            if op is _sre_constants.SUBPATTERN:
                inner = [(av[3], _scoped(flags, av), follows)]
            elif op is _sre_constants.BRANCH:
                inner = [(branch, flags, follows) for branch in av[1]]
            elif op in _REPEATS:
                again = self._first(av[2], flags) if av[1] > 1 else frozenset()
                inner = [(av[2], flags, follows | again)]
            else:  # an atom; an atomic group or a possessive repeat never gives back
                inner = []
            if any(self._junctions(child, then, scoped) for child, scoped, then in inner):
                return True
        return False

    def _following(
        self, items: list[Any], after: frozenset[str], flags: int
    ) -> list[frozenset[str]]:
        """What may follow each part of ``items``, followed by what begins with ``after``;
        from the right, linear in the parts, not quadratic."""
        following = [after] * len(items)
        for i in range(len(items) - 1, 0, -1):
            first = self._first_of(items[i], flags)
            following[i - 1] = first if self._wide(items[i]) else first | following[i]
        for i in range(len(items) - 1):
            op, av = items[i + 1]
            if op is _sre_constants.AT and av in _ENDS:
                following[i] &= {"\n"}  # past a "$", only its line break may come
        return following

    def ways(self, pattern: Any) -> float:
        """How many readings a search from one place may have to try, at most (inf: past
        ``_FEW_WAYS``, or no bound).

        A part that cannot stop early where what follows it can begin has one reading
        that goes on (the others fail at the next character). One that can, as ``\\s?``
        before ``\\s`` or a round of ``(?:\\s|\\s\\s){8}`` before the next, has as many
        as its rounds' readings multiplied, its alternatives' that may begin alike added,
        or its counts of rounds. Parts in a row multiply, whatever lies between them: one
        ``(?:\\s|\\s\\s){8}`` reads a text in up to 256 ways, four in a row in 2**32
        (1.2 s on 34 spaces), two ``(?:\\d{1,3},?){1,4}`` in 81 * 81 (a few ms). A
        lookaround, an atomic group or a possessive repeat counts as a search of its own,
        made wherever it is reached. How often an unbounded repeat runs is left out: that
        grows with the text, not exponentially (``_nested_repeat`` and ``_scan`` refuse
        the unbounded repeats that do more).
        """
        return self._ways(pattern, frozenset(), self.state.flags)

    def _ways(self, items: Any, after: frozenset[str], flags: int) -> float:
        items = list(getattr(items, "data", items))  # a SubPattern's own list: quicker
        if _plain(items):
            return 1.0
        ways = 1.0
        for item, follows in zip(items, self._following(items, after, flags), strict=True):
            if item[0] in _ATOMS:
                continue
            ways *= self._ways_of(item, follows, flags)
            if ways > _FEW_WAYS:
                return math.inf  # too many already: no count that uses it can shrink
        return ways

    def _ways_of(self, item: Any, follows: frozenset[str], flags: int) -> float:
        op, av = item
        if op in _REPEATS:
            low, high, body = av
            each = 1.0
            if not _plain(body.data):  # one round, followed by what follows it or another
                again = self._first_of(item, flags) if high > 1 else frozenset()
                each = self._ways(body, follows | again, flags)
            if high == _sre_constants.MAXREPEAT:
                return each
            if each == 1 and (
                low == high
                or (
                    self._tail_of(item, flags).isdisjoint(follows)
                    and any(self._wide(part) for part in body)
                )
            ):
                return 1.0  # each round one way, and only one count of rounds reads on
            # Its count of rounds, if each reads one way; else each round's readings.
            return float(high - low + 1) if each == 1 else _power(each, high)
        if op is _sre_constants.SUBPATTERN:
            return self._ways(av[3], follows, _scoped(flags, av))
        if op is _sre_constants.BRANCH:
            return self._branch_ways(item, follows, flags)
        if op is _sre_constants.GROUPREF_EXISTS:
            return sum(self._ways(child, follows, flags) for child in _children(op, av))
        # Tried anew wherever the search gets to them, each time as a search of its own.
        if op is _POSSESSIVE:
            return self._ways(av[2], frozenset(), flags)
        if op is _ATOMIC:
            return self._ways(av, frozenset(), flags)
        if op is _sre_constants.ASSERT or op is _sre_constants.ASSERT_NOT:
            return self._ways(av[1], frozenset(), flags)
        return 1.0  # an atom, an anchor, a backreference: one way

    def _branch_ways(self, item: Any, follows: frozenset[str], flags: int) -> float:
        """Alternatives that may stop or part where what follows can begin all count, as
        many as may begin with the same character; otherwise only one of them reads on.
        Past ``_SPELLED_OUT`` alternatives they all count: the finer tests cost more."""
        branches = item[1][1]
        each = [self._ways(branch, follows, flags) for branch in branches]
        if not follows:
            return max(each)  # nothing follows: the first reading to get here ends it
        if len(branches) > _SPELLED_OUT:
            return sum(each)
        if self._tail_of(item, flags).isdisjoint(follows):
            return max(each)
        empty = 0.0
        by_char: dict[str, float] = {}
        for branch, ways in zip(branches, each, strict=True):
            if not self._width(list(branch))[0]:
                empty += ways
                continue
            for char in self._first(branch, flags):
                by_char[char] = by_char.get(char, 0.0) + ways
        return empty + max(by_char.values(), default=0.0)

    def _first(self, items: Any, flags: int) -> frozenset[str]:
        """What a match of ``items`` may begin with."""
        found: set[str] = set()
        for item in items:
            found |= self._first_of(item, flags)
            if self._wide(item):
                break
        return frozenset(found)

    def _tail(self, items: Any, flags: int) -> frozenset[str]:
        """What may continue a match of ``items`` past a point where a shorter one ends."""
        found: set[str] = set()
        for item in reversed(list(items)):
            found |= self._tail_of(item, flags)
            if self._wide(item):
                break
            found |= self._first_of(item, flags)  # it may be left out, or taken
        return frozenset(found)

    def _first_of(self, item: Any, flags: int) -> frozenset[str]:
        key = (id(item), flags)
        if key not in self._firsts:
            self._firsts[key] = (item, self._find_first(item, flags))
        return self._firsts[key][1]

    def _find_first(self, item: Any, flags: int) -> frozenset[str]:
        op, av = item
        if op in _ATOMS:
            return self._chars(item, flags)
        if op in _REPEATS or op is _POSSESSIVE:
            return self._first(av[2], flags) if av[1] else frozenset()
        if op is _ATOMIC:
            return self._first(av, flags)
        if op is _sre_constants.SUBPATTERN:
            return self._first(av[3], _scoped(flags, av))
        if op in _ZERO_WIDTH:
            return frozenset()
        if op is _sre_constants.BRANCH or op is _sre_constants.GROUPREF_EXISTS:
            return frozenset().union(*(self._first(c, flags) for c in _children(op, av)))
        return self.any  # a backreference, or what this check does not know

    def _tail_of(self, item: Any, flags: int) -> frozenset[str]:
        key = (id(item), flags)
        if key not in self._tails:
            self._tails[key] = (item, self._find_tail(item, flags))
        return self._tails[key][1]

    def _find_tail(self, item: Any, flags: int) -> frozenset[str]:
        op, av = item
        if op in _ATOMS or op in _ZERO_WIDTH or op is _POSSESSIVE or op is _ATOMIC:
            return frozenset()  # a possessive repeat or an atomic group never gives back
        if op in _REPEATS:
            low, high, body = av
            more = self._first_of(item, flags) if low != high else frozenset()
            return more | self._tail(body, flags)
        if op is _sre_constants.SUBPATTERN:
            return self._tail(av[3], _scoped(flags, av))
        if op is _sre_constants.BRANCH:
            return self._branch_tail(av[1], flags)
        return self.any  # a backreference, a conditional, or what this check does not know

    def _branch_tail(self, branches: list[Any], flags: int) -> frozenset[str]:
        """The alternatives' own tails, and what continues one alternative past another
        that may be its start; everything if two may be equal, or cannot be told apart."""
        found = set().union(*(self._tail(branch, flags) for branch in branches))
        lines = [self._line(branch, flags) for branch in branches]
        starts = [
            self._first(branch, flags) if self._width(list(branch))[0] else None
            for branch in branches
        ]
        for i, (one, whole_one) in enumerate(lines):
            for j, (other, whole_other) in enumerate(lines[i + 1 :], start=i + 1):
                first_one, first_other = starts[i], starts[j]
                if (
                    first_one is not None
                    and first_other is not None
                    and not first_one & first_other
                ):
                    continue  # (?:\r?\n|<br>): they begin apart, and neither is empty
                common = min(len(one), len(other))
                if any(not one[k] & other[k] for k in range(common)):
                    continue  # they differ somewhere: neither starts the other
                shorter, longer = (one, other) if len(one) < len(other) else (other, one)
                whole_shorter = whole_one if shorter is one else whole_other
                if len(one) == len(other) or not whole_shorter:
                    return self.any
                found |= longer[common]
        return frozenset(found)

    def _line(self, items: Any, flags: int) -> tuple[list[frozenset[str]], bool]:
        """The character sets of ``items``, position by position, as far as they are fixed;
        and whether that is all of it."""
        line: list[frozenset[str]] = []
        for op, av in items:
            if op in _ATOMS:
                line.append(self._chars((op, av), flags))
            elif op in _ZERO_WIDTH:
                continue
            elif op is _POSSESSIVE or op is _ATOMIC:  # one way only: its first characters
                if self._width([(op, av)])[0]:
                    line.append(self._first_of((op, av), flags))
                return line, False
            elif op is _sre_constants.SUBPATTERN or op in _REPEATS:
                body, scoped = (av[2], flags) if op in _REPEATS else (av[3], _scoped(flags, av))
                part, whole = self._line(body, scoped)
                times = 1 if op is _sre_constants.SUBPATTERN else av[0]
                if len(part) * times > _SPELLED_OUT:
                    return line, False
                line.extend(part * times)
                if not whole or (op in _REPEATS and av[0] != av[1]):
                    return line, False
            else:
                return line, False
        return line, True

    def _wide(self, item: Any) -> bool:
        """A match of ``item`` takes at least one character."""
        if item[0] in _ATOMS:
            return True
        if id(item) not in self._widths:
            self._widths[id(item)] = (item, bool(self._width([item])[0]))
        return self._widths[id(item)][1]

    def _width(self, items: list[Any]) -> tuple[int, int]:
        width: tuple[int, int] = _sre_parse.SubPattern(self.state, items).getwidth()
        return width

    def _chars(self, item: Any, flags: int) -> frozenset[str]:
        # A character's own item is its key; a set's (a list inside) is spelled out.
        key = (item if item[0] is not _sre_constants.IN else repr(item), flags)
        if key not in self._sets:
            compiled = _sre_compile(_sre_parse.SubPattern(self.state, [item]), flags)
            self._sets[key] = frozenset(c for c in self.universe if compiled.match(c))
        return self._sets[key]


def _power(base: float, times: int) -> float:
    """``base ** times``, or inf where a float would overflow."""
    if base <= 1:
        return base
    return math.inf if times * math.log(base) > _LOG_MAX else float(base**times)


def _plain(items: list[Any]) -> bool:
    """Characters and anchors only: they read a text one way."""
    return all(op in _ATOMS or op is _sre_constants.AT for op, _ in items)


def _scoped(flags: int, av: Any) -> int:
    """The flags inside a group: ``(?i:...)`` adds, ``(?-i:...)`` removes."""
    return int((flags | av[1]) & ~av[2])


def _codes(pattern: Any) -> Any:
    """Every code point a parsed pattern names: literals and range ends (and middles)."""
    for op, av in pattern:
        if op in (_sre_constants.LITERAL, _sre_constants.NOT_LITERAL):
            yield av
        elif op is _sre_constants.IN:
            yield from _codes(av)
        elif op in (_sre_constants.RANGE, getattr(_sre_constants, "RANGE_UNI_IGNORE", None)):
            yield from (av[0], av[1], (av[0] + av[1]) // 2)
        elif op in _REPEATS or op is _POSSESSIVE:
            yield from _codes(av[2])
        else:
            for child in _children(op, av):
                yield from _codes(child)


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of a group, an alternation, a lookaround or a conditional."""
    if op is _sre_constants.SUBPATTERN:
        return [av[-1]]
    if op is _sre_constants.BRANCH:
        return list(av[1])
    if op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
        return [av[1]]
    if op is _sre_constants.GROUPREF_EXISTS:
        return [branch for branch in av[1:] if branch is not None]
    if op is _ATOMIC:
        return [av]
    if op is _POSSESSIVE:
        return [av[2]]
    return []


class SecretDigest(BaseModel):
    """An extracted link or code, recorded without its value."""

    kind: Literal["link", "code"]
    sha256: str
    last2: str
    host: str | None = None


class MessageReceipt(BaseModel):
    """One message as the run saw it."""

    message_id: str
    received_at: datetime
    subject: str
    #: The envelope recipient's plus-tag (``friend`` for ``alias+friend@domain``, masked as
    #: an address's tag is when it looks like a token); None for mail to the alias alone.
    tag: str | None = None
    state: str
    fence: int | None = None
    claimed_at: datetime | None = None
    consumed_at: datetime | None = None
    secrets: list[SecretDigest] = Field(default_factory=list)


class ReceiptEvent(BaseModel):
    """One step of the run's timeline."""

    at: datetime
    status: str
    detail: str = ""


class AgentEvidence(BaseModel):
    """One agent tool call: ``proposed → allowed → executed`` (``refused``, ``simulated`` in
    dry-run, ``failed`` if the harness failed), or ``proposed → rejected``; a call that has
    not returned stops at ``allowed``, with status ``unfinished``; one its MCP client
    cancelled ends in ``cancelled`` (a wait it stopped has that status too)."""

    at: datetime
    run_id: str
    mailbox_id: str
    tool_call_id: str
    tool: str
    mode: Literal["live", "dry-run"]
    arguments: dict[str, Any] = Field(default_factory=dict)
    steps: list[str]
    status: str
    reason: str | None = None
    latency_ms: float


class Receipt(BaseModel):
    """The small, secret-free record of one run: reserved, saw, claimed, consumed, closed."""

    version: int = 1
    run_id: str
    testrun_uid: str | None = None
    nodeid: str
    mailbox_id: str
    address: str
    purpose: str
    state: str
    close_reason: str | None = None
    fence: int
    created_at: datetime
    expires_at: datetime
    released_at: datetime | None = None
    messages: list[MessageReceipt] = Field(default_factory=list)
    events: list[ReceiptEvent] = Field(default_factory=list)
    evidence: list[AgentEvidence] | None = None

    def timeline(self) -> str:
        """A readable, secret-free timeline for a failure report."""
        lines = [
            f"mailbox {self.address} ({self.mailbox_id}, run {self.run_id}, "
            f"purpose {self.purpose}): {self.state}"
            + (f", {self.close_reason}" if self.close_reason else "")
        ]
        start = self.created_at
        for event in self.events:
            offset = (event.at - start).total_seconds()
            lines.append(f"  +{offset:8.3f}s  {event.status:<16} {event.detail}".rstrip())
        return "\n".join(lines)


#: What pytest's JUnit XML writes as the text ``#x7F``, ``#xFFFE`` in a property's value:
#: DEL, the characters XML 1.0 forbids that JSON leaves as they are (a subject's), and,
#: before pytest 9.1 (pytest-dev/pytest#14483), every character past U+FFFF (an emoji).
_NOT_IN_JUNIT = re.compile("[\x7f\ud800-\udfff\ufffe\uffff\U00010000-\U0010ffff]")


def _json_escape(found: re.Match[str]) -> str:
    """A character as a JSON escape: past U+FFFF, its UTF-16 surrogate pair."""
    code = ord(found.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def dump_receipt(receipt: Receipt) -> str:
    """Compact JSON for a JUnit property or a JSON Lines file; a character JUnit XML would
    change is a JSON escape (only a string holds one), so both files read back the same."""
    text = receipt.model_dump_json(exclude_none=True)
    return _NOT_IN_JUNIT.sub(_json_escape, text)
