"""The contract's vocabulary: statuses, the per-test ``EmailContract``, selectors and receipts."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
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
    "max_reads": "an integer >= 1",
    "max_resends": "an integer >= 0",
    "mode": "'live' or 'dry-run'",
    "link_domains": "a list of host names, e.g. ['app.example.test']",
    "run_header": "a header name such as 'X-Run-Id'",
}


class EmailContract(BaseModel):
    """The per-test rules: ini defaults overlaid by ``@pytest.mark.email_contract(...)``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    purpose: str = Field(default="mail", pattern=_PURPOSE)
    ttl: int = Field(default=300, gt=0)
    lease: float = Field(default=60.0, gt=0)
    timeout: float = Field(default=10.0, gt=0)
    max_reads: int = Field(default=3, ge=1)
    max_resends: int = Field(default=1, ge=0)
    mode: Literal["live", "dry-run"] = "live"
    link_domains: tuple[str, ...] = ()
    run_header: str = Field(default="X-Run-Id", pattern=r"^[A-Za-z0-9-]{1,64}$")

    @field_validator("link_domains")
    @classmethod
    def _lower_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(d.strip().lower().rstrip(".") for d in value if d.strip())

    def check_limits(self, *, ttl_max: int, source: str = "email_contract") -> None:
        """Refuse values that are valid alone but break the configured limits."""
        if self.ttl > ttl_max:
            msg = (
                f"{source}: ttl={self.ttl} exceeds mailbox_ttl_max={ttl_max}; "
                "lower ttl or raise mailbox_ttl_max in pytest.ini"
            )
            raise ValueError(msg)
        if self.lease > self.ttl:
            msg = (
                f"{source}: lease={self.lease:g} exceeds ttl={self.ttl}; "
                "a claim cannot outlive its mailbox, lower lease or raise ttl"
            )
            raise ValueError(msg)


def describe_validation_error(source: str, error: ValidationError, allowed: dict[str, str]) -> str:
    """Turn a pydantic error into one line per field: name, value given, what is allowed."""
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "?"
        top = str(item["loc"][0]) if item["loc"] else ""
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown field {field!r}; allowed fields: {', '.join(allowed)}")
            continue
        hint = allowed.get(top, "")
        lines.append(
            f"{source}: {field}={item.get('input')!r} is invalid: {item['msg']}"
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
            except re.error as exc:
                msg = f"not a valid regular expression ({exc})"
                raise ValueError(msg) from None
        return value

    @field_validator("header")
    @classmethod
    def _header_name(cls, value: tuple[str, str] | None) -> tuple[str, str] | None:
        if value is not None and not re.fullmatch(r"[!-9;-~]{1,76}", value[0]):
            msg = "a header name is printable ASCII without ':', spaces or line breaks"
            raise ValueError(msg)
        return value

    def describe(self) -> str:
        """``subject_contains='Verify', sender='a@b'``: the fields that were given."""
        given = self.model_dump(exclude_none=True)
        return ", ".join(f"{k}={v!r}" for k, v in given.items()) or "any message"


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
