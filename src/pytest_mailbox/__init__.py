"""pytest-mailbox: a real, isolated SMTP mailbox for every test.

PYTEST_DONT_REWRITE: pytest marks an installed plugin's package for assertion rewriting,
and warns (an error under ``-W error``) at each ``pytest.main`` of a process that imported
it before; its asserts are no test's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    StoreError,
    UnexpectedMessage,
    WaitTimeout,
)
from pytest_mailbox.vocabulary import Checkpoint, CloseReason, Status

if TYPE_CHECKING:
    from pytest_mailbox.contract import EmailContract, Receipt, Selector
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
    "StoreError",
    "UnexpectedMessage",
    "WaitTimeout",
]

#: Imported on first use. pytest imports this package in every process it starts, and
#: these bring in pydantic, asyncio, aiosmtpd, the e-mail parser and SQLite: about 0.2 s
#: that a run without mail tests, and the xdist controller (which runs no test and no
#: sink) before it starts its workers, would spend for nothing.
_LAZY = {
    "EmailContract": "contract",
    "Receipt": "contract",
    "Selector": "contract",
    "ClaimedMessage": "mailbox",
    "Mailbox": "mailbox",
    "Message": "message",
    "MailSink": "sink",
    "Store": "store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
