"""pytest-mailbox: a real, isolated SMTP mailbox for every test."""

from __future__ import annotations

from pytest_mailbox.contract import (
    Checkpoint,
    CloseReason,
    EmailContract,
    Receipt,
    Selector,
    Status,
)
from pytest_mailbox.errors import (
    AlreadyClaimed,
    AlreadyConsumed,
    AmbiguousMatch,
    ContractError,
    ExposedSinkWarning,
    ExtractionError,
    FenceMismatch,
    LeaseExpired,
    MailboxClosed,
    MailboxError,
    UnexpectedMessage,
    WaitTimeout,
)
from pytest_mailbox.mailbox import ClaimedMessage, Mailbox
from pytest_mailbox.message import Message
from pytest_mailbox.sink import MailSink
from pytest_mailbox.store import Store

__all__ = [
    "AlreadyClaimed",
    "AlreadyConsumed",
    "AmbiguousMatch",
    "Checkpoint",
    "ClaimedMessage",
    "CloseReason",
    "ContractError",
    "EmailContract",
    "ExposedSinkWarning",
    "ExtractionError",
    "FenceMismatch",
    "LeaseExpired",
    "MailSink",
    "Mailbox",
    "MailboxClosed",
    "MailboxError",
    "Message",
    "Receipt",
    "Selector",
    "Status",
    "Store",
    "UnexpectedMessage",
    "WaitTimeout",
]
