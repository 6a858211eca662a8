"""Typed exceptions: a failure of the contract raises one, carrying its status and result
(``budget_exceeded`` is an agent tool's answer only, never raised)."""

from __future__ import annotations

from typing import Any

from pytest_mailbox.vocabulary import Status

__all__ = [
    "AlreadyClaimed",
    "AlreadyConsumed",
    "AmbiguousMatch",
    "ContractError",
    "ExposedSinkWarning",
    "ExtractionError",
    "FenceMismatch",
    "LeaseExpired",
    "MailboxClosed",
    "MailboxError",
    "StoreError",
    "UnexpectedMessage",
    "WaitTimeout",
]


class MailboxError(Exception):
    """Base class of every pytest-mailbox error; ``status`` and ``result`` say what happened."""

    status: Status = Status.PROVIDER_ERROR

    def __init__(self, message: str, *, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result: dict[str, Any] = {"status": self.status.value, **(result or {})}


class ContractError(MailboxError, ValueError):
    """A contract, selector or option value is invalid; the message names the field."""

    status = Status.POLICY_DENIED


class ExposedSinkWarning(UserWarning):
    """The sink listens on an address that other machines can reach (``mailbox_host``)."""


class ExtractionError(MailboxError, ValueError):
    """A link or code could not be extracted unambiguously from a message."""

    status = Status.AMBIGUOUS


class WaitTimeout(MailboxError, TimeoutError):
    """No message matched before the deadline; the message lists the near misses."""

    status = Status.WAITING


class AmbiguousMatch(MailboxError):
    """Two or more messages matched the selector; none was picked."""

    status = Status.AMBIGUOUS


class UnexpectedMessage(MailboxError, AssertionError):
    """``expect_none`` saw a matching message inside its window."""

    status = Status.POLICY_DENIED


class AlreadyClaimed(MailboxError):
    """The message is held under another live claim."""

    status = Status.ALREADY_CLAIMED


class AlreadyConsumed(MailboxError):
    """The message was acknowledged already; do not act on it twice."""

    status = Status.ALREADY_CONSUMED


class FenceMismatch(MailboxError):
    """The fence token presented is not the current one: a newer holder exists."""

    status = Status.FENCE_MISMATCH


class LeaseExpired(MailboxError):
    """The claim's lease ran out before the operation."""

    status = Status.LEASE_EXPIRED


class MailboxClosed(MailboxError):
    """The mailbox refuses the operation: it is closed (released or expired), re-fenced, or
    the message is not its own; ``status`` says which."""

    status = Status.RELEASED

    def __init__(
        self, message: str, *, status: Status, result: dict[str, Any] | None = None
    ) -> None:
        self.status = status
        super().__init__(message, result=result)


class StoreError(MailboxError):
    """The shared store failed under the call (``provider_error``): it stayed locked for
    its whole ``busy_timeout``, or SQLite refused it (a full disk, an I/O error). The
    ``sqlite3`` error is its ``__cause__``; the call changed nothing."""
