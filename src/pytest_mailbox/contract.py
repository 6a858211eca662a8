"""The contract's vocabulary: statuses, the per-test ``EmailContract``, selectors and receipts."""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_mailbox.endpoint import host_name

if sys.version_info >= (3, 11):
    from re import _constants as _sre_constants
    from re import _parser as _sre_parse
    from re._compiler import compile as _sre_compile
else:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse
    from sre_compile import compile as _sre_compile

__all__ = [
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
]


class Status(str, enum.Enum):
    """One vocabulary for results, exceptions, receipts and agent answers (DESIGN §4)."""

    RESERVED = "reserved"
    WAITING = "waiting"
    CLAIMED = "claimed"
    CONSUMED = "consumed"
    RELEASED = "released"
    EXPIRED = "expired"
    ALREADY_CLAIMED = "already_claimed"
    ALREADY_CONSUMED = "already_consumed"
    AMBIGUOUS = "ambiguous"
    FENCE_MISMATCH = "fence_mismatch"
    LEASE_EXPIRED = "lease_expired"
    BUDGET_EXCEEDED = "budget_exceeded"
    POLICY_DENIED = "policy_denied"
    PROVIDER_ERROR = "provider_error"


class CloseReason(str, enum.Enum):
    """Why a mailbox reservation ended."""

    RELEASED_SUCCESS = "released_success"
    RELEASED_ERROR = "released_error"
    EXPIRED_TIMEOUT = "expired_timeout"


_PURPOSE = r"^[a-z][a-z0-9-]{0,29}$"

#: What each contract field accepts, for error messages and the docs.
CONTRACT_FIELDS: dict[str, str] = {
    "purpose": "lower-case letters, digits and '-', starting with a letter, 1-30 characters",
    "ttl": "whole seconds, 1..mailbox_ttl_max",
    "lease": "seconds > 0, at most ttl",
    "timeout": "seconds > 0",
    "max_reads": "an integer 1..1000",
    "max_resends": "an integer 0..1000",
    "mode": "'live' or 'dry-run'",
    "link_domains": "a list of host names, e.g. ['app.example.test']",
    "run_header": "a header name such as 'X-Run-Id'",
}


#: The longest mailbox ttl, in seconds, unless ``mailbox_ttl_max`` says otherwise.
DEFAULT_TTL_MAX = 3600


