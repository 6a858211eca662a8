"""The contract's words that need no pydantic: statuses, close reasons, defaults, positions.

pytest imports the plugin, so this package, in every run of a project that installs it,
and in the xdist controller, which runs no test. What those processes need (the options'
checks, the report hooks, the store at the end of a run) is here; the pydantic models of
``contract`` are imported only by a process that resolves a contract or builds a receipt.
``contract`` exports all of these names too, but ``digest`` (``message`` does).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timezone

__all__ = [
    "CONTRACT_FIELDS",
    "DEFAULT_LEASE",
    "DEFAULT_TTL",
    "DEFAULT_TTL_MAX",
    "Checkpoint",
    "CloseReason",
    "Status",
    "digest",
    "utc",
]


class Status(str, enum.Enum):
    """One vocabulary for results, exceptions, receipts and agent answers (docs/contract.md)."""

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
#: A mailbox's ttl unless one is given (the settings hold it to ``mailbox_ttl_max``).
DEFAULT_TTL = 300
#: A claim's lease unless one is given; never more than the contract's ttl.
DEFAULT_LEASE = 60.0


@dataclass(frozen=True)
class Checkpoint:
    """A position in the store: messages committed after it have ``seq > self.seq``."""

    seq: int
    at: float


def utc(ts: float) -> datetime:
    """A POSIX timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def digest(value: str, key: bytes) -> tuple[str, str]:
    """(HMAC-SHA256 hex of the UTF-8 value under ``key``, last two characters): how secrets
    appear in receipts. The key is the store's own, random and never in a receipt: without
    it, no one can find a six-digit code by hashing the million candidates."""
    mac = hmac.new(key, value.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return mac.hexdigest(), value[-2:]


def shown(value: object) -> str:
    """``repr(value)`` for an error message, or what it is when Python will not write it:
    an int past 4,300 digits (``sys.set_int_max_str_digits``)."""
    try:
        return repr(value)
    except ValueError:
        return f"<an int of {value.bit_length()} bits>" if isinstance(value, int) else "<?>"
