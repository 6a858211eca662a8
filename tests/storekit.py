"""Helpers for tests that drive the store directly, with a clock moved by hand."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from pytest_mailbox.store import MailboxRow, Outcome, Store

T0 = 1_700_000_000.0
DOMAIN = "mailbox.test"


class Clock:
    """A clock the test moves by hand: ``Store(path, clock=clock)``."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def claim(
    store: Store,
    mailbox: MailboxRow,
    message_id: str,
    holder: str = "run-1",
    lease: float = 30,
    waiting: str | None = None,
) -> Outcome:
    return store.claim(
        mailbox_id=mailbox.mailbox_id,
        mailbox_fence=mailbox.fence,
        message_id=message_id,
        holder=holder,
        lease=lease,
        waiting=waiting,
    )


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the file directly, bypassing the store under test."""
    with closing(sqlite3.connect(db)) as conn:
        return [tuple(r) for r in conn.execute(sql, params).fetchall()]


def snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table that a refused operation must leave alone."""
    return {
        table: rows(db, f"SELECT * FROM {table} ORDER BY 1")
        for table in ("counters", "mailboxes", "messages", "claims", "events")
    }


def fence_counter(db: Path) -> int:
    [(value,)] = rows(db, "SELECT value FROM counters WHERE name = 'fence'")
    return int(value)