class EmailContract(BaseModel):
    """The per-test rules: ini defaults overlaid by ``@pytest.mark.email_contract(...)``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    purpose: str = Field(default="mail", pattern=_PURPOSE)
    ttl: int = Field(default=300, gt=0)
    lease: float = Field(default=60.0, gt=0, allow_inf_nan=False)
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

    def check_limits(
        self,
        *,
        ttl_max: int,
        source: str = "email_contract",
        sources: Mapping[str, str] | None = None,
    ) -> None:
        """Refuse values that are valid alone but break the configured limits.

        ``sources`` names where each value came from, where the settings know it.
        """

        def came(name: str) -> str:
            return f" ({sources[name]})" if sources and name in sources else ""

        if self.ttl > ttl_max:
            msg = (
                f"{source}: ttl={self.ttl}{came('ttl')} exceeds mailbox_ttl_max={ttl_max}"
                f"{came('ttl_max')}; lower ttl or raise mailbox_ttl_max (the ini key, "
                "--mailbox-ttl-max or PYTEST_MAILBOX_TTL_MAX)"
            )
            raise ValueError(msg)
        if self.lease > self.ttl:
            msg = (
                f"{source}: lease={self.lease:g}{came('lease')} exceeds ttl={self.ttl}"
                f"{came('ttl')}; a claim cannot outlive its mailbox, lower lease or raise ttl"
            )
            raise ValueError(msg)


def describe_validation_error(
    source: str,
    error: ValidationError,
    allowed: dict[str, str],
    *,
    sources: Mapping[str, str] | None = None,
) -> str:
    """Turn a pydantic error into one line per field: name, value given, what is allowed.

    ``sources`` names where each field's value came from: ``purpose='x' (ini mailbox_purpose)``.
    """
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "?"
        top = str(item["loc"][0]) if item["loc"] else ""
        came = f" ({sources[top]})" if sources and top in sources else ""
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown field {field!r}; allowed fields: {', '.join(allowed)}")
            continue
        hint = allowed.get(top, "")
        lines.append(
            f"{source}: {field}={item.get('input')!r}{came} is invalid: {item['msg']}"
            + (f" (allowed: {hint})" if hint else "")
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Checkpoint:
    """A position in the store: messages committed after it have ``seq > self.seq``."""

    seq: int
    at: float


SELECTOR_FIELDS: dict[str, str] = {
    "subject": "the exact subject",
    "subject_contains": "text the subject contains",
    "subject_regex": "a regular expression searched in the subject",
    "sender": "an address, compared case-insensitively with From and the envelope sender",
    "header": "a (name, value) pair; the name without ':' or line breaks",
    "body_contains": "text the plain or HTML body contains",
    "body_regex": "a regular expression searched in the body",
    "received_after": "a checkpoint(), a datetime or a POSIX timestamp",
}


class Selector(BaseModel):
    """What a test expects of its message; every given field must match."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    subject: str | None = None
    subject_contains: str | None = None
    subject_regex: str | None = None
    sender: str | None = None
    header: tuple[str, str] | None = None
    body_contains: str | None = None
    body_regex: str | None = None
    received_after: Checkpoint | datetime | float | None = None

    @field_validator("subject_regex", "body_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except Exception as exc:  # re.error, OverflowError, RecursionError
                msg = f"not a valid regular expression ({exc})"
                raise ValueError(msg) from None
            parsed = _sre_parse.parse(value)
            if _nested_repeat(parsed):
                msg = (
                    "the pattern repeats a group that itself repeats a variable number of "
                    "times, as in (a+)+ or (\\w+\\s?)*, which can backtrack for hours on a "
                    "long message; rewrite it without the nesting, or use subject_contains "
                    "/ body_contains"
                )
                raise ValueError(msg)
            if _Overlap(parsed).ambiguous_repeat(parsed):
                msg = (
                    "the pattern repeats a group whose end may also begin its next round, as "
                    "in (a|aa)+ or (ab?)+, so a text splits between the rounds in "
                    "exponentially many ways and a failing search can run for hours; make "
                    "each round end in a part the next cannot begin with (as in (\\w+\\.)+), "
                    "or use subject_contains / body_contains"
                )
                raise ValueError(msg)
        return value

    @field_validator("subject", "subject_contains")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and ("\r" in value or "\n" in value):
            msg = "a subject has no line breaks: folded subjects are compared unfolded"
            raise ValueError(msg)
        return value

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

    def describe(self) -> str:
        """``subject_contains='Verify', sender='a@b'``: the fields that were given."""
        given = self.model_dump(exclude_none=True)
        return ", ".join(f"{k}={v!r}" for k, v in given.items()) or "any message"


_REPEATS = (_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT)


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
        elif any(_dominated(child, unbounded=unbounded) for child in _children(op, av)):
            return True
    return False


#: Python 3.11+: ``a++`` and ``(?>...)`` never backtrack into what they matched.
_POSSESSIVE = getattr(_sre_constants, "POSSESSIVE_REPEAT", object())
_ATOMIC = getattr(_sre_constants, "ATOMIC_GROUP", object())
#: Repeats bounded this low cannot blow up: at most 2**N ways to split a text.
_FEW_ROUNDS = 8
#: Characters a first set is tried on, besides ASCII and the pattern's own literals: one
#: of each kind a category or a negated class may reach outside ASCII.
_SAMPLES = "\u00a0\u00e9\u00df\u0663\u2028\u4e2d\uff11"


class _Overlap:
    """Can a repeated group's round end in a part that may also begin the next round?

    Then the rounds split a text in exponentially many ways (``(a|aa)+``, ``(aa?)+``,
    ``(\\d|\\d\\d)+``), which ``_nested_repeat`` does not see: no repeat nests in another.
    Character sets are compared on a sample of characters (ASCII, the pattern's literals
    and a few others), which errs towards refusing.
    """

    def __init__(self, pattern: Any) -> None:
        self.flags = pattern.state.flags
        self.state = pattern.state
        literals = {chr(av) for op, av in _walk(pattern) if op is _sre_constants.LITERAL}
        self.universe = "".join(sorted({chr(c) for c in range(128)} | literals | set(_SAMPLES)))
        self.any = frozenset(self.universe)

    def ambiguous_repeat(self, pattern: Any) -> bool:
        for op, av in _walk(pattern):
            if op in _REPEATS:
                high, body = av[1], av[2]
                if (high == _sre_constants.MAXREPEAT or high > _FEW_ROUNDS) and (
                    self.first(body) & self.tail(body)
                ):
                    return True
        return False

    def first(self, items: Any) -> frozenset[str]:
        """The characters a match of the sequence ``items`` may begin with."""
        found: set[str] = set()
        for item in items:
            found |= self._first_of(item)
            if self._width(item)[0]:
                break
        return frozenset(found)

    def tail(self, items: Any) -> frozenset[str]:
        """The characters that may continue a match of ``items`` past a point where a
        shorter match of it ends already."""
        found: set[str] = set()
        for item in reversed(list(items)):
            found |= self._tail_of(item)
            if self._width(item)[0]:
                break
            found |= self._first_of(item)  # the item may be skipped, or taken
        return frozenset(found)

    def _first_of(self, item: Any) -> frozenset[str]:
        op, av = item
        if op in (_sre_constants.LITERAL, _sre_constants.NOT_LITERAL, _sre_constants.ANY):
            return self._chars(item)
        if op is _sre_constants.IN:
            return self._chars(item)
        if op in _REPEATS or op is _POSSESSIVE:
            return self.first(av[2]) if av[1] else frozenset()
        if op is _ATOMIC:
            return self.first(av)
        if op is _sre_constants.GROUPREF:
            return self.any
        if op in (_sre_constants.AT, _sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
            return frozenset()
        return frozenset().union(*(self.first(child) for child in _children(op, av)))

    def _tail_of(self, item: Any) -> frozenset[str]:
        op, av = item
        if op in (_POSSESSIVE, _ATOMIC):
            return frozenset()  # never gives back what it took: the next round starts after
        if op in _REPEATS:
            low, high, body = av
            extra = self.first(body) if low != high and high else frozenset()
            return extra | self.tail(body)
        if op is _sre_constants.BRANCH:
            starts = [self.first(branch) for branch in av[1]]
            empty = [branch for branch in av[1] if not self._width(branch)[0]]
            if len(empty) > 1 or any(a & b for i, a in enumerate(starts) for b in starts[i + 1 :]):
                return self.any  # (b|ba), (a|a): two alternatives may take the same text
            return frozenset().union(*(self.tail(branch) for branch in av[1]))
        if op is _sre_constants.GROUPREF:
            return self.any
        return frozenset().union(*(self.tail(child) for child in _children(op, av)))

    def _width(self, item: Any) -> tuple[int, int]:
        if not isinstance(item, _sre_parse.SubPattern):
            item = _sre_parse.SubPattern(self.state, [item])
        width: tuple[int, int] = item.getwidth()
        return width

    def _chars(self, item: Any) -> frozenset[str]:
        compiled = _sre_compile(_sre_parse.SubPattern(self.state, [item]), self.flags)
        return frozenset(c for c in self.universe if compiled.match(c))


def _walk(pattern: Any) -> Any:
    """Every item of a parsed pattern, at every depth."""
    for op, av in pattern:
        yield op, av
        children = [av[2]] if op in _REPEATS else _children(op, av)
        for child in children:
            yield from _walk(child)


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
    return []


def utc(ts: float) -> datetime:
    """A POSIX timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=timezone.utc)


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
    """One agent tool call: ``proposed → allowed → executed`` (or ``refused``), or ``rejected``."""

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


def dump_receipt(receipt: Receipt) -> str:
    """Compact JSON for a JUnit property or a JSON Lines file."""
    return receipt.model_dump_json(exclude_none=True)
